// Hash flooding: keys crafted to collide under libstdc++'s std::hash (the
// attack is real) do not slow the keyspace's tables (keyed hashing).
#include <doctest/doctest.h>

#include <functional>
#include <set>
#include <string>
#include <unordered_set>

#include "collide.h"
#include "store/keyspace/table.h"
#include "test_util.h"

namespace tcpstore::store::testing {
namespace {

constexpr std::size_t kCrafted = 50000;
constexpr std::string_view kPrefix = "/default_pg/key/";  // 16 bytes

TEST_CASE("the collision generator defeats std::hash<std::string_view>") {
  const auto keys = collidingKeys(kCrafted, kPrefix);
  REQUIRE(keys.size() == kCrafted);
  // (an ordered set: a std::unordered_set of these keys is the attack)
  const std::set<std::string> distinct(keys.begin(), keys.end());
  CHECK(distinct.size() == kCrafted);
  const std::size_t h = std::hash<std::string_view>{}(keys[0]);
  std::size_t same = 0;
  for (const auto& k : keys) {
    CHECK(k.size() == kPrefix.size() + 16);
    if (std::hash<std::string_view>{}(k) == h) ++same;
  }
  CHECK(same == kCrafted);  // one full 64-bit hash for all of them
  // Random keys of the same shape do not collide.
  const auto random = randomKeys(1000, kPrefix);
  std::unordered_set<std::size_t> hashes;
  for (const auto& k : random) hashes.insert(std::hash<std::string_view>{}(k));
  CHECK(hashes.size() == random.size());
}

keyspace::ProbeStats fill(const std::vector<std::string>& keys) {
  keyspace::KeyTable<std::string> table;
  for (const auto& k : keys) {
    auto [v, created] = table.findOrInsert(k);
    REQUIRE(created);
    v->assign("v");
  }
  CHECK(table.size() == keys.size());
  for (const auto& k : keys) REQUIRE(table.find(k) != nullptr);
  return table.probeStats();
}

// The table behind keys, queues and wait/watch registrations (all three
// are KeyTables with the same keyed hash).
TEST_CASE("crafted keys probe the key table no longer than random keys") {
  const keyspace::ProbeStats random = fill(randomKeys(kCrafted, kPrefix));
  const keyspace::ProbeStats crafted = fill(collidingKeys(kCrafted, kPrefix));
  INFO("random: longest " << random.longest << ", total " << random.total);
  INFO("crafted: longest " << crafted.longest << ", total " << crafted.total);
  CHECK(random.total < 3 * kCrafted);  // a sane table: < 3 probes per hit
  CHECK(crafted.longest <= 4 * random.longest + 8);
  CHECK(crafted.total <= 2 * random.total);
}

TEST_CASE("crafted keys work as ordinary keys, queues and waits") {
  const auto keys = collidingKeys(2000, kPrefix);
  Harness h;
  std::vector<std::string_view> views(keys.begin(), keys.end());
  REQUIRE(h.run(7, waitKeys(views)).empty());
  for (std::size_t i = 0; i + 1 < keys.size(); ++i) {
    REQUIRE(h.run(1, set(keys[i], keys[i])).empty());
  }
  REQUIRE(h.run(1, push(keys.back(), "item")) == expect({{7, u8(0)}}));
  CHECK(h.ks.numKeys() == keys.size() - 1);
  CHECK(h.ks.queueLength(keys.back()) == 1);
  for (std::size_t i = 0; i + 1 < keys.size(); ++i) {
    REQUIRE(h.value(keys[i]) == keys[i]);
  }
}

}  // namespace
}  // namespace tcpstore::store::testing
