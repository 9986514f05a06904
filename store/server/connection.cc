#include "store/server/connection.h"

#include <fmt/format.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <unistd.h>

#include "store/server/connections.h"
#include "store/server/mux_session.h"
#include "store/server/net.h"

namespace tcpstore::server {

using protocol::DecodeResult;
using protocol::Dialect;

namespace {
// A connection reading in place gets at least this much free tail.
constexpr std::size_t kMinFreeTail = 64 * 1024;
// A pending connection stops reading once it buffers this much.
constexpr std::size_t kPendingInputBytes = 64 * 1024;
// Largest read into a connection's own buffer: libuv reads up to 32 times
// per readable event, and every fresh page read into is a page fault.
constexpr std::size_t kMaxReadBytes = 1024 * 1024;
}  // namespace

// ---- Connection: read and decode -------------------------------------------

Connection::Connection(Connections& set, ConnId id)
    : Endpoint(id), set_(set), stream_(set.limits_) {}

Connection::~Connection() = default;

std::string Connection::peerName() const {
  return formatSockaddr(reinterpret_cast<const sockaddr*>(&peer_));
}

std::string_view Connection::dialectName() const noexcept {
  if (mux_) return "mux";
  auto d = stream_.dialect();
  return d ? protocol::dialectName(*d) : std::string_view("undecided");
}

void Connection::onAlloc(uv_handle_t* h, std::size_t, uv_buf_t* buf) noexcept {
  auto* c = static_cast<Connection*>(h->data);
  // The rest of the current message fits the scratch buffer: read there (no
  // per-connection memory for the common small request). Otherwise read in
  // place into the connection's own buffer. A large partial request reads in
  // place at its field boundaries too (between two MULTI_SET values the next
  // field is small): appending a scratch read would grow its buffer past
  // the budget check below.
  const bool large = !c->in_.empty() && c->in_.freeTail() < kMinFreeTail &&
                     c->partialBytes() > kLargeRequestBytes;
  if (!large && c->need_ <= c->in_.size() + Connections::kScratchBytes) {
    *buf = uv_buf_init(c->set_.scratch_.get(),
                       static_cast<unsigned>(Connections::kScratchBytes));
    return;
  }
  // The turn's reads of large requests are spent: read again next turn.
  if (c->set_.turn_input_ >= Connections::kTurnInputBytes) {
    c->input_yielded_ = true;  // read_cb gets UV_ENOBUFS and stops reading
    *buf = uv_buf_init(nullptr, 0);
    return;
  }
  // Growing (about doubling) a large partial request's buffer must fit the
  // memory budget; otherwise the connection waits until memory is freed.
  if (c->in_.freeTail() < kMinFreeTail &&
      c->set_.budget_.pauseInput(c->set_.memoryUse(), c->partialBytes(),
                                 c->inputGrowth())) {
    c->input_paused_ = true;  // read_cb gets UV_ENOBUFS and stops reading
    *buf = uv_buf_init(nullptr, 0);
    return;
  }
  try {
    char* tail = c->in_.reserveTail(kMinFreeTail);
    c->noteInput();
    std::size_t n = std::min(c->in_.freeTail(), kMaxReadBytes);
    *buf = uv_buf_init(tail, static_cast<unsigned>(n));
  } catch (...) {
    *buf = uv_buf_init(nullptr, 0);  // read_cb gets UV_ENOBUFS
  }
}

void Connection::onRead(uv_stream_t* s, ssize_t nread,
                        const uv_buf_t* buf) noexcept {
  auto* c = static_cast<Connection*>(s->data);
  try {
    c->handleRead(nread, buf);
  } catch (...) {
    c->reject(c->set_.ctr_.rejected_limit,
              "out of memory while serving the connection");
  }
}

void Connection::handleRead(ssize_t nread, const uv_buf_t* buf) {
  if (closing_) return;
  if (nread < 0) {
    if (nread == UV_EOF) {
      handleEof();
    } else if (nread == UV_ENOBUFS && input_yielded_) {
      updateReading();
      try {
        set_.yielded_ids_.push_back(id_);
        set_.continueSoon();
      } catch (...) {
        input_yielded_ = false;  // cannot list it: let it read
        updateReading();
      }
    } else if (nread == UV_ENOBUFS && input_paused_) {
      bump(set_.ctr_.budget_input_paused);
      updateReading();
      try {
        set_.input_paused_ids_.push_back(id_);
        set_.notePausedInput(*this);
      } catch (...) {
        input_paused_ = false;  // cannot list it: let it read
        updateReading();
      }
    } else if (nread == UV_ENOBUFS) {
      reject(set_.ctr_.rejected_limit, "out of memory for the input buffer");
    } else {
      set_.log_.log(
          LogLevel::kDebug,
          fmt::format("connection {} from {}: read error {}", id_, peerName(),
                      uv_strerror(static_cast<int>(nread))));
      close();
    }
    return;
  }
  if (nread == 0) return;
  auto n = static_cast<std::size_t>(nread);
  bump(set_.ctr_.bytes_in, n);
  set_.turn_input_ += n;
  last_read_ms_ = set_.now();
  if (buf->base == set_.scratch_.get()) {
    if (in_.empty()) {
      // Decode straight from the scratch buffer; keep only the rest.
      std::size_t used = drain(buf->base, n);
      if (closing_) return;
      if (used < n) in_.append(buf->base + used, n - used);
    } else {
      in_.append(buf->base, n);
      drainBuffered();
      if (closing_) return;
    }
  } else {
    in_.commit(n);
    drainBuffered();
    if (closing_) return;
  }
  in_.trim();
  noteInput();
  if (pending_ && in_.size() >= kPendingInputBytes) updateReading();
}

void Connection::noteInput() noexcept {
  set_.input_total_ += in_.capacity();
  set_.input_total_ -= counted_in_;
  counted_in_ = in_.capacity();
}

// The peer half-closed. Its requests still get their replies; bytes of an
// unfinished request are a protocol error.
void Connection::handleEof() {
  // Judged once the buffered requests are decoded.
  if (pending_ || paused_ || yielded_) {
    eof_ = true;
    updateReading();
    return;
  }
  DecodeResult r = stream_.finish(std::string_view(in_.data(), in_.size()));
  if (r.failed()) {
    fail(set_.ctr_.rejected_protocol, r.error.message());
    return;
  }
  // A backend with replies still owed (a relay's, in flight upstream) holds
  // the connection pending; resume() judges the EOF again once they are out.
  if (!mux_ && set_.handler_->onPeerEof(*this)) {
    eof_ = true;
    updateReading();
    return;
  }
  set_.log_.log(LogLevel::kDebug, fmt::format("connection {} from {} closed "
                                              "by peer",
                                              id_, peerName()));
  if (outbox_.size() > 0) {
    close_after_flush_ = true;  // closes once its replies are written
    updateReading();
    return;
  }
  close();
}

void Connection::drainBuffered() {
  std::size_t used = drain(in_.data(), in_.size());
  if (!closing_) in_.consume(used);
}

std::size_t Connection::drain(const char* data, std::size_t len) {
  protocol::Request& req = set_.req_;
  std::size_t off = 0;
  draining_ = true;
  struct Reset {
    bool& flag;
    ~Reset() { flag = false; }
  } reset{draining_};
  if (!mux_decided_) {
    switch (detectMuxPreamble(std::string_view(data, len))) {
      case MuxPreamble::kNeedMore:
        need_ = protocol::mux::kMuxPreamble.size();
        return 0;
      case MuxPreamble::kNo:
        mux_decided_ = true;
        need_ = 1;
        break;
      case MuxPreamble::kYes:
        mux_decided_ = true;
        mux_ = std::make_unique<MuxSession>(*this);
        off = protocol::mux::kMuxPreamble.size();
        need_ = 1;
        send(protocol::mux::kMuxPreamble, true);
        break;
    }
  }
  if (mux_) return off + mux_->drain(data + off, len - off);
  while (!paused_ && !pending_ && !yielded_ && !closing_ && !failed_ &&
         len - off >= need_) {
    DecodeResult r = stream_.next(std::string_view(data + off, len - off), req);
    if (!dialect_noted_) noteDialect();
    if (r.kind == DecodeResult::kNeedMore) {
      need_ = r.need_at_least > 0 ? r.need_at_least : 1;
      break;
    }
    if (r.kind == DecodeResult::kError) {
      fail(set_.ctr_.forDecodeError(r.error.code), r.error.message());
      return off;
    }
    need_ = 1;
    off += r.consumed;
    const std::uint64_t work_before = set_.turn_output_;
    set_.handler_->onRequest(*this, req);
    ++set_.turn_requests_;
    noteTurnWork(set_.turn_output_ - work_before);
    if (off < len && set_.turnSpent() && usedQuantum()) yield();
  }
  return off;
}

void Connection::noteTurnWork(std::uint64_t bytes) noexcept {
  if (turn_no_ != set_.turn_no_) {  // the first request of a new turn
    turn_no_ = set_.turn_no_;
    turn_bytes_ = 0;
    turn_requests_ = 0;
  }
  turn_bytes_ += bytes;
  ++turn_requests_;
}

bool Connection::usedQuantum() const noexcept {
  return turn_bytes_ >= Connections::kQuantumBytes ||
         turn_requests_ >= Connections::kQuantumRequests;
}

void Connection::yield() noexcept {
  if (closing_) return;
  try {
    set_.yielded_ids_.push_back(id_);
  } catch (...) {
    return;  // cannot list it: it goes on decoding
  }
  yielded_ = true;
  bump(set_.ctr_.turn_yields);
  updateReading();
  set_.continueSoon();
}

void Connection::noteDialect() noexcept {
  auto d = stream_.dialect();
  if (!d) return;
  dialect_noted_ = true;
  bump(*d == Dialect::kV2 ? set_.ctr_.connections_v2
                          : set_.ctr_.connections_v113);
}

void Connection::resume() {
  if (closing_ || draining_) return;
  // Paused or pending, the server was not waiting for the peer's bytes: the
  // partial-request clock starts again.
  last_read_ms_ = set_.now();
  // A mux connection's channels whose queued requests waited for its output
  // to drain go first: their requests came before the frames in in_.
  if (mux_ && !paused_ && !set_.stopping_ && !failed_) {
    mux_->resumeChannels();
    if (closing_) return;
  }
  // Stopping: requests not yet decoded are not started.
  if (!paused_ && !pending_ && !yielded_ && !set_.stopping_ && !failed_ &&
      !in_.empty()) {
    drainBuffered();
    if (closing_) return;
    in_.trim();
    noteInput();
  }
  if (eof_ && !paused_ && !pending_ && !yielded_ && !set_.stopping_ &&
      !failed_) {
    eof_ = false;
    handleEof();
    return;
  }
  if ((set_.stopping_ || close_after_flush_) && !pending_ &&
      outbox_.size() == 0) {
    close();
    return;
  }
  updateReading();
}

bool Connection::wantsToRead() const noexcept {
  return !closing_ && !paused_ && !yielded_ && !input_paused_ &&
         !input_yielded_ && !eof_ && !close_after_flush_ && !set_.stopping_ &&
         !(pending_ && in_.size() >= kPendingInputBytes);
}

void Connection::updateReading() noexcept {
  const bool want = wantsToRead();
  if (want == reading_) return;
  if (want) {
    if (uv_read_start(stream(), &Connection::onAlloc, &Connection::onRead) !=
        0) {
      close();
      return;
    }
  } else {
    uv_read_stop(stream());
  }
  reading_ = want;
}

// ---- Connection: close -----------------------------------------------------

void Connection::logClosing(std::string_view reason) noexcept {
  if (!set_.log_.enabled(LogLevel::kWarn)) return;
  try {
    set_.logRejection(fmt::format("closing connection from {} ({}): {}",
                                  peerName(), dialectName(), reason));
  } catch (...) {
  }
}

void Connection::reject(Counter& counter, std::string_view reason) noexcept {
  if (closing_) return;
  bump(counter);
  logClosing(reason);
  close();
}

void Connection::drop(std::string_view reason) noexcept {
  if (closing_) return;
  logClosing(reason);
  close();
}

void Connection::fail(Counter& counter, std::string_view reason) noexcept {
  if (closing_ || failed_) return;
  // A backend with replies still owed for earlier requests (a relay's, in
  // flight upstream) holds the connection pending until they are routed,
  // as at a half-close.
  const bool owed = [&]() noexcept {
    if (set_.stopping_ || mux_ || pending_) return false;
    try {
      return set_.handler_->onPeerEof(*this);
    } catch (...) {
      return false;
    }
  }();
  if ((outbox_.size() == 0 && !owed) || set_.stopping_) {
    reject(counter, reason);
    return;
  }
  bump(counter);
  logClosing(reason);
  // Like a half-close: nothing more is read or decoded; the check phase
  // flushes the outbox (it is listed) and afterOutputDrained() closes.
  failed_ = true;
  close_after_flush_ = true;
  failed_ms_ = set_.now();
  updateReading();
}

void Connection::close() noexcept {
  if (closing_) return;
  closing_ = true;
  set_.input_total_ -= counted_in_;
  counted_in_ = 0;
  if (in_.capacity() >= Connections::kDeferFreeBytes) set_.freeLater(in_);
  if (mux_) mux_->closeAll();
  set_.closed(*this);  // uncounts the unsent output: before it is taken
  if (outbox_.size() >= Connections::kDeferFreeBytes) {
    try {
      outbox_.takeChunks(set_.dead_chunks_);
      set_.continueSoon();
    } catch (...) {  // freed with the connection
    }
  }
  uv_close(reinterpret_cast<uv_handle_t*>(&tcp_), &Connection::onClosed);
  if (set_.stopping_ && set_.by_id_.empty() && set_.on_drained_ != nullptr) {
    set_.on_drained_(set_.on_drained_arg_);
  }
}

void Connection::onClosed(uv_handle_t* h) noexcept {
  delete static_cast<Connection*>(h->data);
}

void Connection::stopForShutdown() noexcept {
  if (closing_) return;
  updateReading();  // stops: the set is stopping
  if (outbox_.size() == 0 && !pending_) {
    close();
  } else {
    flush();  // closes the connection once everything is written
  }
}

}  // namespace tcpstore::server
