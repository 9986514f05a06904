// semantics: what each command does to the key space (docs/protocol.md §3, §4):
// ADD parsing and overflow, the COMPARE_SET cases, WAIT and CANCEL_WAIT,
// DELETE_KEY with waiters, GETNUMKEYS counting, CHECK of queues, MULTI_GET of
// a missing key, APPEND.
#include <fmt/format.h>

#include "conform/check.h"
#include "conform/ctx.h"
#include "conform/vectors.h"

namespace tcpstore::conform {
namespace {

constexpr const char* kFile = "conform/checks/semantics.cc";
constexpr Dialect V2 = Dialect::kV2;

std::string str(std::string_view v) { return le64(v.size()) + std::string(v); }

void setKey(Ctx& ctx, Conn& c, Dialect d, const std::string& k,
            std::string_view v) {
  ctx.send(c, req::set(d, k, v), "SET");
  ctx.fence(c, d);
}

std::int64_t addKey(Ctx& ctx, Conn& c, Dialect d, const std::string& k,
                    std::int64_t delta) {
  return ctx.call(c, req::add(d, k, delta), ReplyShape::kInt64, "ADD").number;
}

void expectValue(Ctx& ctx, Conn& c, Dialect d, const std::string& k,
                 std::string_view want) {
  ctx.send(c, req::get(d, k), "GET " + k);
  ctx.expectBytes(c, str(want), "GET " + k);
}

Observed addParsePrefix(Ctx& ctx) {
  Dialect d = ctx.main();
  Conn c = ctx.connect(d);
  std::string a = ctx.key("a"), b = ctx.key("b");
  setKey(ctx, c, d, a, "12abc");
  if (auto n = addKey(ctx, c, d, a, 1); n != 13)
    fail(fmt::format("12abc + 1 = {}", n));
  expectValue(ctx, c, d, a, "13");
  setKey(ctx, c, d, b, "  7");
  if (auto n = addKey(ctx, c, d, b, 1); n != 8)
    fail(fmt::format("'  7' + 1 = {}", n));
  return {"ok", ""};
}

Observed addOverflow(Ctx& ctx) {
  Dialect d = ctx.main();
  Conn c = ctx.connect(d);
  std::string k = ctx.key("max");
  setKey(ctx, c, d, k, "9223372036854775807");
  Answer a = ctx.call(c, req::add(d, k, 1), ReplyShape::kInt64, "ADD max+1");
  if (a.raw != le64(0x8000000000000000ull))
    fail("INT64_MAX + 1 replied " + hex(a.raw));
  expectValue(ctx, c, d, k, "-9223372036854775808");
  return {"ok", ""};
}

// The four COMPARE_SET rows of §3.6, plus "" matching a present empty value.
Observed casCreate(Ctx& ctx) {
  Dialect d = ctx.main();
  Conn c = ctx.connect(d);
  std::string k = ctx.key("c");
  ctx.send(c, req::compareSet(d, k, "", "v1"), "COMPARE_SET missing '' -> v1");
  ctx.expectBytes(c, str("v1"), "COMPARE_SET reply");
  expectValue(ctx, c, d, k, "v1");
  return {"ok", ""};
}

Observed casMissingExpected(Ctx& ctx) {
  Dialect d = ctx.main();
  Conn c = ctx.connect(d);
  std::string k = ctx.key("c");
  ctx.send(c, req::compareSet(d, k, "exp", "des"), "COMPARE_SET missing exp");
  ctx.expectBytes(c, str("exp"), "reply echoes expected");
  ctx.send(c, req::check(d, {k}), "CHECK");
  ctx.expectBytes(c, "\x01", "key still missing (NOT_READY)");
  return {"ok", ""};
}

Observed casMatch(Ctx& ctx) {
  Dialect d = ctx.main();
  Conn c = ctx.connect(d);
  std::string k = ctx.key("c");
  setKey(ctx, c, d, k, "old");
  ctx.send(c, req::compareSet(d, k, "old", "new"), "COMPARE_SET match");
  ctx.expectBytes(c, str("new"), "reply is the new value");
  expectValue(ctx, c, d, k, "new");
  return {"ok", ""};
}

Observed casMismatch(Ctx& ctx) {
  Dialect d = ctx.main();
  Conn c = ctx.connect(d);
  std::string k = ctx.key("c");
  setKey(ctx, c, d, k, "cur");
  ctx.send(c, req::compareSet(d, k, "other", "new"), "COMPARE_SET mismatch");
  ctx.expectBytes(c, str("cur"), "reply is the current value");
  expectValue(ctx, c, d, k, "cur");
  return {"ok", ""};
}

Observed casEmptyMatchesEmpty(Ctx& ctx) {
  Dialect d = ctx.main();
  Conn c = ctx.connect(d);
  std::string k = ctx.key("c");
  setKey(ctx, c, d, k, "");
  ctx.send(c, req::compareSet(d, k, "", "filled"), "COMPARE_SET '' on ''");
  ctx.expectBytes(c, str("filled"), "reply");
  expectValue(ctx, c, d, k, "filled");
  return {"ok", ""};
}

Observed waitDuplicate(Ctx& ctx) {
  Dialect d = ctx.main();
  Conn w = ctx.connect(d), s = ctx.connect(d);
  std::string k = ctx.key("k");
  ctx.send(w, req::wait(d, {k, k}), "WAIT [k, k]");
  ctx.expectQuiet(w, "WAIT [k, k] before the SET");
  ctx.send(s, req::set(d, k, "v"), "SET k");
  ctx.expectBytes(w, std::string("\x00", 1), "one STOP_WAITING");
  ctx.expectQuiet(w, "no second STOP_WAITING");
  return {"ok", ""};
}

Observed waitMulti(Ctx& ctx) {
  Dialect d = ctx.main();
  Conn w = ctx.connect(d), s = ctx.connect(d);
  std::string a = ctx.key("a"), b = ctx.key("b");
  ctx.send(w, req::wait(d, {a, b}), "WAIT [a, b]");
  setKey(ctx, s, d, a, "1");
  ctx.expectQuiet(w, "WAIT [a, b] after only a was set");
  ctx.send(s, req::set(d, b, "2"), "SET b");
  ctx.expectBytes(w, std::string("\x00", 1), "STOP_WAITING after b");
  return {"ok", ""};
}

Observed cancelIdle(Ctx& ctx) {
  Conn c = ctx.connect(V2);
  ctx.send(c, req::cancelWait(), "CANCEL_WAIT with nothing pending");
  ctx.expectBytes(c, "\x01", "WAIT_CANCELED");
  ctx.fence(c, V2);
  return {"ok", ""};
}

Observed cancelCompleted(Ctx& ctx) {
  Conn w = ctx.connect(V2), s = ctx.connect(V2);
  std::string k = ctx.key("k");
  ctx.send(w, req::wait(V2, {k}), "WAIT [k]");
  setKey(ctx, s, V2, k, "v");
  ctx.send(w, req::cancelWait(), "CANCEL_WAIT after completion");
  ctx.expectBytes(w, std::string("\x00\x01", 2),
                  "STOP_WAITING then WAIT_CANCELED");
  return {"ok", ""};
}

Observed cancelTwice(Ctx& ctx) {
  Conn c = ctx.connect(V2);
  ctx.send(c, req::wait(V2, {ctx.key("never")}), "WAIT [never]");
  ctx.send(c, req::cancelWait() + req::cancelWait(), "two CANCEL_WAITs");
  ctx.expectBytes(c, std::string("\x01\x01", 2), "two WAIT_CANCELED");
  return {"ok", ""};
}

Observed deleteWithWaiter(Ctx& ctx) {
  Dialect d = ctx.main();
  Conn w = ctx.connect(d), s = ctx.connect(d);
  std::string k = ctx.key("k");
  ctx.send(w, req::wait(d, {k}), "WAIT [k]");
  ctx.expectQuiet(w, "pending WAIT");
  Answer a = ctx.call(s, req::del(d, k), ReplyShape::kInt64, "DELETE_KEY k");
  if (a.number != 0) fail("DELETE_KEY of a missing key replied " + hex(a.raw));
  ctx.expectQuiet(w, "WAIT after DELETE_KEY (a delete wakes nobody)");
  ctx.send(s, req::set(d, k, "v"), "SET k");
  ctx.expectBytes(w, std::string("\x00", 1),
                  "the next SET releases the waiter");
  return {"ok", ""};
}

Observed numKeysCounting(Ctx& ctx) {
  Dialect d = ctx.main();
  Conn c = ctx.connect(d);
  auto count = [&] {
    return ctx.call(c, req::numKeys(d), ReplyShape::kInt64, "GETNUMKEYS")
        .number;
  };
  std::int64_t n0 = count();
  std::string k = ctx.key("a");
  std::string raw = ctx.prefix().substr(1) + "-raw";  // no leading '/'
  ctx.send(c, req::set(d, k, "1"), "SET a");
  std::int64_t n1 = count();
  ctx.send(c, req::set(d, k, "2"), "SET a again");
  std::int64_t n2 = count();
  addKey(ctx, c, d, raw, 1);
  std::int64_t n3 = count();
  ctx.call(c, req::del(d, k), ReplyShape::kInt64, "DELETE_KEY a");
  ctx.call(c, req::del(d, raw), ReplyShape::kInt64, "DELETE_KEY raw");
  std::int64_t n4 = count();
  if (n1 != n0 + 1 || n2 != n1 || n3 != n2 + 1 || n4 != n0) {
    fail(
        fmt::format("counts {} {} {} {} {} (expected n, n+1, n+1, n+2, n; "
                    "other clients of a shared server can disturb this)",
                    n0, n1, n2, n3, n4));
  }
  return {"ok", ""};
}

Observed checkQueue(Ctx& ctx) {
  Conn c = ctx.connect(V2);
  std::string q = ctx.key("q");
  // One write: a server without queues closes on QUEUE_PUSH, and a second
  // write could then fail (EPIPE) instead of showing the close.
  ctx.send(c, req::queuePush(q, "job") + req::check(V2, {q}),
           "QUEUE_PUSH + CHECK [q]");
  if (c.fill(1, Clock::now() + ctx.timing().op) != RecvStatus::kData) {
    return {"closes", "connection closed on QUEUE_PUSH"};
  }
  std::string b = c.take(1);
  if (b != std::string("\x00", 1))
    fail("CHECK of a non-empty queue: " + hex(b));
  return {"ok", ""};
}

// MULTI_GET [present, missing]: servers differ (§3.13).
Observed multiGetMissing(Ctx& ctx) {
  Conn c = ctx.connect(V2);
  setKey(ctx, c, V2, ctx.key("mg1"), "a");
  const Vector& v = replyVector(V2, 39);
  ctx.send(c, rekey(V2, v.request, ctx.prefix()), v.op);
  std::string got;
  if (c.closesSilently(ctx.timing().window, &got)) {
    return {"close-no-reply", "closed without a reply"};
  }
  if (got == v.reply && c.buffer() == got) {
    c.take(got.size());
    if (c.closesSilently(ctx.timing().window)) {
      return {"partial-then-close", "value of /mg1, then closed (as captured)"};
    }
  }
  if (got == v.reply + le64(0))
    return {"empty-value", "empty value for the missing key"};
  fail("MULTI_GET with a missing key: " + hex(got));
}

Observed appendExisting(Ctx& ctx) {
  Conn c = ctx.connect(V2);
  std::string k = ctx.key("ap");
  setKey(ctx, c, V2, k, "ab");
  ctx.send(c, req::append(k, "cd"), "APPEND cd");
  ctx.send(c, req::append(k, ""), "APPEND ''");
  expectValue(ctx, c, V2, k, "abcd");
  return {"ok", ""};
}

Observed multiSetZero(Ctx& ctx) {
  Conn c = ctx.connect(V2);
  ctx.send(c, req::multiSet({}, {}), "MULTI_SET []");
  ctx.send(c, req::multiGet({}), "MULTI_GET []");
  ctx.fence(c, V2);
  return {"ok", ""};
}

// 1.13 watches of a closed connection (§3.11): torch never drops them, so
// the next change of the key is written to whichever connection got the
// closed one's descriptor number (the next one accepted, after the close was
// seen). Ours drops them.
Observed watchOfClosedConnection(Ctx& ctx) {
  constexpr Dialect V1 = Dialect::kV113;
  std::string k = ctx.key("wk");
  Conn s = ctx.connect(V1);
  Conn w = ctx.connect(V1);
  ctx.call(w, req::watch(k), ReplyShape::kByte, "WATCH_KEY");
  w.close();
  ctx.fence(s, V1);  // two round trips: the server has seen the close
  ctx.fence(s, V1);
  Conn n = ctx.connect(V1);
  ctx.send(s, req::set(V1, k, "v"), "SET the watched key");
  ctx.fence(s, V1);
  ctx.send(n, req::numKeys(V1), "GETNUMKEYS on a new connection");
  if (ctx.readExact(n, 1, "first byte") == std::string("\x01", 1) &&
      n.fill(8, Clock::now() + ctx.timing().op) == RecvStatus::kData &&
      n.buffer().substr(0, 8) == le64(k.size())) {
    return {"leaks", "the new connection got the closed watcher's KEY_CREATED"};
  }
  return {"ok", ""};
}

}  // namespace

std::vector<Check> semanticsChecks() {
  const Group G = Group::kSemantics;
  using S = Speaks;
  // clang-format off
  return {
    TCPSTORE_CONFORM_CHECK(kFile, "sem.add.parse", "ADD parses a decimal prefix ('12abc', '  7')", "§3.5", G, S::kMain, kAllOk, addParsePrefix),
    TCPSTORE_CONFORM_CHECK(kFile, "sem.add.overflow", "ADD past INT64_MAX wraps to INT64_MIN", "§3.5", G, S::kMain, kAllOk, addOverflow),
    TCPSTORE_CONFORM_CHECK(kFile, "sem.compare_set.create", "COMPARE_SET '' on a missing key creates it", "§3.6", G, S::kMain, kAllOk, casCreate),
    TCPSTORE_CONFORM_CHECK(kFile, "sem.compare_set.missing_expected", "COMPARE_SET on a missing key echoes expected, stores nothing", "§3.6", G, S::kMain, kAllOk, casMissingExpected),
    TCPSTORE_CONFORM_CHECK(kFile, "sem.compare_set.match", "COMPARE_SET match stores and returns desired", "§3.6", G, S::kMain, kAllOk, casMatch),
    TCPSTORE_CONFORM_CHECK(kFile, "sem.compare_set.mismatch", "COMPARE_SET mismatch returns the current value", "§3.6", G, S::kMain, kAllOk, casMismatch),
    TCPSTORE_CONFORM_CHECK(kFile, "sem.compare_set.empty_matches_empty", "COMPARE_SET '' matches a present empty value", "§3.6", G, S::kMain, kAllOk, casEmptyMatchesEmpty),
    TCPSTORE_CONFORM_CHECK(kFile, "sem.wait.duplicate_keys", "WAIT [k, k] is released once by one SET", "§4.1", G, S::kMain, kAllOk, waitDuplicate),
    TCPSTORE_CONFORM_CHECK(kFile, "sem.wait.all_keys", "WAIT [a, b] waits for both keys", "§4.1", G, S::kMain, kAllOk, waitMulti),
    TCPSTORE_CONFORM_CHECK(kFile, "sem.cancel_wait.idle", "CANCEL_WAIT with nothing pending replies 01", "§3.15", G, S::kV2, kV2Ok, cancelIdle),
    TCPSTORE_CONFORM_CHECK(kFile, "sem.cancel_wait.completed", "CANCEL_WAIT after the wait completed: 00 01", "§3.15", G, S::kV2, kV2Ok, cancelCompleted),
    TCPSTORE_CONFORM_CHECK(kFile, "sem.cancel_wait.twice", "two CANCEL_WAITs: 01 01", "§3.15", G, S::kV2, kV2Ok, cancelTwice),
    TCPSTORE_CONFORM_CHECK(kFile, "sem.delete.waiters", "DELETE_KEY wakes nobody; the next SET does", "§3.10, §4.1", G, S::kMain, kAllOk, deleteWithWaiter),
    TCPSTORE_CONFORM_CHECK(kFile, "sem.watch.closed_watcher", "a closed 1.13 watcher's notifications go nowhere", "§3.11", G, S::kV113, (Expect{"leaks", nullptr, nullptr, "ok"}), watchOfClosedConnection),
    TCPSTORE_CONFORM_CHECK(kFile, "sem.num_keys.counting", "GETNUMKEYS counts every key, raw ones too", "§3.9", G, S::kMain, kAllOk, numKeysCounting),
    TCPSTORE_CONFORM_CHECK(kFile, "sem.check.queue", "CHECK counts a non-empty queue as present", "§3.7, §3.16", G, S::kV2, kOursOk, checkQueue),
    TCPSTORE_CONFORM_CHECK(kFile, "sem.multi_get.missing", "MULTI_GET [present, missing]", "§3.13, §9.1 #39", G, S::kV2, (Expect{nullptr, "partial-then-close", "partial-then-close", "close-no-reply"}), multiGetMissing),
    TCPSTORE_CONFORM_CHECK(kFile, "sem.append.existing", "APPEND extends an existing value", "§3.12", G, S::kV2, kV2Ok, appendExisting),
    TCPSTORE_CONFORM_CHECK(kFile, "sem.multi_set.empty", "MULTI_SET and MULTI_GET of no keys", "§3.13-14", G, S::kV2, kV2Ok, multiSetZero),
  };
  // clang-format on
}

}  // namespace tcpstore::conform
