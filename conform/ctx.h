// What a check may do with the server under test: open raw connections (with
// or without the 2.x handshake), send request bytes, and read replies with a
// deadline. Every failure to get the expected bytes in time throws
// CheckFailure, so a hanging or misbehaving server fails that check only.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "conform/check.h"
#include "conform/conn.h"
#include "protocol/message.h"
#include "protocol/wire.h"

namespace tcpstore::conform {

using protocol::Dialect;
using protocol::ReplyShape;

// One decoded reply, owning its bytes.
struct Answer {
  std::string raw;  // the reply's exact bytes
  std::uint8_t byte = 0;
  std::uint32_t u32 = 0;
  std::int64_t number = 0;
  std::string value;
  std::vector<std::string> values;
};

struct Timing {
  Ms op{3000};     // one reply, one connect
  Ms window{400};  // "nothing happens" windows (no reply, no close)
};

class Ctx {
 public:
  Ctx(std::string host, std::uint16_t port, Dialect main, std::string prefix,
      Timing timing)
      : host_(std::move(host)),
        port_(port),
        main_(main),
        prefix_(std::move(prefix)),
        timing_(timing) {}

  Dialect main() const noexcept { return main_; }
  const Timing& timing() const noexcept { return timing_; }
  // A key unique to this run and check: "<prefix>/<name>".
  std::string key(std::string_view name) const;
  const std::string& prefix() const noexcept { return prefix_; }

  // A connection; for 2.x with VALIDATE + PING done (echo checked).
  Conn connect(Dialect d);
  // A connection with no bytes sent yet.
  Conn connectRaw();

  void send(Conn& c, std::string_view bytes, std::string_view what);
  // Exactly n bytes within the op deadline.
  std::string readExact(Conn& c, std::size_t n, std::string_view what);
  // Exactly `expected` (raw bytes) within the op deadline.
  void expectBytes(Conn& c, std::string_view expected, std::string_view what);
  // One reply of `shape` within the op deadline.
  Answer read(Conn& c, ReplyShape shape, std::string_view what,
              std::uint64_t count = 0);
  Answer call(Conn& c, std::string_view request, ReplyShape shape,
              std::string_view what, std::uint64_t count = 0);
  // Nothing arrives for the window (no byte, no close).
  void expectQuiet(Conn& c, std::string_view what);
  // A GETNUMKEYS round trip: everything sent before on `c` was applied.
  void fence(Conn& c, Dialect d);
  // A fresh connection in the main dialect still gets answers.
  void expectAlive(std::string_view after);

 private:
  std::string host_;
  std::uint16_t port_;
  Dialect main_;
  std::string prefix_;
  Timing timing_;
};

[[noreturn]] void fail(std::string detail);
std::string hex(std::string_view bytes, std::size_t max = 48);
std::string unhex(std::string_view hex);

// Request bytes, encoded with the project's codec (protocol::encodeRequest).
namespace req {
std::string validate(std::uint32_t magic = protocol::kValidateMagic);
std::string ping(std::uint32_t nonce);
std::string set(Dialect d, std::string_view k, std::string_view v);
std::string get(Dialect d, std::string_view k);
std::string add(Dialect d, std::string_view k, std::int64_t delta);
std::string compareSet(Dialect d, std::string_view k, std::string_view expected,
                       std::string_view desired);
std::string check(Dialect d, const std::vector<std::string>& keys);
std::string wait(Dialect d, const std::vector<std::string>& keys);
std::string numKeys(Dialect d);
std::string del(Dialect d, std::string_view k);
std::string watch(std::string_view k);  // 1.13 only
std::string append(std::string_view k, std::string_view v);
std::string multiGet(const std::vector<std::string>& keys);
std::string multiSet(const std::vector<std::string>& keys,
                     const std::vector<std::string>& values);
std::string cancelWait();
std::string queuePush(std::string_view k, std::string_view v);
std::string queuePop(std::string_view k);
std::string queueLen(std::string_view k);
std::string listKeys();
std::string barrier(std::string_view k, std::int64_t world_size);
}  // namespace req

// i64 / u64 little-endian, as on the wire.
std::string le64(std::uint64_t v);

}  // namespace tcpstore::conform
