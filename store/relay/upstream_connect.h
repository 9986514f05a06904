// Blocking connect to a relay's upstream, for the start of a relay only
// (Backend::open() runs on the starting thread before the loop exists):
// resolve, connect, send kMuxPreamble and read it back, all within one
// deadline. Reconnects are asynchronous (upstream_link.h).
#pragma once

#include <cstdint>
#include <string>

#include "tcpstore/status.h"

namespace tcpstore::store::relay {

// Returns a connected, non-blocking socket whose peer echoed the preamble.
// Errors: kRefused (cannot resolve or connect: names host:port and why),
// kTimeout (no connection within timeout_ms), kProtocolError (connected,
// but the peer closed or sent other bytes: it does not speak the relay
// extension; the message says so, and that it may be a torch server).
Result<int> connectUpstream(const std::string& host, std::uint16_t port,
                            std::uint64_t timeout_ms);

// The log line for an upstream that does not speak the extension.
std::string notRelayCapable(const std::string& host, std::uint16_t port);

}  // namespace tcpstore::store::relay
