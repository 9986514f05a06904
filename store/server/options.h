// ServerOptions -> what each part of the server needs. The defaults live in
// one place, include/tcpstore/server.h (ServerLimits, ServerOptions).
#pragma once

#include "protocol/limits.h"
#include "store/keyspace.h"
#include "store/server/backpressure.h"
#include "store/server/log.h"
#include "tcpstore/server.h"

namespace tcpstore::server {

// The decoder's limits.
protocol::Limits protocolLimits(const ServerLimits& l) noexcept;
// The output policy's limits.
OutputLimits outputLimits(const ServerLimits& l) noexcept;
// The in-memory keyspace's options: GET of a missing key closes (like every
// real server), and no reply is built that could never be delivered (over
// twice the output cap, but at least one value and its length).
store::KeyspaceOptions keyspaceOptions(const ServerOptions& o) noexcept;
// The log level, or kInvalidArgument for a bad level or a zero output cap.
Result<LogLevel> checkOptions(const ServerOptions& o);

}  // namespace tcpstore::server
