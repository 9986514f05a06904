// Budget: the server-wide memory policy, as pure functions of byte counts.
// The connection and dispatch code report what they hold and ask; this file
// decides. No sockets, no loop.
//
// One budget (`max_bytes`, --max-memory-bytes) covers:
//  - input: the buffers of connections holding part of a large request,
//    and mux channels (mux_session.h: kChannelBytes each, plus the requests
//    queued behind a pending one);
//  - output: unsent bytes of every connection (replies and pushes);
//  - backend: stored keys, values, queues, wait/watch registrations.
//
// Decisions, each with its own counter (counters.h):
//  - refuse a request whose result would take the total past the budget
//    (a SET/APPEND/MULTI_SET/QUEUE_PUSH storing, a WAIT registering, a
//    MULTI_GET/LIST_KEYS/GET reply): the connection is closed with a log
//    line. Requests larger than kLargeRequestBytes are refused already past
//    the soft line (15/16 of the budget), and so are the replies of any size
//    to a connection whose unsent output is already larger (a client that
//    does not read), so the last sixteenth stays for clients of normal size,
//    whose small requests are refused only at the budget itself;
//  - stop reading a connection whose partial request needs a buffer of its
//    own (over kLargeRequestBytes) while the total is past the soft line;
//    it reads again once the total is back under 7/8 (or is closed by
//    --partial-request-ms if that never happens);
//  - past the budget, drop the connections that stopped reading (a write is
//    pending) holding the most unsent output, largest first, until the total
//    is back under it. A client that reads its replies is never dropped.
#pragma once

#include <cstddef>
#include <cstdint>

#include "protocol/message.h"

namespace tcpstore::server {

// Requests (and partial inputs) above this are "large": refused or paused
// first, before clients of normal size.
inline constexpr std::size_t kLargeRequestBytes = 64 * 1024;

struct MemoryUse {
  std::uint64_t input = 0;    // input buffers, mux channels and their queues
  std::uint64_t output = 0;   // unsent bytes, all connections
  std::uint64_t backend = 0;  // Backend::memoryBytes()
  std::uint64_t total() const noexcept { return input + output + backend; }
};

class MemoryBudget {
 public:
  // max_bytes 0: no budget (every question answers "fine").
  explicit MemoryBudget(std::uint64_t max_bytes) noexcept : max_(max_bytes) {}
  std::uint64_t max() const noexcept { return max_; }
  std::uint64_t softLine() const noexcept { return max_ - max_ / 16; }
  std::uint64_t resumeLine() const noexcept { return max_ - max_ / 8; }

  // A request whose result adds `extra` bytes (see estimateBytes()) when the
  // server holds `use`: true if it must be refused. `large` judges it as a
  // large request whatever its size (a reply to a client already behind).
  bool refuse(const MemoryUse& use, std::uint64_t extra,
              bool large = false) const noexcept;
  // A connection about to grow its own input buffer by `growth` bytes to
  // hold a partial request of `partial` bytes: true if it must stop reading
  // instead.
  bool pauseInput(const MemoryUse& use, std::size_t partial,
                  std::size_t growth) const noexcept;
  // Input paused by pauseInput() may read again.
  bool mayResumeInput(const MemoryUse& use) const noexcept;
  // Past the budget: the largest non-reading connections must be dropped.
  bool overBudget(const MemoryUse& use) const noexcept;

 private:
  std::uint64_t max_;
};

// Bytes the result of `req` would add to the server's memory before it is
// applied (known after decoding): stored keys and values, registrations per
// waited key, or 0 when the cost depends on stored values (GET, MULTI_GET,
// LIST_KEYS: judged on the built reply) or is small and fixed.
std::uint64_t estimateBytes(const protocol::Request& req) noexcept;

// Per-key cost of a WAIT registration, and of a stored entry, beyond its
// key and value bytes (an upper estimate of the keyspace's structures).
inline constexpr std::uint64_t kWaitKeyOverhead = 96;
inline constexpr std::uint64_t kEntryOverhead = 64;

}  // namespace tcpstore::server
