// BoundPort: a socket bound to 127.0.0.1:0 but not listening, for tests
// that need a port nobody else can take (connects to it are refused) or a
// listen socket to hand to ServerOptions::listen_fd.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>

namespace tcpstore::test {

// A socket bound to 127.0.0.1:0 but not listening: connects to its port are
// refused, and no other socket (a parallel test's server) can take the port.
// release() hands the fd over (e.g. to ServerOptions::listen_fd).
class BoundPort {
 public:
  BoundPort() {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0)
      return;
    socklen_t len = sizeof(a);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
  }
  ~BoundPort() {
    if (fd_ >= 0) ::close(fd_);
  }
  BoundPort(const BoundPort&) = delete;
  BoundPort& operator=(const BoundPort&) = delete;
  std::uint16_t port() const { return port_; }
  // Pins the send buffer of every connection the server accepts on this
  // socket (accepted sockets inherit it): what the kernel holds for a peer
  // that does not read no longer depends on the machine's autotuning.
  bool pinSendBuffer(int bytes) {
    return ::setsockopt(fd_, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes) == 0;
  }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_ = -1;
  std::uint16_t port_ = 0;
};

}  // namespace tcpstore::test
