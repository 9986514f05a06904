#include "store/server/net.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <unistd.h>
#include <uv.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

namespace tcpstore::server {

std::string formatSockaddr(const sockaddr* sa) {
  char host[INET6_ADDRSTRLEN] = "?";
  if (sa->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    uv_ip4_name(in, host, sizeof host);
    return fmt::format("{}:{}", host, ntohs(in->sin_port));
  }
  if (sa->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    uv_ip6_name(in6, host, sizeof host);
    return fmt::format("[{}]:{}", host, ntohs(in6->sin6_port));
  }
  return "?";
}

std::uint16_t sockaddrPort(const sockaddr* sa) noexcept {
  if (sa->sa_family == AF_INET)
    return ntohs(reinterpret_cast<const sockaddr_in*>(sa)->sin_port);
  if (sa->sa_family == AF_INET6)
    return ntohs(reinterpret_cast<const sockaddr_in6*>(sa)->sin6_port);
  return 0;
}

std::string errnoText(int err) {
  return fmt::format("{} ({})", std::strerror(err), err);
}

namespace {

int listenBacklog() {
  int backlog = 4096;
  if (std::FILE* f = std::fopen("/proc/sys/net/core/somaxconn", "r")) {
    int v = 0;
    if (std::fscanf(f, "%d", &v) == 1 && v > 0) backlog = v;
    std::fclose(f);
  }
  return backlog;
}

// socket + SO_REUSEADDR (+ IPV6_V6ONLY off) + bind + listen. Returns the fd or
// -errno.
int makeListenSocket(const sockaddr* sa, socklen_t len, int backlog) {
  int fd =
      ::socket(sa->sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -errno;
  int one = 1;
  (void)::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (sa->sa_family == AF_INET6) {
    int zero = 0;
    (void)::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
  }
  if (::bind(fd, sa, len) != 0 || ::listen(fd, backlog) != 0) {
    int err = errno;
    ::close(fd);
    return -err;
  }
  return fd;
}

// `fd` is bound and listening: make it non-blocking and read its address.
// Closes `fd` on error.
Result<ListenSocket> finish(int fd) {
  int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) {
    Status st = Status::ioError(fmt::format(
        "cannot make fd {} non-blocking: {}", fd, errnoText(errno)));
    ::close(fd);
    return st;
  }
  (void)::fcntl(fd, F_SETFD, FD_CLOEXEC);
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
    Status st =
        Status::ioError(fmt::format("getsockname: {}", errnoText(errno)));
    ::close(fd);
    return st;
  }
  ListenSocket ls;
  ls.fd = fd;
  ls.port = sockaddrPort(reinterpret_cast<sockaddr*>(&ss));
  ls.address = formatSockaddr(reinterpret_cast<sockaddr*>(&ss));
  return ls;
}

Result<ListenSocket> adopt(int fd, std::uint16_t port, int backlog) {
  int type = 0;
  socklen_t tlen = sizeof type;
  if (::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tlen) != 0) {
    return Status::invalidArgument(
        fmt::format("listen fd {} is not a socket: {}", fd, errnoText(errno)));
  }
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (type != SOCK_STREAM ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0 ||
      (ss.ss_family != AF_INET && ss.ss_family != AF_INET6)) {
    return Status::invalidArgument(
        fmt::format("listen fd {} is not a TCP socket", fd));
  }
  std::uint16_t bound = sockaddrPort(reinterpret_cast<sockaddr*>(&ss));
  if (bound == 0) {
    return Status::invalidArgument(
        fmt::format("listen fd {} is not bound to a port", fd));
  }
  if (port != 0 && port != bound) {
    return Status::invalidArgument(fmt::format(
        "listen fd {} is bound to port {}, expected to be bound to port {}", fd,
        bound, port));
  }
  if (::listen(fd, backlog) != 0) {
    return Status::ioError(
        fmt::format("listen on fd {}: {}", fd, errnoText(errno)));
  }
  return finish(fd);
}

struct Candidate {
  sockaddr_storage ss{};
  socklen_t len = 0;
};

Result<std::vector<Candidate>> candidatesFor(const std::string& host_arg,
                                             std::uint16_t port) {
  std::vector<Candidate> out;
  if (host_arg.empty()) {
    Candidate c6;
    uv_ip6_addr("::", port, reinterpret_cast<sockaddr_in6*>(&c6.ss));
    c6.len = sizeof(sockaddr_in6);
    out.push_back(c6);
    Candidate c4;
    uv_ip4_addr("0.0.0.0", port, reinterpret_cast<sockaddr_in*>(&c4.ss));
    c4.len = sizeof(sockaddr_in);
    out.push_back(c4);
    return out;
  }
  std::string host = host_arg;
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  Candidate c;
  if (uv_ip4_addr(host.c_str(), port, reinterpret_cast<sockaddr_in*>(&c.ss)) ==
      0) {
    c.len = sizeof(sockaddr_in);
    out.push_back(c);
    return out;
  }
  if (uv_ip6_addr(host.c_str(), port, reinterpret_cast<sockaddr_in6*>(&c.ss)) ==
      0) {
    c.len = sizeof(sockaddr_in6);
    out.push_back(c);
    return out;
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int gai = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (gai != 0) {
    return Status::ioError(fmt::format("cannot resolve host '{}': {}", host_arg,
                                       gai_strerror(gai)));
  }
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    if (ai->ai_family != AF_INET && ai->ai_family != AF_INET6) continue;
    Candidate r;
    std::memcpy(&r.ss, ai->ai_addr, ai->ai_addrlen);
    r.len = ai->ai_addrlen;
    if (ai->ai_family == AF_INET) {
      reinterpret_cast<sockaddr_in*>(&r.ss)->sin_port = htons(port);
    } else {
      reinterpret_cast<sockaddr_in6*>(&r.ss)->sin6_port = htons(port);
    }
    out.push_back(r);
  }
  ::freeaddrinfo(res);
  if (out.empty()) {
    return Status::ioError(
        fmt::format("host '{}' has no IPv4/IPv6 address", host_arg));
  }
  return out;
}

}  // namespace

Result<ListenSocket> openListenSocket(const std::string& host,
                                      std::uint16_t port, int listen_fd,
                                      const Logger& log) {
  const int backlog = listenBacklog();
  if (listen_fd >= 0) return adopt(listen_fd, port, backlog);
  auto candidates = candidatesFor(host, port);
  if (!candidates) return candidates.error();
  std::string failures;
  bool in_use = false;
  for (const Candidate& c : *candidates) {
    const auto* sa = reinterpret_cast<const sockaddr*>(&c.ss);
    int fd = makeListenSocket(sa, c.len, backlog);
    if (fd >= 0) return finish(fd);
    if (-fd == EADDRINUSE) in_use = true;
    if (!failures.empty()) failures += "; ";
    failures += fmt::format("{}: {}", formatSockaddr(sa), errnoText(-fd));
    log.log(LogLevel::kDebug, fmt::format("bind {} failed: {}",
                                          formatSockaddr(sa), errnoText(-fd)));
  }
  if (in_use) {
    return Status::ioError(
        fmt::format("port {} is already in use ({})", port, failures));
  }
  return Status::ioError(fmt::format("cannot bind/listen: {}", failures));
}

}  // namespace tcpstore::server
