// extensions: the 2.x commands that not every server has (docs/protocol.md §2.1):
// PING (2.x since 2024), QUEUE_* (libuv only), LIST_KEYS and BARRIER (2.14).
// A server that closes the connection on the command does not support it;
// that is reported, and is a failure only for a profile that requires it.
#include <fmt/format.h>

#include "conform/check.h"
#include "conform/ctx.h"
#include "conform/vectors.h"

namespace tcpstore::conform {
namespace {

constexpr const char* kFile = "conform/checks/extensions.cc";
constexpr Dialect V2 = Dialect::kV2;

// Sends `request`; if the server closes instead of answering, the command is
// unsupported (thrown as Unsupported, turned into an observation below).
struct Unsupported {
  std::string what;
};

void sendOrUnsupported(Ctx& ctx, Conn& c, const std::string& request,
                       const char* what, std::size_t reply_bytes) {
  ctx.send(c, request, what);
  if (reply_bytes == 0) {
    ctx.fence(c, V2);  // a close shows up here
    return;
  }
  RecvStatus s = c.fill(reply_bytes, Clock::now() + ctx.timing().op);
  if (s == RecvStatus::kClosed && c.buffer().empty()) throw Unsupported{what};
}

template <Observed (*F)(Ctx&)>
Observed orUnsupported(Ctx& ctx) {
  try {
    return F(ctx);
  } catch (const Unsupported& u) {
    return {"closes", fmt::format("connection closed on {}", u.what)};
  }
}

Observed ping(Ctx& ctx) {
  Conn c = ctx.connect(V2);
  for (std::uint32_t nonce : {0u, 4242u, 0xFFFFFFFFu}) {
    sendOrUnsupported(ctx, c, req::ping(nonce), "PING", 4);
    Answer a = ctx.read(c, ReplyShape::kU32, "PING echo");
    if (a.u32 != nonce)
      fail(fmt::format("PING {} echoed {}", nonce, hex(a.raw)));
  }
  return {"ok", ""};
}

Observed queues(Ctx& ctx) {
  Conn c = ctx.connect(V2);
  auto step = [&](int n) {
    const Vector& v = replyVector(V2, n);
    sendOrUnsupported(ctx, c, rekey(V2, v.request, ctx.prefix()), v.op.c_str(),
                      v.reply.empty() ? 0 : 1);
    if (!v.reply.empty()) ctx.expectBytes(c, v.reply, v.op);
  };
  try {
    ctx.send(c, rekey(V2, replyVector(V2, 31).request, ctx.prefix()),
             "QUEUE_PUSH");
    ctx.fence(c, V2);
  } catch (const CheckFailure&) {
    throw Unsupported{"QUEUE_PUSH"};
  }
  for (int n : {32, 33, 34}) step(n);
  return {"ok", ""};
}

Observed listKeys(Ctx& ctx) {
  Conn c = ctx.connect(V2);
  std::string a = ctx.key("m1"), b = ctx.key("m2");
  ctx.send(c, req::multiSet({a, b}, {"1", "2"}), "MULTI_SET");
  ctx.fence(c, V2);
  const Vector& v = replyVector(V2, 35);
  if (req::listKeys() != v.request) fail("tool error: LIST_KEYS encoding");
  sendOrUnsupported(ctx, c, v.request, "LIST_KEYS", 8);
  Answer r = ctx.read(c, ReplyShape::kCountedStrings, "LIST_KEYS");
  int found = 0;
  for (const auto& k : r.values) found += (k == a || k == b);
  if (found != 2) {
    fail(fmt::format("LIST_KEYS ({} keys) lacks a key just set",
                     r.values.size()));
  }
  return {"ok", ""};
}

Observed barrier(Ctx& ctx) {
  Conn first = ctx.connect(V2), last = ctx.connect(V2);
  std::string k = ctx.key("b");
  ctx.send(first, req::barrier(k, 2), "BARRIER (first of 2)");
  if (!first.quiet(ctx.timing().window)) {
    if (first.buffer().empty()) throw Unsupported{"BARRIER"};
    fail("first arrival answered early: " + hex(first.buffer()));
  }
  const Vector& v = replyVector(V2, 37);
  ctx.send(last, rekey(V2, v.request, ctx.prefix()), v.op);
  ctx.expectBytes(last, v.reply, v.op);
  ctx.expectBytes(first, std::string("\x00", 1), "first arrival released");
  ctx.send(last, req::get(V2, k), "GET the counter");
  ctx.expectBytes(last, le64(1) + "2", "counter value");
  const Vector& one = replyVector(V2, 38);
  ctx.send(last, rekey(V2, one.request, ctx.prefix()), one.op);
  ctx.expectBytes(last, one.reply, one.op);
  return {"ok", ""};
}

// 2.14 registers a BARRIER waiter like a WAIT, so any write of the key
// releases it; ours releases it only when the count is reached.
Observed barrierRelease(Ctx& ctx) {
  Conn w = ctx.connect(V2), s = ctx.connect(V2);
  std::string k = ctx.key("b");
  ctx.send(w, req::barrier(k, 3), "BARRIER (1 of 3)");
  if (!w.quiet(ctx.timing().window)) {
    if (w.buffer().empty()) throw Unsupported{"BARRIER"};
    fail("answered early: " + hex(w.buffer()));
  }
  ctx.call(s, req::add(V2, k, 0), ReplyShape::kInt64, "ADD 0 to the counter");
  if (!w.quiet(ctx.timing().window)) {
    ctx.expectBytes(w, std::string("\x00", 1), "STOP_WAITING");
    return {"any-write", "released by an ADD of 0 (count 1 of 3)"};
  }
  ctx.call(s, req::add(V2, k, 2), ReplyShape::kInt64, "ADD 2 (count 3 of 3)");
  ctx.expectBytes(w, std::string("\x00", 1), "released at the world size");
  return {"ok", ""};
}

}  // namespace

std::vector<Check> extensionChecks() {
  const Group G = Group::kExtensions;
  using S = Speaks;
  // clang-format off
  return {
    TCPSTORE_CONFORM_CHECK(kFile, "ext.ping", "PING echoes any nonce", "§3.2", G, S::kV2, kV2Ok, orUnsupported<ping>),
    TCPSTORE_CONFORM_CHECK(kFile, "ext.queue", "QUEUE_PUSH, QUEUE_LEN, QUEUE_POP", "§3.16, §9.1 #31-34", G, S::kV2, kOursOk, orUnsupported<queues>),
    TCPSTORE_CONFORM_CHECK(kFile, "ext.list_keys", "LIST_KEYS lists raw keys", "§3.17, §9.1 #35", G, S::kV2, k214Ok, orUnsupported<listKeys>),
    TCPSTORE_CONFORM_CHECK(kFile, "ext.barrier", "BARRIER of two clients, counter, world size 1", "§3.18, §9.1 #37-38", G, S::kV2, k214Ok, orUnsupported<barrier>),
    TCPSTORE_CONFORM_CHECK(kFile, "ext.barrier.release", "a BARRIER waiter is released only at its world size", "§3.18, §4.1", G, S::kV2, (Expect{nullptr, nullptr, "any-write", "ok"}), orUnsupported<barrierRelease>),
  };
  // clang-format on
}

}  // namespace tcpstore::conform
