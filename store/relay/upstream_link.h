// UpstreamLink: the relay's one TCP connection to its upstream, on the
// server's loop. Frames out (buffered, written by flush()), frames in
// (decoded and handed to the LinkHandler), and when the connection is lost:
// reconnect with exponential backoff and jitter, each attempt resolving the
// name again, connecting and checking the preamble echo within
// connect_timeout_ms.
//
// Lifecycle: open() adopts a socket connectUpstream() already handshook;
// close() closes every handle (each freed in its close callback) and stops
// reconnecting. Loop thread only (open() also before the loop runs).
#pragma once

#include <uv.h>

#include <cstdint>
#include <random>
#include <string>

#include "protocol/mux.h"
#include "store/relay/relay_options.h"
#include "tcpstore/status.h"

namespace tcpstore::store::relay {

class LinkHandler {
 public:
  // A frame from the upstream; its payload is valid during the call only.
  // Returns false if the frame breaks a channel rule (the link is dropped).
  virtual bool onFrame(const protocol::mux::Frame& f) = 0;
  // Every frame of one read has been handed on.
  virtual void onReadDone() = 0;
  // The connection is gone (`why`); every channel with it. A reconnect is
  // scheduled; frames appended meanwhile are discarded.
  virtual void onLinkDown(const Status& why) = 0;
  // A new connection completed its handshake (after onLinkDown()).
  virtual void onLinkUp() = 0;

 protected:
  ~LinkHandler() = default;
};

class UpstreamLink {
 public:
  UpstreamLink(const RelayOptions& options, LinkHandler& handler,
               RelayCounters& counters);
  ~UpstreamLink();
  UpstreamLink(const UpstreamLink&) = delete;
  UpstreamLink& operator=(const UpstreamLink&) = delete;

  // Starts serving the handshaken socket `fd` on `loop` (owned from here).
  Status open(uv_loop_t* loop, int fd);
  bool up() const noexcept { return state_ == State::kUp; }
  // Connections made since open() (0 while the first one lasts).
  std::uint64_t generation() const noexcept { return generation_; }

  // Frames go here; written by the next flush(). Discarded while down.
  std::string& out() noexcept { return out_; }
  // Starts writing what out() holds (one write in flight at a time).
  void flush() noexcept;
  // Bytes appended or being written and not yet taken by the kernel.
  std::size_t backlog() const noexcept { return out_.size() + writing_; }
  // Drops the connection now (a broken channel rule): onLinkDown follows.
  void drop(const Status& why) noexcept;
  // Shutdown: closes every handle; no callback into the handler follows.
  void close() noexcept;

  std::string name() const;

 private:
  enum class State {
    kUp,
    kWaiting,
    kResolving,
    kConnecting,
    kHandshake,
    kClosed
  };
  struct Tcp;    // a uv_tcp_t and its link
  struct Write;  // a uv_write_t and its bytes

  static void onAlloc(uv_handle_t* h, std::size_t, uv_buf_t* buf) noexcept;
  static void onRead(uv_stream_t* s, ssize_t nread,
                     const uv_buf_t* buf) noexcept;
  static void onWritten(uv_write_t* req, int status) noexcept;
  static void onTcpClosed(uv_handle_t* h) noexcept;
  static void onTimer(uv_timer_t* t) noexcept;
  static void onTimerClosed(uv_handle_t* h) noexcept;
  static void onResolved(uv_getaddrinfo_t* req, int status,
                         addrinfo* res) noexcept;
  static void onConnected(uv_connect_t* req, int status) noexcept;

  Status adopt(int fd);
  void startReading() noexcept;
  void lose(const Status& why) noexcept;              // up -> waiting (reports)
  void failAttempt(const std::string& why) noexcept;  // attempt -> waiting
  void closeTcp() noexcept;
  void scheduleAttempt() noexcept;
  void attempt() noexcept;
  void connectNext() noexcept;
  void handleBytes(const char* data, std::size_t n) noexcept;
  void handshake(const char* data, std::size_t n) noexcept;
  void decodeFrames() noexcept;
  void log(RelayLog level, const std::string& line) const noexcept;

  const RelayOptions& options_;
  LinkHandler& handler_;
  RelayCounters& counters_;
  uv_loop_t* loop_ = nullptr;
  State state_ = State::kClosed;
  Tcp* tcp_ = nullptr;
  uv_timer_t* timer_ = nullptr;            // backoff and attempt deadline
  uv_getaddrinfo_t* resolving_ = nullptr;  // owned by its callback
  addrinfo* addrs_ = nullptr;
  addrinfo* next_addr_ = nullptr;
  std::string in_;
  std::size_t need_ = protocol::mux::kFrameHeaderBytes;
  std::string out_;
  std::size_t writing_ = 0;
  bool write_in_flight_ = false;
  std::uint64_t generation_ = 0;
  std::uint32_t failures_ = 0;  // attempts failed since the last loss
  std::string last_failure_;    // logged once per distinct reason
  std::minstd_rand rng_;
  char scratch_[64 * 1024];
};

}  // namespace tcpstore::store::relay
