#include "conform/ctx.h"

#include <fmt/format.h>

#include <utility>

#include "protocol/codec.h"
#include "protocol/limits.h"
#include "protocol/requests.h"

namespace tcpstore::conform {
namespace {

protocol::Limits replyLimits() {
  protocol::Limits l;
  l.max_key_bytes = 1ull << 30;
  l.max_value_bytes = 1ull << 30;
  l.max_keys_per_request = 1ull << 24;
  l.max_request_bytes = 1ull << 31;
  return l;
}

std::string encode(Dialect d, const protocol::Request& r) {
  std::string out;
  if (!protocol::encodeRequest(d, r, out)) {
    fail(fmt::format("the {} dialect has no command {}",
                     d == Dialect::kV113 ? "1.13" : "2.x",
                     static_cast<int>(r.command)));
  }
  return out;
}

}  // namespace

void fail(std::string detail) { throw CheckFailure{std::move(detail)}; }

std::string hex(std::string_view bytes, std::size_t max) {
  std::string out;
  for (std::size_t i = 0; i < bytes.size() && i < max; ++i) {
    if (i) out += ' ';
    out += fmt::format("{:02x}", static_cast<unsigned char>(bytes[i]));
  }
  if (bytes.size() > max) out += fmt::format(" ... ({} bytes)", bytes.size());
  if (bytes.empty()) out = "(nothing)";
  return out;
}

std::string unhex(std::string_view h) {
  std::string out;
  for (std::size_t i = 0; i + 1 < h.size(); i += 2) {
    out +=
        static_cast<char>(std::stoi(std::string(h.substr(i, 2)), nullptr, 16));
  }
  return out;
}

std::string le64(std::uint64_t v) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return out;
}

std::string Ctx::key(std::string_view name) const {
  std::string k = prefix_;
  if (name.empty() || name.front() != '/') k += '/';
  k += name;
  return k;
}

Conn Ctx::connectRaw() {
  Conn c;
  if (!c.connect(host_, port_, timing_.op))
    fail("cannot connect: " + c.error());
  return c;
}

Conn Ctx::connect(Dialect d) {
  Conn c = connectRaw();
  if (d == Dialect::kV2) {
    const std::uint32_t nonce = 0x00C0FFEE;
    send(c, req::validate() + req::ping(nonce), "VALIDATE+PING");
    Answer a = read(c, ReplyShape::kU32, "PING echo");
    if (a.u32 != nonce) fail("PING echoed " + hex(a.raw));
  }
  return c;
}

void Ctx::send(Conn& c, std::string_view bytes, std::string_view what) {
  if (!c.send(bytes, timing_.op)) {
    fail(fmt::format("{}: {}", what, c.error()));
  }
}

std::string Ctx::readExact(Conn& c, std::size_t n, std::string_view what) {
  RecvStatus s = c.fill(n, Clock::now() + timing_.op);
  if (s == RecvStatus::kData) return c.take(n);
  fail(fmt::format(
      "{}: {} after {} of {} bytes ({})", what,
      s == RecvStatus::kClosed ? "connection closed" : "no reply in time",
      c.buffer().size(), n, hex(c.buffer())));
}

void Ctx::expectBytes(Conn& c, std::string_view expected,
                      std::string_view what) {
  if (expected.empty())
    fail(fmt::format("tool error: {}: nothing to expect", what));
  std::string got = readExact(c, expected.size(), what);
  if (got != expected) {
    fail(fmt::format("{}: expected {}, got {}", what, hex(expected), hex(got)));
  }
}

Answer Ctx::read(Conn& c, ReplyShape shape, std::string_view what,
                 std::uint64_t count) {
  static const protocol::Limits limits = replyLimits();
  auto deadline = Clock::now() + timing_.op;
  for (;;) {
    protocol::Reply r;
    auto res = protocol::decodeReply(c.buffer(), shape, limits, r, count);
    if (res.frame()) {
      Answer a;
      a.raw = c.buffer().substr(0, res.consumed);
      a.byte = r.byte;
      a.u32 = r.u32;
      a.number = r.number;
      a.value = std::string(r.value);
      for (auto v : r.values) a.values.emplace_back(v);
      c.take(res.consumed);
      return a;
    }
    if (res.failed()) {
      fail(fmt::format("{}: malformed reply {} ({})", what, hex(c.buffer()),
                       res.error.message()));
    }
    RecvStatus s = c.recvSome(deadline);
    if (s != RecvStatus::kData) {
      fail(fmt::format(
          "{}: {} ({} bytes so far: {})", what,
          s == RecvStatus::kClosed ? "connection closed" : "no reply in time",
          c.buffer().size(), hex(c.buffer())));
    }
  }
}

Answer Ctx::call(Conn& c, std::string_view request, ReplyShape shape,
                 std::string_view what, std::uint64_t count) {
  send(c, request, what);
  return read(c, shape, what, count);
}

void Ctx::expectQuiet(Conn& c, std::string_view what) {
  if (!c.quiet(timing_.window)) {
    fail(fmt::format("{}: expected nothing, got {}{}", what, hex(c.buffer()),
                     c.buffer().empty() ? " (connection closed)" : ""));
  }
}

void Ctx::fence(Conn& c, Dialect d) {
  call(c, req::numKeys(d), ReplyShape::kInt64, "fence (GETNUMKEYS)");
}

void Ctx::expectAlive(std::string_view after) {
  Conn c;
  if (!c.connect(host_, port_, timing_.op)) {
    fail(fmt::format("server gone after {}: {}", after, c.error()));
  }
  try {
    if (main_ == Dialect::kV2) {
      send(c, req::validate() + req::ping(7), "VALIDATE+PING");
      read(c, ReplyShape::kU32, "PING echo");
    }
    fence(c, main_);
  } catch (const CheckFailure& f) {
    fail(fmt::format("server not answering after {}: {}", after, f.detail));
  }
}

namespace req {
// The requests are the library's own builders (protocol/requests.h); what is
// judged is the bytes the server sends back.
namespace R = protocol::requests;
using protocol::Command;
using protocol::Request;

std::string validate(std::uint32_t magic) {
  Request r = R::of(Command::kValidate);
  r.u32 = magic;  // a check may send a wrong magic
  return encode(Dialect::kV2, r);
}
std::string ping(std::uint32_t nonce) {
  return encode(Dialect::kV2, R::ping(nonce));
}
std::string set(Dialect d, std::string_view k, std::string_view v) {
  return encode(d, R::set(k, v));
}
std::string get(Dialect d, std::string_view k) { return encode(d, R::get(k)); }
std::string add(Dialect d, std::string_view k, std::int64_t delta) {
  return encode(d, R::add(k, delta));
}
std::string compareSet(Dialect d, std::string_view k, std::string_view expected,
                       std::string_view desired) {
  return encode(d, R::compareSet(k, expected, desired));
}
std::string check(Dialect d, const std::vector<std::string>& keys) {
  return encode(d, R::check(keys));
}
std::string wait(Dialect d, const std::vector<std::string>& keys) {
  return encode(d, R::wait(keys));
}
std::string numKeys(Dialect d) { return encode(d, R::numKeys()); }
std::string del(Dialect d, std::string_view k) {
  return encode(d, R::deleteKey(k));
}
std::string watch(std::string_view k) {
  return encode(Dialect::kV113, R::keyed(Command::kWatchKey, k));
}
std::string append(std::string_view k, std::string_view v) {
  return encode(Dialect::kV2, R::append(k, v));
}
std::string multiGet(const std::vector<std::string>& keys) {
  return encode(Dialect::kV2, R::multiGet(keys));
}
std::string multiSet(const std::vector<std::string>& keys,
                     const std::vector<std::string>& values) {
  return encode(Dialect::kV2, R::multiSet(keys, values));
}
std::string cancelWait() { return encode(Dialect::kV2, R::cancelWait()); }
std::string queuePush(std::string_view k, std::string_view v) {
  return encode(Dialect::kV2, R::queuePush(k, v));
}
std::string queuePop(std::string_view k) {
  return encode(Dialect::kV2, R::queuePop(k));
}
std::string queueLen(std::string_view k) {
  return encode(Dialect::kV2, R::queueLen(k));
}
std::string listKeys() { return encode(Dialect::kV2, R::listKeys()); }
std::string barrier(std::string_view k, std::int64_t world_size) {
  return encode(Dialect::kV2, R::barrier(k, world_size));
}
}  // namespace req

}  // namespace tcpstore::conform
