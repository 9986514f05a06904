// blocking: a WAIT on one connection released by writes on another
// (docs/protocol.md §4.1 table), cancellation (§3.15), a waiter that disconnects
// (§4.2), and a second WAIT after a client-side timeout (§4.3).
#include <fmt/format.h>

#include "conform/check.h"
#include "conform/ctx.h"

namespace tcpstore::conform {
namespace {

constexpr const char* kFile = "conform/checks/blocking.cc";
constexpr Dialect V2 = Dialect::kV2;

// A waiter on a fresh key, and a second connection to write with.
struct Pair {
  Conn waiter, writer;
  std::string key;
};

Pair pendingWait(Ctx& ctx, Dialect d) {
  Pair p{ctx.connect(d), ctx.connect(d), ctx.key("k")};
  ctx.send(p.waiter, req::wait(d, {p.key}), "WAIT [k]");
  ctx.expectQuiet(p.waiter, "WAIT on a missing key");
  return p;
}

Observed releasedBy(Ctx& ctx, Dialect d, const std::string& write,
                    ReplyShape reply, const char* what) {
  Pair p = pendingWait(ctx, d);
  ctx.send(p.writer, write, what);
  if (reply != ReplyShape::kNone) ctx.read(p.writer, reply, what);
  ctx.expectBytes(p.waiter, std::string("\x00", 1),
                  fmt::format("STOP_WAITING after {}", what));
  ctx.expectQuiet(p.waiter, "nothing after the STOP_WAITING");
  return {"ok", ""};
}

Observed bySet(Ctx& ctx) {
  Dialect d = ctx.main();
  return releasedBy(ctx, d, req::set(d, ctx.key("k"), "v"), ReplyShape::kNone,
                    "SET");
}

Observed byAdd(Ctx& ctx) {
  Dialect d = ctx.main();
  return releasedBy(ctx, d, req::add(d, ctx.key("k"), 1), ReplyShape::kInt64,
                    "ADD");
}

Observed byAppend(Ctx& ctx) {
  return releasedBy(ctx, V2, req::append(ctx.key("k"), "v"), ReplyShape::kNone,
                    "APPEND");
}

Observed byMultiSet(Ctx& ctx) {
  return releasedBy(ctx, V2,
                    req::multiSet({ctx.key("other"), ctx.key("k")}, {"1", "2"}),
                    ReplyShape::kNone, "MULTI_SET");
}

// The classic servers never wake waiters from COMPARE_SET (§3.6).
Observed byCompareSet(Ctx& ctx) {
  Dialect d = ctx.main();
  Pair p = pendingWait(ctx, d);
  ctx.call(p.writer, req::compareSet(d, p.key, "", "v"), ReplyShape::kString,
           "COMPARE_SET creating the key");
  if (!p.waiter.quiet(ctx.timing().window)) {
    ctx.expectBytes(p.waiter, std::string("\x00", 1), "STOP_WAITING");
    return {"ok", "woken by COMPARE_SET"};
  }
  ctx.send(p.writer, req::set(d, p.key, "w"), "SET after COMPARE_SET");
  ctx.expectBytes(p.waiter, std::string("\x00", 1), "STOP_WAITING after SET");
  return {"no-wake", "not woken by COMPARE_SET; the next SET released it"};
}

Observed twoWaiters(Ctx& ctx) {
  Dialect d = ctx.main();
  std::string k = ctx.key("k");
  Conn a = ctx.connect(d), b = ctx.connect(d), w = ctx.connect(d);
  ctx.send(a, req::wait(d, {k}), "WAIT a");
  ctx.send(b, req::wait(d, {k}), "WAIT b");
  ctx.expectQuiet(b, "two pending WAITs");
  ctx.call(w, req::add(d, k, 1), ReplyShape::kInt64, "ADD");
  ctx.expectBytes(a, std::string("\x00", 1), "first waiter");
  ctx.expectBytes(b, std::string("\x00", 1), "second waiter");
  return {"ok", ""};
}

Observed cancel(Ctx& ctx) {
  Pair p = pendingWait(ctx, V2);
  ctx.send(p.waiter, req::cancelWait(), "CANCEL_WAIT");
  ctx.expectBytes(p.waiter, "\x01", "WAIT_CANCELED");
  ctx.send(p.writer, req::set(V2, p.key, "v"), "SET after the cancel");
  ctx.fence(p.writer, V2);
  ctx.expectQuiet(p.waiter, "no STOP_WAITING for a cancelled wait");
  ctx.fence(p.waiter, V2);
  return {"ok", ""};
}

Observed waiterDisconnects(Ctx& ctx) {
  Dialect d = ctx.main();
  Pair p = pendingWait(ctx, d);
  p.waiter.close();
  ctx.send(p.writer, req::set(d, p.key, "v"), "SET after the waiter left");
  ctx.fence(p.writer, d);
  ctx.expectAlive("a waiter disconnected");
  return {"ok", ""};
}

// A 1.13 client whose wait timed out sends nothing (§4.3) and then WAITs
// for another key on the same connection. torch keeps the old key's
// registration, so a write of the OLD key releases the new wait early.
Observed afterClientTimeout(Ctx& ctx) {
  Dialect d = ctx.main();
  Conn w = ctx.connect(d), s = ctx.connect(d);
  std::string k1 = ctx.key("k1"), k2 = ctx.key("k2");
  ctx.send(w, req::wait(d, {k1}), "WAIT [k1]");
  ctx.expectQuiet(w, "WAIT [k1]");
  ctx.send(w, req::wait(d, {k2}), "WAIT [k2] (the first abandoned)");
  ctx.expectQuiet(w, "WAIT [k2]");
  ctx.send(s, req::set(d, k1, "old"), "SET k1");
  ctx.fence(s, d);
  if (!w.quiet(ctx.timing().window)) {
    ctx.expectBytes(w, std::string("\x00", 1), "stale STOP_WAITING");
    return {"stale-release", "the abandoned key released the new WAIT"};
  }
  ctx.send(s, req::set(d, k2, "new"), "SET k2");
  ctx.expectBytes(w, std::string("\x00", 1), "STOP_WAITING for k2");
  ctx.expectQuiet(w, "exactly one STOP_WAITING");
  return {"ok", ""};
}

}  // namespace

std::vector<Check> blockingChecks() {
  const Group G = Group::kBlocking;
  using S = Speaks;
  // clang-format off
  constexpr Expect kClassicNoWake = {"no-wake", "no-wake", "no-wake", "ok"};
  constexpr Expect kClassicStale = {"stale-release", "stale-release", "stale-release", "ok"};
  return {
    TCPSTORE_CONFORM_CHECK(kFile, "block.set", "a WAIT is released by another connection's SET", "§4.1", G, S::kMain, kAllOk, bySet),
    TCPSTORE_CONFORM_CHECK(kFile, "block.add", "a WAIT is released by another connection's ADD", "§4.1", G, S::kMain, kAllOk, byAdd),
    TCPSTORE_CONFORM_CHECK(kFile, "block.compare_set", "a WAIT is released by a COMPARE_SET that creates the key", "§3.6, §4.1", G, S::kMain, kClassicNoWake, byCompareSet),
    TCPSTORE_CONFORM_CHECK(kFile, "block.append", "a WAIT is released by another connection's APPEND", "§3.12, §4.1", G, S::kV2, kV2Ok, byAppend),
    TCPSTORE_CONFORM_CHECK(kFile, "block.multi_set", "a WAIT is released by another connection's MULTI_SET", "§3.14, §4.1", G, S::kV2, kV2Ok, byMultiSet),
    TCPSTORE_CONFORM_CHECK(kFile, "block.two_waiters", "one ADD releases two waiters", "§4.1", G, S::kMain, kAllOk, twoWaiters),
    TCPSTORE_CONFORM_CHECK(kFile, "block.cancel", "a cancelled WAIT gets nothing when the key appears", "§3.15, §4.3", G, S::kV2, kV2Ok, cancel),
    TCPSTORE_CONFORM_CHECK(kFile, "block.waiter_disconnects", "a waiter that disconnects is forgotten", "§4.2", G, S::kMain, kAllOk, waiterDisconnects),
    TCPSTORE_CONFORM_CHECK(kFile, "block.after_client_timeout", "a WAIT after an abandoned WAIT is released only by its own key", "§4.1 (3), §4.3", G, S::kMain, kClassicStale, afterClientTimeout),
  };
  // clang-format on
}

}  // namespace tcpstore::conform
