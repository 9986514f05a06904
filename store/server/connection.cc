#include "store/server/connection.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>

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
// Largest read into a connection's own buffer: every fresh page read into
// is a page fault.
constexpr std::size_t kMaxReadBytes = 1024 * 1024;
// Reads per readable event (as libuv's streams): the socket is polled
// level-triggered, so what is left is read on the next loop turn.
constexpr int kMaxReadsPerEvent = 32;
}  // namespace

BusyState::BusyState(const protocol::Limits& limits) : stream(limits) {}
BusyState::~BusyState() = default;

// ---- Connection: state -----------------------------------------------------

Connection::Connection(Connections& set, ConnId id) : Endpoint(id), set_(set) {}

Connection::~Connection() { delete busy_; }

std::string Connection::peerName() const {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  const int f = fd();
  if (f < 0 || ::getpeername(f, reinterpret_cast<sockaddr*>(&ss), &len) != 0)
    return "?";
  return formatSockaddr(reinterpret_cast<const sockaddr*>(&ss));
}

std::string_view Connection::dialectName() const noexcept {
  if (mux() != nullptr) return "mux";
  std::optional<Dialect> d;
  if (busy_ != nullptr) {
    d = busy_->stream.dialect();
  } else if (dialect_ != 0) {
    d = static_cast<Dialect>(dialect_ - 1);
  }
  return d ? protocol::dialectName(*d) : std::string_view("undecided");
}

int Connection::fd() const noexcept {
  uv_os_fd_t f = -1;
  if (uv_fileno(reinterpret_cast<const uv_handle_t*>(&poll_), &f) != 0)
    return -1;
  return f;
}

BusyState& Connection::busy() {
  if (busy_ != nullptr) return *busy_;
  BusyState* b = set_.takeBusy();
  if (dialect_ != 0) {
    b->stream = protocol::RequestStream(
        set_.limits_, static_cast<Dialect>(dialect_ - 1), validated_);
  } else {
    b->stream = protocol::RequestStream(set_.limits_);
  }
  b->last_read_ms = set_.now();
  busy_ = b;
  return *b;
}

void Connection::settle() noexcept {
  BusyState* b = busy_;
  if (b == nullptr || closing_ || draining_ || paused_ || yielded_ || eof_ ||
      failed_ || input_paused_ || input_yielded_ || b->mux != nullptr ||
      !b->in.empty() || b->outbox.size() != 0 || b->outbox.writing()) {
    return;
  }
  if (auto d = b->stream.dialect())
    dialect_ = static_cast<std::uint8_t>(1 + static_cast<unsigned>(*d)) & 3u;
  validated_ = b->stream.validated();
  set_.input_total_ -= b->counted_in;
  b->counted_in = 0;
  busy_ = nullptr;
  set_.giveBusy(b);
}

// ---- Connection: read and decode -------------------------------------------

void Connection::onPoll(uv_poll_t* h, int status, int events) noexcept {
  auto* c = static_cast<Connection*>(h->data);
  if (c->closing_) return;
  if (status < 0) {
    c->handlePollError(status);
    return;
  }
  if ((events & UV_WRITABLE) != 0) {
    c->handleWritable();
    if (c->closing_) return;
  }
  if ((events & UV_READABLE) != 0 && c->reading_) {
    try {
      c->handleReadable();
    } catch (...) {
      c->reject(c->set_.ctr_.rejected_limit,
                "out of memory while serving the connection");
    }
  }
}

// libuv stopped the handle. Bytes that came before the error are served as
// a read would serve them; then the socket's error closes the connection.
void Connection::handlePollError(int status) noexcept {
  reading_ = false;
  polling_out_ = false;
  if (wantsToRead()) {
    reading_ = true;  // handleReadable() reads only while reading_
    try {
      handleReadable();
    } catch (...) {
      reject(set_.ctr_.rejected_limit,
             "out of memory while serving the connection");
    }
    if (closing_) return;
    reading_ = false;
  }
  int err = 0;
  socklen_t len = sizeof err;
  if (::getsockopt(fd(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
  if (err != 0) {
    try {
      set_.log_.log(
          LogLevel::kDebug,
          fmt::format("connection {} from {}: socket error {} ({})", id_,
                      peerName(), errnoText(err), uv_strerror(status)));
    } catch (...) {
    }
    close();
    return;
  }
  updateReading();  // polls again for what it wants
}

char* Connection::readBuffer(std::size_t& len) {
  BusyState& b = *busy_;
  // The rest of the current message fits the scratch buffer: read there (no
  // per-connection memory for the common small request). Otherwise read in
  // place into the connection's own buffer. A large partial request reads in
  // place at its field boundaries too (between two MULTI_SET values the next
  // field is small): appending a scratch read would grow its buffer past
  // the budget check below.
  const bool large = !b.in.empty() && b.in.freeTail() < kMinFreeTail &&
                     partialBytes() > kLargeRequestBytes;
  if (!large && b.need <= b.in.size() + Connections::kScratchBytes) {
    len = Connections::kScratchBytes;
    return set_.scratch_.get();
  }
  // The turn's reads of large requests are spent: read again next turn.
  if (set_.turn_input_ >= Connections::kTurnInputBytes) {
    input_yielded_ = true;
    return nullptr;
  }
  // Growing (about doubling) a large partial request's buffer must fit the
  // memory budget; otherwise the connection waits until memory is freed.
  if (b.in.freeTail() < kMinFreeTail &&
      set_.budget_.pauseInput(set_.memoryUse(), partialBytes(),
                              inputGrowth())) {
    input_paused_ = true;
    return nullptr;
  }
  char* tail = nullptr;
  try {
    tail = b.in.reserveTail(kMinFreeTail);
  } catch (...) {
    reject(set_.ctr_.rejected_limit, "out of memory for the input buffer");
    return nullptr;
  }
  noteInput();
  len = std::min(b.in.freeTail(), kMaxReadBytes);
  return tail;
}

void Connection::handleReadable() {
  busy();
  for (int i = 0; i < kMaxReadsPerEvent && reading_ && wantsToRead(); ++i) {
    std::size_t len = 0;
    char* buf = readBuffer(len);
    if (buf == nullptr) {
      if (!closing_) inputStopped();
      return;
    }
    const ssize_t r = ::read(fd(), buf, len);
    if (r < 0) {
      const int err = errno;
      if (err == EINTR) continue;
      if (err == EAGAIN || err == EWOULDBLOCK) break;
      set_.log_.log(LogLevel::kDebug,
                    fmt::format("connection {} from {}: read error {}", id_,
                                peerName(), errnoText(err)));
      close();
      return;
    }
    if (r == 0) {
      handleEof();
      if (closing_) return;
      break;
    }
    handleRead(buf, static_cast<std::size_t>(r));
    if (closing_) return;
    if (static_cast<std::size_t>(r) < len) break;  // drained, most likely
  }
  // The replies to this read batch leave now, in one write (as they would
  // in the check phase): the connection is idle again at once, so a burst
  // of handshakes holds one busy state at a time, not one per connection.
  if (busy_ != nullptr && busy_->outbox.hasPending()) {
    flush();  // settles
    return;
  }
  settle();
}

// Reading stopped for the turn's input budget or the memory budget.
void Connection::inputStopped() noexcept {
  if (input_yielded_) {
    updateReading();
    try {
      set_.yielded_ids_.push_back(id_);
      set_.continueSoon();
    } catch (...) {
      input_yielded_ = false;  // cannot list it: let it read
      updateReading();
    }
  } else if (input_paused_) {
    bump(set_.ctr_.budget_input_paused);
    updateReading();
    try {
      set_.input_paused_ids_.push_back(id_);
      set_.notePausedInput(*this);
    } catch (...) {
      input_paused_ = false;  // cannot list it: let it read
      updateReading();
    }
  }
}

void Connection::handleRead(const char* buf, std::size_t n) {
  bump(set_.ctr_.bytes_in, n);
  set_.turn_input_ += n;
  busy_->last_read_ms = set_.now();
  if (buf == set_.scratch_.get()) {
    if (busy_->in.empty()) {
      // Decode straight from the scratch buffer; keep only the rest.
      std::size_t used = drain(buf, n);
      if (closing_) return;
      if (used < n) busy_->in.append(buf + used, n - used);
    } else {
      busy_->in.append(buf, n);
      drainBuffered();
      if (closing_) return;
    }
  } else {
    busy_->in.commit(n);
    drainBuffered();
    if (closing_) return;
  }
  busy_->in.trim();
  noteInput();
  if (pending_ && busy_->in.size() >= kPendingInputBytes) updateReading();
}

void Connection::noteInput() noexcept {
  BusyState& b = *busy_;
  set_.input_total_ += b.in.capacity();
  set_.input_total_ -= b.counted_in;
  b.counted_in = b.in.capacity();
}

// The peer half-closed. Its requests still get their replies; bytes of an
// unfinished request are a protocol error.
void Connection::handleEof() {
  BusyState& b = busy();
  // Judged once the buffered requests are decoded.
  if (pending_ || paused_ || yielded_) {
    eof_ = true;
    updateReading();
    return;
  }
  DecodeResult r = b.stream.finish(std::string_view(b.in.data(), b.in.size()));
  if (r.failed()) {
    fail(set_.ctr_.rejected_protocol, r.error.message());
    return;
  }
  set_.log_.log(LogLevel::kDebug, fmt::format("connection {} from {} closed "
                                              "by peer",
                                              id_, peerName()));
  if (b.outbox.size() > 0) {
    close_after_flush_ = true;  // closes once its replies are written
    updateReading();
    return;
  }
  close();
}

void Connection::drainBuffered() {
  std::size_t used = drain(busy_->in.data(), busy_->in.size());
  if (!closing_) busy_->in.consume(used);
}

std::size_t Connection::drain(const char* data, std::size_t len) {
  BusyState& b = *busy_;  // kept while draining_ (settle() waits)
  protocol::Request& req = set_.req_;
  std::size_t off = 0;
  draining_ = true;
  struct Reset {
    Connection* c;
    ~Reset() { c->draining_ = false; }
  } reset{this};
  if (!mux_decided_) {
    switch (detectMuxPreamble(std::string_view(data, len))) {
      case MuxPreamble::kNeedMore:
        b.need = protocol::mux::kMuxPreamble.size();
        return 0;
      case MuxPreamble::kNo:
        mux_decided_ = true;
        b.need = 1;
        break;
      case MuxPreamble::kYes:
        mux_decided_ = true;
        b.mux = std::make_unique<MuxSession>(*this);
        off = protocol::mux::kMuxPreamble.size();
        b.need = 1;
        send(protocol::mux::kMuxPreamble, true);
        break;
    }
  }
  if (b.mux) return off + b.mux->drain(data + off, len - off);
  while (!paused_ && !pending_ && !yielded_ && !closing_ && !failed_ &&
         len - off >= b.need) {
    DecodeResult r =
        b.stream.next(std::string_view(data + off, len - off), req);
    if (!dialect_noted_) noteDialect();
    if (r.kind == DecodeResult::kNeedMore) {
      b.need = r.need_at_least > 0 ? r.need_at_least : 1;
      break;
    }
    if (r.kind == DecodeResult::kError) {
      fail(set_.ctr_.forDecodeError(r.error.code), r.error.message());
      return off;
    }
    b.need = 1;
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
  BusyState& b = *busy_;
  if (b.turn_no != set_.turn_no_) {  // the first request of a new turn
    b.turn_no = set_.turn_no_;
    b.turn_bytes = 0;
    b.turn_requests = 0;
  }
  b.turn_bytes += bytes;
  ++b.turn_requests;
}

bool Connection::usedQuantum() const noexcept {
  return busy_->turn_bytes >= Connections::kQuantumBytes ||
         busy_->turn_requests >= Connections::kQuantumRequests;
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
  auto d = busy_->stream.dialect();
  if (!d) return;
  dialect_noted_ = true;
  bump(*d == Dialect::kV2 ? set_.ctr_.connections_v2
                          : set_.ctr_.connections_v113);
}

void Connection::resume() {
  if (closing_ || draining_) return;
  // Paused or pending, the server was not waiting for the peer's bytes: the
  // partial-request clock starts again.
  if (busy_ != nullptr) busy_->last_read_ms = set_.now();
  // A mux connection's channels whose queued requests waited for its output
  // to drain go first: their requests came before the frames in its input.
  if (mux() != nullptr && !paused_ && !set_.stopping_ && !failed_) {
    mux()->resumeChannels();
    if (closing_) return;
  }
  // Stopping: requests not yet decoded are not started.
  if (!paused_ && !pending_ && !yielded_ && !set_.stopping_ && !failed_ &&
      busy_ != nullptr && !busy_->in.empty()) {
    drainBuffered();
    if (closing_) return;
    busy_->in.trim();
    noteInput();
  }
  if (eof_ && !paused_ && !pending_ && !yielded_ && !set_.stopping_ &&
      !failed_) {
    eof_ = false;
    handleEof();
    return;
  }
  if ((set_.stopping_ || close_after_flush_) && !pending_ &&
      unsentBytes() == 0) {
    close();
    return;
  }
  updateReading();
  settle();
}

bool Connection::wantsToRead() const noexcept {
  return !closing_ && !paused_ && !yielded_ && !input_paused_ &&
         !input_yielded_ && !eof_ && !close_after_flush_ && !set_.stopping_ &&
         !(pending_ && busy_ != nullptr &&
           busy_->in.size() >= kPendingInputBytes);
}

void Connection::updateReading() noexcept {
  if (closing_) return;
  const bool want_in = wantsToRead();
  const bool want_out = busy_ != nullptr && busy_->outbox.writing();
  if (want_in == reading_ && want_out == polling_out_) return;
  const int events = (want_in ? UV_READABLE : 0) | (want_out ? UV_WRITABLE : 0);
  if (events == 0) {
    uv_poll_stop(&poll_);
  } else if (uv_poll_start(&poll_, events, &Connection::onPoll) != 0) {
    close();
    return;
  }
  reading_ = want_in;
  polling_out_ = want_out;
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
  if (unsentBytes() == 0 || set_.stopping_) {
    reject(counter, reason);
    return;
  }
  bump(counter);
  logClosing(reason);
  // Like a half-close: nothing more is read or decoded; the check phase
  // flushes the outbox (it is listed) and afterOutputDrained() closes.
  failed_ = true;
  close_after_flush_ = true;
  busy_->failed_ms = set_.now();  // it has output, so it is busy
  updateReading();
}

void Connection::close() noexcept {
  if (closing_) return;
  closing_ = true;
  if (busy_ != nullptr) {
    set_.input_total_ -= busy_->counted_in;
    busy_->counted_in = 0;
    if (busy_->in.capacity() >= Connections::kDeferFreeBytes)
      set_.freeLater(busy_->in);
    if (busy_->mux) busy_->mux->closeAll();
  }
  set_.closed(*this);  // uncounts the unsent output: before it is taken
  if (busy_ != nullptr &&
      busy_->outbox.size() >= Connections::kDeferFreeBytes) {
    try {
      busy_->outbox.takeChunks(set_.dead_chunks_);
      set_.continueSoon();
    } catch (...) {  // freed with the connection
    }
  }
  // The socket goes now (its poll handle stops at uv_close).
  const int f = fd();
  uv_close(reinterpret_cast<uv_handle_t*>(&poll_), &Connection::onClosed);
  if (f >= 0) ::close(f);
  if (set_.stopping_ && set_.by_id_.empty() && set_.on_drained_ != nullptr) {
    set_.on_drained_(set_.on_drained_arg_);
  }
}

void Connection::onClosed(uv_handle_t* h) noexcept {
  delete static_cast<Connection*>(h->data);
}

void Connection::stopForShutdown() noexcept {
  if (closing_) return;
  updateReading();  // stops reading: the set is stopping
  if (unsentBytes() == 0 && !pending_) {
    close();
  } else {
    flush();  // closes the connection once everything is written
  }
}

}  // namespace tcpstore::server
