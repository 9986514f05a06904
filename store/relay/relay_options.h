// RelayOptions: what a relay (tcpstore-server --upstream HOST:PORT) needs to
// reach its upstream, and the counters it keeps. docs/relay.md, "Relay side".
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "protocol/limits.h"
#include "tcpstore/status.h"

namespace tcpstore::store::relay {

// Levels as server::LogLevel (0 error, 1 warn, 2 info, 3 debug).
enum class RelayLog : int { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

struct RelayOptions {
  // The upstream tcpstore-server (or relay): a name or address, and a port.
  std::string host;
  std::uint16_t port = 0;
  // Start: connect and get the preamble echoed within this, else open()
  // fails. Reconnects: one attempt (resolve, connect, echo) gets this long.
  std::uint64_t connect_timeout_ms = 5000;
  // Reconnect delays: doubling from min to max, each scaled by a random
  // factor in [0.5, 1] (jitter: relays of a job do not reconnect in step).
  std::uint64_t backoff_min_ms = 50;
  std::uint64_t backoff_max_ms = 2000;
  // Limits for decoding the upstream's replies (the relay's own server
  // limits; a reply past them only stops combining for that client).
  protocol::Limits limits;
  // Largest frame payload accepted from the upstream (checked at the frame
  // header, before anything is buffered for it).
  std::uint64_t max_frame_bytes = 300ull * 1024 * 1024;
  // Combine concurrent ADDs and coalesce identical GET/CHECK/MULTI_GET.
  bool combine = true;
  // With `combine`: identical WAITs of idle clients share one upstream WAIT.
  bool share_waits = true;
  // Log sink (loop thread or the starting thread); null: silent.
  std::function<void(RelayLog, std::string_view)> log;
};

// Parses "HOST:PORT" ("[::1]:29500" for IPv6 literals). kInvalidArgument
// with a message naming the problem.
Status parseUpstream(std::string_view spec, RelayOptions& out);

// Statistics; written by the loop thread, read from any thread.
struct RelayCounters {
  std::atomic<std::uint64_t> tunneled{
      0};  // requests sent on a client's channel
  std::atomic<std::uint64_t> combined{0};   // ADDs answered from a combined ADD
  std::atomic<std::uint64_t> coalesced{0};  // reads answered from a shared read
  std::atomic<std::uint64_t> upstream_adds{0};   // combined ADDs sent upstream
  std::atomic<std::uint64_t> upstream_reads{0};  // shared reads sent upstream
  std::atomic<std::uint64_t> shared_waits{0};    // WAITs taken into a group
  std::atomic<std::uint64_t> upstream_waits{0};  // shared WAITs sent upstream
  std::atomic<std::uint64_t> reconnects{0};      // upstream connections re-made
  std::atomic<std::uint64_t> losses{0};          // upstream connections lost
  std::atomic<std::uint64_t> refused{0};         // requests refused while down
};

inline void bumpRelay(std::atomic<std::uint64_t>& c,
                      std::uint64_t n = 1) noexcept {
  c.store(c.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
}

}  // namespace tcpstore::store::relay
