// A WAIT registered in steps (Keyspace::startWait / advanceWaits): writes,
// removals, duplicates, cancels and disconnects during the registration
// give the result of registering every key at once.
#include <doctest/doctest.h>

#include <optional>
#include <random>
#include <string>
#include <vector>

#include "test_util.h"

namespace tcpstore::store::testing {
namespace {

// Starts a WAIT of `conn` that is left in progress (at most 4 keys at once).
void startPending(Harness& h, ConnId conn,
                  const std::vector<std::string_view>& keys) {
  h.fx.clear();
  REQUIRE(h.ks.startWait(conn, waitKeys(keys), h.fx, 4));
  REQUIRE(h.fx.empty());
}

// One advanceWaits() step: "" while in progress, else "done <sends>".
std::string advance(Harness& h, std::size_t keys) {
  h.fx.clear();
  auto done = h.ks.advanceWaits(keys, h.fx);
  if (!done) {
    REQUIRE(h.fx.empty());
    return "";
  }
  REQUIRE(done->ok);
  return "done " + std::to_string(done->conn) + " " + render(h.fx);
}

// Advances until the WAIT in progress finishes (bounded).
std::string finish(Harness& h, std::size_t step) {
  for (int i = 0; i < 1000000; ++i) {
    std::string r = advance(h, step);
    if (!r.empty()) return r;
  }
  FAIL("the WAIT never finished");
  return "";
}

const std::string kStop = u8(protocol::kStopWaiting);

TEST_CASE("a small WAIT is registered by startWait itself") {
  Harness h;
  h.fx.clear();
  CHECK_FALSE(h.ks.startWait(3, waitKeys({"a", "b"}), h.fx, 4));
  CHECK(h.fx.empty());
  CHECK(h.ks.waitsInProgress() == 0);
  CHECK(h.ks.numPendingWaits() == 1);
  CHECK(h.run(1, set("a", "1")).empty());
  CHECK(h.run(1, set("b", "1")) == expect({{3, kStop}}));
}

TEST_CASE("writes before and after a key's turn both count") {
  Harness h;
  const auto keys = keysNamed("/k/", 100);
  startPending(h, 7, views(keys));
  CHECK(h.ks.waitsInProgress() == 1);
  CHECK(advance(h, 50).empty());  // keys 0-49 linked, 50-99 not yet
  CHECK(h.ks.numPendingWaits() == 1);
  // Every key written: 0-49 through their links, 50-99 before their turn.
  // Nothing is released while the registration goes on.
  for (const auto& k : keys) CHECK(h.run(1, set(k, "v")).empty());
  CHECK(h.ks.numPendingWaits() == 1);
  CHECK(finish(h, 10) == "done 7 " + expect({{7, kStop}}));
  CHECK(h.ks.numPendingWaits() == 0);
  CHECK(h.ks.waitsInProgress() == 0);
}

TEST_CASE("a registered key of a half-registered wait still releases it") {
  Harness h;
  const auto keys = keysNamed("/k/", 100);
  startPending(h, 7, views(keys));
  CHECK(advance(h, 50).empty());
  // All but key 10 (already linked) arrive; then the registration ends
  // with the wait still waiting for key 10 only.
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (i != 10) CHECK(h.run(1, set(keys[i], "v")).empty());
  }
  CHECK(finish(h, 7) == "done 7 ");
  CHECK(h.ks.numPendingWaits() == 1);
  CHECK(h.run(1, add(keys[10], 1)) == expect({{1, i64(1)}, {7, kStop}}));
  CHECK(h.ks.numPendingWaits() == 0);
}

TEST_CASE("a WAIT whose keys all exist finishes with STOP_WAITING") {
  Harness h;
  const auto keys = keysNamed("/there/", 64);
  for (const auto& k : keys) REQUIRE(h.run(1, set(k, "v")).empty());
  const std::size_t before = h.ks.memoryBytes();
  startPending(h, 9, views(keys));
  CHECK(h.ks.memoryBytes() > before);  // the copy is charged
  CHECK(finish(h, 5) == "done 9 " + expect({{9, kStop}}));
  CHECK(h.ks.numPendingWaits() == 0);
  CHECK(h.ks.numWaitingConnections() == 0);
  CHECK(h.ks.memoryBytes() == before);
}

TEST_CASE("a key removed before its turn counts if it existed since start") {
  Harness h;
  const auto keys = keysNamed("/d/", 100);
  // Keys 60-79 exist when the WAIT starts; 60-69 are deleted before their
  // turn, 70-79 are queue items popped before it. Registered at once, they
  // would all have counted.
  for (int i = 60; i < 70; ++i) REQUIRE(h.run(1, set(keys[i], "v")).empty());
  for (int i = 70; i < 80; ++i) REQUIRE(h.run(1, push(keys[i], "q")).empty());
  // Key 90 is deleted before the WAIT: it must still be waited for.
  REQUIRE(h.run(1, set(keys[90], "v")).empty());
  REQUIRE(h.run(1, del(keys[90])) == expect({{1, i64(1)}}));
  startPending(h, 7, views(keys));
  CHECK(advance(h, 50).empty());
  for (int i = 60; i < 70; ++i) {
    CHECK(h.run(1, del(keys[i])) == expect({{1, i64(1)}}));
  }
  for (int i = 70; i < 80; ++i) REQUIRE(h.apply(1, pop(keys[i])).isOk());
  // Key 95 is created and deleted before its turn: it existed since start.
  REQUIRE(h.run(1, set(keys[95], "v")).empty());
  REQUIRE(h.run(1, del(keys[95])) == expect({{1, i64(1)}}));
  CHECK(finish(h, 8) == "done 7 ");
  // Every other key, then key 90, must arrive.
  for (int i = 0; i < 100; ++i) {
    if ((i >= 60 && i < 80) || i == 90 || i == 95) continue;
    CHECK(h.run(1, set(keys[i], "v")).empty());
  }
  CHECK(h.run(1, set(keys[90], "v")) == expect({{7, kStop}}));
}

TEST_CASE("duplicate keys of a stepped WAIT count once") {
  Harness h;
  std::vector<std::string_view> keys;
  for (int round = 0; round < 10; ++round) {
    for (std::string_view k : {"x", "y", "z"}) keys.push_back(k);
  }
  startPending(h, 4, keys);
  CHECK(advance(h, 4).empty());  // x, y, z linked, x again skipped
  CHECK(finish(h, 3) == "done 4 ");
  CHECK(h.run(1, set("x", "1")).empty());
  CHECK(h.run(1, set("y", "1")).empty());
  CHECK(h.run(1, set("z", "1")) == expect({{4, kStop}}));
  // Nothing of it is left.
  CHECK(h.run(1, set("z", "2")).empty());
  CHECK(h.ks.numPendingWaits() == 0);
}

TEST_CASE("disconnect during the registration cancels it cleanly") {
  Harness h;
  const auto keys = keysNamed("/gone/", 1000);
  startPending(h, 7, views(keys));
  CHECK(advance(h, 300).empty());
  CHECK(h.ks.memoryBytes() > 0);
  h.ks.disconnect(7);
  CHECK(h.ks.waitsInProgress() == 0);
  CHECK(h.ks.numPendingWaits() == 0);
  CHECK(h.ks.numWaitingConnections() == 0);
  CHECK_FALSE(h.ks.advanceWaits(100, h.fx).has_value());
  // Linked or not, its keys wake nobody.
  CHECK(h.run(1, set(keys[0], "v")).empty());
  CHECK(h.run(1, set(keys[999], "v")).empty());
  while (h.ks.reclaim(100) != 0) {
  }
  h.run(1, del(keys[0]));
  h.run(1, del(keys[999]));
  CHECK(h.ks.memoryBytes() == 0);
}

TEST_CASE("a new WAIT or CANCEL_WAIT of the connection cancels the rest") {
  Harness h;
  const auto keys = keysNamed("/old/", 100);
  SUBCASE("a new WAIT") {
    startPending(h, 7, views(keys));
    CHECK(advance(h, 30).empty());
    CHECK(h.run(7, waitKeys({"/new"})).empty());
  }
  SUBCASE("CANCEL_WAIT, then a new WAIT") {
    startPending(h, 7, views(keys));
    CHECK(advance(h, 30).empty());
    CHECK(h.run(7, req(Command::kCancelWait)) ==
          expect({{7, u8(protocol::kWaitCanceled)}}));
    CHECK(h.run(7, waitKeys({"/new"})).empty());
  }
  CHECK(h.ks.waitsInProgress() == 0);
  CHECK(h.ks.numPendingWaits() == 1);
  for (const auto& k : keys) CHECK(h.run(1, set(k, "v")).empty());
  CHECK(h.run(1, set("/new", "v")) == expect({{7, kStop}}));
}

TEST_CASE("WAITs in progress finish oldest first, each on its own") {
  Harness h;
  const auto a = keysNamed("/a/", 40);
  const auto b = keysNamed("/b/", 40);
  startPending(h, 1, views(a));
  startPending(h, 2, views(b));
  CHECK(h.ks.waitsInProgress() == 2);
  for (const auto& k : b) REQUIRE(h.run(9, set(k, "v")).empty());
  CHECK(finish(h, 7) == "done 1 ");
  CHECK(finish(h, 7) == "done 2 " + expect({{2, kStop}}));
  CHECK(h.ks.waitsInProgress() == 0);
}

// Random SETs, DELETEs and steps against the rule of a WAIT registered at
// once: it is released exactly when every key has existed at some time
// since the WAIT started.
TEST_CASE("stepped WAITs match registering at once (randomized)") {
  std::mt19937 rng(20261202);
  for (int round = 0; round < 200; ++round) {
    Harness h;
    const std::size_t n = 5 + rng() % 60;
    const auto keys = keysNamed("/r/", n + 5);  // 5 keys not waited on
    std::vector<bool> exists(keys.size()), seen(keys.size());
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (rng() % 3 == 0) {
        REQUIRE(h.run(1, set(keys[i], "v")).empty());
        exists[i] = true;
      }
    }
    std::vector<std::string_view> waited;
    for (std::size_t i = 0; i < n; ++i) {
      waited.push_back(keys[rng() % n]);  // duplicates too
    }
    auto index = [&](std::string_view k) {
      return static_cast<std::size_t>(std::stoul(std::string(k.substr(3))));
    };
    for (std::size_t i = 0; i < keys.size(); ++i) seen[i] = exists[i];
    auto all_seen = [&] {
      for (std::string_view k : waited) {
        if (!seen[index(k)]) return false;
      }
      return true;
    };
    startPending(h, 7, waited);
    bool registering = true, released = false;
    for (int op = 0; op < 400 && !released; ++op) {
      const std::size_t i = rng() % keys.size();
      const unsigned what = rng() % 4;
      std::string out;
      if (what == 0 && registering) {
        out = advance(h, 1 + rng() % 8);
        if (!out.empty()) {
          registering = false;
          const bool stop = out.find("7:00") != std::string::npos;
          REQUIRE(out.rfind("done 7 ", 0) == 0);
          CHECK(stop == all_seen());
          released = stop;
        }
        continue;
      }
      if (what == 1 && exists[i]) {
        out = h.run(1, del(keys[i]));
        exists[i] = false;
      } else {
        out = h.run(1, set(keys[i], "v"));
        exists[i] = seen[i] = true;
      }
      const bool stop = out.find("7:00") != std::string::npos;
      // While registering nothing is released; after, exactly when due.
      CHECK(stop == (!registering && all_seen()));
      released = stop;
    }
  }
}

}  // namespace
}  // namespace tcpstore::store::testing
