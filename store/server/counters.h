// Counters: the server's statistics. Written by the loop thread only, read
// from any thread (Server::counters()).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "protocol/codec.h"
#include "tcpstore/server.h"

namespace tcpstore::server {

using Counter = std::atomic<std::uint64_t>;

// Single writer (the loop thread), any number of readers: a relaxed load and
// store is race-free and costs a plain move on x86-64 and arm64.
inline void bump(Counter& a, std::uint64_t n = 1) noexcept {
  a.store(a.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
}

struct Counters {
  Counter requests[ServerCounters::kCommands] = {};
  Counter requests_total{0};
  Counter connections_accepted{0};
  Counter connections_closed{0};
  Counter connections_v113{0};
  Counter connections_v2{0};
  Counter rejected_protocol{0};
  Counter rejected_limit{0};
  Counter rejected_semantic{0};
  Counter rejected_slow_reader{0};
  Counter rejected_partial_timeout{0};
  Counter rejected_peer_gone{0};
  Counter turn_yields{0};
  Counter max_turn_cpu_us{0};  // a gauge
  Counter budget_refused{0};
  Counter budget_dropped{0};
  Counter budget_input_paused{0};
  Counter memory_bytes{0};  // a gauge, stored each loop turn
  Counter accept_errors{0};
  Counter connections_shed{0};
  Counter bytes_in{0};
  Counter bytes_out{0};
  Counter mux_connections{0};
  Counter mux_channels_opened{0};
  Counter mux_channels_closed{0};
  Counter mux_channels_refused{0};
  Counter shared_replies{0};

  // One request of `cmd` was decoded.
  void countRequest(protocol::Command cmd) noexcept {
    auto i = static_cast<std::size_t>(cmd);
    if (i < protocol::kCommandCount) bump(requests[i]);
    bump(requests_total);
  }
  // The counter a decode error is charged to (limit or protocol).
  Counter& forDecodeError(protocol::DecodeErrorCode code) noexcept;
  // The counter a failed request is charged to (limit or semantic).
  Counter& forRejectedRequest(const Status& st) noexcept {
    return st.code() == StatusCode::kLimitExceeded ? rejected_limit
                                                   : rejected_semantic;
  }

  ServerCounters snapshot() const noexcept;
};

// "requests total=3 set=1 ... | conns accepted=... | rejected ... | bytes ..."
std::string countersLine(const ServerCounters& c);

}  // namespace tcpstore::server
