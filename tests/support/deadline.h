// Deadlines for the tests. Every in-test deadline goes through scaled(), so
// TCPSTORE_TEST_TIMEOUT_MULTIPLIER (sanitizer builds; ctest's TIMEOUT reads it
// too) stretches all of them. eventually() waits for an observable event
// (a counter, a state) with a deadline: never a fixed sleep.
#pragma once

#include <chrono>
#include <cstdlib>
#include <thread>

namespace tcpstore::test {

using Clock = std::chrono::steady_clock;

// TCPSTORE_TEST_TIMEOUT_MULTIPLIER, at least 1.
inline int timeoutMultiplier() {
  const char* m = std::getenv("TCPSTORE_TEST_TIMEOUT_MULTIPLIER");
  const int v = m ? std::atoi(m) : 1;
  return v > 0 ? v : 1;
}

// A test deadline, stretched by the multiplier.
inline std::chrono::milliseconds scaled(std::chrono::milliseconds d) {
  return d * timeoutMultiplier();
}

// Polls `pred` until it holds or scaled(limit) has passed; returns its last
// value. The poll interval is only the granularity of the check: the result
// never depends on it.
template <typename Pred>
bool eventually(Pred pred,
                std::chrono::milliseconds limit = std::chrono::seconds(10)) {
  const auto end = Clock::now() + scaled(limit);
  for (;;) {
    if (pred()) return true;
    if (Clock::now() >= end) return pred();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

}  // namespace tcpstore::test
