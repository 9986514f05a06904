// Unit tests of the store state machine: every command's reply bytes, waits,
// cancellation, disconnects, barriers, queues and 1.13 watches. No sockets.
#include "store/keyspace.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "protocol/wire.h"
#include "test_util.h"

namespace tcpstore::store::testing {
namespace {

using protocol::WatchEvent;

constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
constexpr std::int64_t kMin = std::numeric_limits<std::int64_t>::min();

TEST_CASE("PING echoes the nonce, VALIDATE answers nothing") {
  Harness h;
  Request p = req(Command::kPing);
  p.u32 = 4242;
  CHECK(h.run(1, p) == expect({{1, u32(4242)}}));
  Request v = req(Command::kValidate);
  v.u32 = protocol::kValidateMagic;
  CHECK(h.run(1, v).empty());
  CHECK(h.ks.numKeys() == 0);
}

TEST_CASE("SET then GET, overwrite, empty and binary values") {
  Harness h;
  CHECK(h.run(1, set("/k", "v1")).empty());  // SET has no reply
  CHECK(h.run(1, get("/k")) == expect({{1, str("v1")}}));
  CHECK(h.run(2, set("/k", "longer value than fifteen bytes")).empty());
  CHECK(h.run(1, get("/k")) ==
        expect({{1, str("longer value than fifteen bytes")}}));
  CHECK(h.run(1, set("/k", "")).empty());
  CHECK(h.run(1, get("/k")) ==
        expect({{1, i64(0)}}));  // empty value: 8 zero bytes
  const std::string bin("\x00\x01\xff", 3);
  CHECK(h.run(1, set("/bin", bin)).empty());
  CHECK(h.run(1, get("/bin")) == expect({{1, str(bin)}}));
  CHECK(h.ks.numKeys() == 2);
  const std::string key_with_nul("a\0b", 3);
  CHECK(h.run(1, set(key_with_nul, "x")).empty());
  CHECK(h.value(key_with_nul) == "x");
  CHECK(h.ks.find("a") == nullptr);
}

TEST_CASE("GET of a missing key is an error that emits nothing") {
  Harness h;
  REQUIRE(h.run(1, set("/a", "1")).empty());
  Status s = h.apply(1, get("/nope"));
  CHECK_FALSE(s.isOk());
  CHECK(s.code() == StatusCode::kProtocolError);
  CHECK(s.message().find("/nope") != std::string::npos);
  CHECK(h.fx.sends().empty());
  CHECK(h.ks.numKeys() == 1);

  Harness lib(KeyspaceOptions{.compare_set_wakes = true,
                              .get_missing_returns_empty = true});
  CHECK(lib.run(1, get("/nope")) == expect({{1, str("")}}));
  CHECK(lib.ks.numKeys() == 0);  // answering does not create the key
}

TEST_CASE("ADD on missing and existing keys stores decimal text") {
  Harness h;
  CHECK(h.run(1, add("/cnt", 5)) == expect({{1, i64(5)}}));
  CHECK(h.value("/cnt") == "5");
  CHECK(h.run(1, add("/cnt", -2)) == expect({{1, i64(3)}}));
  CHECK(h.value("/cnt") == "3");
  CHECK(h.run(1, add("/cnt", 0)) == expect({{1, i64(3)}}));
  CHECK(h.run(1, add("/neg", -7)) == expect({{1, i64(-7)}}));
  CHECK(h.value("/neg") == "-7");
  CHECK(h.run(1, get("/cnt")) == expect({{1, str("3")}}));
}

TEST_CASE("ADD parses stored values like std::stoll (docs/protocol.md 3.5)") {
  struct Row {
    const char* stored;
    std::int64_t delta;
    bool ok;
    std::int64_t result;
  };
  const Row rows[] = {
      {"abc", 1, false, 0},
      {"", 1, false, 0},
      {"12abc", 1, true, 13},
      {"  7", 1, true, 8},
      {"9223372036854775807", 1, true, kMin},
      {"100000000000000000000", 1, false, 0},
      {"-9223372036854775808", 0, true, kMin},
      {"-9223372036854775808", -1, true, kMax},
      {"-9223372036854775809", 1, false, 0},
      {"9223372036854775808", 0, false, 0},
      {"+3", 1, true, 4},
      {"-5", 1, true, -4},
      {"\t\n\v\f\r 4", 1, true, 5},
      {"-", 1, false, 0},
      {"+", 1, false, 0},
      {"   ", 1, false, 0},
      {"+-5", 1, false, 0},
      {"0x10", 1, true, 1},
      {"007", 1, true, 8},
      {"5 6", 1, true, 6},
      {"-0", 0, true, 0},
      {"x5", 1, false, 0},
  };
  for (const Row& row : rows) {
    CAPTURE(row.stored);
    Harness h;
    REQUIRE(h.run(1, set("/nn", row.stored)).empty());
    Status s = h.apply(1, add("/nn", row.delta));
    CHECK(s.isOk() == row.ok);
    if (row.ok) {
      CHECK(render(h.fx) == expect({{1, i64(row.result)}}));
      CHECK(h.value("/nn") == std::to_string(row.result));
    } else {
      CHECK(s.code() == StatusCode::kProtocolError);
      CHECK(h.fx.sends().empty());
      CHECK(h.value("/nn") == row.stored);  // unchanged
    }
  }
  // A stored NUL ends the number like the C string stoll sees.
  Harness h;
  REQUIRE(h.run(1, set("/z", std::string("12\0"
                                         "9",
                                         4)))
              .empty());
  CHECK(h.run(1, add("/z", 1)) == expect({{1, i64(13)}}));
}

TEST_CASE("ADD wraps like two's complement without UB") {
  Harness h;
  CHECK(h.run(1, add("/w", kMax)) == expect({{1, i64(kMax)}}));
  CHECK(h.run(1, add("/w", 1)) == expect({{1, i64(kMin)}}));
  CHECK(h.value("/w") == "-9223372036854775808");
  CHECK(h.run(1, add("/w", -1)) == expect({{1, i64(kMax)}}));
  CHECK(h.run(1, add("/w", kMin)) == expect({{1, i64(-1)}}));
}

TEST_CASE("an ADD error leaves waiters and state alone") {
  Harness h;
  REQUIRE(h.run(1, set("/nn", "abc")).empty());
  REQUIRE(h.run(2, waitKeys({"/other"})).empty());
  CHECK_FALSE(h.apply(1, add("/nn", 1)).isOk());
  CHECK(h.fx.sends().empty());
  CHECK(h.value("/nn") == "abc");
  CHECK(h.ks.numKeys() == 1);
  CHECK(h.ks.numPendingWaits() == 1);
  // The error did not make /nn's watchers or waiters fire either.
  REQUIRE(h.run(3, waitKeys({"/x"})).empty());
  REQUIRE(h.run(4, watch("/nn")) == expect({{4, u8(3)}}));
  CHECK_FALSE(h.apply(1, add("/nn", 1)).isOk());
  CHECK(h.fx.sends().empty());
}

TEST_CASE("COMPARE_SET: the four cases") {
  Harness h;
  // missing, expected empty: store desired, reply desired
  CHECK(h.run(1, cas("/c", "", "d1")) == expect({{1, str("d1")}}));
  CHECK(h.value("/c") == "d1");
  // missing, expected non-empty: store nothing, reply expected
  CHECK(h.run(1, cas("/m", "exp", "des")) == expect({{1, str("exp")}}));
  CHECK(h.ks.find("/m") == nullptr);
  // present, current == expected: store desired, reply desired
  CHECK(h.run(1, cas("/c", "d1", "d2")) == expect({{1, str("d2")}}));
  CHECK(h.value("/c") == "d2");
  // present, mismatch: reply current
  CHECK(h.run(1, cas("/c", "zz", "d3")) == expect({{1, str("d2")}}));
  CHECK(h.value("/c") == "d2");
  // present with empty value matches expected ''
  REQUIRE(h.run(1, set("/e", "")).empty());
  CHECK(h.run(1, cas("/e", "", "filled")) == expect({{1, str("filled")}}));
  CHECK(h.ks.numKeys() == 2);
}

TEST_CASE("COMPARE_SET wakes waiters when it stores (option)") {
  Harness h;
  REQUIRE(h.run(2, waitKeys({"/c"})).empty());
  // a mismatch stores nothing and wakes nobody
  CHECK(h.run(1, cas("/c", "x", "y")) == expect({{1, str("x")}}));
  CHECK(h.ks.numWaitingConnections() == 1);
  CHECK(h.run(1, cas("/c", "", "y")) == expect({{1, str("y")}, {2, u8(0)}}));
  CHECK(h.ks.numWaitingConnections() == 0);

  Harness classic(KeyspaceOptions{.compare_set_wakes = false});
  REQUIRE(classic.run(2, waitKeys({"/c"})).empty());
  CHECK(classic.run(1, cas("/c", "", "y")) == expect({{1, str("y")}}));
  CHECK(classic.ks.numWaitingConnections() == 1);
  // not even a second store wakes; the next SET does
  CHECK(classic.run(1, cas("/c", "y", "z")) == expect({{1, str("z")}}));
  CHECK(classic.run(1, set("/c", "w")) == expect({{2, u8(0)}}));
}

TEST_CASE("CHECK") {
  Harness h;
  CHECK(h.run(1, check({})) == expect({{1, u8(0)}}));
  CHECK(h.run(1, check({"/a"})) == expect({{1, u8(1)}}));
  REQUIRE(h.run(1, set("/a", "1")).empty());
  CHECK(h.run(1, check({"/a"})) == expect({{1, u8(0)}}));
  CHECK(h.run(1, check({"/a", "/b"})) == expect({{1, u8(1)}}));
  REQUIRE(h.run(1, push("/b", "item")).empty());  // a non-empty queue counts
  CHECK(h.run(1, check({"/a", "/b"})) == expect({{1, u8(0)}}));
  REQUIRE(h.run(1, pop("/b")) == expect({{1, i64(1) + str("item")}}));
  CHECK(h.run(1, check({"/a", "/b"})) == expect({{1, u8(1)}}));
  CHECK(h.ks.numWaitingConnections() == 0);  // CHECK never registers
}

TEST_CASE("WAIT on present, missing and zero keys") {
  Harness h;
  CHECK(h.run(1, waitKeys({})) == expect({{1, u8(0)}}));
  REQUIRE(h.run(1, set("/p", "1")).empty());
  CHECK(h.run(1, waitKeys({"/p"})) == expect({{1, u8(0)}}));
  CHECK(h.run(1, waitKeys({"/p", "/p"})) == expect({{1, u8(0)}}));
  CHECK(h.ks.numWaitingConnections() == 0);
  CHECK(h.run(1, waitKeys({"/m"})).empty());
  CHECK(h.ks.numWaitingConnections() == 1);
  CHECK(h.run(2, set("/m", "v")) == expect({{1, u8(0)}}));
  CHECK(h.ks.numWaitingConnections() == 0);
  CHECK(h.ks.numPendingWaits() == 0);
  // the key's list was cleared: a second write sends nothing
  CHECK(h.run(2, set("/m", "v2")).empty());
}

TEST_CASE("WAIT on a duplicated missing key is released by one SET") {
  Harness h;
  CHECK(h.run(1, waitKeys({"/k", "/k"})).empty());
  CHECK(h.run(2, set("/k", "v")) == expect({{1, u8(0)}}));
  CHECK(h.ks.numPendingWaits() == 0);
  // present + missing duplicate mix
  CHECK(h.run(1, waitKeys({"/k", "/j", "/k", "/j"})).empty());
  CHECK(h.run(2, add("/j", 1)) == expect({{2, i64(1)}, {1, u8(0)}}));
}

TEST_CASE("two waiters are woken by one write, in registration order") {
  Harness h;
  REQUIRE(h.run(3, waitKeys({"/k"})).empty());
  REQUIRE(h.run(1, waitKeys({"/k"})).empty());
  CHECK(h.ks.numWaitingConnections() == 2);
  CHECK(h.run(2, add("/k", 1)) ==
        expect({{2, i64(1)}, {3, u8(0)}, {1, u8(0)}}));
  CHECK(h.ks.numWaitingConnections() == 0);
}

TEST_CASE("a multi-key wait is released only when all keys were written") {
  Harness h;
  REQUIRE(h.run(1, set("/a", "present")).empty());
  REQUIRE(h.run(1, waitKeys({"/a", "/b", "/c"})).empty());
  CHECK(h.run(2, set("/b", "1")).empty());
  CHECK(h.run(2, set("/b", "2"))
            .empty());  // the same key again does not count twice
  CHECK(h.ks.numWaitingConnections() == 1);
  CHECK(h.run(2, set("/a", "again")).empty());  // /a was present: not awaited
  CHECK(h.run(2, append("/c", "x")) == expect({{1, u8(0)}}));
  CHECK(h.ks.numWaitingConnections() == 0);
}

TEST_CASE("DELETE_KEY after registration does not release, a later SET does") {
  Harness h;
  REQUIRE(h.run(1, set("/k", "v")).empty());
  REQUIRE(h.run(1, del("/k")) == expect({{1, i64(1)}}));
  REQUIRE(h.run(2, waitKeys({"/k"})).empty());
  REQUIRE(h.run(1, set("/k", "v")) == expect({{2, u8(0)}}));
  // registered while missing, then the key is created and deleted by
  // non-waking means: still waiting
  Harness classic(KeyspaceOptions{.compare_set_wakes = false});
  REQUIRE(classic.run(2, waitKeys({"/k"})).empty());
  REQUIRE(classic.run(1, cas("/k", "", "v")) == expect({{1, str("v")}}));
  CHECK(classic.run(1, del("/k")) == expect({{1, i64(1)}}));
  CHECK(classic.ks.numWaitingConnections() == 1);
  CHECK(classic.run(1, set("/k", "v")) == expect({{2, u8(0)}}));
}

TEST_CASE("a new WAIT replaces the connection's pending wait") {
  // PyTorch keeps one counter per connection, overwritten by each WAIT: a
  // 1.13 client that timed out (telling the server nothing) and waits again
  // gets exactly one STOP_WAITING. Two here would shift every later reply.
  Harness h;
  REQUIRE(h.run(1, waitKeys({"/r"})).empty());
  REQUIRE(h.run(1, waitKeys({"/r"})).empty());
  CHECK(h.ks.numPendingWaits() == 1);
  CHECK(h.run(2, set("/r", "1")) == expect({{1, u8(0)}}));
  CHECK(h.ks.numWaitingConnections() == 0);
  // The abandoned wait's keys no longer count for the new one.
  REQUIRE(h.run(1, waitKeys({"/a", "/b"})).empty());
  REQUIRE(h.run(1, waitKeys({"/c"})).empty());
  CHECK(h.run(2, set("/a", "1")).empty());
  CHECK(h.run(2, set("/b", "1")).empty());
  CHECK(h.run(2, set("/c", "1")) == expect({{1, u8(0)}}));
  CHECK(h.ks.numPendingWaits() == 0);
  // A WAIT answered at once also drops the abandoned one.
  REQUIRE(h.run(1, waitKeys({"/d"})).empty());
  CHECK(h.run(1, waitKeys({"/a"})) == expect({{1, u8(0)}}));
  CHECK(h.run(2, set("/d", "1")).empty());
  // Other connections' waits are untouched.
  REQUIRE(h.run(3, waitKeys({"/e"})).empty());
  REQUIRE(h.run(1, waitKeys({"/e"})).empty());
  REQUIRE(h.run(1, waitKeys({"/e", "/e"})).empty());
  CHECK(h.run(2, set("/e", "1")) == expect({{3, u8(0)}, {1, u8(0)}}));
}

TEST_CASE("a WAIT does not drop the connection's pending BARRIER") {
  Harness h;
  REQUIRE(h.run(1, barrier("/bar", 2)).empty());
  REQUIRE(h.run(1, waitKeys({"/w"})).empty());
  CHECK(h.ks.numPendingWaits() == 2);
  CHECK(h.run(2, barrier("/bar", 2)) == expect({{2, u8(0)}, {1, u8(0)}}));
  CHECK(h.run(2, set("/w", "1")) == expect({{1, u8(0)}}));
}

TEST_CASE("CANCEL_WAIT") {
  Harness h;
  SUBCASE("nothing pending -> 01, twice -> 01 01") {
    CHECK(h.run(1, req(Command::kCancelWait)) == expect({{1, u8(1)}}));
    CHECK(h.run(1, req(Command::kCancelWait)) == expect({{1, u8(1)}}));
    CHECK(h.run(1, set("/a", "1")).empty());  // still usable
  }
  SUBCASE("pending -> 01, later SET sends nothing") {
    REQUIRE(h.run(1, waitKeys({"/k", "/j"})).empty());
    REQUIRE(h.run(1, waitKeys({"/k"})).empty());
    REQUIRE(h.run(2, waitKeys({"/k"})).empty());
    CHECK(h.run(1, req(Command::kCancelWait)) == expect({{1, u8(1)}}));
    CHECK(h.ks.numWaitingConnections() == 1);
    CHECK(h.ks.numPendingWaits() == 1);
    CHECK(h.run(3, set("/k", "v")) == expect({{2, u8(0)}}));
    CHECK(h.run(3, set("/j", "v")).empty());
  }
  SUBCASE("completed -> 00 then 01") {
    REQUIRE(h.run(1, waitKeys({"/k"})).empty());
    CHECK(h.run(2, set("/k", "v")) == expect({{1, u8(0)}}));
    CHECK(h.run(1, req(Command::kCancelWait)) == expect({{1, u8(1)}}));
  }
  SUBCASE("cancel only touches the caller's waits") {
    REQUIRE(h.run(1, waitKeys({"/k"})).empty());
    REQUIRE(h.run(2, waitKeys({"/k"})).empty());
    CHECK(h.run(2, req(Command::kCancelWait)) == expect({{2, u8(1)}}));
    CHECK(h.run(3, set("/k", "v")) == expect({{1, u8(0)}}));
  }
}

TEST_CASE("disconnect forgets waits") {
  Harness h;
  REQUIRE(h.run(1, waitKeys({"/k", "/j"})).empty());
  REQUIRE(h.run(1, waitKeys({"/k"})).empty());
  REQUIRE(h.run(2, waitKeys({"/k"})).empty());
  CHECK(h.ks.numWaitingConnections() == 2);
  h.ks.disconnect(1);
  CHECK(h.ks.numWaitingConnections() == 1);
  CHECK(h.run(3, set("/k", "v")) == expect({{2, u8(0)}}));
  CHECK(h.run(3, set("/j", "v")).empty());
  CHECK(h.ks.numWaitingConnections() == 0);
  CHECK(h.ks.numPendingWaits() == 0);
  h.ks.disconnect(1);  // unknown / repeated: harmless
  h.ks.disconnect(99);
  // a reused connection id starts clean
  CHECK(h.run(1, waitKeys({"/k"})) == expect({{1, u8(0)}}));
}

TEST_CASE("GETNUMKEYS counts every map key, not queues") {
  Harness h;
  CHECK(h.run(1, req(Command::kGetNumKeys)) == expect({{1, i64(0)}}));
  REQUIRE(h.run(1, set("init/", "1")).empty());
  CHECK(h.run(1, req(Command::kGetNumKeys)) == expect({{1, i64(1)}}));
  REQUIRE(h.run(1, set("/a", "1")).empty());
  REQUIRE(h.run(1, add("/b", 1)) == expect({{1, i64(1)}}));
  REQUIRE(h.run(1, push("/q", "x")).empty());
  CHECK(h.run(1, req(Command::kGetNumKeys)) == expect({{1, i64(3)}}));
  REQUIRE(h.run(1, del("/a")) == expect({{1, i64(1)}}));
  CHECK(h.run(1, req(Command::kGetNumKeys)) == expect({{1, i64(2)}}));
}

TEST_CASE("DELETE_KEY replies 1/0 and does not wake") {
  Harness h;
  CHECK(h.run(1, del("/x")) == expect({{1, i64(0)}}));
  REQUIRE(h.run(1, set("/x", "v")).empty());
  REQUIRE(h.run(2, waitKeys({"/x", "/y"})).empty());
  CHECK(h.run(1, del("/x")) == expect({{1, i64(1)}}));
  CHECK(h.ks.find("/x") == nullptr);
  CHECK(h.run(1, del("/x")) == expect({{1, i64(0)}}));
  CHECK(h.run(1, set("/y", "v")) ==
        expect({{2, u8(0)}}));  // /x was present at WAIT
}

TEST_CASE("APPEND creates or appends, and wakes") {
  Harness h;
  REQUIRE(h.run(2, waitKeys({"/ap"})).empty());
  CHECK(h.run(1, append("/ap", "xy")) == expect({{2, u8(0)}}));
  CHECK(h.run(1, append("/ap", "z")).empty());
  CHECK(h.value("/ap") == "xyz");
  CHECK(h.run(1, append("/ap", "")).empty());
  CHECK(h.value("/ap") == "xyz");
  REQUIRE(h.run(2, waitKeys({"/e"})).empty());
  CHECK(h.run(1, append("/e", "")) ==
        expect({{2, u8(0)}}));  // creates an empty key
  CHECK(h.ks.numKeys() == 2);
}

TEST_CASE("MULTI_GET") {
  Harness h;
  REQUIRE(h.run(1, multiSet({"/a", "/b"}, {"1", "22"})).empty());
  CHECK(h.run(1, multiGet({"/b", "/a", "/b"})) ==
        expect({{1, str("22") + str("1") + str("22")}}));
  CHECK(h.run(1, multiGet({})).empty());  // reads nothing
  Status s = h.apply(1, multiGet({"/a", "/missing", "/a"}));
  CHECK(s.code() == StatusCode::kProtocolError);
  CHECK(h.fx.sends().empty());
  CHECK_FALSE(h.apply(1, multiGet({"/a", "/missing"})).isOk());
  CHECK(h.fx.sends().empty());

  Harness lib(KeyspaceOptions{.get_missing_returns_empty = true});
  REQUIRE(lib.run(1, set("/a", "1")).empty());
  CHECK(lib.run(1, multiGet({"/a", "/missing"})) ==
        expect({{1, str("1") + str("")}}));
}

TEST_CASE("MULTI_SET applies pairs in order and wakes each") {
  Harness h;
  REQUIRE(h.run(2, waitKeys({"/a"})).empty());
  REQUIRE(h.run(3, waitKeys({"/b"})).empty());
  CHECK(h.run(1, multiSet({"/b", "/a", "/b"}, {"1", "2", "3"})) ==
        expect({{3, u8(0)}, {2, u8(0)}}));
  CHECK(h.value("/a") == "2");
  CHECK(h.value("/b") == "3");
  CHECK(h.run(1, multiSet({}, {})).empty());
  Status s = h.apply(1, multiSet({"/c", "/d"}, {"1"}));
  CHECK_FALSE(s.isOk());
  CHECK(h.fx.sends().empty());
  CHECK(h.ks.find("/c") == nullptr);
}

TEST_CASE("queues: push, pop, len, FIFO, separate from the map") {
  Harness h;
  CHECK(h.run(1, qlen("/q")) == expect({{1, i64(0)}}));
  CHECK(h.run(1, pop("/q")) == expect({{1, i64(0)}}));
  CHECK(h.run(1, push("/q", "a")).empty());
  CHECK(h.run(1, push("/q", "bb")).empty());
  CHECK(h.run(1, push("/q", "")).empty());
  CHECK(h.ks.queueLength("/q") == 3);
  CHECK(h.run(1, qlen("/q")) == expect({{1, i64(3)}}));
  CHECK(h.ks.numKeys() == 0);
  CHECK_FALSE(h.apply(1, get("/q")).isOk());
  CHECK(h.run(1, req(Command::kListKeys)) == expect({{1, i64(0)}}));
  CHECK(h.run(1, pop("/q")) == expect({{1, i64(3) + str("a")}}));
  CHECK(h.run(1, pop("/q")) == expect({{1, i64(2) + str("bb")}}));
  CHECK(h.run(1, pop("/q")) == expect({{1, i64(1) + str("")}}));
  CHECK(h.run(1, pop("/q")) == expect({{1, i64(0)}}));
  CHECK(h.run(1, qlen("/q")) == expect({{1, i64(0)}}));
  // a map key and a queue of the same name are independent
  REQUIRE(h.run(1, set("/q", "mapvalue")).empty());
  REQUIRE(h.run(1, push("/q", "qv")).empty());
  CHECK(h.value("/q") == "mapvalue");
  CHECK(h.run(1, pop("/q")) == expect({{1, i64(1) + str("qv")}}));
  CHECK(h.value("/q") == "mapvalue");
}

TEST_CASE("QUEUE_PUSH wakes only the oldest waiter") {
  Harness h;
  REQUIRE(h.run(1, waitKeys({"/q"})).empty());
  REQUIRE(h.run(2, waitKeys({"/q"})).empty());
  REQUIRE(h.run(3, waitKeys({"/q"})).empty());
  CHECK(h.run(9, push("/q", "x")) == expect({{1, u8(0)}}));
  CHECK(h.ks.numWaitingConnections() == 2);
  CHECK(h.run(9, push("/q", "y")) == expect({{2, u8(0)}}));
  // a WAIT while the queue is non-empty returns at once
  CHECK(h.run(4, waitKeys({"/q"})) == expect({{4, u8(0)}}));
  CHECK(h.run(9, push("/q", "z")) == expect({{3, u8(0)}}));
  CHECK(h.ks.numWaitingConnections() == 0);
  CHECK(h.run(9, push("/q", "w")).empty());
  CHECK(h.ks.queueLength("/q") == 4);
  // a SET of the same name wakes all of the key's waiters
  REQUIRE(h.run(1, waitKeys({"/r"})).empty());
  REQUIRE(h.run(2, waitKeys({"/r"})).empty());
  CHECK(h.run(9, set("/r", "v")) == expect({{1, u8(0)}, {2, u8(0)}}));
  // a multi-key waiter counts the pushed key once
  REQUIRE(h.run(1, waitKeys({"/s", "/t"})).empty());
  CHECK(h.run(9, push("/s", "1")).empty());
  CHECK(h.run(9, push("/s", "2")).empty());
  CHECK(h.ks.numWaitingConnections() == 1);
  CHECK(h.run(9, push("/t", "1")) == expect({{1, u8(0)}}));
}

TEST_CASE("LIST_KEYS lists every map key raw") {
  Harness h;
  CHECK(h.run(1, req(Command::kListKeys)) == expect({{1, i64(0)}}));
  REQUIRE(h.run(1, set("init/", "1")).empty());
  REQUIRE(h.run(1, set("/m1", "a")).empty());
  REQUIRE(h.run(1, set("/m2", "b")).empty());
  REQUIRE(h.run(1, del("/m2")) == expect({{1, i64(1)}}));
  REQUIRE(h.run(1, push("/queue", "x")).empty());
  REQUIRE(h.apply(1, req(Command::kListKeys)).isOk());
  REQUIRE(h.fx.sends().size() == 1);
  std::string_view b = h.fx.bytesOf(h.fx.sends()[0]);
  REQUIRE(b.size() >= 8);
  auto load = [](std::string_view s) {
    return protocol::loadU64(reinterpret_cast<const unsigned char*>(s.data()));
  };
  CHECK(load(b) == 2);
  b.remove_prefix(8);
  std::set<std::string> keys;
  while (!b.empty()) {
    REQUIRE(b.size() >= 8);
    auto n = load(b);
    b.remove_prefix(8);
    REQUIRE(b.size() >= n);
    keys.insert(std::string(b.substr(0, n)));
    b.remove_prefix(n);
  }
  CHECK(keys == std::set<std::string>{"init/", "/m1"});
}

TEST_CASE("BARRIER with two parties") {
  Harness h;
  CHECK(h.run(1, barrier("/b", 2)).empty());
  CHECK(h.value("/b") == "1");
  CHECK(h.ks.numWaitingConnections() == 1);
  CHECK(h.run(2, barrier("/b", 2)) == expect({{2, u8(0)}, {1, u8(0)}}));
  CHECK(h.value("/b") == "2");
  CHECK(h.ks.numWaitingConnections() == 0);
  // reuse: increments further and returns at once
  CHECK(h.run(3, barrier("/b", 2)) == expect({{3, u8(0)}}));
  CHECK(h.value("/b") == "3");
  CHECK(h.run(3, get("/b")) == expect({{3, str("3")}}));
}

TEST_CASE("BARRIER with world_size 0, 1 and negative returns at once") {
  Harness h;
  CHECK(h.run(1, barrier("/b0", 0)) == expect({{1, u8(0)}}));
  CHECK(h.run(1, barrier("/b1", 1)) == expect({{1, u8(0)}}));
  CHECK(h.run(1, barrier("/bn", -5)) == expect({{1, u8(0)}}));
  CHECK(h.value("/b0") == "1");
  CHECK(h.value("/b1") == "1");
  CHECK(h.ks.numWaitingConnections() == 0);
}

TEST_CASE("BARRIER: three parties, completion wakes every waiter on the key") {
  Harness h;
  CHECK(h.run(1, barrier("/b", 3)).empty());
  CHECK(h.run(2, barrier("/b", 3)).empty());
  REQUIRE(h.run(4, waitKeys({"/b"})) == expect({{4, u8(0)}}));  // exists now
  REQUIRE(h.run(5, waitKeys({"/b", "/other"})).empty());
  CHECK(h.ks.numWaitingConnections() == 3);
  CHECK(h.run(3, barrier("/b", 3)) ==
        expect({{3, u8(0)}, {1, u8(0)}, {2, u8(0)}}));
  CHECK(h.ks.numWaitingConnections() == 1);  // 5 still waits for /other
}

TEST_CASE("BARRIER waiters are released by ADD/SET only at the threshold") {
  Harness h;
  REQUIRE(h.run(1, barrier("/b", 4)).empty());  // counter 1
  REQUIRE(h.run(2, waitKeys({"/b2"})).empty());
  CHECK(h.run(9, add("/b", 1)) == expect({{9, i64(2)}}));  // below: nothing
  CHECK(h.run(9, set("/b", "not a number")).empty());  // unparsable: nothing
  CHECK(h.run(9, set("/b", "3")).empty());
  CHECK(h.ks.numWaitingConnections() == 2);
  CHECK(h.run(9, add("/b", 1)) ==
        expect({{9, i64(4)}, {1, u8(0)}}));  // reached
  CHECK(h.ks.numWaitingConnections() == 1);
  // SET above the threshold releases too
  REQUIRE(h.run(3, barrier("/c", 10)).empty());
  CHECK(h.run(9, set("/c", "  12")) == expect({{3, u8(0)}}));
  // an increment by another barrier call that does not complete wakes plain
  // waiters of the key but keeps barrier waiters
  REQUIRE(h.run(4, barrier("/d", 3)).empty());
  REQUIRE(h.run(5, waitKeys({"/d", "/d2"}))
              .empty());  // /d present: counts only /d2
  REQUIRE(h.run(6, del("/d")) == expect({{6, i64(1)}}));
  REQUIRE(h.run(7, waitKeys({"/d"})).empty());
  CHECK(h.run(8, barrier("/d", 3)) == expect({{7, u8(0)}}));  // /d = 1 again
  CHECK(h.ks.numWaitingConnections() ==
        4);  // 2, 4 (barrier), 5 (/d2), 8 (barrier)
}

TEST_CASE("BARRIER on a non-numeric value is an error that changes nothing") {
  Harness h;
  REQUIRE(h.run(1, set("/bn", "x")).empty());
  REQUIRE(h.run(2, waitKeys({"/bn2"})).empty());
  Status s = h.apply(1, barrier("/bn", 2));
  CHECK(s.code() == StatusCode::kProtocolError);
  CHECK(h.fx.sends().empty());
  CHECK(h.value("/bn") == "x");
  CHECK(h.ks.numPendingWaits() == 1);
}

TEST_CASE("CANCEL_WAIT and disconnect cancel barrier waits") {
  Harness h;
  REQUIRE(h.run(1, barrier("/b", 3)).empty());
  CHECK(h.run(1, req(Command::kCancelWait)) == expect({{1, u8(1)}}));
  CHECK(h.ks.numWaitingConnections() == 0);
  CHECK(h.value("/b") == "1");  // the increment stays
  REQUIRE(h.run(2, barrier("/b", 3)).empty());
  h.ks.disconnect(2);
  CHECK(h.ks.numWaitingConnections() == 0);
  // one later arrival completes at once; nobody else is sent anything
  CHECK(h.run(3, barrier("/b", 3)) == expect({{3, u8(0)}}));
}

// Writes of a key that only barrier waits wait on skip the list until the
// counter reaches the smallest world size among them: these pin that the
// skip never keeps a wait that should go.
TEST_CASE("BARRIER waits of different world sizes on one key") {
  Harness h;
  REQUIRE(h.run(1, barrier("/m", 5)).empty());  // counter 1
  REQUIRE(h.run(2, barrier("/m", 3)).empty());  // counter 2
  CHECK(h.run(9, add("/m", 1)) == expect({{9, i64(3)}, {2, u8(0)}}));
  CHECK(h.run(9, add("/m", 1)) == expect({{9, i64(4)}}));  // 1 needs 5
  CHECK(h.run(9, add("/m", -3)) == expect({{9, i64(1)}}));
  REQUIRE(h.run(3, barrier("/m", 3)).empty());  // counter 2: not complete
  CHECK(h.ks.numPendingWaits() == 2);
  CHECK(h.run(9, set("/m", "3")) == expect({{3, u8(0)}}));
  CHECK(h.run(9, add("/m", 2)) == expect({{9, i64(5)}, {1, u8(0)}}));
  CHECK(h.ks.numPendingWaits() == 0);
}

TEST_CASE("BARRIER: a disconnected waiter's smaller world size holds no one") {
  Harness h;
  REQUIRE(h.run(3, barrier("/s", 2)).empty());  // counter 1
  h.ks.disconnect(3);
  REQUIRE(h.run(4, barrier("/s", 10)).empty());  // counter 2, 3 is dead
  CHECK(h.run(9, add("/s", 7)) == expect({{9, i64(9)}}));
  CHECK(h.run(9, add("/s", 1)) == expect({{9, i64(10)}, {4, u8(0)}}));
  // a plain wait beside barrier waits is woken by every write
  REQUIRE(h.run(5, barrier("/p", 4)).empty());
  REQUIRE(h.run(6, waitKeys({"/p", "/q"})).empty());  // /p present: /q only
  CHECK(h.run(7, barrier("/q", 4)) == expect({{6, u8(0)}}));  // /q created
  CHECK(h.ks.numPendingWaits() == 2);                         // 5 and 7
  REQUIRE(h.run(8, waitKeys({"/q2"})).empty());
  CHECK(h.run(9, add("/p", 2)) == expect({{9, i64(3)}}));
  CHECK(h.run(9, add("/p", 1)) == expect({{9, i64(4)}, {5, u8(0)}}));
}

TEST_CASE("BARRIER of many ranks: nobody released before the last arrival") {
  Harness h;
  constexpr ConnId kRanks = 2000;
  for (ConnId c = 1; c < kRanks; ++c) {
    REQUIRE(h.run(c, barrier("/many", kRanks)).empty());
  }
  CHECK(h.ks.numPendingWaits() == kRanks - 1);
  REQUIRE_FALSE(h.run(kRanks, barrier("/many", kRanks)).empty());
  CHECK(h.fx.sends().size() == kRanks);  // its reply, then 1999 releases
  CHECK(h.ks.numPendingWaits() == 0);
}

TEST_CASE("WATCH_KEY: registration and notifications per trigger") {
  using E = WatchEvent;
  Harness h;
  CHECK(h.run(7, watch("/w")) == expect({{7, u8(3)}}));
  CHECK(h.ks.numWatchers() == 1);
  CHECK(h.run(1, set("/w", "a")) ==
        expect({{7, note(E::kCreated, "/w", "", "a")}}));
  CHECK(h.run(1, set("/w", "b")) ==
        expect({{7, note(E::kUpdated, "/w", "a", "b")}}));
  CHECK(h.run(1, set("/other", "b")).empty());
  CHECK(h.run(1, del("/w")) ==
        expect({{7, note(E::kDeleted, "/w", "b", "")}, {1, i64(1)}}));
  CHECK(h.run(1, del("/w")) ==
        expect({{1, i64(0)}}));  // did not exist: no notification
  CHECK(h.run(1, add("/w", 5)) ==
        expect({{1, i64(5)}, {7, note(E::kCreated, "/w", "", "5")}}));
  CHECK(h.run(1, add("/w", 1)) ==
        expect({{1, i64(6)}, {7, note(E::kUpdated, "/w", "5", "6")}}));
  CHECK(h.run(1, cas("/w", "nope", "x")) ==
        expect({{1, str("6")}}));  // no store
  CHECK(h.run(1, cas("/w", "6", "x")) ==
        expect({{1, str("x")}, {7, note(E::kUpdated, "/w", "6", "x")}}));
  CHECK(h.run(1, append("/w", "yz")) ==
        expect({{7, note(E::kUpdated, "/w", "x", "xyz")}}));
  CHECK(h.run(1, multiSet({"/w", "/o", "/w"}, {"1", "2", "3"})) ==
        expect({{7, note(E::kUpdated, "/w", "xyz", "1")},
                {7, note(E::kUpdated, "/w", "1", "3")}}));
  REQUIRE(h.run(1, del("/w")).size() > 0);
  CHECK(h.run(1, cas("/w", "", "c")) ==
        expect({{1, str("c")}, {7, note(E::kCreated, "/w", "", "c")}}));
  REQUIRE(h.run(1, del("/w")).size() > 0);
  CHECK(h.run(1, barrier("/w", 1)) ==
        expect({{1, u8(0)}, {7, note(E::kCreated, "/w", "", "1")}}));
  CHECK(h.run(1, barrier("/w", 5)) ==
        expect({{7, note(E::kUpdated, "/w", "1", "2")}}));
  CHECK(h.run(1, push("/w", "q")).empty());  // queues are not the map
  CHECK(h.run(1, get("/w")) == expect({{1, str("2")}}));
}

TEST_CASE(
    "WATCH_KEY: each registration gets a copy, wakes come before "
    "notifications") {
  using E = WatchEvent;
  Harness h;
  REQUIRE(h.run(7, watch("/w")) == expect({{7, u8(3)}}));
  REQUIRE(h.run(7, watch("/w")) == expect({{7, u8(3)}}));
  REQUIRE(h.run(8, watch("/w")) == expect({{8, u8(3)}}));
  REQUIRE(h.run(2, waitKeys({"/w"})).empty());
  CHECK(h.ks.numWatchers() == 3);
  const std::string n = note(E::kCreated, "/w", "", "v");
  CHECK(h.run(1, set("/w", "v")) ==
        expect({{2, u8(0)}, {7, n}, {7, n}, {8, n}}));
}

TEST_CASE("disconnect forgets watchers") {
  using E = WatchEvent;
  Harness h;
  REQUIRE(h.run(7, watch("/w")) == expect({{7, u8(3)}}));
  REQUIRE(h.run(7, watch("/v")) == expect({{7, u8(3)}}));
  REQUIRE(h.run(8, watch("/w")) == expect({{8, u8(3)}}));
  REQUIRE(h.run(7, waitKeys({"/x"})).empty());
  h.ks.disconnect(7);
  CHECK(h.ks.numWatchers() == 1);
  CHECK(h.ks.numWaitingConnections() == 0);
  CHECK(h.run(1, set("/w", "v")) ==
        expect({{8, note(E::kCreated, "/w", "", "v")}}));
  CHECK(h.run(1, set("/v", "v")).empty());
  CHECK(h.run(1, set("/x", "v")).empty());
  h.ks.disconnect(8);
  CHECK(h.ks.numWatchers() == 0);
  CHECK(h.run(1, set("/w", "again")).empty());
  // CANCEL_WAIT does not drop watches
  REQUIRE(h.run(9, watch("/w")) == expect({{9, u8(3)}}));
  REQUIRE(h.run(9, req(Command::kCancelWait)) == expect({{9, u8(1)}}));
  CHECK(h.run(1, set("/w", "b")) ==
        expect({{9, note(E::kUpdated, "/w", "again", "b")}}));
}

TEST_CASE("fan-out: 10k waiters on one key are woken by one SET") {
  constexpr ConnId kWaiters = 10000;
  Harness h;
  for (ConnId c = 1; c <= kWaiters; ++c)
    REQUIRE(h.run(c, waitKeys({"/big"})).empty());
  CHECK(h.ks.numWaitingConnections() == kWaiters);
  // every other waiter disconnects first
  for (ConnId c = 2; c <= kWaiters; c += 2) h.ks.disconnect(c);
  CHECK(h.ks.numWaitingConnections() == kWaiters / 2);
  REQUIRE(h.apply(kWaiters + 1, set("/big", "v")).isOk());
  REQUIRE(h.fx.sends().size() == kWaiters / 2);
  ConnId expected_conn = 1;
  for (const auto& s : h.fx.sends()) {
    CHECK(s.conn == expected_conn);
    CHECK(h.fx.bytesOf(s) == u8(0));
    expected_conn += 2;
  }
  CHECK(h.ks.numWaitingConnections() == 0);
  CHECK(h.ks.numPendingWaits() == 0);
  CHECK(h.run(1, set("/big", "w")).empty());
}

TEST_CASE("many keys: inserts, deletes and lookups stay consistent") {
  // Exercises table growth and backward-shift deletion against a model.
  Harness h;
  std::set<std::string> model;
  std::uint64_t x = 88172645463325252ull;  // xorshift, fixed seed
  auto next = [&x] {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  };
  std::vector<std::string> names;
  for (int i = 0; i < 3000; ++i)
    names.push_back("/key/" + std::to_string(i * 7919 % 3001));
  for (int step = 0; step < 20000; ++step) {
    const std::string& k = names[next() % names.size()];
    if (next() % 3 == 0) {
      const bool had = model.erase(k) > 0;
      REQUIRE(h.run(1, del(k)) == expect({{1, i64(had ? 1 : 0)}}));
    } else {
      model.insert(k);
      REQUIRE(h.run(1, set(k, k)).empty());
    }
  }
  CHECK(h.ks.numKeys() == model.size());
  for (const std::string& k : names) {
    const std::string* v = h.ks.find(k);
    if (model.count(k) != 0) {
      REQUIRE(v != nullptr);
      CHECK(*v == k);
    } else {
      CHECK(v == nullptr);
    }
  }
  // the empty key is an ordinary key
  REQUIRE(h.run(1, set("", "empty key")).empty());
  CHECK(h.value("") == "empty key");
}

TEST_CASE("a moved keyspace keeps its keys, waits and watches") {
  using E = WatchEvent;
  Keyspace a;
  Effects fx;
  REQUIRE(a.apply(1, set("/k", "v"), fx).isOk());
  REQUIRE(a.apply(2, waitKeys({"/m"}), fx).isOk());
  REQUIRE(a.apply(3, watch("/m"), fx).isOk());
  Keyspace b(std::move(a));
  CHECK(b.numKeys() == 1);
  CHECK(b.numWaitingConnections() == 1);
  CHECK(b.numWatchers() == 1);
  fx.clear();
  REQUIRE(b.apply(1, set("/m", "x"), fx).isOk());
  CHECK(render(fx) ==
        expect({{2, u8(0)}, {3, note(E::kCreated, "/m", "", "x")}}));
  Keyspace c;
  REQUIRE(c.apply(5, waitKeys({"/z"}), fx).isOk());
  c = std::move(b);
  CHECK(c.numKeys() == 2);
  CHECK(c.numWaitingConnections() == 0);
  CHECK(*c.find("/k") == "v");
}

TEST_CASE("watch notifications to many watchers share one copy of the bytes") {
  // One SET of a large value watched by N connections must not build N
  // copies (N * 2 values) before the server can drop any slow watcher.
  using E = WatchEvent;
  Harness h;
  constexpr ConnId kWatchers = 100;
  for (ConnId c = 10; c < 10 + kWatchers; ++c) {
    REQUIRE(h.run(c, watch("/big")) == expect({{c, u8(3)}}));
  }
  const std::string value(4096, 'v');
  REQUIRE(h.apply(1, set("/big", value)).isOk());
  const std::string one = note(E::kCreated, "/big", "", value);
  REQUIRE(h.fx.sends().size() == kWatchers);
  CHECK(h.fx.bytes().size() == one.size());
  ConnId expected_conn = 10;
  for (const auto& s : h.fx.sends()) {
    CHECK(s.conn == expected_conn++);
    CHECK(h.fx.bytesOf(s) == one);
  }
}

TEST_CASE("APPEND past max_value_bytes is an error that changes nothing") {
  KeyspaceOptions o;
  o.max_value_bytes = 10;
  Harness h(o);
  REQUIRE(h.run(2, waitKeys({"/ap"})).empty());
  CHECK(h.run(1, append("/ap", "0123456")) == expect({{2, u8(0)}}));
  CHECK(h.run(1, append("/ap", "789")).empty());
  CHECK(h.value("/ap") == "0123456789");
  Status st = h.apply(1, append("/ap", "x"));
  CHECK(st.code() == StatusCode::kLimitExceeded);
  CHECK(h.fx.sends().empty());
  CHECK(h.value("/ap") == "0123456789");
  // Creating a key through APPEND is bounded the same way.
  CHECK(h.apply(1, append("/new", std::string(11, 'n'))).code() ==
        StatusCode::kLimitExceeded);
  CHECK(h.value("/new") == "<missing>");
}

TEST_CASE("MULTI_GET and LIST_KEYS over max_reply_bytes build nothing") {
  KeyspaceOptions o;
  o.max_reply_bytes = 100;
  Harness h(o);
  const std::string v(40, 'x');
  REQUIRE(h.run(1, set("/m", v)).empty());
  // 2 * (8 + 40) = 96 bytes: fits.
  CHECK(h.run(1, multiGet({"/m", "/m"})) == expect({{1, str(v) + str(v)}}));
  // The same key three times: 144 bytes.
  Status st = h.apply(1, multiGet({"/m", "/m", "/m"}));
  CHECK(st.code() == StatusCode::kLimitExceeded);
  CHECK(h.fx.sends().empty());
  CHECK(h.fx.bytes().empty());
  // LIST_KEYS: 8 + (8 + 2) per key; 9 keys = 98 bytes fit, 10 do not.
  Harness l(o);
  std::vector<std::string> keys;
  for (int i = 0; i < 10; ++i) keys.push_back("/" + std::to_string(i));
  for (int i = 0; i < 9; ++i) REQUIRE(l.run(1, set(keys[i], "")).empty());
  CHECK(l.apply(1, req(Command::kListKeys)).isOk());
  REQUIRE(l.run(1, set(keys[9], "")).empty());
  CHECK(l.apply(1, req(Command::kListKeys)).code() ==
        StatusCode::kLimitExceeded);
  CHECK(l.fx.bytes().empty());
}

}  // namespace
}  // namespace tcpstore::store::testing
