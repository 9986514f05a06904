// Connection: one client's socket, its input buffer and request stream, and
// its outbox. Connections: every open connection of a server, and what they
// share (the read scratch buffer, the flush list, the output budget, the
// stall timer, the rejection log).
//
// Data path of a connection: libuv reads into the loop-wide scratch buffer
// (or, mid-way through a message too large for it, into the connection's
// InputBuffer), the RequestStream decodes whole requests, each goes to the
// RequestHandler (the dispatcher), whose replies come back through send()
// into the Outbox, flushed once per loop turn.
//
// Decoding stops while the connection is paused (its unsent output is over
// the cap, see backpressure.h) or holds a pending request (the backend
// answers later); the bytes stay buffered and are decoded on resume. Reads
// stop too while paused, and while pending with 64 KiB buffered.
//
// Lifetime: a Connection is created by Connections::accept(), closed once
// by close() (the handler's onClosing() runs, then the handle is closed) and
// deleted in the handle's close callback, so a pointer stays valid for the
// rest of the loop turn in which it closed. Loop thread only.
#pragma once

#include <sys/socket.h>
#include <uv.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "protocol/codec.h"
#include "store/effects.h"
#include "store/server/backpressure.h"
#include "store/server/counters.h"
#include "store/server/input_buffer.h"
#include "store/server/log.h"
#include "store/server/loop_handles.h"
#include "store/server/outbox.h"

namespace tcpstore::server {

using store::ConnId;
class Connection;
class Connections;

// Where a connection's decoded requests go (the dispatcher).
class RequestHandler {
 public:
  // One decoded request of `c`; its views are valid during the call only.
  // May send to any connection, close any (also `c`), or mark `c` pending.
  // Throws std::bad_alloc only.
  virtual void onRequest(Connection& c, const protocol::Request& req) = 0;
  // `c` is closing (called once): forget it. Nothing more is sent to it.
  virtual void onClosing(Connection& c) noexcept = 0;

 protected:
  ~RequestHandler() = default;
};

class Connection {
 public:
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  ConnId id() const noexcept { return id_; }
  bool closing() const noexcept { return closing_; }
  std::string peerName() const;
  std::string_view dialectName() const noexcept;
  Outbox& outbox() noexcept { return outbox_; }

  // Queues `bytes` for the client, applying the output policy: a push the
  // client did not ask for (`requested` false) may drop a client that is
  // behind; output over the cap pauses it. Throws std::bad_alloc.
  void send(std::string_view bytes, bool requested);

  // While pending, nothing more is decoded. setPending(false) does not
  // decode: call resume() once the reply is routed.
  void setPending(bool pending) noexcept { pending_ = pending; }
  bool pending() const noexcept { return pending_; }
  // Decodes the buffered requests (if not paused, pending or closing) and
  // restarts reading if it had stopped. Throws std::bad_alloc.
  void resume();

  // Counts `counter`, logs "closing connection from P (dialect): reason"
  // (rate-limited) and closes. No-op if closing.
  void reject(Counter& counter, std::string_view reason) noexcept;
  // Closes now: unsent output is dropped. Idempotent.
  void close() noexcept;

 private:
  friend class Connections;
  Connection(Connections& set, ConnId id);

  static void onAlloc(uv_handle_t* h, std::size_t, uv_buf_t* buf) noexcept;
  static void onRead(uv_stream_t* s, ssize_t nread,
                     const uv_buf_t* buf) noexcept;
  static void onWrite(uv_write_t* req, int status) noexcept;
  static void onClosed(uv_handle_t* h) noexcept;

  void handleRead(ssize_t nread, const uv_buf_t* buf);
  void handleEof();
  // Decodes and hands on requests from [data, data+len); returns the bytes
  // consumed.
  std::size_t drain(const char* data, std::size_t len);
  void drainBuffered();
  void noteDialect() noexcept;
  void checkOutput();
  void flush() noexcept;
  void afterOutputDrained() noexcept;
  void stopForShutdown() noexcept;
  void updateReading() noexcept;
  bool wantsToRead() const noexcept;
  uv_stream_t* stream() noexcept {
    return reinterpret_cast<uv_stream_t*>(&tcp_);
  }

  uv_tcp_t tcp_{};
  Connections& set_;
  const ConnId id_;
  protocol::RequestStream stream_;
  InputBuffer in_;
  std::size_t need_ = 1;  // bytes that must be buffered before decoding again
  Outbox outbox_;
  sockaddr_storage peer_{};
  StallClock stall_;
  bool reading_ = false;
  bool paused_ = false;   // output over the cap: no reading, no decoding
  bool pending_ = false;  // a request awaits the backend: no decoding
  bool eof_ = false;      // the peer half-closed; seen while pending
  bool closing_ = false;
  // The peer half-closed: close once the replies are out.
  bool close_after_flush_ = false;
  bool dialect_noted_ = false;
  bool draining_ = false;  // inside drain(): resume() must not re-enter
};

class Connections {
 public:
  // `limits` and `output` are copied; `ctr` and `log` outlive this.
  Connections(const protocol::Limits& limits, const OutputLimits& output,
              Counters& ctr, const Logger& log);
  ~Connections();
  Connections(const Connections&) = delete;
  Connections& operator=(const Connections&) = delete;

  // Adds this set's loop handles (flush check, stall and log timers).
  Status open(LoopHandles& handles);
  void setHandler(RequestHandler& handler) noexcept { handler_ = &handler; }
  // Called once the last connection has closed after beginStop().
  void setOnDrained(void (*fn)(void*) noexcept, void* arg) noexcept {
    on_drained_ = fn;
    on_drained_arg_ = arg;
  }

  // Serves an accepted socket (owns `fd` from here on). Throws
  // std::bad_alloc (after closing `fd`).
  void accept(int fd, const sockaddr_storage& peer);
  std::size_t size() const noexcept { return by_id_.size(); }

  // The open connection `id`, or nullptr (closed, or never existed).
  Connection* find(ConnId id) const noexcept {
    auto it = by_id_.find(id);
    return it == by_id_.end() ? nullptr : it->second;
  }
  bool stopping() const noexcept { return stopping_; }
  // Stop: reads end; a connection without unsent output closes now, the
  // others once their output is written. Returns true if none is left.
  bool beginStop() noexcept;
  // Closes every connection at once.
  void closeAll() noexcept;
  // Output queued outside a read callback (a backend completing from a
  // timer) is flushed on this loop turn: the poll phase must not block.
  void flushSoon() noexcept {
    if (!flush_list_.empty()) uv_idle_start(flush_idle_, &Connections::onIdle);
  }
  // Warn lines about closed connections, rate-limited.
  void logRejection(std::string_view line) noexcept;

 private:
  friend class Connection;
  static void onCheck(uv_check_t* check) noexcept;
  static void onIdle(uv_idle_t*) noexcept {}
  static void onStallTimer(uv_timer_t* timer) noexcept;
  static void onLogTimer(uv_timer_t* timer) noexcept;
  void paused(Connection& c);
  void closed(Connection& c) noexcept;
  std::uint64_t now() const noexcept { return uv_now(loop_); }

  uv_loop_t* loop_ = nullptr;
  const protocol::Limits limits_;
  const OutputLimits output_;
  Counters& ctr_;
  const Logger& log_;
  RequestHandler* handler_ = nullptr;
  std::unordered_map<ConnId, Connection*> by_id_;
  ConnId next_id_ = 1;
  // Loop-wide read buffer: reads land here unless a connection is in the
  // middle of a message too large for it.
  std::unique_ptr<char[]> scratch_;
  FlushList<Connection> flush_list_;
  uv_idle_t* flush_idle_ = nullptr;  // active: the loop does not block
  std::uint64_t total_output_ = 0;   // sum of outbox sizes
  // Paused connections checked for a stall; may hold stale or repeated ids.
  std::vector<ConnId> paused_ids_;
  uv_timer_t* stall_timer_ = nullptr;
  RateLimitedLog rejections_;
  uv_timer_t* log_timer_ = nullptr;
  // The request being decoded (views into a connection's bytes).
  protocol::Request req_;
  bool stopping_ = false;
  void (*on_drained_)(void*) noexcept = nullptr;
  void* on_drained_arg_ = nullptr;
};

}  // namespace tcpstore::server
