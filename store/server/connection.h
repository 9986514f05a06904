// Connection: one client's socket, its input buffer and request stream, and
// its outbox (connections.h holds them all and what they share).
//
// Data path of a connection: recv(2) fills the loop-wide scratch buffer
// (or, mid-way through a message too large for it, into the connection's
// InputBuffer), the RequestStream decodes whole requests, each goes to the
// RequestHandler (the dispatcher), whose replies come back through send()
// into the Outbox, written at the end of the read batch (replies to other
// connections' requests: once per loop turn, in the check phase).
//
// A connection whose first bytes are the mux preamble (protocol/mux.h) is a
// relay's: it carries frames, and its MuxSession (mux_session.h) serves each
// channel as an Endpoint of its own.
//
// Decoding stops while the connection is paused (its unsent output is over
// the cap, see backpressure.h) or holds a pending request (the backend
// answers later); the bytes stay buffered and are decoded on resume. Reads
// stop too while paused, and while pending with 64 KiB buffered.
//
// Work per loop turn is bounded: once the replies queued in this turn (all
// connections together) pass Connections::kTurnOutputBytes, or the requests
// decoded pass Connections::kTurnRequests, a connection that did its own
// share of the turn (Connections::kQuantumBytes or kQuantumRequests) stops
// decoding after its current request and yields; its buffered requests are
// decoded in order on a later turn (Connections::onCheck), and it reads
// nothing meanwhile. So one client pipelining large GETs cannot hold the loop
// for longer than a few MiB of replies, and a client of small requests is
// never queued behind it. Likewise reads into connections' own buffers
// (large requests) stop for the turn once Connections::kTurnInputBytes were
// read; small requests read on.
//
// Memory: an idle connection (no partial request, no unsent output) holds
// only its uv_poll_t, its flags and its dialect; the decoder, input buffer
// and outbox live in a BusyState taken from (and given back to) a small
// pool of Connections while the connection has work. A mux connection keeps
// its BusyState (its MuxSession lives there).
//
// I/O: the accepted socket is polled (uv_poll_t, level-triggered): it is
// read with recv(2) when readable and reads are wanted, and written with
// send(2) (one buffer) or sendmsg(2) once per loop turn; what the kernel
// does not take is written when the socket becomes writable.
//
// Lifetime: a Connection is created by Connections::accept(), closed once
// by close() (the handler's onClosing() runs, the poll handle is closed and
// the socket with it) and deleted in the handle's close callback, so a
// pointer stays valid for the rest of the loop turn in which it closed. Loop
// thread only.
#pragma once

#include <sys/socket.h>
#include <uv.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "protocol/codec.h"
#include "store/effects.h"
#include "store/server/backpressure.h"
#include "store/server/counters.h"
#include "store/server/endpoint.h"
#include "store/server/input_buffer.h"
#include "store/server/log.h"
#include "store/server/outbox.h"

namespace tcpstore::server {

class Connections;
class MuxSession;

// A connection's state while it has work (see "Memory" above).
struct BusyState {
  explicit BusyState(const protocol::Limits& limits);
  ~BusyState();
  BusyState(const BusyState&) = delete;
  BusyState& operator=(const BusyState&) = delete;

  protocol::RequestStream stream;
  // Set once the first bytes were the mux preamble (mux_session.h): the
  // connection then carries frames, not requests.
  std::unique_ptr<MuxSession> mux;
  InputBuffer in;
  std::size_t need = 1;  // bytes that must be buffered before decoding again
  std::size_t counted_in = 0;  // in.capacity() charged to the budget
  Outbox outbox;
  StallClock stall;
  std::uint64_t last_read_ms = 0;   // loop time of the last byte read
  std::uint64_t failed_ms = 0;      // loop time of fail() (if failed_)
  std::uint64_t turn_no = 0;        // the loop turn of turn_bytes/requests
  std::uint64_t turn_bytes = 0;     // work of its requests in that turn
  std::uint64_t turn_requests = 0;  // its requests decoded in that turn
};

class Connection final : public Endpoint {
 public:
  ~Connection();

  // The peer's address (getpeername: "?" once the socket is reset).
  std::string peerName() const override;
  // "1.13", "2.x", "mux" or "undecided".
  std::string_view dialectName() const noexcept override;
  std::size_t unsentBytes() const noexcept override {
    return busy_ != nullptr ? busy_->outbox.size() : 0;
  }
  // For FlushList (outbox.h): listed for this turn's flush.
  bool listed() const noexcept { return listed_; }
  void setListed(bool on) noexcept { listed_ = on; }

  // Queues `bytes` for the client, applying the output policy: a push the
  // client did not ask for (`requested` false) may drop a client that is
  // behind; output over the cap pauses it. Throws std::bad_alloc.
  void send(std::string_view bytes, bool requested) override {
    send(bytes, std::string_view(), requested);
  }
  // As send(head + body), without joining them first.
  void send(std::string_view head, std::string_view body, bool requested);
  // A reply, moved into the outbox without a copy.
  void sendOwned(std::string bytes) override;
  // As send(), queueing a reference to the shared bytes (counted in
  // shared_replies; a small range is copied). The output policy charges
  // them to this connection by length, as if they were its own.
  void sendShared(const store::SharedBytes& buf, std::size_t offset,
                  std::size_t length, bool requested) override;

  // Decodes the buffered requests (if not paused, pending or closing) and
  // restarts reading if it had stopped. Throws std::bad_alloc.
  void resume() override;

  // Counts `counter`, logs "closing connection from P (dialect): reason"
  // (rate-limited) and closes. No-op if closing.
  void reject(Counter& counter, std::string_view reason) noexcept override;
  // An error in this connection's requests (bad bytes, a refused request):
  // counts `counter`, logs like reject(), stops reading and decoding, and
  // closes once the replies owed for its earlier requests are written (at
  // once if there are none; after partial_request_ms at most if the peer
  // does not read them). No-op if closing.
  void fail(Counter& counter, std::string_view reason) noexcept override;
  // Logs like reject() and closes, counting nothing.
  void drop(std::string_view reason) noexcept override;
  // Closes now: unsent output is dropped. Idempotent.
  void close() noexcept;

 private:
  friend class Connections;
  friend class MuxSession;
  friend class Channel;
  Connection(Connections& set, ConnId id);

  // A pending connection stops reading once it buffers this much.
  static constexpr std::size_t kPendingInputBytes = 64 * 1024;

  static void onPoll(uv_poll_t* h, int status, int events) noexcept;
  static void onClosed(uv_handle_t* h) noexcept;

  // The busy state, taken from the pool if idle. Throws std::bad_alloc.
  BusyState& busy();
  // Gives the busy state back once the connection is idle again.
  void settle() noexcept;
  MuxSession* mux() const noexcept {
    return busy_ != nullptr ? busy_->mux.get() : nullptr;
  }
  int fd() const noexcept;

  // Reads while readable and reads are wanted (a bounded number of times).
  void handleReadable();
  // Where the next read goes; nullptr if this connection must not read now
  // (then input_yielded_ or input_paused_ says why). Throws std::bad_alloc.
  char* readBuffer(std::size_t& len);
  // `n` bytes were read into `buf`.
  void handleRead(const char* buf, std::size_t n);
  // The socket failed (POLLERR): reads what is left, then closes.
  void handlePollError(int status) noexcept;
  void inputStopped() noexcept;
  void handleEof();
  // Decodes and hands on requests from [data, data+len); returns the bytes
  // consumed.
  std::size_t drain(const char* data, std::size_t len);
  void drainBuffered();
  void noteDialect() noexcept;
  void checkOutput();
  // `n` bytes were appended to the outbox.
  void queued(std::size_t n);
  // An unrequested push of `n` bytes must drop this client (it is behind
  // while the server's output is past its budget): rejects it, true.
  bool refusePush(std::size_t n) noexcept;
  void flush() noexcept;
  // The socket is writable: writes more of what the kernel did not take.
  void handleWritable() noexcept;
  // `f` came back from a write: accounts it; false if the connection closed.
  bool noteWritten(const Outbox::Flushed& f) noexcept;
  void afterOutputDrained() noexcept;
  void stopForShutdown() noexcept;
  // Polls for what the connection wants now (reading, writability).
  void updateReading() noexcept;
  bool wantsToRead() const noexcept;
  // Holds part of a request and waits for more of it from the peer.
  bool holdsPartialRequest() const noexcept {
    return busy_ != nullptr && !busy_->in.empty() && !pending_ && !paused_ &&
           !yielded_ && !input_yielded_ && !eof_ && !close_after_flush_ &&
           !closing_;
  }
  // The turn's output budget is spent: stop decoding, continue next turn.
  void yield() noexcept;
  // A request of this connection did `bytes` of work in this turn.
  void noteTurnWork(std::uint64_t bytes) noexcept;
  // This connection did its share of this turn's work (only such yield:
  // a client of small requests is never held behind those of large ones).
  bool usedQuantum() const noexcept;
  void logClosing(std::string_view reason) noexcept;
  void noteInput() noexcept;
  // The partial request's size, and what growing its buffer would add.
  std::size_t partialBytes() const noexcept {
    return busy_->need > busy_->in.size() ? busy_->need : busy_->in.size();
  }
  std::size_t inputGrowth() const noexcept {
    const std::size_t want = busy_->in.size() + 64 * 1024;
    return want > busy_->in.capacity() ? want : busy_->in.capacity();
  }

  // Idle: 8 (vtable) + 8 (id) + these flags in Endpoint's tail padding,
  // the poll handle, set_ and busy_.
  bool listed_ = false;           // in the FlushList
  bool reading_ : 1 = false;      // UV_READABLE is polled
  bool polling_out_ : 1 = false;  // UV_WRITABLE is polled
  bool paused_ : 1 = false;   // output over the cap: no reading, no decoding
  bool yielded_ : 1 = false;  // turn budget spent: decoded on a later turn
  bool eof_ : 1 = false;      // the peer half-closed; seen while pending
  bool mux_decided_ : 1 = false;  // the first bytes were (or were not) the
                                  // mux preamble
  // The peer half-closed: close once the replies are out.
  bool close_after_flush_ : 1 = false;
  bool dialect_noted_ : 1 = false;
  bool input_paused_ : 1 = false;   // budget: no reading until memory is freed
  bool input_yielded_ : 1 = false;  // turn's large reads spent: read next turn
  bool failed_ : 1 = false;     // fail(): closes once the owed replies are out
  bool draining_ : 1 = false;   // inside drain(): resume() must not re-enter
  bool validated_ : 1 = false;  // idle: the stream's validated()
  // Idle: the stream's dialect, 0 undecided, else 1 + Dialect.
  std::uint8_t dialect_ : 2 = 0;
  uv_poll_t poll_{};
  Connections& set_;
  BusyState* busy_ = nullptr;  // owned; see busy() and settle()
};

}  // namespace tcpstore::server
