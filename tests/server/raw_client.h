// A tiny raw-socket test client for the server tests: blocking sockets, every
// receive bounded by a poll() deadline. Deliberately independent of
// tcpstore::client (the tests must be able to send anything, including
// garbage).
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

#include "tests/support/deadline.h"
#include "tests/support/hex.h"

namespace tcpstore::test {

// ---- wire building blocks (little-endian, docs/protocol.md §1.2) ---------------
inline std::string u32le(std::uint32_t v) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}
inline std::string u64le(std::uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}
inline std::string i64le(std::int64_t v) {
  return u64le(static_cast<std::uint64_t>(v));
}
inline std::string str(std::string_view s) {
  return u64le(s.size()) + std::string(s);
}
inline std::string byte(std::uint8_t b) {
  return std::string(1, static_cast<char>(b));
}
inline std::uint64_t loadU64le(std::string_view s, std::size_t at = 0) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i)
    v = (v << 8) | static_cast<unsigned char>(s[at + i]);
  return v;
}
// 1.13 command codes (Dialect A) and 2.x codes (Dialect B).
namespace v113 {
inline constexpr std::uint8_t kSet = 0x00, kCompareSet = 0x01, kGet = 0x02,
                              kAdd = 0x03, kCheck = 0x04, kWait = 0x05,
                              kGetNumKeys = 0x06, kWatchKey = 0x07,
                              kDeleteKey = 0x08;
}
namespace v2 {
inline constexpr std::uint8_t kValidate = 0x00, kSet = 0x01, kCompareSet = 0x02,
                              kGet = 0x03, kAdd = 0x04, kCheck = 0x05,
                              kWait = 0x06, kGetNumKeys = 0x07,
                              kDeleteKey = 0x08, kAppend = 0x09,
                              kMultiGet = 0x0a, kMultiSet = 0x0b,
                              kCancelWait = 0x0c, kPing = 0x0d,
                              kQueuePush = 0x0e, kQueuePop = 0x0f,
                              kQueueLen = 0x10, kListKeys = 0x11,
                              kBarrier = 0x12;
}
inline std::string validateMsg() {
  return byte(v2::kValidate) + u32le(0x3C85F7CE);
}
inline std::string pingMsg(std::uint32_t nonce) {
  return byte(v2::kPing) + u32le(nonce);
}
inline std::string keysMsg(std::uint8_t code,
                           std::initializer_list<std::string_view> keys) {
  std::string m = byte(code) + u64le(keys.size());
  for (auto k : keys) m += str(k);
  return m;
}

class RawConn {
 public:
  RawConn() = default;
  explicit RawConn(int fd) : fd_(fd) {}
  RawConn(RawConn&& o) noexcept
      : fd_(std::exchange(o.fd_, -1)),
        closed_(o.closed_),
        abortive_(o.abortive_) {}
  RawConn& operator=(RawConn&& o) noexcept {
    if (this != &o) {
      close();
      fd_ = std::exchange(o.fd_, -1);
      closed_ = o.closed_;
      abortive_ = o.abortive_;
    }
    return *this;
  }
  ~RawConn() { close(); }

  // Connects to 127.0.0.1:port (blocking connect). !ok() on failure.
  // recv_buffer > 0 pins SO_RCVBUF before connect, so the window this socket
  // offers stays small whatever the machine's autotuning (tcp_rmem) allows.
  static RawConn connect(std::uint16_t port, const char* ip = "127.0.0.1",
                         int recv_buffer = 0) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return RawConn();
    if (recv_buffer > 0 && ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &recv_buffer,
                                        sizeof recv_buffer) != 0) {
      ::close(fd);
      return RawConn();
    }
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(port);
    ::inet_pton(AF_INET, ip, &sa.sin_addr);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
      ::close(fd);
      return RawConn();
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return RawConn(fd);
  }

  bool ok() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  void close() {
    if (fd_ >= 0) {
      if (abortive_) {
        linger l{1, 0};
        ::setsockopt(fd_, SOL_SOCKET, SO_LINGER, &l, sizeof l);
      }
      ::close(fd_);
    }
    fd_ = -1;
  }
  // close() resets the connection instead of a FIN: no TIME_WAIT left behind
  // (tests that open thousands of connections share the ephemeral ports).
  void setAbortiveClose() { abortive_ = true; }
  void shutdownWrite() { ::shutdown(fd_, SHUT_WR); }

  // Sends everything; false on error (e.g. the server already closed).
  bool send(std::string_view bytes) {
    while (!bytes.empty()) {
      ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      bytes.remove_prefix(static_cast<std::size_t>(n));
    }
    return true;
  }

  // Receives exactly n bytes unless EOF/error/deadline comes first; returns
  // what arrived. closed() tells whether EOF or reset was seen.
  std::string recv(std::size_t n, std::chrono::milliseconds timeout =
                                      scaled(std::chrono::seconds(5))) {
    std::string out;
    auto deadline = std::chrono::steady_clock::now() + timeout;
    char buf[65536];
    while (out.size() < n) {
      if (!waitReadable(deadline)) break;
      std::size_t want = std::min(sizeof buf, n - out.size());
      ssize_t r = ::recv(fd_, buf, want, 0);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        closed_ = true;
        break;
      }
      out.append(buf, static_cast<std::size_t>(r));
    }
    return out;
  }

  // Reads until the peer closes (EOF or reset) or the deadline passes.
  // Returns true if the connection was closed; `got` receives any bytes.
  bool waitClosed(
      std::string* got = nullptr,
      std::chrono::milliseconds timeout = scaled(std::chrono::seconds(5))) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    char buf[65536];
    for (;;) {
      if (!waitReadable(deadline)) return false;
      ssize_t r = ::recv(fd_, buf, sizeof buf, 0);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        closed_ = true;
        return true;
      }
      if (got) got->append(buf, static_cast<std::size_t>(r));
    }
  }

  bool closed() const { return closed_; }

  // 2.x handshake: VALIDATE + PING, checks the echoed nonce.
  bool handshake(std::uint32_t nonce = 4242) {
    if (!send(validateMsg()) || !send(pingMsg(nonce))) return false;
    return recv(4) == u32le(nonce);
  }

 private:
  bool waitReadable(std::chrono::steady_clock::time_point deadline) {
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                      deadline - std::chrono::steady_clock::now())
                      .count();
      if (left < 0) left = 0;
      pollfd p{fd_, POLLIN, 0};
      int r = ::poll(&p, 1, static_cast<int>(left));
      if (r > 0) return true;
      if (r == 0) return false;
      if (errno != EINTR) return false;
    }
  }

  int fd_ = -1;
  bool closed_ = false;
  bool abortive_ = false;
};

// Fences: a round trip on the same connection. The server answers a
// connection's requests in order and writes every byte it owes that
// connection (a STOP_WAITING, a watch notification) in the order it produced
// them, so when the fence's reply arrives first and intact, nothing was sent
// to this connection before the server read the fence: this proves absence
// (and that the server has processed every earlier request on it) without a
// timer.
//
// 2.x: PING with a nonce whose bytes no other reply starts with.
inline bool pingFence(RawConn& c) {
  constexpr std::uint32_t kNonce = 0xC0DEFE4Cu;
  return c.send(pingMsg(kNonce)) && c.recv(4) == u32le(kNonce);
}
// 1.13 (no PING): CHECK of a key no test sets; the reply is one NOT_READY
// byte (0x01), which a stray STOP_WAITING (0x00) cannot be mistaken for. On a
// connection that may get watch notifications use numKeys(), whose 8-byte
// reply tells them apart.
inline bool checkFence(RawConn& c) {
  return c.send(keysMsg(v113::kCheck, {"/tcpstore-test-fence"})) &&
         c.recv(1) == byte(0x01);
}

}  // namespace tcpstore::test
