// Starting a Server over a chosen Backend (internal: not in include/).
//
// tcpstore::Server::start() serves from memory (store::MemoryBackend).
// Programs that serve the same protocol from another state holder (a relay
// to an upstream tcpstore-server, an etcd-backed gateway) start it here.
#pragma once

#include <memory>

#include "store/backend.h"
#include "tcpstore/server.h"

namespace tcpstore::server {

// As Server::start(options), over `backend` (not null). The backend is
// opened on the starting thread before the socket is bound (its open()
// error fails the start) and is used from the loop thread only from then
// on; it is closed during stop() and destroyed with the Server. With
// options.multi_tenant and a live server on the port, returns that server
// and drops `backend` unopened.
Result<std::shared_ptr<Server>> startServer(
    const ServerOptions& options, std::unique_ptr<store::Backend> backend);

}  // namespace tcpstore::server
