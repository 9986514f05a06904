#include "conform/conn.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace tcpstore::conform {
namespace {

int msLeft(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<Ms>(deadline - Clock::now()).count();
  return left < 0 ? 0 : static_cast<int>(left);
}

}  // namespace

Conn::~Conn() { close(); }

Conn::Conn(Conn&& o) noexcept { *this = std::move(o); }

Conn& Conn::operator=(Conn&& o) noexcept {
  if (this != &o) {
    close();
    fd_ = std::exchange(o.fd_, -1);
    in_ = std::move(o.in_);
    error_ = std::move(o.error_);
    peer_closed_ = std::exchange(o.peer_closed_, false);
  }
  return *this;
}

void Conn::close() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  in_.clear();
  peer_closed_ = false;
}

bool Conn::connect(const std::string& host, std::uint16_t port, Ms timeout) {
  close();
  auto deadline = Clock::now() + timeout;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_family = AF_UNSPEC;
  addrinfo* res = nullptr;
  std::string service = std::to_string(port);
  int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0) {
    error_ = std::string("cannot resolve ") + host + ": " + gai_strerror(rc);
    return false;
  }
  error_ = "no address";
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    int fd =
        ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                 a->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    rc = ::connect(fd, a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      rc = ::poll(&p, 1, msLeft(deadline)) == 1 ? 0 : -1;
      if (rc != 0) errno = ETIMEDOUT;
      int err = 0;
      socklen_t len = sizeof(err);
      if (rc == 0 && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 &&
          err != 0) {
        errno = err;
        rc = -1;
      }
    }
    if (rc == 0) {
      fd_ = fd;
      error_.clear();
      break;
    }
    error_ = std::string("connect: ") + std::strerror(errno);
    ::close(fd);
  }
  ::freeaddrinfo(res);
  return fd_ >= 0;
}

bool Conn::send(std::string_view bytes, Ms timeout) {
  if (fd_ < 0) return false;
  auto deadline = Clock::now() + timeout;
  while (!bytes.empty()) {
    ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n > 0) {
      bytes.remove_prefix(static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd_, POLLOUT, 0};
      if (::poll(&p, 1, msLeft(deadline)) != 1) {
        error_ = "send: deadline passed (server not reading)";
        return false;
      }
      continue;
    }
    error_ = std::string("send: ") + std::strerror(errno);
    return false;
  }
  return true;
}

RecvStatus Conn::recvSome(Clock::time_point deadline) {
  if (fd_ < 0 || peer_closed_) return RecvStatus::kClosed;
  for (;;) {
    char buf[16384];
    ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
    if (n > 0) {
      in_.append(buf, static_cast<std::size_t>(n));
      return RecvStatus::kData;
    }
    if (n == 0) {
      peer_closed_ = true;
      return RecvStatus::kClosed;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      peer_closed_ = true;  // reset: the server dropped us
      return RecvStatus::kClosed;
    }
    pollfd p{fd_, POLLIN, 0};
    int left = msLeft(deadline);
    if (left == 0 || ::poll(&p, 1, left) == 0) return RecvStatus::kTimeout;
  }
}

RecvStatus Conn::fill(std::size_t n, Clock::time_point deadline) {
  while (in_.size() < n) {
    RecvStatus s = recvSome(deadline);
    if (s != RecvStatus::kData) return s;
  }
  return RecvStatus::kData;
}

std::string Conn::take(std::size_t n) {
  std::string out = in_.substr(0, n);
  in_.erase(0, n);
  return out;
}

bool Conn::quiet(Ms window) {
  if (!in_.empty()) return false;
  return recvSome(Clock::now() + window) == RecvStatus::kTimeout;
}

bool Conn::closesSilently(Ms window, std::string* extra) {
  auto deadline = Clock::now() + window;
  for (;;) {
    RecvStatus s = recvSome(deadline);
    if (s == RecvStatus::kTimeout) {
      if (extra) *extra = in_;
      return false;
    }
    if (s == RecvStatus::kClosed) {
      if (extra) *extra = in_;
      return in_.empty();
    }
  }
}

std::uint16_t pickFreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::uint16_t port = 0;
  socklen_t len = sizeof(a);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  ::close(fd);
  return port;
}

}  // namespace tcpstore::conform
