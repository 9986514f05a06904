#include "store/server/counters.h"

#include <fmt/format.h>

#include <cctype>

namespace tcpstore::server {

static_assert(ServerCounters::kCommands ==
              static_cast<int>(protocol::kCommandCount));

namespace {
std::uint64_t get(const Counter& a) noexcept {
  return a.load(std::memory_order_relaxed);
}
}  // namespace

Counter& Counters::forDecodeError(protocol::DecodeErrorCode code) noexcept {
  using protocol::DecodeErrorCode;
  switch (code) {
    case DecodeErrorCode::kKeyTooLong:
    case DecodeErrorCode::kValueTooLong:
    case DecodeErrorCode::kTooManyKeys:
    case DecodeErrorCode::kRequestTooLarge:
      return rejected_limit;
    default:
      return rejected_protocol;
  }
}

ServerCounters Counters::snapshot() const noexcept {
  ServerCounters c;
  for (int i = 0; i < ServerCounters::kCommands; ++i)
    c.requests[i] = get(requests[i]);
  c.requests_total = get(requests_total);
  c.connections_accepted = get(connections_accepted);
  c.connections_closed = get(connections_closed);
  c.connections_open = c.connections_accepted >= c.connections_closed
                           ? c.connections_accepted - c.connections_closed
                           : 0;
  c.connections_v113 = get(connections_v113);
  c.connections_v2 = get(connections_v2);
  c.rejected_protocol = get(rejected_protocol);
  c.rejected_limit = get(rejected_limit);
  c.rejected_semantic = get(rejected_semantic);
  c.rejected_slow_reader = get(rejected_slow_reader);
  c.rejected_partial_timeout = get(rejected_partial_timeout);
  c.rejected_peer_gone = get(rejected_peer_gone);
  c.turn_yields = get(turn_yields);
  c.max_turn_cpu_us = get(max_turn_cpu_us);
  c.budget_refused = get(budget_refused);
  c.budget_dropped = get(budget_dropped);
  c.budget_input_paused = get(budget_input_paused);
  c.memory_bytes = get(memory_bytes);
  c.accept_errors = get(accept_errors);
  c.connections_shed = get(connections_shed);
  c.bytes_in = get(bytes_in);
  c.bytes_out = get(bytes_out);
  c.mux_connections = get(mux_connections);
  c.mux_channels_opened = get(mux_channels_opened);
  c.mux_channels_closed = get(mux_channels_closed);
  c.mux_channels_open = c.mux_channels_opened >= c.mux_channels_closed
                            ? c.mux_channels_opened - c.mux_channels_closed
                            : 0;
  c.mux_channels_refused = get(mux_channels_refused);
  c.shared_replies = get(shared_replies);
  return c;
}

std::string countersLine(const ServerCounters& c) {
  std::string out = fmt::format("requests total={}", c.requests_total);
  for (int i = 0; i < ServerCounters::kCommands; ++i) {
    if (c.requests[i] == 0) continue;
    std::string name(protocol::commandName(static_cast<protocol::Command>(i)));
    for (char& ch : name)
      ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    out += fmt::format(" {}={}", name, c.requests[i]);
  }
  out += fmt::format(
      " | conns accepted={} closed={} open={} v1.13={} v2={} | rejected "
      "protocol={} limit={} semantic={} slow_reader={} partial_timeout={} "
      "peer_gone={} | accept_errors={} shed={} turn_yields={} "
      "max_turn_cpu_us={} | bytes in={} out={}",
      c.connections_accepted, c.connections_closed, c.connections_open,
      c.connections_v113, c.connections_v2, c.rejected_protocol,
      c.rejected_limit, c.rejected_semantic, c.rejected_slow_reader,
      c.rejected_partial_timeout, c.rejected_peer_gone, c.accept_errors,
      c.connections_shed, c.turn_yields, c.max_turn_cpu_us, c.bytes_in,
      c.bytes_out);
  out += fmt::format(
      " | budget refused={} dropped={} input_paused={} memory_bytes={}",
      c.budget_refused, c.budget_dropped, c.budget_input_paused,
      c.memory_bytes);
  out += fmt::format(
      " | mux conns={} channels opened={} closed={} open={} refused={}"
      " | shared_replies={}",
      c.mux_connections, c.mux_channels_opened, c.mux_channels_closed,
      c.mux_channels_open, c.mux_channels_refused, c.shared_replies);
  return out;
}

}  // namespace tcpstore::server
