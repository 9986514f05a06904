// The measuring side of `tcpstore-bench abuse`: a blocking client socket with
// deadlines (for attackers that misbehave on purpose and for the setup
// connection), the honest probe client (its own thread and connection, 2.x
// dialect, a verified SET+GET round trip every ~1.5 ms) and a sampler of the
// server's RSS. Not a library for production use.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "bench/loadgen.h"
#include "protocol/codec.h"

namespace tcpstore::bench::abuse {

// The 2.x wire bytes of `req` (appended to `out`).
void encode2(const protocol::Request& req, std::string& out);
std::string encode2(const protocol::Request& req);

// One TCP connection to the server. Blocking calls take an absolute deadline
// (nowNs() clock) and return false when it passes, the peer closes, or an
// error occurs. Move-only; the destructor closes.
class RawSock {
 public:
  RawSock() = default;
  ~RawSock() { close(); }
  RawSock(RawSock&& o) noexcept;
  RawSock& operator=(RawSock&& o) noexcept;
  RawSock(const RawSock&) = delete;
  RawSock& operator=(const RawSock&) = delete;

  // Connects (blocking, bounded by `deadline`). `rcvbuf` > 0 pins the
  // receive buffer before the connect (a small window for non-readers).
  // `handshake`: the 2.x VALIDATE + PING, its nonce checked.
  static RawSock connect(const Endpoint& ep, std::int64_t deadline,
                         bool handshake, int rcvbuf = 0);
  bool ok() const noexcept { return fd_ >= 0; }
  int fd() const noexcept { return fd_; }

  bool sendAll(std::string_view bytes, std::int64_t deadline);
  // Non-blocking: the bytes the kernel takes now (0 if none); -1 if the
  // connection failed or the peer closed it.
  long sendSome(std::string_view bytes);
  // Reads one reply of `shape`; `out`'s views live until the next call.
  bool recvReply(protocol::ReplyShape shape, protocol::Reply& out,
                 std::int64_t deadline);
  // PING with a nonce, and its echo: every request sent before it was
  // processed.
  bool fence(std::int64_t deadline);
  // True once the server closed (FIN or reset seen), without reading.
  bool peerClosed() const;
  // Reads (and keeps in `got`, if given) until the server closes; false if
  // the deadline passes first.
  bool waitClosed(std::int64_t deadline, std::string* got = nullptr);
  void close() noexcept;

 private:
  bool fill(std::int64_t deadline);  // at least one more byte into in_
  int fd_ = -1;
  std::string in_;
  std::size_t in_off_ = 0;
  std::uint32_t nonce_ = 1;
};

inline constexpr int kMaxPhases = 16;

// Reads the server's RSS every few milliseconds in its own thread and keeps
// the peak of each phase (setPhase). pid 0: every figure is -1. Also keeps
// each phase's longest oversleep of that thread (asked for 5 ms): the
// machine's own scheduling delay, beside which a probe stall is judged.
class RssSampler {
 public:
  explicit RssSampler(int pid);
  ~RssSampler();
  RssSampler(const RssSampler&) = delete;
  RssSampler& operator=(const RssSampler&) = delete;
  std::int64_t now() const;  // RSS right now, bytes
  void setPhase(int phase);  // also records now() as the phase's first sample
  std::int64_t peak(int phase) const { return peak_[phase].load(); }
  double lagMs(int phase) const {
    return static_cast<double>(lag_[phase].load()) / 1e6;
  }

 private:
  void note(std::int64_t rss);
  int fd_ = -1;
  std::atomic<int> phase_{0};
  std::array<std::atomic<std::int64_t>, kMaxPhases> peak_{};
  std::array<std::atomic<std::int64_t>, kMaxPhases> lag_{};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

struct ProbeStats {
  std::uint64_t round_trips = 0;
  double p50_ms = 0, p99_ms = 0, max_ms = 0;
  std::int64_t max_at_ns = 0;     // when the slowest round trip was sent
  std::uint64_t data_errors = 0;  // a GET returned other bytes than stored
  std::uint64_t lost = 0;         // round trips that failed (closed, timed out)
};

// The honest client. Every round trip: SET k[j] (a fresh value), GET k[j]
// (must return it) and GET k[j+1] (must return what the probe stored there
// earlier), pipelined on one 2.x connection; its latency is attributed to
// the phase current when it was sent. A lost connection is counted and
// reopened.
class Probe {
 public:
  Probe(const Endpoint& ep, std::string key_prefix, double interval_ms,
        double timeout_s);
  ~Probe();
  Probe(const Probe&) = delete;
  Probe& operator=(const Probe&) = delete;
  bool start(std::string& error);  // connects, then runs in its own thread
  void setPhase(int phase) { phase_.store(phase); }
  void stop();  // joins; stats() are final afterwards
  ProbeStats stats(int phase) const;
  std::uint64_t dataErrors() const;
  std::uint64_t lost() const;

 private:
  static constexpr int kKeys = 32;
  struct Sample {
    int phase;
    std::int64_t at;  // sent (nowNs clock)
    std::int64_t ns;  // round trip
  };
  void run();
  bool roundTrip(std::uint64_t n);
  bool reconnect();

  Endpoint ep_;
  std::string prefix_;
  std::int64_t interval_ns_;
  std::int64_t timeout_ns_;
  RawSock sock_;
  std::array<std::string, kKeys> keys_;
  std::array<std::string, kKeys> expected_;  // empty: unknown
  std::string msg_;
  std::string value_;
  protocol::Reply reply_;
  std::vector<Sample> samples_;
  std::array<std::uint64_t, kMaxPhases> data_errors_{};
  std::array<std::uint64_t, kMaxPhases> lost_{};
  std::atomic<int> phase_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace tcpstore::bench::abuse
