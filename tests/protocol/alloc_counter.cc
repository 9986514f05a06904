#include "tests/protocol/alloc_counter.h"

#include <atomic>
#include <cstdlib>
#include <new>

namespace {
std::atomic<bool> g_counting{false};
std::atomic<std::size_t> g_allocated{0};
}  // namespace

namespace tcpstore::test {
void startCountingAllocations() noexcept {
  g_allocated.store(0);
  g_counting.store(true);
}
std::size_t stopCountingAllocations() noexcept {
  g_counting.store(false);
  return g_allocated.load();
}
}  // namespace tcpstore::test

void* operator new(std::size_t n) {
  if (g_counting.load(std::memory_order_relaxed)) {
    g_allocated.fetch_add(n, std::memory_order_relaxed);
  }
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
