#include "store/relay/upstream_connect.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string_view>

#include "protocol/mux.h"

namespace tcpstore::store::relay {

namespace {

using Clock = std::chrono::steady_clock;

int msLeft(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                        deadline - Clock::now())
                        .count();
  return left <= 0 ? 0 : static_cast<int>(left > 60000 ? 60000 : left);
}

// Waits for `events` on fd until the deadline; false on timeout.
bool waitFor(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, msLeft(deadline));
    if (r > 0) return true;
    if (r == 0) return false;
    if (errno != EINTR) return false;
  }
}

std::string where(const std::string& host, std::uint16_t port) {
  return host.find(':') != std::string::npos
             ? "[" + host + "]:" + std::to_string(port)
             : host + ":" + std::to_string(port);
}

// Connects one address; returns the fd or -1 with `why` set.
int connectOne(const addrinfo* ai, Clock::time_point deadline,
               std::string& why) {
  const int fd =
      ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
               ai->ai_protocol);
  if (fd < 0) {
    why = std::strerror(errno);
    return -1;
  }
  if (::connect(fd, ai->ai_addr, ai->ai_addrlen) != 0 && errno != EINPROGRESS) {
    why = std::strerror(errno);
    ::close(fd);
    return -1;
  }
  if (!waitFor(fd, POLLOUT, deadline)) {
    why = "timed out";
    ::close(fd);
    return -1;
  }
  int err = 0;
  socklen_t len = sizeof err;
  ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
  if (err != 0) {
    why = std::strerror(err);
    ::close(fd);
    return -1;
  }
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

}  // namespace

std::string notRelayCapable(const std::string& host, std::uint16_t port) {
  return "upstream " + where(host, port) +
         " does not speak the tcpstore relay extension (is it a torch "
         "server?)";
}

Result<int> connectUpstream(const std::string& host, std::uint16_t port,
                            std::uint64_t timeout_ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  const int gai = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &res);
  if (gai != 0) {
    return Status::refused("cannot resolve upstream " + where(host, port) +
                           ": " + ::gai_strerror(gai));
  }
  std::string why = "no address";
  int fd = -1;
  for (const addrinfo* ai = res; ai != nullptr && fd < 0; ai = ai->ai_next) {
    fd = connectOne(ai, deadline, why);
  }
  ::freeaddrinfo(res);
  if (fd < 0) {
    const std::string msg =
        "cannot connect to upstream " + where(host, port) + ": " + why;
    return why == "timed out" ? Status::timeout(msg) : Status::refused(msg);
  }
  // Preamble out, echo back.
  const std::string_view pre = protocol::mux::kMuxPreamble;
  std::size_t sent = 0;
  while (sent < pre.size()) {
    const ssize_t n =
        ::send(fd, pre.data() + sent, pre.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<std::size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      if (!waitFor(fd, POLLOUT, deadline)) break;
    } else {
      break;
    }
  }
  char echo[8];
  std::size_t got = 0;
  while (sent == pre.size() && got < sizeof echo) {
    const ssize_t n = ::recv(fd, echo + got, sizeof echo - got, 0);
    if (n > 0) {
      got += static_cast<std::size_t>(n);
      if (std::memcmp(echo, pre.data(), got) != 0) break;
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      if (!waitFor(fd, POLLIN, deadline)) break;
    } else {
      break;  // closed (a torch server) or reset
    }
  }
  if (got == sizeof echo && std::memcmp(echo, pre.data(), got) == 0) return fd;
  ::close(fd);
  return Status::protocolError(notRelayCapable(host, port));
}

}  // namespace tcpstore::store::relay
