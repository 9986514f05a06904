// Connection: its busy state, decoding, resuming and closing (the socket
// side is connection_poll.cc, the output side connection_output.cc).
#include "store/server/connection.h"

#include <fmt/format.h>
#include <unistd.h>

#include "store/server/connections.h"
#include "store/server/mux_session.h"
#include "store/server/net.h"

namespace tcpstore::server {

using protocol::DecodeResult;
using protocol::Dialect;

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

// ---- Connection: decode ----------------------------------------------------

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
  // A backend with replies still owed (a relay's, in flight upstream) holds
  // the connection pending; resume() judges the EOF again once they are out.
  if (mux() == nullptr && set_.handler_->onPeerEof(*this)) {
    eof_ = true;
    updateReading();
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
    if (set_.stopping_ || mux() != nullptr || pending_) return false;
    try {
      return set_.handler_->onPeerEof(*this);
    } catch (...) {
      return false;
    }
  }();
  if ((unsentBytes() == 0 && !owed) || set_.stopping_) {
    reject(counter, reason);
    return;
  }
  // Held with replies owed but none queued yet: it needs its busy state
  // (for failed_ms) like a connection with output.
  try {
    busy();
  } catch (...) {
    reject(counter, reason);
    return;
  }
  bump(counter);
  logClosing(reason);
  // Like a half-close: nothing more is read or decoded; the check phase
  // flushes the outbox (it is listed) and afterOutputDrained() closes.
  failed_ = true;
  close_after_flush_ = true;
  busy_->failed_ms = set_.now();
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
