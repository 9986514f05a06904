// Bounded work and memory accounting: disconnect() and CANCEL_WAIT detach
// in O(1), reclaim() frees a bounded number of registrations per call, and
// memoryBytes() follows what is stored.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "test_util.h"

namespace tcpstore::store::testing {
namespace {

// Calls reclaim(step) until nothing is left; returns the number of calls.
std::size_t drain(Keyspace& ks, std::size_t step) {
  std::size_t calls = 0;
  std::size_t left = ks.reclaim(0);
  while (left > 0) {
    const std::size_t next = ks.reclaim(step);
    REQUIRE(next == (left > step ? left - step : 0));  // exactly `step` each
    left = next;
    ++calls;
    REQUIRE(calls < 100000);
  }
  return calls;
}

TEST_CASE("disconnect detaches a large wait at once, and reclaim frees it") {
  Harness h;
  const auto keys = keysNamed("/absent/", 10000);
  REQUIRE(h.run(7, waitKeys(views(keys))).empty());
  REQUIRE(h.run(8, waitKeys({keys.back()})).empty());
  CHECK(h.ks.numPendingWaits() == 2);
  h.ks.disconnect(7);
  CHECK(h.ks.numPendingWaits() == 1);
  CHECK(h.ks.numWaitingConnections() == 1);
  const std::size_t left = h.ks.reclaim(0);
  CHECK(left > 0);
  CHECK(left <= keys.size());
  // A write of a key the dead wait is still linked to wakes only the live
  // waiter.
  CHECK(h.run(1, set(keys.back(), "v")) == expect({{8, u8(0)}}));
  CHECK(h.run(1, set(keys.front(), "v")).empty());
  const std::size_t after_sets = h.ks.reclaim(0);
  CHECK(after_sets < left);  // each apply() reclaims a few
  CHECK(drain(h.ks, 1000) == (after_sets + 999) / 1000);
  CHECK(h.ks.reclaim(1000) == 0);
  // Nothing of connection 7 is left: the keys can be waited on afresh.
  REQUIRE(h.run(9, waitKeys({keys[5000]})).empty());
  CHECK(h.run(1, set(keys[5000], "v")) == expect({{9, u8(0)}}));
}

TEST_CASE("small registrations are freed by disconnect itself") {
  Harness h;
  REQUIRE(h.run(7, waitKeys({"/a", "/b"})).empty());
  REQUIRE(h.run(7, watch("/a")) == expect({{7, u8(3)}}));
  h.ks.disconnect(7);
  CHECK(h.ks.reclaim(0) == 0);
  CHECK(h.ks.numWatchers() == 0);
  CHECK(h.ks.memoryBytes() == 0);
}

TEST_CASE("dead watches are not notified") {
  Harness h;
  const auto keys = keysNamed("/watched/", 200);
  for (const auto& k : keys)
    REQUIRE(h.run(7, watch(k)) == expect({{7, u8(3)}}));
  REQUIRE(h.run(8, watch(keys.back())) == expect({{8, u8(3)}}));
  h.ks.disconnect(7);
  CHECK(h.ks.numWatchers() == 1);
  CHECK(h.ks.reclaim(0) > 0);
  CHECK(h.run(1, set(keys.front(), "x")).empty());
  CHECK(h.run(1, set(keys.back(), "y")) ==
        expect(
            {{8, note(protocol::WatchEvent::kCreated, keys.back(), "", "y")}}));
  drain(h.ks, 7);
}

TEST_CASE("CANCEL_WAIT and a replacing WAIT detach the old wait") {
  Harness h;
  const auto keys = keysNamed("/absent/", 1000);
  REQUIRE(h.run(7, waitKeys(views(keys))).empty());
  CHECK(h.run(7, req(Command::kCancelWait)) == expect({{7, u8(1)}}));
  CHECK(h.ks.numPendingWaits() == 0);
  CHECK(h.ks.reclaim(0) > 0);
  CHECK(h.run(1, set(keys.back(), "v")).empty());
  REQUIRE(h.run(7, waitKeys(views(keys))).empty());
  REQUIRE(h.run(7, waitKeys({"/other"})).empty());  // replaces it
  CHECK(h.ks.numPendingWaits() == 1);
  CHECK(h.run(1, set(keys.front(), "v")).empty());
  CHECK(h.run(1, set("/other", "v")) == expect({{7, u8(0)}}));
  drain(h.ks, 100);
  CHECK(h.run(1, del(keys.front())) == expect({{1, i64(1)}}));
  CHECK(h.run(1, del(keys.back())) == expect({{1, i64(1)}}));
  CHECK(h.run(1, del("/other")) == expect({{1, i64(1)}}));
  h.ks.disconnect(7);
  CHECK(h.ks.memoryBytes() == 0);
}

TEST_CASE("memoryBytes rises and falls with keys, values, queues and waits") {
  Harness h;
  CHECK(h.ks.memoryBytes() == 0);
  const std::string big(1000, 'v');
  REQUIRE(h.run(1, set("/k", big)).empty());
  const std::size_t with_big = h.ks.memoryBytes();
  CHECK(with_big >= 1000 + 2);
  REQUIRE(h.run(1, set("/k", "small")).empty());
  CHECK(h.ks.memoryBytes() == with_big - (1000 - 5));
  REQUIRE(h.run(1, append("/k", "er")).empty());
  CHECK(h.ks.memoryBytes() == with_big - (1000 - 7));
  CHECK(h.run(1, del("/k")) == expect({{1, i64(1)}}));
  CHECK(h.ks.memoryBytes() == 0);

  REQUIRE(h.run(1, push("/q", big)).empty());
  REQUIRE(h.run(1, push("/q", big)).empty());
  const std::size_t two_items = h.ks.memoryBytes();
  CHECK(two_items >= 2000);
  REQUIRE(h.apply(1, pop("/q")).isOk());
  CHECK(h.ks.memoryBytes() < two_items - 1000);
  REQUIRE(h.apply(1, pop("/q")).isOk());
  CHECK(h.ks.memoryBytes() == 0);

  const auto keys = keysNamed("/absent/", 5000);
  REQUIRE(h.run(7, waitKeys(views(keys))).empty());
  const std::size_t waiting = h.ks.memoryBytes();
  CHECK(waiting >= 5000 * (8 + sizeof(void*)));
  h.ks.disconnect(7);
  CHECK(h.ks.memoryBytes() > 0);  // detached, not yet freed
  CHECK(h.ks.memoryBytes() <= waiting);
  drain(h.ks, 500);
  CHECK(h.ks.memoryBytes() == 0);

  REQUIRE(h.run(1, add("/n", 5)) == expect({{1, i64(5)}}));
  REQUIRE(h.run(2, barrier("/b", 3)).empty());
  CHECK(h.ks.memoryBytes() > 0);
  h.ks.disconnect(2);
  CHECK(h.run(1, del("/n")) == expect({{1, i64(1)}}));
  CHECK(h.run(1, del("/b")) == expect({{1, i64(1)}}));
  CHECK(h.ks.memoryBytes() == 0);
}

TEST_CASE("a moved-from keyspace is empty and usable") {
  Keyspace a;
  Effects fx;
  REQUIRE(a.apply(1, set("/k", "v"), fx).isOk());
  Keyspace b(std::move(a));
  CHECK(a.numKeys() == 0);  // NOLINT(bugprone-use-after-move): the contract
  CHECK(a.find("/k") == nullptr);
  CHECK(a.memoryBytes() == 0);
  CHECK(a.reclaim(10) == 0);
  a.disconnect(1);
  REQUIRE(a.apply(1, set("/k", "w"), fx).isOk());
  CHECK(*a.find("/k") == "w");
  CHECK(*b.find("/k") == "v");
}

}  // namespace
}  // namespace tcpstore::store::testing
