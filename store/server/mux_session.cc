#include "store/server/mux_session.h"

#include <fmt/format.h>

#include <algorithm>

#include "store/server/connection.h"
#include "store/server/connections.h"

namespace tcpstore::server {

using protocol::DecodeResult;
using protocol::Dialect;
namespace mux = protocol::mux;

namespace {
// A REQUEST payload may pass the request limit by this much, so a request
// just over it is refused on its channel (by the decoder) rather than
// taken for a relay bug that closes every channel.
constexpr std::uint64_t kRequestMarginBytes = 64 * 1024;
// CLOSED reasons are cut to this length.
constexpr std::size_t kMaxReasonBytes = 1024;

std::uint64_t payloadLimit(std::uint64_t max_request_bytes) noexcept {
  constexpr std::uint64_t kU32 = 0xffffffffu;
  return max_request_bytes >= kU32 - kRequestMarginBytes
             ? kU32
             : max_request_bytes + kRequestMarginBytes;
}
}  // namespace

MuxPreamble detectMuxPreamble(std::string_view first) noexcept {
  // A lone 0xff is garbage that torch's servers close at once: so do we.
  if (first.size() == 1) return MuxPreamble::kNo;
  const std::size_t n = std::min(first.size(), mux::kMuxPreamble.size());
  if (first.substr(0, n) != mux::kMuxPreamble.substr(0, n))
    return MuxPreamble::kNo;
  return n == mux::kMuxPreamble.size() ? MuxPreamble::kYes
                                       : MuxPreamble::kNeedMore;
}

// ---- Channel ---------------------------------------------------------------

Channel::Channel(MuxSession& session, ConnId id, std::uint32_t number,
                 Dialect dialect) noexcept
    : Endpoint(id), session_(session), number_(number), dialect_(dialect) {}

Channel::~Channel() = default;

std::string Channel::peerName() const {
  return fmt::format("{} channel {}", session_.conn_.peerName(), number_);
}

std::string_view Channel::dialectName() const noexcept {
  return protocol::dialectName(dialect_);
}

void Channel::send(std::string_view bytes, bool) {
  if (closing_) return;
  // A relay asked for everything its channels get (a DATA frame is never an
  // unrequested push that could drop the relay's connection).
  std::string head;
  do {
    const std::size_t n = std::min(bytes.size(), kMaxDataFrameBytes);
    head.clear();
    mux::appendFrameHeader(head, mux::FrameType::kData, number_,
                           static_cast<std::uint32_t>(n));
    session_.conn_.send(head, bytes.substr(0, n), true);
    bytes.remove_prefix(n);
  } while (!bytes.empty());
}

void Channel::request(std::string_view payload) {
  if (eof_) {
    session_.violation(
        fmt::format("REQUEST on channel {} after its SHUTDOWN", number_));
    return;
  }
  if (pending_ || draining_ || (queue_ != nullptr && !queue_->empty())) {
    enqueue(payload);
    return;
  }
  dispatch(payload);
}

void Channel::dispatch(std::string_view payload) {
  Connections& set = session_.set_;
  protocol::Request& req = set.req_;
  DecodeResult r = session_.stream(dialect_).next(payload, req);
  if (r.failed()) {
    session_.resetStream(dialect_);
    reject(set.ctr_.forDecodeError(r.error.code), r.error.message());
    return;
  }
  if (!r.frame() || r.consumed != payload.size()) {
    session_.resetStream(dialect_);
    session_.violation(fmt::format(
        "REQUEST of {} bytes on channel {} is not exactly one {} request",
        payload.size(), number_, dialectName()));
    return;
  }
  set.handler_->onRequest(*this, req);
}

void Channel::enqueue(std::string_view payload) {
  Connections& set = session_.set_;
  const MemoryUse use = set.memoryUse();
  if (set.budget_.refuse(use, payload.size())) {
    reject(set.ctr_.budget_refused,
           fmt::format("a request of {} bytes queued behind a pending one "
                       "would cross the memory budget ({} of {} bytes held)",
                       payload.size(), use.total(), set.budget_.max()));
    return;
  }
  if (queue_ == nullptr) queue_ = std::make_unique<Queue>();
  Queue& q = *queue_;
  // Drop the consumed front once it is most of the buffer (never while a
  // queued request's bytes are being dispatched).
  if (!draining_ && q.next_byte > 0 && q.next_byte >= q.bytes.size() / 2) {
    q.bytes.erase(0, q.next_byte);
    q.lengths.erase(q.lengths.begin(),
                    q.lengths.begin() + static_cast<std::ptrdiff_t>(q.next));
    q.next = 0;
    q.next_byte = 0;
  }
  q.bytes.append(payload.data(), payload.size());
  q.lengths.push_back(static_cast<std::uint32_t>(payload.size()));
  const std::size_t now = q.bytes.capacity() + 4 * q.lengths.capacity();
  set.input_total_ += now;
  set.input_total_ -= q.charged;
  q.charged = now;
}

void Channel::releaseQueue() noexcept {
  if (queue_ == nullptr) return;
  session_.set_.input_total_ -= queue_->charged;
  queue_.reset();
}

void Channel::shutdown() {
  if (eof_) {
    session_.violation(fmt::format("second SHUTDOWN of channel {}", number_));
    return;
  }
  eof_ = true;
  finishIfDone();
}

void Channel::finishIfDone() {
  if (closing_ || !eof_ || pending_ || draining_ ||
      (queue_ != nullptr && !queue_->empty()))
    return;
  Connection& c = session_.conn_;
  if (c.closing_ || session_.set_.stopping_) return;
  // A backend with replies still owed (a relay behind this one) leaves the
  // channel pending; its completion calls resume(), which comes back here.
  if (session_.set_.handler_->onPeerEof(*this)) return;
  session_.closeChannel(*this, true, {});
}

void Channel::resume() {
  if (closing_ || draining_) return;
  if (queue_ == nullptr) {
    finishIfDone();
    return;
  }
  Connection& c = session_.conn_;
  if (c.closing_ || session_.set_.stopping_) return;
  draining_ = true;
  struct Reset {
    bool& flag;
    ~Reset() { flag = false; }
  } reset{draining_};
  while (!pending_ && !closing_ && !queue_->empty()) {
    if (c.paused_) {  // its output is over the cap: wait with the others
      session_.blocked_.push_back(number_);
      return;
    }
    // The view stays valid through the dispatch: frames are decoded only on
    // the connection's read path, never from inside a dispatch, so nothing
    // is appended to this queue meanwhile (and a close keeps it alive).
    Queue& q = *queue_;
    const std::uint32_t n = q.lengths[q.next];
    std::string_view payload(q.bytes.data() + q.next_byte, n);
    ++q.next;
    q.next_byte += n;
    dispatch(payload);
  }
  if (!closing_ && queue_->empty()) releaseQueue();
  reset.flag = false;
  finishIfDone();
}

void Channel::logClosing(std::string_view reason) noexcept {
  Connections& set = session_.set_;
  if (!set.log_.enabled(LogLevel::kWarn)) return;
  try {
    set.logRejection(
        fmt::format("closing channel {} of mux connection from "
                    "{} ({}): {}",
                    number_, session_.conn_.peerName(), dialectName(), reason));
  } catch (...) {
  }
}

void Channel::reject(Counter& counter, std::string_view reason) noexcept {
  if (closing_) return;
  bump(counter);
  logClosing(reason);
  session_.closeChannel(*this, true, reason);
}

void Channel::drop(std::string_view reason) noexcept {
  if (closing_) return;
  logClosing(reason);
  session_.closeChannel(*this, true, reason);
}

// ---- MuxSession ------------------------------------------------------------

MuxSession::MuxSession(Connection& conn)
    : conn_(conn),
      set_(conn.set_),
      max_payload_(payloadLimit(conn.set_.limits_.max_request_bytes)),
      v113_(conn.set_.limits_, Dialect::kV113, true),
      v2_(conn.set_.limits_, Dialect::kV2, true) {
  bump(set_.ctr_.mux_connections);
}

MuxSession::~MuxSession() = default;

void MuxSession::resetStream(Dialect d) noexcept {
  stream(d) = protocol::RequestStream(set_.limits_, d, true);
}

std::size_t MuxSession::drain(const char* data, std::size_t len) {
  Connection& c = conn_;
  std::size_t off = 0;
  mux::Frame f;
  while (!c.paused_ && !c.closing_ && !c.failed_ &&
         len - off >= c.busy_->need) {
    std::string_view in(data + off, len - off);
    // Server-to-relay types are refused at their first byte, before their
    // payload is buffered.
    const auto type = static_cast<mux::FrameType>(in[0]);
    if (type == mux::FrameType::kData || type == mux::FrameType::kClosed) {
      violation(fmt::format("{} frame from the relay (the server sends those)",
                            mux::frameTypeName(type)));
      return off;
    }
    mux::FrameDecodeResult r = mux::decodeFrame(in, max_payload_, f);
    if (r.status == mux::FrameDecodeResult::kNeedMore) {
      c.busy_->need = r.need_at_least;
      break;
    }
    if (r.status == mux::FrameDecodeResult::kError) {
      violation(r.error);
      return off;
    }
    c.busy_->need = 1;
    off += r.consumed;
    onFrame(f);
  }
  return off;
}

void MuxSession::onFrame(const mux::Frame& f) {
  switch (f.type) {
    case mux::FrameType::kOpen:
      if (f.channel <= highest_) {
        violation(
            fmt::format("OPEN of channel {}: ids must increase (highest "
                        "opened so far {})",
                        f.channel, highest_));
        return;
      }
      highest_ = f.channel;
      open(f.channel, static_cast<Dialect>(f.payload[0]));
      return;
    case mux::FrameType::kRequest:
    case mux::FrameType::kClose:
    case mux::FrameType::kShutdown: {
      if (f.channel == 0 || f.channel > highest_) {
        violation(fmt::format("{} for channel {}, which was never opened",
                              mux::frameTypeName(f.type), f.channel));
        return;
      }
      auto it = channels_.find(f.channel);
      if (it == channels_.end()) return;  // it crossed our CLOSED
      Channel& ch = *it->second;
      if (f.type == mux::FrameType::kRequest) {
        ch.request(f.payload);
      } else if (f.type == mux::FrameType::kShutdown) {
        ch.shutdown();
      } else {
        closeChannel(ch, false, {});
      }
      return;
    }
    case mux::FrameType::kData:
    case mux::FrameType::kClosed:
      violation(
          fmt::format("{} frame from the relay", mux::frameTypeName(f.type)));
      return;
  }
}

void MuxSession::open(std::uint32_t number, Dialect dialect) {
  if (channels_.size() >= set_.max_mux_channels_) {
    refuse(number, set_.ctr_.mux_channels_refused,
           fmt::format("too many channels on this connection (limit {})",
                       set_.max_mux_channels_));
    return;
  }
  const MemoryUse use = set_.memoryUse();
  if (set_.budget_.refuse(use, kChannelBytes)) {
    bump(set_.ctr_.mux_channels_refused);
    refuse(number, set_.ctr_.budget_refused,
           fmt::format("memory budget: the server holds {} of {} bytes",
                       use.total(), set_.budget_.max()));
    return;
  }
  auto ch = std::make_unique<Channel>(*this, set_.next_id_++, number, dialect);
  Channel* p = ch.get();
  set_.channels_.emplace(p->id(), p);
  try {
    channels_.emplace(number, std::move(ch));
  } catch (...) {
    set_.channels_.erase(p->id());
    throw;
  }
  set_.input_total_ += kChannelBytes;
  bump(set_.ctr_.mux_channels_opened);
}

void MuxSession::refuse(std::uint32_t number, Counter& counter,
                        std::string_view reason) {
  bump(counter);
  if (set_.log_.enabled(LogLevel::kWarn)) {
    set_.logRejection(
        fmt::format("refusing channel {} of mux connection from {}: {}", number,
                    conn_.peerName(), reason));
  }
  sendClosed(number, reason);
}

void MuxSession::sendClosed(std::uint32_t number, std::string_view reason) {
  reason = reason.substr(0, kMaxReasonBytes);
  std::string head;
  mux::appendFrameHeader(head, mux::FrameType::kClosed, number,
                         static_cast<std::uint32_t>(reason.size()));
  conn_.send(head, reason, true);
}

void MuxSession::violation(std::string_view reason) noexcept {
  try {
    conn_.reject(set_.ctr_.rejected_protocol,
                 fmt::format("relay extension: {}", reason));
  } catch (...) {
    conn_.close();
  }
}

void MuxSession::retire(Channel& ch) noexcept {
  ch.closing_ = true;
  set_.handler_->onClosing(ch);
  set_.channels_.erase(ch.id());
  set_.input_total_ -= kChannelBytes;
  // The queue's bytes leave the budget now but are freed with the channel:
  // a request of it may be on the stack.
  if (ch.queue_ != nullptr) {
    set_.input_total_ -= ch.queue_->charged;
    ch.queue_->charged = 0;
  }
  bump(set_.ctr_.mux_channels_closed);
}

void MuxSession::closeChannel(Channel& ch, bool tell,
                              std::string_view reason) noexcept {
  if (ch.closing_) return;
  if (tell) {
    try {
      sendClosed(ch.number_, reason);
    } catch (...) {  // cannot tell the relay: it must not wait forever
      retire(ch);
      conn_.reject(set_.ctr_.rejected_limit,
                   "out of memory while closing a channel");
      return;
    }
  }
  auto it = channels_.find(ch.number_);
  retire(ch);
  if (it == channels_.end()) return;  // closeAll() holds it
  it->second->next_dead_ = std::move(set_.dead_channels_);
  set_.dead_channels_ = std::move(it->second);
  channels_.erase(it);
}

void MuxSession::closeAll() noexcept {
  for (auto& [number, ch] : channels_) {
    if (!ch->closing_) retire(*ch);
    ch->next_dead_ = std::move(set_.dead_channels_);
    set_.dead_channels_ = std::move(ch);
  }
  channels_.clear();
  blocked_.clear();
}

void MuxSession::resumeChannels() {
  if (blocked_.empty()) return;
  std::vector<std::uint32_t> ids;
  ids.swap(blocked_);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (conn_.paused_ || conn_.closing_) {  // paused again: the rest wait
      blocked_.insert(blocked_.end(),
                      ids.begin() + static_cast<std::ptrdiff_t>(i), ids.end());
      return;
    }
    auto it = channels_.find(ids[i]);
    if (it != channels_.end()) it->second->resume();
  }
}

}  // namespace tcpstore::server
