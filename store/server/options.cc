#include "store/server/options.h"

#include <fmt/format.h>

#include <algorithm>

namespace tcpstore::server {

protocol::Limits protocolLimits(const ServerLimits& l) noexcept {
  protocol::Limits p;
  p.max_key_bytes = l.max_key_bytes;
  p.max_value_bytes = l.max_value_bytes;
  p.max_keys_per_request = l.max_keys_per_request;
  p.max_request_bytes = l.max_request_bytes;
  p.max_buffered_output_bytes = l.max_buffered_output_bytes;
  return p;
}

OutputLimits outputLimits(const ServerLimits& l) noexcept {
  OutputLimits o;
  o.cap = l.max_buffered_output_bytes;
  o.total_budget = l.max_total_output_bytes;
  o.stall_ms = l.stalled_reader_ms;
  return o;
}

store::KeyspaceOptions keyspaceOptions(const ServerOptions& o) noexcept {
  store::KeyspaceOptions ko;
  ko.compare_set_wakes = o.compare_set_wakes;
  ko.get_missing_returns_empty = false;
  ko.max_value_bytes = o.limits.max_value_bytes;
  const std::uint64_t cap = o.limits.max_buffered_output_bytes;
  const std::uint64_t two_caps = cap > UINT64_MAX / 2 ? UINT64_MAX : 2 * cap;
  const std::uint64_t one_value = o.limits.max_value_bytes > UINT64_MAX - 8
                                      ? UINT64_MAX
                                      : o.limits.max_value_bytes + 8;
  ko.max_reply_bytes = std::max(two_caps, one_value);
  // The reply cache is charged to the memory budget with the keyspace: at
  // most 1/32 of it, so cached replies never crowd out stored data.
  if (o.limits.max_memory_bytes > 0) {
    ko.reply_cache_bytes =
        std::min(ko.reply_cache_bytes, o.limits.max_memory_bytes / 32);
  }
  return ko;
}

Result<LogLevel> checkOptions(const ServerOptions& o) {
  auto lvl = parseLogLevel(o.log_level);
  if (!lvl) {
    return Status::invalidArgument(
        fmt::format("unknown log level '{}' (use error, warn, info or debug)",
                    o.log_level));
  }
  if (o.limits.max_buffered_output_bytes == 0) {
    return Status::invalidArgument("max_buffered_output_bytes must be > 0");
  }
  return *lvl;
}

}  // namespace tcpstore::server
