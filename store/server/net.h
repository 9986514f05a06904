// Socket helpers of the server: address text, the listen backlog, and the
// listening socket itself (bound here, or adopted from the caller).
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <string>

#include "store/server/log.h"
#include "tcpstore/status.h"

namespace tcpstore::server {

// "127.0.0.1:29500", "[::1]:29500", or "?".
std::string formatSockaddr(const sockaddr* sa);
// The port of an AF_INET/AF_INET6 address (0 otherwise).
std::uint16_t sockaddrPort(const sockaddr* sa) noexcept;
// "Connection refused (111)".
std::string errnoText(int err);

// A listening, non-blocking, close-on-exec TCP socket and its address.
struct ListenSocket {
  int fd = -1;
  std::uint16_t port = 0;
  std::string address;  // as formatSockaddr() prints it
};

// With listen_fd >= 0: adopts that bound TCP socket (checked: a stream
// socket of AF_INET/AF_INET6, bound to `port` unless port is 0) and listens
// on it. Otherwise binds `host` (empty: "::" dual-stack, then "0.0.0.0"; a
// literal address, "[v6]", or a name, each resolved address tried in turn)
// on `port`. The backlog is net.core.somaxconn. Errors: kInvalidArgument for
// a bad fd, kIoError for a failed resolve/bind/listen ("port P is already in
// use" first when any candidate was). On success the caller owns `fd` (an
// adopted fd too: it is closed with the listener).
Result<ListenSocket> openListenSocket(const std::string& host,
                                      std::uint16_t port, int listen_fd,
                                      const Logger& log);

}  // namespace tcpstore::server
