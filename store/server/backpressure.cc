#include "store/server/backpressure.h"

#include <algorithm>

namespace tcpstore::server {

bool dropUnrequestedPush(const OutputLimits& l, std::uint64_t total,
                         std::size_t conn, std::size_t bytes) noexcept {
  return total + bytes > l.total_budget && conn + bytes > kBehindBytes;
}

CapAction judgeOutput(const OutputLimits& l, std::size_t out, bool writing,
                      bool paused) noexcept {
  const std::uint64_t two_caps =
      l.cap > UINT64_MAX / 2 ? UINT64_MAX : 2 * l.cap;
  if (out > two_caps && writing) return CapAction::kDrop;
  if (out > l.cap && !paused) return CapAction::kPause;
  return CapAction::kNone;
}

bool mayResume(const OutputLimits& l, std::size_t out) noexcept {
  return out <= l.cap / 2;
}

std::uint64_t stallCheckEveryMs(std::uint64_t stall_ms) noexcept {
  return std::clamp<std::uint64_t>(stall_ms / 4, 1, 1000);
}

std::uint64_t partialSweepEveryMs(std::uint64_t partial_ms) noexcept {
  if (partial_ms == 0) partial_ms = 60000;
  return std::clamp<std::uint64_t>(partial_ms / 4, 5, 5000);
}

bool StallClock::stalled(std::uint64_t now, std::size_t queued,
                         std::uint64_t stall_ms) noexcept {
  if (queued < queue_) {
    if (queue_ != kUnknown) progress_ms_ = now;
    queue_ = queued;
  }
  return now - progress_ms_ >= stall_ms;
}

}  // namespace tcpstore::server
