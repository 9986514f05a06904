// Read-only access to raw (unmapped) keys, for tcpstore-cli's views of keys
// that tcpstore::Client cannot name: torch's "init/" worker counter is sent
// without the leading '/' every Client key gets.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "tcpstore/client.h"
#include "tcpstore/status.h"

namespace tcpstore::cli {

// One short-lived connection to host:port in `dialect` (2.x: VALIDATE first),
// then CHECK [key] and, if it exists, GET key. Never writes. Returns nullopt
// for a missing key. Every step has `timeout` as its deadline (kTimeout);
// connect failures are kRefused/kIoError, bad reply bytes kProtocolError.
Result<std::optional<std::string>> readRawKey(
    const std::string& host, std::uint16_t port, Dialect dialect,
    std::string_view key, std::chrono::milliseconds timeout);

}  // namespace tcpstore::cli
