// wire: every command and reply byte for byte against the vectors captured
// from real torch 1.13, 2.6 and 2.14 (docs/protocol.md §9.1), in both dialects,
// plus dialect detection (§8.1) and the inputs after which servers close.
#include <fmt/format.h>

#include "conform/check.h"
#include "conform/ctx.h"
#include "conform/vectors.h"

namespace tcpstore::conform {
namespace {

constexpr const char* kFile = "conform/checks/wire.cc";
constexpr Dialect V1 = Dialect::kV113;
constexpr Dialect V2 = Dialect::kV2;

// The vector numbers of the shared rows differ by the two handshake rows.
template <Dialect D>
constexpr int row(int v113_row) {
  return D == V2 ? v113_row + 2 : v113_row;
}

// Sends vector `n` re-keyed and compares the reply byte for byte.
template <Dialect D>
void step(Ctx& ctx, Conn& c, int n) {
  const Vector& v = replyVector(D, n);
  ctx.send(c, rekey(D, v.request, ctx.prefix()), v.op);
  if (!v.reply.empty()) ctx.expectBytes(c, v.reply, v.op);
}

template <Dialect D>
Observed setGet(Ctx& ctx) {
  Conn c = ctx.connect(D);
  for (int r : {1, 2, 3, 6}) step<D>(ctx, c, row<D>(r));
  ctx.send(c, req::get(D, ctx.key("binv")), "GET /binv");
  ctx.expectBytes(c, le64(3) + std::string("\x00\x01\xff", 3), "GET /binv");
  return {"ok", ""};
}

template <Dialect D>
Observed emptyValue(Ctx& ctx) {
  Conn c = ctx.connect(D);
  for (int r : {4, 5}) step<D>(ctx, c, row<D>(r));
  return {"ok", ""};
}

template <Dialect D>
Observed add(Ctx& ctx) {
  Conn c = ctx.connect(D);
  for (int r : {7, 8, 9, 10}) step<D>(ctx, c, row<D>(r));
  return {"ok", ""};
}

template <Dialect D>
Observed compareSet(Ctx& ctx) {
  Conn c = ctx.connect(D);
  for (int r : {11, 12, 13, 14}) step<D>(ctx, c, row<D>(r));
  return {"ok", ""};
}

template <Dialect D>
Observed numKeys(Ctx& ctx) {
  Conn c = ctx.connect(D);
  const Vector& v = replyVector(D, row<D>(15));
  if (req::numKeys(D) != v.request) fail("tool error: GETNUMKEYS encoding");
  ctx.send(c, v.request, v.op);
  std::string reply = ctx.readExact(c, 8, v.op);  // the count is server state
  if (static_cast<unsigned char>(reply[7]) >= 0x80) {
    fail("GETNUMKEYS replied a negative count: " + hex(reply));
  }
  return {"ok", ""};
}

template <Dialect D>
Observed deleteKey(Ctx& ctx) {
  Conn c = ctx.connect(D);
  for (int r : {1, 16, 17}) step<D>(ctx, c, row<D>(r));
  return {"ok", ""};
}

template <Dialect D>
Observed wait(Ctx& ctx) {
  Conn c = ctx.connect(D);
  for (int r : {7, 11, 18, 19}) step<D>(ctx, c, row<D>(r));
  return {"ok", ""};
}

template <Dialect D>
Observed check(Ctx& ctx) {
  Conn c = ctx.connect(D);
  step<D>(ctx, c, row<D>(20));
  ctx.send(c, req::set(D, ctx.key("ck1"), "x"), "SET /ck1");
  for (int r : {21, 22}) step<D>(ctx, c, row<D>(r));
  return {"ok", ""};
}

template <Dialect D>
Observed initKey(Ctx& ctx) {
  Conn c = ctx.connect(D);
  for (int r : {23, 24}) step<D>(ctx, c, row<D>(r));
  return {"ok", ""};
}

// 1.13 watch: the notification carries the key, so the expected bytes are
// the captured ones with the key re-prefixed.
Observed watch(Ctx& ctx) {
  Conn cb = ctx.connect(V1);
  Conn c = ctx.connect(V1);
  step<V1>(ctx, cb, 25);
  std::string k = ctx.key("wk");
  auto expect = [&](int n) {
    const Vector& v = replyVector(V1, n);
    std::string want =
        v.reply.substr(0, 1) + le64(k.size()) + k + v.reply.substr(1 + 8 + 3);
    ctx.expectBytes(cb, want, v.op);
  };
  ctx.send(c, req::set(V1, k, "a"), "SET /wk a");
  expect(26);
  ctx.send(c, req::set(V1, k, "bb"), "SET /wk bb");
  expect(27);
  ctx.send(c, req::set(V1, k, "ccc"), "SET /wk ccc");
  ctx.readExact(cb, 1 + 8 + k.size() + 8 + 2 + 8 + 3, "KEY_UPDATED bb->ccc");
  ctx.call(c, req::del(V1, k), ReplyShape::kInt64, "DELETE_KEY /wk");
  expect(28);
  return {"ok", ""};
}

Observed handshake(Ctx& ctx) {
  Conn c = ctx.connectRaw();
  const Vector& validate = replyVector(V2, 1);
  const Vector& ping = replyVector(V2, 2);
  if (req::validate() != validate.request || req::ping(4242) != ping.request) {
    fail("tool error: handshake encoding differs from the vectors");
  }
  ctx.send(c, validate.request, validate.op);
  ctx.send(c, ping.request, ping.op);
  ctx.expectBytes(c, ping.reply, ping.op);
  ctx.send(c, req::ping(7), "second PING 7");
  ctx.expectBytes(c, std::string("\x07\x00\x00\x00", 4), "second PING 7");
  return {"ok", ""};
}

// VALIDATE alone, without PING, is a complete handshake (§3.1).
Observed validateOnly(Ctx& ctx) {
  Conn c = ctx.connectRaw();
  ctx.send(c, replyVector(V2, 1).request, "VALIDATE");
  ctx.fence(c, V2);
  return {"ok", ""};
}

Observed append(Ctx& ctx) {
  Conn c = ctx.connect(V2);
  step<V2>(ctx, c, 27);
  ctx.send(c, req::get(V2, ctx.key("ap")), "GET /ap");
  ctx.expectBytes(c, le64(2) + "xy", "GET /ap");
  return {"ok", ""};
}

Observed multi(Ctx& ctx) {
  Conn c = ctx.connect(V2);
  for (int r : {28, 29}) step<V2>(ctx, c, r);
  return {"ok", ""};
}

Observed cancelWait(Ctx& ctx) {
  Conn c = ctx.connect(V2);
  ctx.send(c, req::wait(V2, {ctx.key("late")}), "WAIT [/late]");
  ctx.expectQuiet(c, "pending WAIT [/late]");
  step<V2>(ctx, c, 30);
  return {"ok", ""};
}

// One port, both dialects: a 1.13 connection and a 2.x connection share keys.
Observed dialectDetect(Ctx& ctx) {
  Conn old = ctx.connect(V1);
  Conn cur = ctx.connect(V2);
  ctx.send(old, req::set(V1, ctx.key("x113"), "from-1.13"), "1.13 SET");
  ctx.fence(old, V1);
  ctx.send(cur, req::get(V2, ctx.key("x113")), "2.x GET");
  ctx.expectBytes(cur, le64(9) + "from-1.13", "2.x GET of the 1.13 key");
  ctx.send(cur, req::set(V2, ctx.key("x2"), "from-2.x"), "2.x SET");
  ctx.fence(cur, V2);
  ctx.send(old, req::get(V1, ctx.key("x2")), "1.13 GET");
  ctx.expectBytes(old, le64(8) + "from-2.x", "1.13 GET of the 2.x key");
  return {"ok", ""};
}

// ---- inputs after which torch's servers close the connection -------------

// Setup (a SET in the vector's dialect) before the closing request.
struct Setup {
  const char* key;
  const char* value;
};

template <Dialect D>
Observed closes(Ctx& ctx, int n, Setup setup = {nullptr, nullptr}) {
  const Vector& v = closeVector(D, n);
  if (setup.key) {
    Conn s = ctx.connect(D);
    ctx.send(s, req::set(D, ctx.key(setup.key), setup.value), "setup SET");
    ctx.fence(s, D);
  }
  Conn c = D == V2 && v.after_handshake ? ctx.connect(V2) : ctx.connectRaw();
  ctx.send(c, rekey(D, v.request, ctx.prefix()), v.op);
  std::string extra;
  Observed o;
  if (c.closesSilently(ctx.timing().window, &extra)) {
    o = {"ok", "closed, no reply"};
  } else if (!extra.empty()) {
    o = {"replied", "replied " + hex(extra)};
  } else {
    o = {"stays-open", "no reply, connection kept open (request incomplete)"};
  }
  c.close();
  ctx.expectAlive(v.op);
  if (setup.key && o.behaviour == "ok") {  // the value is unchanged
    Conn r = ctx.connect(D);
    std::string val = setup.value;
    ctx.send(r, req::get(D, ctx.key(setup.key)), "GET after the close");
    ctx.expectBytes(r, le64(val.size()) + val, "value unchanged");
  }
  return o;
}

#define CLOSES(D, N, ...) \
  [](Ctx& ctx) { return closes<D>(ctx, N __VA_OPT__(, ) __VA_ARGS__); }

}  // namespace

std::vector<Check> wireChecks() {
  using G = Group;
  using S = Speaks;
  const G W = G::kWire;
  // clang-format off
  constexpr Expect kV1Close = {"ok", nullptr, nullptr, "ok"};
  constexpr Expect kV2Close = {nullptr, "ok", "ok", "ok"};
  constexpr Expect kV2CloseOurs113 = {nullptr, "ok", "ok", "stays-open"};
  return {
    TCPSTORE_CONFORM_CHECK(kFile, "wire.v1.set_get", "1.13 SET, WAIT, GET, binary value", "§9.1 #1-3,6", W, S::kV113, kV113Ok, setGet<V1>),
    TCPSTORE_CONFORM_CHECK(kFile, "wire.v1.empty_value", "1.13 SET and GET of an empty value", "§9.1 #4-5", W, S::kV113, kV113Ok, emptyValue<V1>),
    TCPSTORE_CONFORM_CHECK(kFile, "wire.v1.add", "1.13 ADD new, negative, zero; value is decimal text", "§9.1 #7-10", W, S::kV113, kV113Ok, add<V1>),
    TCPSTORE_CONFORM_CHECK(kFile, "wire.v1.compare_set", "1.13 COMPARE_SET, four cases", "§9.1 #11-14", W, S::kV113, kV113Ok, compareSet<V1>),
    TCPSTORE_CONFORM_CHECK(kFile, "wire.v1.num_keys", "1.13 GETNUMKEYS request and reply shape", "§9.1 #15", W, S::kV113, kV113Ok, numKeys<V1>),
    TCPSTORE_CONFORM_CHECK(kFile, "wire.v1.delete", "1.13 DELETE_KEY present and missing", "§9.1 #16-17", W, S::kV113, kV113Ok, deleteKey<V1>),
    TCPSTORE_CONFORM_CHECK(kFile, "wire.v1.wait", "1.13 WAIT on present keys and on no keys", "§9.1 #18-19", W, S::kV113, kV113Ok, wait<V1>),
    TCPSTORE_CONFORM_CHECK(kFile, "wire.v1.check", "1.13 CHECK missing, present, partial", "§9.1 #20-22", W, S::kV113, kV113Ok, check<V1>),
    TCPSTORE_CONFORM_CHECK(kFile, "wire.v1.init_key", "1.13 ADD of the raw init/ key", "§9.1 #23-24", W, S::kV113, kV113Ok, initKey<V1>),
    TCPSTORE_CONFORM_CHECK(kFile, "wire.v1.watch", "1.13 WATCH_KEY and its notifications", "§3.11, §9.1 #25-28", W, S::kV113, kV113Ok, watch),
    TCPSTORE_CONFORM_CHECK(kFile, "wire.v1.close.unknown_09", "1.13 unknown command 0x09 closes", "§7, §9.1 C1", W, S::kV113, kV1Close, CLOSES(V1, 1)),
    TCPSTORE_CONFORM_CHECK(kFile, "wire.v1.close.unknown_ff", "1.13 unknown command 0xff closes", "§7, §9.1 C2", W, S::kV113, kV1Close, CLOSES(V1, 2)),
    TCPSTORE_CONFORM_CHECK(kFile, "wire.v1.close.get_missing", "1.13 raw GET of a missing key closes", "§3.4, §9.1 C3", W, S::kV113, kV1Close, CLOSES(V1, 3)),
    TCPSTORE_CONFORM_CHECK(kFile, "wire.v1.close.add_nonnumeric", "1.13 ADD on a non-numeric value closes, value kept", "§3.5, §9.1 C4", W, S::kV113, kV1Close, CLOSES(V1, 4, Setup{"nn", "abc"})),
    TCPSTORE_CONFORM_CHECK(kFile, "wire.v1.close.key_2e62", "1.13 SET with key length 2^62 closes", "§7, §9.1 C5", W, S::kV113, kV1Close, CLOSES(V1, 5)),
    TCPSTORE_CONFORM_CHECK(kFile, "wire.v1.close.v2_handshake", "2.x handshake on a 1.13-only server", "§8.4, §9.1 C6", W, S::kV113, (Expect{"ok", nullptr, nullptr, "replied"}), CLOSES(V1, 6)),
    TCPSTORE_CONFORM_CHECK(kFile, "wire.v2.handshake", "2.x VALIDATE + PING, echo of any nonce", "§3.1, §3.2, §9.1 #1-2", W, S::kV2, kV2Ok, handshake),
    TCPSTORE_CONFORM_CHECK(kFile, "wire.v2.validate_only", "2.x VALIDATE without PING is a complete handshake", "§3.1, §8.1", W, S::kV2, kV2Ok, validateOnly),
    TCPSTORE_CONFORM_CHECK(kFile, "wire.v2.set_get", "2.x SET, WAIT, GET, binary value", "§9.1 #3-5,8", W, S::kV2, kV2Ok, setGet<V2>),
    TCPSTORE_CONFORM_CHECK(kFile, "wire.v2.empty_value", "2.x SET and GET of an empty value", "§9.1 #6-7", W, S::kV2, kV2Ok, emptyValue<V2>),
    TCPSTORE_CONFORM_CHECK(kFile, "wire.v2.add", "2.x ADD new, negative, zero; value is decimal text", "§9.1 #9-12", W, S::kV2, kV2Ok, add<V2>),
    TCPSTORE_CONFORM_CHECK(kFile, "wire.v2.compare_set", "2.x COMPARE_SET, four cases", "§9.1 #13-16", W, S::kV2, kV2Ok, compareSet<V2>),
    TCPSTORE_CONFORM_CHECK(kFile, "wire.v2.num_keys", "2.x GETNUMKEYS request and reply shape", "§9.1 #17", W, S::kV2, kV2Ok, numKeys<V2>),
    TCPSTORE_CONFORM_CHECK(kFile, "wire.v2.delete", "2.x DELETE_KEY present and missing", "§9.1 #18-19", W, S::kV2, kV2Ok, deleteKey<V2>),
    TCPSTORE_CONFORM_CHECK(kFile, "wire.v2.wait", "2.x WAIT on present keys and on no keys", "§9.1 #20-21", W, S::kV2, kV2Ok, wait<V2>),
    TCPSTORE_CONFORM_CHECK(kFile, "wire.v2.check", "2.x CHECK missing, present, partial", "§9.1 #22-24", W, S::kV2, kV2Ok, check<V2>),
    TCPSTORE_CONFORM_CHECK(kFile, "wire.v2.init_key", "2.x ADD of the raw init/ key", "§9.1 #25-26", W, S::kV2, kV2Ok, initKey<V2>),
    TCPSTORE_CONFORM_CHECK(kFile, "wire.v2.append", "2.x APPEND creates the key, no reply", "§3.12, §9.1 #27", W, S::kV2, kV2Ok, append),
    TCPSTORE_CONFORM_CHECK(kFile, "wire.v2.multi_set_get", "2.x MULTI_SET then MULTI_GET", "§3.13-14, §9.1 #28-29", W, S::kV2, kV2Ok, multi),
    TCPSTORE_CONFORM_CHECK(kFile, "wire.v2.cancel_wait", "2.x CANCEL_WAIT of a pending WAIT", "§3.15, §9.1 #30", W, S::kV2, kV2Ok, cancelWait),
    TCPSTORE_CONFORM_CHECK(kFile, "wire.v2.close.first_not_validate_set", "2.x first request SET (no VALIDATE)", "§3.1, §9.1 C1", W, S::kV2, kV2CloseOurs113, CLOSES(V2, 1)),
    TCPSTORE_CONFORM_CHECK(kFile, "wire.v2.close.first_not_validate_num_keys", "2.x first request GETNUMKEYS (no VALIDATE)", "§3.1, §9.1 C2", W, S::kV2, kV2CloseOurs113, CLOSES(V2, 2)),
    TCPSTORE_CONFORM_CHECK(kFile, "wire.v2.close.ping_first", "2.x PING before VALIDATE closes", "§3.1, §9.1 C3", W, S::kV2, kV2Close, CLOSES(V2, 3)),
    TCPSTORE_CONFORM_CHECK(kFile, "wire.v2.close.bad_magic", "2.x VALIDATE with a wrong magic", "§3.1, §9.1 C4", W, S::kV2, kV2CloseOurs113, CLOSES(V2, 4)),
    TCPSTORE_CONFORM_CHECK(kFile, "wire.v2.close.second_validate", "2.x second VALIDATE closes", "§3.1, §9.1 C5", W, S::kV2, kV2Close, CLOSES(V2, 5)),
    TCPSTORE_CONFORM_CHECK(kFile, "wire.v2.close.unknown_13", "2.x unknown command 0x13 closes", "§7, §9.1 C9", W, S::kV2, kV2Close, CLOSES(V2, 9)),
    TCPSTORE_CONFORM_CHECK(kFile, "wire.v2.close.unknown_ff", "2.x unknown command 0xff closes", "§7, §9.1 C10", W, S::kV2, kV2Close, CLOSES(V2, 10)),
    TCPSTORE_CONFORM_CHECK(kFile, "wire.v2.close.get_missing", "2.x raw GET of a missing key closes", "§3.4, §9.1 C11", W, S::kV2, kV2Close, CLOSES(V2, 11)),
    TCPSTORE_CONFORM_CHECK(kFile, "wire.v2.close.add_nonnumeric", "2.x ADD on a non-numeric value closes, value kept", "§3.5, §9.1 C12", W, S::kV2, kV2Close, CLOSES(V2, 12, Setup{"nn", "abc"})),
    TCPSTORE_CONFORM_CHECK(kFile, "wire.v2.close.add_empty", "2.x ADD on an empty value closes", "§3.5, §9.1 C13", W, S::kV2, kV2Close, CLOSES(V2, 13, Setup{"ev", ""})),
    TCPSTORE_CONFORM_CHECK(kFile, "wire.v2.close.add_out_of_range", "2.x ADD on 10^20 closes", "§3.5, §9.1 C14", W, S::kV2, kV2Close, CLOSES(V2, 14, Setup{"big", "100000000000000000000"})),
    TCPSTORE_CONFORM_CHECK(kFile, "wire.v2.close.key_2e62", "2.x SET with key length 2^62 closes", "§7, §9.1 C15", W, S::kV2, kV2Close, CLOSES(V2, 15)),
    TCPSTORE_CONFORM_CHECK(kFile, "wire.v2.close.wait_count_2e62", "2.x WAIT with key count 2^62 closes", "§7, §9.1 C16", W, S::kV2, kV2Close, CLOSES(V2, 16)),
    TCPSTORE_CONFORM_CHECK(kFile, "wire.v2.close.multi_get_missing_middle", "2.x MULTI_GET with a missing key in the middle", "§3.13, §9.1 C17", W, S::kV2, kV2Close, CLOSES(V2, 17, Setup{"mg1", "a"})),
    TCPSTORE_CONFORM_CHECK(kFile, "wire.v2.close.barrier_nonnumeric", "2.x BARRIER on a non-numeric value closes", "§3.18, §9.1 C18", W, S::kV2, k214Ok, CLOSES(V2, 18, Setup{"bn", "x"})),
    TCPSTORE_CONFORM_CHECK(kFile, "wire.dialect.detect", "both dialects on one port share one key space", "§8.1", W, S::kBoth, kOursOk, dialectDetect),
  };
  // clang-format on
}

}  // namespace tcpstore::conform
