// Servers and clients whose socket buffers are pinned small.
//
// Back-pressure and socket I/O tests must not depend on how much the kernel
// buffers for a peer that does not read (loopback autotuning lets
// tcp_rmem/tcp_wmem grow to tens of MiB on some machines). These pin both
// ends: the server's send buffer through an adopted listen socket (accepted
// sockets inherit it) and the client's receive buffer before connect. The
// kernel then holds some tens of KiB per connection, far below the replies
// these tests queue, and every large reply takes many writable events.
#pragma once

#include <doctest/doctest.h>

#include "tcpstore/server.h"
#include "tests/server/raw_client.h"
#include "tests/support/bound_port.h"
#include "tests/support/scoped_server.h"

namespace tcpstore::test {

inline constexpr int kPinnedBuffer = 16 * 1024;

// An in-process server listening on a socket with a pinned send buffer.
inline ScopedServer startPinned(tcpstore::ServerOptions o = {}) {
  BoundPort listen;
  REQUIRE(listen.port() != 0);
  REQUIRE(listen.pinSendBuffer(kPinnedBuffer));
  o.port = listen.port();
  o.listen_fd = listen.release();
  return ScopedServer::local(o);
}

// A 2.x connection (handshake done) whose receive buffer is pinned.
inline RawConn pinned2(const tcpstore::Server& s) {
  RawConn c = RawConn::connect(s.port(), "127.0.0.1", kPinnedBuffer);
  REQUIRE(c.ok());
  REQUIRE(c.handshake());
  return c;
}

}  // namespace tcpstore::test
