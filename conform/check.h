// The conformance model: checks, groups, profiles and what a check observed.
//
// A check runs against a live server through Ctx (raw sockets only) and
// returns the name of the behaviour it observed ("ok" for the behaviour the
// protocol reference describes as correct, other names for the alternatives
// real servers show, e.g. "stays-open"). Each check states, per profile, the
// behaviour that profile requires, or nullptr when the profile does not
// require the feature at all (shown as UNSUPPORTED, never as FAIL). A check
// that cannot complete (timeout, wrong bytes, closed connection) throws
// CheckFailure, which is always a failure of a required check.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace tcpstore::conform {

class Ctx;

enum class Group { kWire, kSemantics, kBlocking, kIsolation, kExtensions };
std::string_view groupName(Group g) noexcept;

// The reference behaviours a server can be judged against. The first
// kTableProfiles have a column in every check's Expect; the others are
// derived from one of those columns (profile.cc).
enum class Profile {
  kTorch113 = 0,
  kTorch26,
  kTorch214,
  kTcpstore,
  kTcpstoreGateway,  // tcpstore-server --backend etcd://: kTcpstore's column
                     // minus the features the gateway does not serve
};
inline constexpr std::size_t kTableProfiles = 4;
inline constexpr std::size_t kProfileCount = 5;
std::string_view profileName(Profile p) noexcept;

// Which dialect a check speaks: a fixed one, or the server's main dialect
// (2.x if the profile speaks it, else 1.13), or both at once.
enum class Speaks { kV113, kV2, kMain, kBoth };

// Expected behaviour per table profile, indexed by Profile; nullptr = not
// required. Read it through expected(), which also answers derived profiles.
using Expect = std::array<const char*, kTableProfiles>;
// clang-format off
inline constexpr Expect kAllOk   = {"ok", "ok", "ok", "ok"};
inline constexpr Expect kV2Ok    = {nullptr, "ok", "ok", "ok"};
inline constexpr Expect kV113Ok  = {"ok", nullptr, nullptr, "ok"};
inline constexpr Expect k214Ok   = {nullptr, nullptr, "ok", "ok"};
inline constexpr Expect kOursOk  = {nullptr, nullptr, nullptr, "ok"};
// clang-format on

struct CheckFailure {
  std::string detail;
};

struct Observed {
  std::string behaviour;  // "ok", a named alternative, or "fail"
  std::string detail;     // what was seen (for the report)
};

struct Check {
  const char* id;
  const char* title;
  const char* ref;  // docs/protocol.md section, e.g. "§3.5"
  Group group;
  Speaks speaks;
  Expect expect;
  Observed (*run)(Ctx&);
  const char* file;  // source file relative to the repository
  int line;          // line of the definition
};

// Defines a Check at this source line.
#define TCPSTORE_CONFORM_CHECK(file, id, title, ref, group, speaks, expect, \
                               fn)                                          \
  ::tcpstore::conform::Check {                                              \
    id, title, ref, group, speaks, expect, fn, file, __LINE__               \
  }

// The behaviour profile `p` requires of `c`, or nullptr if it requires none.
// Derived profiles answer from their base column and their exception list.
const char* expected(const Check& c, Profile p) noexcept;
// Why a derived profile does not require `c` (its exception entry), or
// nullptr if it has none.
const char* exceptionReason(const Check& c, Profile p) noexcept;

std::vector<Check> wireChecks();
std::vector<Check> semanticsChecks();
std::vector<Check> blockingChecks();
std::vector<Check> isolationChecks();
std::vector<Check> extensionChecks();
// Every check, in report order.
std::vector<Check> allChecks();

}  // namespace tcpstore::conform
