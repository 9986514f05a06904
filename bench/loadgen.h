// The event loop of tcpstore-bench: thousands of non-blocking TCP client
// connections in one thread (epoll, edge-triggered), each with an output
// buffer, an input buffer and a queue of replies it expects. Requests are
// encoded and replies decoded with tcpstore::protocol.
//
// Not a library for production use: errors are counted and reported, never
// thrown; everything is bounded by the caller's deadline.
#pragma once

#include <netinet/in.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <queue>
#include <string>
#include <string_view>
#include <vector>

#include "protocol/codec.h"

namespace tcpstore::bench {

std::int64_t nowNs() noexcept;

// "HOST:PORT" (IPv4 literal or [IPv6]) to a socket address.
struct Endpoint {
  sockaddr_storage addr{};
  socklen_t len = 0;
  bool ipv4 = false;
  std::string text;
};
bool parseEndpoint(std::string_view s, Endpoint& out, std::string& error);

// Raises RLIMIT_NOFILE's soft limit to the hard limit; returns the new soft
// limit.
std::uint64_t raiseFdLimit();

// Forks a loopback server for a floor measurement: binds 127.0.0.1 (port 0
// first unless `below_ephemeral`; then random ports in 20000-31999, below the
// ephemeral range the generator binds explicit ports in), listens, and runs
// serve(listening fd) in a child that dies with this process. Sets `ep` to
// its address. Returns the child's pid, or -1 (nothing left running).
int forkLoopbackServer(Endpoint& ep, bool below_ephemeral,
                       void (*serve)(int listen_fd));

// Pins this process (children forked later inherit it) and, with pid > 0,
// every thread of that process to one CPU; the destructor restores the old
// masks. Used for latency runs: on this VM a round trip between two vCPUs is
// bimodal (an idle vCPU's wake-up costs tens of microseconds), so client and
// server share one CPU for a stable comparison.
class CpuPin {
 public:
  CpuPin(int cpu, int pid);
  ~CpuPin();
  CpuPin(const CpuPin&) = delete;
  CpuPin& operator=(const CpuPin&) = delete;
  int pinnedThreads() const noexcept { return static_cast<int>(saved_.size()); }

 private:
  struct Saved;
  std::vector<std::unique_ptr<Saved>> saved_;
};

// Server process figures from /proc.
double processCpuSeconds(
    int pid);  // utime + stime (all threads); < 0 if unreadable
std::int64_t processRssBytes(int pid);  // VmRSS; < 0 if unreadable
double selfCpuSeconds();
// A TcpExt counter of /proc/net/netstat (e.g. "ListenOverflows"); -1 if absent.
std::int64_t tcpExtCounter(
    std::string_view name);  // this process (the load generator), user + system

// One reply a connection expects, in order.
struct Pending {
  protocol::ReplyShape shape = protocol::ReplyShape::kNone;
  std::uint32_t raw_len = 0;  // > 0: expect exactly raw_len opaque bytes (echo)
  std::uint32_t tag = 0;      // the caller's own label
  std::uint64_t count = 0;    // kStrings: number of strings
  std::int64_t sent_ns = 0;
};

class Conn;

class ConnHandler {
 public:
  virtual ~ConnHandler() = default;
  virtual void onConnected(Conn& c) = 0;
  virtual void onReply(Conn& c, const Pending& p, const protocol::Reply& r) = 0;
  // True: a kStrings reply (MULTI_GET) is not buffered whole; each value goes
  // to onValue as soon as it has arrived, and onReply then gets a reply with
  // no values and `number` = the count. 16K ranks that each await a 100 KiB
  // MULTI_GET reply at once would otherwise hold 1.6 GB in this process.
  virtual bool streamsValues() const { return false; }
  virtual void onValue(Conn& c, const Pending& p, std::string_view value) {
    (void)c, (void)p, (void)value;
  }
  // The connection failed or was closed by the peer. `established` tells
  // whether the TCP connect had completed. The Conn is already closed.
  virtual void onClosed(Conn& c, int err, bool established) = 0;
};

class Loop;

class Conn {
 public:
  std::uint64_t user = 0;  // the handler's own label
  bool open() const noexcept { return fd_ >= 0; }
  bool established() const noexcept { return fd_ >= 0 && !connecting_; }
  std::size_t pendingCount() const noexcept { return pending_.size(); }

 private:
  friend class Loop;
  int fd_ = -1;
  bool connecting_ = false;
  bool dirty_ = false;
  ConnHandler* handler_ = nullptr;
  std::string out_;
  std::size_t out_off_ = 0;
  std::string in_;  // the front reply's bytes not decoded yet
  // Of the front reply: raw bytes consumed, or values streamed (onValue).
  std::uint64_t front_done_ = 0;
  std::deque<Pending> pending_;
};

class TimerHandler {
 public:
  virtual ~TimerHandler() = default;
  virtual void onTimer(std::uint64_t arg) = 0;
};

struct LoopStats {
  std::uint64_t requests_sent = 0;
  std::uint64_t replies = 0;
  std::uint64_t connects_started = 0;
  std::uint64_t connect_errors = 0;  // connect() failed (refused, timeout, ...)
  std::uint64_t closed_by_peer = 0;  // EOF/reset on an established connection
  std::uint64_t protocol_errors = 0;  // unexpected or undecodable reply bytes
  std::uint64_t src_retries =
      0;  // EADDRNOTAVAIL: source port taken, next one tried
};

class Loop {
 public:
  Loop();
  ~Loop();
  Loop(const Loop&) = delete;
  Loop& operator=(const Loop&) = delete;

  // Starts a non-blocking connect. Returns nullptr (and counts a connect
  // error) if the socket could not even be created.
  Conn* connect(const Endpoint& ep, ConnHandler* h, std::uint64_t user);
  // Queues a request; it is written at the end of this loop iteration.
  void send(Conn& c, protocol::Dialect d, const protocol::Request& req,
            std::uint32_t tag, std::uint64_t count = 0);
  // Queues opaque bytes expecting `expect_len` bytes back (echo).
  void sendRaw(Conn& c, std::string_view bytes, std::uint32_t expect_len,
               std::uint32_t tag);
  void close(Conn& c);
  void addTimer(std::int64_t when_ns, TimerHandler* h, std::uint64_t arg);

  // Waits up to `max_wait_ns` for events, processes them and due timers,
  // then flushes queued output.
  void runOnce(std::int64_t max_wait_ns);

  const LoopStats& stats() const noexcept { return stats_; }
  std::size_t openConns() const noexcept { return open_; }
  // Spread source addresses over 127.S.x.y (S random) from the start.
  // How client sockets pick their source address/port (IPv4 only).
  enum class SourceMode {
    kKernel,  // the kernel's ephemeral port choice
    kPorts,   // the destination's address, explicit round-robin ports
    kAddrs,   // 127.S.x.y source addresses (S random), kernel-chosen ports
  };
  void setSourceMode(SourceMode m) noexcept { source_mode_ = m; }
  // SO_RCVBUF of every client socket opened later (0: the kernel's
  // autotuning). Bounds the kernel memory a slow reader of many large
  // replies pins on one machine.
  void setRecvBuffer(int bytes) noexcept { rcvbuf_ = bytes; }

 private:
  struct Timer {
    std::int64_t when;
    std::uint64_t seq;
    TimerHandler* h;
    std::uint64_t arg;
    bool operator>(const Timer& o) const noexcept {
      return when != o.when ? when > o.when : seq > o.seq;
    }
  };
  void handleEvent(Conn& c, std::uint32_t events);
  void readAll(Conn& c);
  // Decodes replies of `c` from `in` (its buffered bytes, or a fresh read
  // when none are); returns the bytes used. `c` may be closed on return.
  std::size_t decode(Conn& c, std::string_view in);
  // A connection's buffer above this is released once empty.
  static constexpr std::size_t kKeepBufferBytes = 4096;
  void flush(Conn& c);
  void fail(Conn& c, int err);
  void markDirty(Conn& c);
  int openSocket(const Endpoint& ep, int& err);

  int epfd_ = -1;
  std::vector<std::unique_ptr<Conn>> conns_;
  std::vector<Conn*> dirty_;
  std::priority_queue<Timer, std::vector<Timer>, std::greater<Timer>> timers_;
  std::uint64_t timer_seq_ = 0;
  LoopStats stats_;
  std::size_t open_ = 0;
  SourceMode source_mode_ = SourceMode::kKernel;
  int rcvbuf_ = 0;
  std::uint32_t source_next_ = 0;
  std::uint32_t port_lo_ = 32768, port_hi_ = 60999;
  std::uint8_t spread_octet_ = 1;
  protocol::Limits limits_;
  protocol::Reply reply_;
  std::vector<char> scratch_;
  std::string encode_buf_;
};

// Percentile (0..100) of an unsorted sample; sorts it. 0 if empty.
double percentile(std::vector<std::int64_t>& v, double pct);

// Minimal JSON object writer (flat or nested via raw values).
class JsonObject {
 public:
  JsonObject& num(std::string_view k, double v);
  JsonObject& integer(std::string_view k, std::int64_t v);
  JsonObject& str(std::string_view k, std::string_view v);
  JsonObject& boolean(std::string_view k, bool v);
  JsonObject& raw(std::string_view k, std::string_view json);
  std::string text() const;

 private:
  std::string body_;
};
bool writeFile(const std::string& path, const std::string& text);

}  // namespace tcpstore::bench
