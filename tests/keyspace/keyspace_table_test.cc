// KeyTable against a model (std::map), through many grows: inserts and
// removes interleave with the incremental move of a grow.
#include <doctest/doctest.h>

#include <cstdint>
#include <map>
#include <string>

#include "store/keyspace/table.h"

namespace tcpstore::store::testing {
namespace {

using keyspace::KeyTable;

TEST_CASE("KeyTable matches a model through grows, removes and clears") {
  KeyTable<std::uint64_t> table;
  std::map<std::string, std::uint64_t> model;
  std::uint64_t s = 12345;
  auto next = [&s] {  // xorshift64
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  };
  for (int round = 0; round < 3; ++round) {
    const std::uint64_t space = 40000u << round;  // key space per round
    for (int op = 0; op < 120000; ++op) {
      const std::uint64_t r = next();
      const std::string key = "/k/" + std::to_string(r % space);
      if (r % 3 != 0) {  // insert twice as often as remove: the table grows
        auto [v, created] = table.findOrInsert(key);
        REQUIRE(created == (model.count(key) == 0));
        *v = r;
        model[key] = r;
      } else {
        REQUIRE(table.erase(key) == (model.erase(key) == 1));
      }
      if (op % 1000 == 0) {
        REQUIRE(table.size() == model.size());
        const std::string probe = "/k/" + std::to_string(next() % space);
        const std::uint64_t* v = table.find(probe);
        auto it = model.find(probe);
        REQUIRE((v == nullptr) == (it == model.end()));
        if (v != nullptr) REQUIRE(*v == it->second);
      }
    }
    std::size_t seen = 0;
    table.forEach([&](std::string_view k, const std::uint64_t& v) {
      ++seen;
      auto it = model.find(std::string(k));
      REQUIRE(it != model.end());
      REQUIRE(it->second == v);
    });
    CHECK(seen == model.size());
    for (const auto& [k, v] : model) REQUIRE(*table.find(k) == v);
    const auto st = table.probeStats();
    CHECK(st.total < 4 * model.size());
    if (round == 1) {
      // Remove everything: the emptied table frees its arrays.
      for (const auto& [k, v] : model) REQUIRE(table.erase(k));
      model.clear();
      CHECK(table.size() == 0);
      CHECK(table.memoryBytes() == 0);
    }
  }
  table.clear();
  CHECK(table.memoryBytes() == 0);
}

}  // namespace
}  // namespace tcpstore::store::testing
