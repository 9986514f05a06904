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
// Largest read into a connection's own buffer.
constexpr std::size_t kMaxReadBytes = std::size_t{1} << 30;
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
  if (pending_ || paused_) {  // judged once the buffered requests are decoded
    eof_ = true;
    updateReading();
    return;
  }
  DecodeResult r = stream_.finish(std::string_view(in_.data(), in_.size()));
  if (r.failed()) {
    fail(set_.ctr_.rejected_protocol, r.error.message());
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
  while (!paused_ && !pending_ && !closing_ && !failed_ && len - off >= need_) {
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
    set_.handler_->onRequest(*this, req);
  }
  return off;
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
  if (!paused_ && !pending_ && !set_.stopping_ && !failed_ && !in_.empty()) {
    drainBuffered();
    if (closing_) return;
    in_.trim();
    noteInput();
  }
  if (eof_ && !paused_ && !pending_ && !set_.stopping_ && !failed_) {
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
  return !closing_ && !paused_ && !input_paused_ && !eof_ &&
         !close_after_flush_ && !set_.stopping_ &&
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

// ---- Connection: output ----------------------------------------------------

void Connection::send(std::string_view head, std::string_view body,
                      bool requested) {
  if (closing_) return;
  const OutputLimits& lim = set_.output_;
  const std::size_t n = head.size() + body.size();
  if (!requested &&
      dropUnrequestedPush(lim, set_.total_output_, outbox_.size(), n)) {
    reject(set_.ctr_.rejected_slow_reader,
           fmt::format("{} unsent bytes while the server's unsent output is "
                       "past its budget of {} bytes",
                       outbox_.size() + n, lim.total_budget));
    return;
  }
  outbox_.append(head);
  if (!body.empty()) outbox_.append(body);
  set_.total_output_ += n;
  set_.flush_list_.add(this);
  checkOutput();
}

void Connection::checkOutput() {
  const OutputLimits& lim = set_.output_;
  CapAction action =
      judgeOutput(lim, outbox_.size(), outbox_.writing(), paused_);
  // A relay's connection carries many clients' replies: a full kernel buffer
  // is not a reason to drop them all. It is paused (flow control); the stall
  // timer and the memory budget still drop a relay that stopped reading.
  if (mux_ && action == CapAction::kDrop)
    action = paused_ ? CapAction::kNone : CapAction::kPause;
  switch (action) {
    case CapAction::kDrop:
      reject(set_.ctr_.rejected_slow_reader,
             fmt::format("slow reader: {} bytes of replies not taken (limit "
                         "{})",
                         outbox_.size(), 2 * lim.cap));
      return;
    case CapAction::kPause:
      paused_ = true;
      updateReading();
      if (lim.stall_ms > 0 && !set_.stopping_) {
        stall_.start(set_.now());
        set_.paused(*this);
      }
      return;
    case CapAction::kNone:
      return;
  }
}

void Connection::flush() noexcept {
  if (closing_) return;
  try {
    Outbox::Flushed f = outbox_.flush(stream(), this, &Connection::onWrite);
    bump(set_.ctr_.bytes_out, f.written);
    if (f.written > 0) stall_.progressed(set_.now());
    set_.total_output_ -= f.written;
    if (f.error != 0) {
      set_.log_.log(LogLevel::kDebug,
                    fmt::format("connection {} from {}: write error {}", id_,
                                peerName(), uv_strerror(f.error)));
      close();
      return;
    }
    if (outbox_.writing()) {
      checkOutput();
      if (closing_) return;
    }
  } catch (...) {
    reject(set_.ctr_.rejected_limit, "out of memory while writing");
    return;
  }
  afterOutputDrained();
}

void Connection::onWrite(uv_write_t* req, int status) noexcept {
  auto* c = static_cast<Connection*>(req->data);
  const std::size_t n = c->outbox_.finishWrite();
  if (c->closing_) return;  // its bytes left the budget at close
  Connections& s = c->set_;
  s.total_output_ -= n;
  if (status < 0) {
    try {
      s.log_.log(LogLevel::kDebug, fmt::format("connection {}: write error {}",
                                               c->id_, uv_strerror(status)));
    } catch (...) {
    }
    c->close();
    return;
  }
  bump(s.ctr_.bytes_out, n);
  c->stall_.progressed(s.now());
  if (c->outbox_.hasPending()) {
    c->flush();
  } else {
    c->afterOutputDrained();
  }
}

// Some output was handed to the kernel: close a connection that was only
// waiting for that, or resume a paused one that drained enough.
void Connection::afterOutputDrained() noexcept {
  if (closing_) return;
  if ((set_.stopping_ || close_after_flush_) && outbox_.size() == 0 &&
      !pending_) {
    close();
    return;
  }
  if (!paused_ || set_.stopping_ || close_after_flush_ ||
      !mayResume(set_.output_, outbox_.size())) {
    return;
  }
  paused_ = false;
  try {
    resume();
  } catch (...) {
    reject(set_.ctr_.rejected_limit, "out of memory while writing");
  }
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
  if (outbox_.size() == 0 || set_.stopping_) {
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
  if (mux_) mux_->closeAll();
  set_.closed(*this);
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
