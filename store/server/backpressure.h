// Backpressure: the output policy, as pure functions of byte counts and
// times. The connection code asks; this file decides. No sockets, no loop.
//
//  - A connection whose unsent replies pass `cap` is paused (its reads and
//    its decoding stop) until they drain to cap/2.
//  - Past 2 x cap while the kernel takes nothing more (a write is pending),
//    it is dropped as a slow reader. Replies are judged only after a write
//    attempt, so one large reply to a reading client is never mistaken for a
//    slow reader.
//  - A push the receiver did not ask for (STOP_WAITING, a watch notification)
//    that would take the server's unsent output past `total_budget` drops the
//    receiver if it is behind (would hold over kBehindBytes unsent). An idle
//    waiter always gets its byte.
//  - A paused connection whose output takes no byte for `stall_ms` is
//    dropped (0: never). Progress is seen as the bytes the kernel has not
//    taken yet (the connection waits for writability) shrinking.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tcpstore::server {

// Under the server-wide budget, a receiver holding more than this many
// unsent bytes (with the new push) counts as behind.
inline constexpr std::size_t kBehindBytes = 4096;

struct OutputLimits {
  std::uint64_t cap = 0;  // per connection, paused above, dropped at 2x
  std::uint64_t total_budget = 0;  // all connections, for unrequested pushes
  std::uint64_t stall_ms = 0;      // paused without progress; 0: never
};

// True: the receiver of an unrequested push of `bytes` must be dropped
// instead (server holds `total` unsent bytes, the receiver `conn`).
bool dropUnrequestedPush(const OutputLimits& l, std::uint64_t total,
                         std::size_t conn, std::size_t bytes) noexcept;

enum class CapAction { kNone, kPause, kDrop };

// What to do with a connection holding `out` unsent bytes (`writing`: a
// write waits for writability, the kernel took all it would; `paused`:
// already).
CapAction judgeOutput(const OutputLimits& l, std::size_t out, bool writing,
                      bool paused) noexcept;

// A paused connection holding `out` unsent bytes may read again.
bool mayResume(const OutputLimits& l, std::size_t out) noexcept;

// How often paused connections are checked for a stall (ms, > 0).
std::uint64_t stallCheckEveryMs(std::uint64_t stall_ms) noexcept;

// How often connections are checked for a partial request without progress
// (ms, > 0): a quarter of `partial_ms` within [5 ms, 5 s] (60 s if 0).
std::uint64_t partialSweepEveryMs(std::uint64_t partial_ms) noexcept;

// Stall bookkeeping of one paused connection.
class StallClock {
 public:
  // The connection was paused at `now`. The first check() records the
  // write queue size it sees.
  void start(std::uint64_t now) noexcept {
    progress_ms_ = now;
    queue_ = kUnknown;
  }
  // Bytes were handed to the kernel at `now`.
  void progressed(std::uint64_t now) noexcept { progress_ms_ = now; }
  // A periodic check at `now` seeing `queued` bytes the kernel has not
  // taken yet.
  // Returns true once no progress was seen for `stall_ms` (> 0).
  bool stalled(std::uint64_t now, std::size_t queued,
               std::uint64_t stall_ms) noexcept;
  // Milliseconds since the last progress.
  std::uint64_t idleMs(std::uint64_t now) const noexcept {
    return now - progress_ms_;
  }

 private:
  static constexpr std::size_t kUnknown = SIZE_MAX;
  std::uint64_t progress_ms_ = 0;
  std::size_t queue_ = kUnknown;
};

}  // namespace tcpstore::server
