// A raw TCP connection to the server under test, with a deadline on every
// operation. The conformance tool judges a server only through bytes on
// sockets like this one: nothing here knows the protocol.
//
// Threads: one Conn is used by one thread. Errors are reported, never thrown,
// except by the *OrThrow helpers used inside checks (they throw CheckFailure).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tcpstore::conform {

using Clock = std::chrono::steady_clock;
using Ms = std::chrono::milliseconds;

// What a bounded receive saw.
enum class RecvStatus { kData, kClosed, kTimeout };

class Conn {
 public:
  Conn() = default;
  ~Conn();
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;
  Conn(Conn&& o) noexcept;
  Conn& operator=(Conn&& o) noexcept;

  // Connects to host:port (IPv4 or IPv6 literal or name) within `timeout`.
  // Returns false (with error() set) on failure.
  bool connect(const std::string& host, std::uint16_t port, Ms timeout);
  bool open() const noexcept { return fd_ >= 0; }
  void close() noexcept;
  const std::string& error() const noexcept { return error_; }

  // Writes all of `bytes` within `timeout`; false if the peer closed (EPIPE,
  // reset) or the deadline passed.
  bool send(std::string_view bytes, Ms timeout);

  // Waits until at least one more byte is buffered, the peer closes, or the
  // deadline; appends what arrived to buffer().
  RecvStatus recvSome(Clock::time_point deadline);
  // Waits until buffer() holds `n` bytes (kData), or reports why not.
  RecvStatus fill(std::size_t n, Clock::time_point deadline);
  // Bytes received and not yet consumed.
  std::string& buffer() noexcept { return in_; }
  std::string take(std::size_t n);

  // Nothing arrives and the peer does not close for `window` (buffer empty).
  bool quiet(Ms window);
  // The peer closes within `window` without sending anything more; `extra`
  // receives whatever did arrive before the close or the deadline.
  bool closesSilently(Ms window, std::string* extra = nullptr);

 private:
  int fd_ = -1;
  std::string in_;
  std::string error_;
  bool peer_closed_ = false;
};

// Picks a currently free TCP port on 127.0.0.1 (bind to 0, read, close).
std::uint16_t pickFreePort();

}  // namespace tcpstore::conform
