// Runs the checks against one server and judges what they observed against
// a profile. Text and JSON reports are built from RunReport.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "conform/check.h"
#include "conform/ctx.h"

namespace tcpstore::conform {

enum class Verdict { kPass, kFail, kDeviates, kUnsupported };
std::string_view verdictName(Verdict v) noexcept;

struct RunOptions {
  std::string host = "127.0.0.1";
  std::uint16_t port = 0;
  bool v113 = true;  // --dialect
  bool v2 = true;
  std::optional<Profile> profile;  // nullopt: pick the best match
  std::optional<Group> only;
  Timing timing;
};

struct CheckResult {
  const Check* check = nullptr;
  bool ran = false;
  Observed observed;  // empty behaviour if not run
  double ms = 0;
  // Filled by judge():
  Verdict verdict = Verdict::kUnsupported;
  std::string expected;  // "" if not required
  std::string note;      // why (deviations name the profiles it matches)
};

struct RunReport {
  std::string target;  // free-form name (--name)
  std::string address;
  Profile profile = Profile::kTcpstore;
  bool profile_auto = false;
  std::vector<CheckResult> results;
  int passed = 0, failed = 0, deviates = 0, unsupported = 0;
};

// Runs every selected check (each with its own key prefix under a random
// run prefix) and judges the results.
RunReport runChecks(const std::vector<Check>& checks, const RunOptions& opts);

// The verdict of one observation under `p`.
void judge(CheckResult& r, Profile p);

// Text report (one line per check, then the summary; the last line is
// exactly "N passed, N failed").
std::string textReport(const RunReport& r);
std::string jsonReport(const RunReport& r);

}  // namespace tcpstore::conform
