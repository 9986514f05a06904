// Steady-state apply() of SET/GET/ADD on existing keys must not allocate
// (keyspace.h / the task's memory budget). Counts global operator new calls
// in a window; the replacement covers the whole test binary but only counts
// while `counting` is set.
#include <doctest/doctest.h>

#include <cstdlib>
#include <new>
#include <string>

#include "store/keyspace.h"
#include "test_util.h"

namespace {
bool counting = false;
std::size_t allocations = 0;
}  // namespace

void* operator new(std::size_t n) {
  if (counting) ++allocations;
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return ::operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

namespace tcpstore::store::testing {
namespace {

TEST_CASE("SET/GET/ADD of existing keys do not allocate in steady state") {
  Harness h;
  const std::string key(96, 'k');
  const std::string counter = "/counter";
  const std::string v1(12, 'a');
  const std::string v2(40, 'b');  // heap-allocated value, capacity then reused
  // warm up: create keys, grow value capacities, grow Effects buffers
  for (int i = 0; i < 3; ++i) {
    REQUIRE(h.apply(1, set(key, v2)).isOk());
    REQUIRE(h.apply(1, get(key)).isOk());
    REQUIRE(h.apply(1, add(counter, 1)).isOk());
    REQUIRE(h.apply(1, set(key, v1)).isOk());
  }
  REQUIRE(h.apply(2, waitKeys({"/elsewhere"}))
              .isOk());  // waiters exist, not on these keys
  allocations = 0;
  counting = true;
  for (int i = 0; i < 1000; ++i) {
    h.fx.clear();
    (void)h.ks.apply(1, set(key, (i % 2) != 0 ? v1 : v2), h.fx);
    h.fx.clear();
    (void)h.ks.apply(1, get(key), h.fx);
    h.fx.clear();
    (void)h.ks.apply(1, add(counter, 1), h.fx);
  }
  counting = false;
  CHECK(allocations == 0);
  CHECK(h.value(counter) == "1003");
}

}  // namespace
}  // namespace tcpstore::store::testing
