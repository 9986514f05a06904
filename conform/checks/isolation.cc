// isolation: one connection's bad behaviour costs nobody else anything
// (docs/protocol.md §7): a partial message delays no other client, garbage
// closes only its own connection, and length limits are enforced as soon as
// the length arrives, before anything is allocated for it.
//
// torch's servers block on a partial message (§7: "the whole server
// stalls") and have no limits, so these checks are not required by the torch
// profiles; the stall they cause is ended by closing the stalling connection.
#include <fmt/format.h>

#include <thread>

#include "conform/check.h"
#include "conform/ctx.h"

namespace tcpstore::conform {
namespace {

constexpr const char* kFile = "conform/checks/isolation.cc";

// `partial` is sent on its own connection (after the 2.x handshake if
// `handshake`); another connection, opened before, must still be served.
Observed otherServed(Ctx& ctx, const std::string& partial, bool handshake) {
  Dialect d = ctx.main();
  Conn other = ctx.connect(d);
  Conn bad = handshake ? ctx.connect(d) : ctx.connectRaw();
  ctx.send(bad, partial, "partial message");
  // Let the server start on the partial message before the other request
  // arrives (a blocking server that polls both at once may serve the lower
  // descriptor first and only then block).
  std::this_thread::sleep_for(ctx.timing().window);
  ctx.send(other, req::numKeys(d), "GETNUMKEYS on another connection");
  if (other.fill(8, Clock::now() + ctx.timing().op) == RecvStatus::kData) {
    other.take(8);
    if (!bad.quiet(ctx.timing().window)) {
      fail("the partial message got an answer or a close: " +
           hex(bad.buffer()));
    }
    return {"ok", ""};
  }
  bad.close();  // ends the stall of a blocking server
  ctx.read(other, ReplyShape::kInt64,
           "GETNUMKEYS after the partial sender left");
  return {"stalls",
          fmt::format("no answer for {} ms while another connection "
                      "held a partial message; answered once it closed",
                      ctx.timing().op.count())};
}

Observed partialRequest(Ctx& ctx) {
  Dialect d = ctx.main();
  std::string set = req::set(d, ctx.key("0123456789abcdef"), "v");
  return otherServed(ctx, set.substr(0, 1 + 8 + 3), true);
}

Observed partialCommandByte(Ctx& ctx) {
  return otherServed(ctx, req::set(ctx.main(), "k", "v").substr(0, 1), true);
}

Observed partialHandshake(Ctx& ctx) {
  return otherServed(ctx, req::validate().substr(0, 3), false);
}

// Garbage on one connection closes it; a pending WAIT elsewhere survives.
Observed garbage(Ctx& ctx) {
  Dialect d = ctx.main();
  std::string k = ctx.key("k");
  Conn waiter = ctx.connect(d);
  ctx.send(waiter, req::wait(d, {k}), "WAIT [k]");
  Conn bad = ctx.connect(d);
  ctx.send(bad, std::string("\xff\xfe\xfd garbage", 11), "garbage");
  if (!bad.closesSilently(ctx.timing().op)) {
    fail("garbage was not answered by a close: " + hex(bad.buffer()));
  }
  ctx.expectQuiet(waiter, "the other connection's WAIT");
  Conn writer = ctx.connect(d);
  ctx.send(writer, req::set(d, k, "v"), "SET k");
  ctx.expectBytes(waiter, std::string("\x00", 1), "the WAIT still completes");
  return {"ok", ""};
}

// A length over the limit closes at once, without the bytes it announces.
Observed limit(Ctx& ctx, const std::string& header, const char* what) {
  Conn c = ctx.connect(ctx.main());
  ctx.send(c, header, what);
  std::string extra;
  if (c.closesSilently(ctx.timing().op, &extra)) {
    c.close();
    ctx.expectAlive(what);
    return {"ok", "closed as soon as the length arrived"};
  }
  if (!extra.empty()) fail(fmt::format("{}: replied {}", what, hex(extra)));
  c.close();
  ctx.expectAlive(what);
  return {"reads-on", "kept reading: the announced bytes would be accepted"};
}

Observed keyLimit(Ctx& ctx) {
  Dialect d = ctx.main();
  std::string set = req::set(d, "k", "v");  // command byte, then u64 key length
  return limit(ctx, set.substr(0, 1) + le64(64 * 1024) + "abc",
               "SET with a 64 KiB key length (limit 8 KiB)");
}

Observed valueLimit(Ctx& ctx) {
  Dialect d = ctx.main();
  std::string set = req::set(d, "k", "");  // ends with the u64 value length
  return limit(ctx, set.substr(0, set.size() - 8) + le64(16 << 20) + "abc",
               "SET with a 16 MiB value length (limit 8 MiB)");
}

Observed keyCountLimit(Ctx& ctx) {
  Dialect d = ctx.main();
  std::string wait = req::wait(d, {});  // command byte, u64 count 0
  return limit(ctx, wait.substr(0, 1) + le64(200000) + le64(2) + "/x",
               "WAIT with 200000 keys (limit 131072)");
}

}  // namespace

std::vector<Check> isolationChecks() {
  const Group G = Group::kIsolation;
  using S = Speaks;
  // clang-format off
  return {
    TCPSTORE_CONFORM_CHECK(kFile, "iso.partial.request", "a request cut mid-key delays no other client", "§7 truncated request", G, S::kMain, kOursOk, partialRequest),
    TCPSTORE_CONFORM_CHECK(kFile, "iso.partial.command_byte", "a bare command byte delays no other client", "§7 truncated request", G, S::kMain, kOursOk, partialCommandByte),
    TCPSTORE_CONFORM_CHECK(kFile, "iso.partial.handshake", "3 of VALIDATE's 5 bytes delay no other client", "§3.1, §8.1", G, S::kV2, kOursOk, partialHandshake),
    TCPSTORE_CONFORM_CHECK(kFile, "iso.garbage", "garbage closes only its own connection", "§7", G, S::kMain, kAllOk, garbage),
    TCPSTORE_CONFORM_CHECK(kFile, "iso.limit.key", "a key length over 8 KiB closes before the key is read", "§7 limits", G, S::kMain, kOursOk, keyLimit),
    TCPSTORE_CONFORM_CHECK(kFile, "iso.limit.value", "a value length over 8 MiB closes before the value is read", "§7 limits", G, S::kMain, kOursOk, valueLimit),
    TCPSTORE_CONFORM_CHECK(kFile, "iso.limit.key_count", "a key count over 128 Ki closes before the keys are read", "§7 limits", G, S::kMain, kOursOk, keyCountLimit),
  };
  // clang-format on
}

}  // namespace tcpstore::conform
