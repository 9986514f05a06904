// Counts the bytes requested from the global operator new inside a window, so
// a test can assert that the decoder reserved nothing for an absurd length.
// The replacement operators live in alloc_counter.cc (their own translation
// unit, so no call site sees new and delete inlined together).
#pragma once

#include <cstddef>

namespace tcpstore::test {

void startCountingAllocations() noexcept;
// Stops counting; returns the bytes requested since the start.
std::size_t stopCountingAllocations() noexcept;

class AllocationWindow {
 public:
  AllocationWindow() noexcept { startCountingAllocations(); }
  ~AllocationWindow() { stopCountingAllocations(); }
  AllocationWindow(const AllocationWindow&) = delete;
  AllocationWindow& operator=(const AllocationWindow&) = delete;
  std::size_t stop() noexcept { return stopCountingAllocations(); }
};

}  // namespace tcpstore::test
