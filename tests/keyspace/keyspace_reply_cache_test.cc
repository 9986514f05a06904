// The reply cache (store/keyspace/reply_cache.h): large MULTI_GET/GET
// replies are built once and shared, and a reply is never reused after one
// of its keys changed. Randomized rounds compare against a keyspace without
// the cache.
#include <doctest/doctest.h>

#include <random>
#include <string>
#include <vector>

#include "store/keyspace/reply_cache.h"
#include "tests/keyspace/test_util.h"

namespace {

using namespace tcpstore::store;
using namespace tcpstore::store::testing;

constexpr std::size_t kValueBytes = 1024;
constexpr std::size_t kMaxKeys = keyspace::ReplyCache::kMaxKeys;

// Sets keys k0..k7 to 1 KiB values: a MULTI_GET of all is > 8 KiB.
struct Cached {
  explicit Cached(KeyspaceOptions o = {}) : h(o) {
    names = keysNamed("k", 8);
    for (std::size_t i = 0; i < names.size(); ++i) {
      vals.push_back(std::string(kValueBytes, static_cast<char>('a' + i)));
      REQUIRE(h.run(9, set(names[i], vals[i])).empty());
    }
  }
  Request all() const { return multiGet(views(names)); }
  std::string expected() const {
    std::string b;
    for (const std::string& v : vals) b += str(v);
    return b;
  }
  // MULTI_GET of all keys from `conn`: the reply's bytes, and its buffer if
  // it was sent shared.
  std::string read(ConnId conn, SharedBytes* buf = nullptr) {
    h.fx.clear();
    REQUIRE(h.ks.apply(conn, all(), h.fx).isOk());
    REQUIRE(h.fx.sends().size() == 1);
    const Effects::Send& s = h.fx.sends().front();
    CHECK(s.conn == conn);
    if (buf != nullptr) {
      const SharedBytes* b = h.fx.sharedOf(s);
      *buf = b == nullptr ? SharedBytes() : *b;
    }
    return std::string(h.fx.bytesOf(s));
  }
  // Reads until the reply is cached (the second sight admits it).
  void warm() {
    read(1);
    read(2);
    REQUIRE(h.ks.replyCacheStats().entries == 1);
  }

  Harness h;
  std::vector<std::string> names;
  std::vector<std::string> vals;
};

TEST_CASE("identical MULTI_GETs share one reply buffer, built once") {
  Cached c;
  SharedBytes first, second, third;
  CHECK(c.read(1, &first) == c.expected());
  CHECK(!first);  // seen once: built plainly, not cached
  CHECK(c.h.ks.replyCacheStats().inserts == 0);
  CHECK(c.read(2, &second) == c.expected());
  REQUIRE(second);  // seen twice: built as a shared buffer and cached
  CHECK(c.h.ks.replyCacheStats().inserts == 1);
  CHECK(c.read(3, &third) == c.expected());
  CHECK(third == second);  // the same buffer, not a copy
  CHECK(c.h.ks.replyCacheStats().hits == 1);
  for (ConnId conn = 4; conn < 100; ++conn) {
    SharedBytes b;
    REQUIRE(c.read(conn, &b) == c.expected());
    REQUIRE(b == second);
  }
  CHECK(c.h.ks.replyCacheStats().hits == 97);
  CHECK(c.h.ks.replyCacheStats().inserts == 1);
}

TEST_CASE("a small MULTI_GET reply is never cached") {
  Harness h;
  REQUIRE(h.run(9, set("a", "1")).empty());
  for (ConnId conn = 1; conn < 5; ++conn) {
    h.fx.clear();
    REQUIRE(h.ks.apply(conn, multiGet({"a", "a"}), h.fx).isOk());
    CHECK(h.fx.sharedOf(h.fx.sends().front()) == nullptr);
  }
  CHECK(h.ks.replyCacheStats().inserts == 0);
}

TEST_CASE("GET of a large value is shared too") {
  Harness h;
  const std::string big(8000, 'v');
  REQUIRE(h.run(9, set("big", big)).empty());
  SharedBytes seen;
  for (ConnId conn = 1; conn <= 4; ++conn) {
    h.fx.clear();
    REQUIRE(h.ks.apply(conn, get("big"), h.fx).isOk());
    REQUIRE(h.fx.sends().size() == 1);
    CHECK(h.fx.bytesOf(h.fx.sends().front()) == str(big));
    if (conn >= 2) {
      const SharedBytes* b = h.fx.sharedOf(h.fx.sends().front());
      REQUIRE(b != nullptr);
      if (conn == 2) seen = *b;
      CHECK(*b == seen);
    }
  }
  CHECK(h.ks.replyCacheStats().hits == 2);
  REQUIRE(h.run(9, append("big", "!")).empty());
  CHECK(h.run(5, get("big")) == expect({{5, str(big + "!")}}));
}

// Each write of one cached key between two identical MULTI_GETs: the second
// gets the new bytes, and the cache entry was dropped (not patched).
TEST_CASE("every kind of write of a cached key drops the cached reply") {
  struct Write {
    const char* name;
    Request (*make)(std::vector<std::string>& vals);
  };
  // Each changes key k3 (index 3) and updates the model `vals`.
  static std::string scratch;
  const Write writes[] = {
      {"SET",
       [](std::vector<std::string>& v) {
         v[3] = std::string(kValueBytes, 'S');
         scratch = v[3];
         return set("k3", scratch);
       }},
      {"APPEND",
       [](std::vector<std::string>& v) {
         v[3] += "tail";
         return append("k3", "tail");
       }},
      {"COMPARE_SET",
       [](std::vector<std::string>& v) {
         scratch = v[3];
         v[3] = "swapped";
         return cas("k3", scratch, "swapped");
       }},
      {"MULTI_SET",
       [](std::vector<std::string>& v) {
         v[3] = "m3";
         return multiSet({"zz", "k3"}, {"x", "m3"});
       }},
  };
  for (const Write& w : writes) {
    CAPTURE(w.name);
    Cached c;
    c.warm();
    c.h.fx.clear();
    REQUIRE(c.h.ks.apply(9, w.make(c.vals), c.h.fx).isOk());
    CHECK(c.h.ks.replyCacheStats().invalidated == 1);
    CHECK(c.h.ks.replyCacheStats().entries == 0);
    CHECK(c.read(3) == c.expected());
    CHECK(c.h.ks.replyCacheStats().hits == 0);
  }
}

TEST_CASE("ADD and BARRIER of a cached counter drop the cached reply") {
  Cached c;
  c.vals[7] = "41";
  REQUIRE(c.h.run(9, set("k7", "41")).empty());
  // Keep the reply large: the other values are 1 KiB each.
  c.warm();
  CHECK(c.read(3) == c.expected());
  CHECK(c.h.ks.replyCacheStats().hits == 1);
  REQUIRE(c.h.run(9, add("k7", 1)) == expect({{9, i64(42)}}));
  c.vals[7] = "42";
  CHECK(c.h.ks.replyCacheStats().invalidated == 1);
  CHECK(c.read(4) == c.expected());
  c.warm();
  REQUIRE(c.h.run(9, barrier("k7", 100)).empty());  // 43, waits
  c.vals[7] = "43";
  CHECK(c.read(5) == c.expected());
  CHECK(c.h.ks.replyCacheStats().invalidated == 2);
}

TEST_CASE("DELETE_KEY and re-creating a key drop the cached reply") {
  KeyspaceOptions o;
  o.get_missing_returns_empty = true;
  Cached c(o);
  c.warm();
  REQUIRE(c.h.run(9, del("k0")) == expect({{9, i64(1)}}));
  c.vals[0].clear();  // a missing key reads as empty with this option
  CHECK(c.read(3) == c.expected());
  CHECK(c.h.ks.replyCacheStats().hits == 0);
  c.warm();  // cached with k0 missing
  CHECK(c.read(4) == c.expected());
  CHECK(c.h.ks.replyCacheStats().hits == 2);       // warm()'s second read, this
  REQUIRE(c.h.run(9, set("k0", "back")).empty());  // creation is a change
  c.vals[0] = "back";
  CHECK(c.read(5) == c.expected());
  CHECK(c.h.ks.replyCacheStats().hits == 2);
}

TEST_CASE("without the option, a deleted key makes the cached MULTI_GET fail") {
  Cached c;
  c.warm();
  REQUIRE(c.h.run(9, del("k5")) == expect({{9, i64(1)}}));
  CHECK(c.h.apply(3, c.all()).code() == tcpstore::StatusCode::kProtocolError);
  CHECK(c.h.fx.sends().empty());
}

TEST_CASE("writes of other keys keep the cache (no global generation)") {
  Cached c;
  c.warm();
  for (int i = 0; i < 50; ++i) {
    REQUIRE(c.h.run(9, add("init/", 1)) == expect({{9, i64(i + 1)}}));
    REQUIRE(c.h.run(9, set("other", "x")).empty());
    REQUIRE(c.h.run(9, del("gone")) == expect({{9, i64(0)}}));
    REQUIRE(c.read(10 + static_cast<ConnId>(i)) == c.expected());
  }
  CHECK(c.h.ks.replyCacheStats().hits == 50);
  CHECK(c.h.ks.replyCacheStats().invalidated == 0);
}

TEST_CASE("the cache is bounded and counted in memoryBytes()") {
  KeyspaceOptions o;
  o.reply_cache_bytes = 64 * 1024;
  Harness h(o);
  const std::string v(3000, 'x');
  std::vector<std::string> names = keysNamed("key", 64);
  for (const std::string& n : names) REQUIRE(h.run(9, set(n, v)).empty());
  const std::size_t before = h.ks.memoryBytes();
  // 63 distinct pairs, each read three times: each is cached once seen twice.
  for (std::size_t i = 0; i + 1 < names.size(); ++i) {
    const Request r = multiGet({names[i], names[i + 1]});
    for (int rep = 0; rep < 3; ++rep) {
      h.fx.clear();
      REQUIRE(h.ks.apply(1, r, h.fx).isOk());
    }
    const ReplyCacheStats st = h.ks.replyCacheStats();
    CHECK(st.entries <= 32);
    CHECK(h.ks.memoryBytes() > before);
    // Replies and key lists stay under the bound (plus the key index).
    CHECK(h.ks.memoryBytes() - before <= o.reply_cache_bytes + 8 * 1024);
  }
  const ReplyCacheStats st = h.ks.replyCacheStats();
  CHECK(st.inserts == 63);
  CHECK(st.hits == 63);
  CHECK(st.evicted > 0);
  // Dropping every cached reply returns what they were charged (the same
  // value again is a write too).
  for (const std::string& n : names) REQUIRE(h.run(9, set(n, v)).empty());
  CHECK(h.ks.replyCacheStats().entries == 0);
  CHECK(h.ks.memoryBytes() == before);
}

TEST_CASE("a key list longer than kMaxKeys is not cached (bounded writes)") {
  Harness h;
  const std::vector<std::string> names = keysNamed("n", kMaxKeys + 1);
  for (const std::string& n : names) REQUIRE(h.run(9, set(n, "v")).empty());
  std::vector<std::string_view> at_limit = views(names);
  at_limit.pop_back();
  for (int rep = 0; rep < 3; ++rep) {
    REQUIRE(h.apply(1, multiGet(views(names))).isOk());
  }
  CHECK(h.ks.replyCacheStats().inserts == 0);
  for (int rep = 0; rep < 3; ++rep) {
    REQUIRE(h.apply(1, multiGet(at_limit)).isOk());
  }
  CHECK(h.ks.replyCacheStats().inserts == 1);
  CHECK(h.ks.replyCacheStats().hits == 1);
}

TEST_CASE("reply_cache_bytes 0 turns the cache off") {
  KeyspaceOptions o;
  o.reply_cache_bytes = 0;
  Cached c(o);
  for (ConnId conn = 1; conn < 6; ++conn) {
    SharedBytes b;
    CHECK(c.read(conn, &b) == c.expected());
    CHECK(!b);
  }
  CHECK(c.h.ks.replyCacheStats().inserts == 0);
}

// Random requests over few keys and few key lists, against a keyspace
// without the cache: every reply and every error must be the same.
void randomRounds(bool missing_empty, std::uint32_t seed) {
  KeyspaceOptions with;
  with.get_missing_returns_empty = missing_empty;
  with.reply_cache_min_bytes = 16;  // cache nearly every read
  KeyspaceOptions without = with;
  without.reply_cache_bytes = 0;
  Harness a(with), b(without);
  std::mt19937 rng(seed);
  const std::vector<std::string> keys = keysNamed("r", 6);
  std::vector<std::vector<std::string_view>> lists;
  for (int i = 0; i < 8; ++i) {
    std::vector<std::string_view> l;
    const int n = 1 + static_cast<int>(rng() % 4);
    for (int j = 0; j < n; ++j) l.push_back(keys[rng() % keys.size()]);
    lists.push_back(std::move(l));
  }
  std::string val, cur;
  for (int round = 0; round < 4000; ++round) {
    const std::string_view k = keys[rng() % keys.size()];
    val.assign(1 + rng() % 40, static_cast<char>('a' + rng() % 26));
    if (rng() % 3 == 0) val = std::to_string(rng() % 100);
    cur = a.value(k);
    if (cur == "<missing>") cur.clear();
    Request r;
    // About one write in eight requests, so lists are read again between
    // writes of their keys (hits) and also after them (invalidations).
    switch (rng() % 40) {
      case 0:
        r = set(k, val);
        break;
      case 1:
        r = append(k, val);
        break;
      case 2:
        r = add(k, 1);
        break;
      case 3:
        r = del(k);
        break;
      case 4:
        r = cas(k, cur, val);
        break;
      case 5:
      case 6:
      case 7:
      case 8:
        r = get(k);
        break;
      default:
        r = multiGet(lists[rng() % lists.size()]);
        break;
    }
    const ConnId conn = 1 + rng() % 5;
    const tcpstore::Status sa = a.apply(conn, r);
    const tcpstore::Status sb = b.apply(conn, r);
    REQUIRE(sa.code() == sb.code());
    REQUIRE(render(a.fx) == render(b.fx));
  }
  const ReplyCacheStats st = a.ks.replyCacheStats();
  CHECK(st.hits > 100);  // the comparison did exercise cached replies
  CHECK(st.invalidated > 100);
  CHECK(b.ks.replyCacheStats().hits == 0);
}

TEST_CASE("randomized rounds: the cache answers as a keyspace without it") {
  for (std::uint32_t seed = 1; seed <= 5; ++seed) {
    CAPTURE(seed);
    randomRounds(true, seed);
    randomRounds(false, seed);
  }
}

}  // namespace
