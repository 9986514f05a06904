// Connection, output side: queueing replies under the output policy,
// flushing them once per loop turn, and resuming a paused connection.
#include <fmt/format.h>

#include "store/server/connection.h"
#include "store/server/connections.h"

namespace tcpstore::server {

// ---- Connection: output ----------------------------------------------------

bool Connection::refusePush(std::size_t n) noexcept {
  const OutputLimits& lim = set_.output_;
  if (!dropUnrequestedPush(lim, set_.total_output_, outbox_.size(), n))
    return false;
  reject(set_.ctr_.rejected_slow_reader,
         fmt::format("{} unsent bytes while the server's unsent output is "
                     "past its budget of {} bytes",
                     outbox_.size() + n, lim.total_budget));
  return true;
}

void Connection::send(std::string_view head, std::string_view body,
                      bool requested) {
  if (closing_) return;
  const std::size_t n = head.size() + body.size();
  if (!requested && refusePush(n)) return;
  outbox_.append(head);
  if (!body.empty()) outbox_.append(body);
  queued(n);
}

void Connection::sendOwned(std::string bytes) {
  if (closing_) return;
  const std::size_t n = bytes.size();
  outbox_.append(std::move(bytes));
  queued(n);
}

// A shared buffer is charged to each connection holding it by length (the
// server's unsent output and this connection's cap), as if copied: the cap
// measures how far this reader is behind, and the budget's drop of the
// largest non-reader must lower the total by what it charged, whoever else
// still holds the buffer. So the charge can only be higher than the memory
// really held, never lower.
void Connection::sendShared(const store::SharedBytes& buf, std::size_t offset,
                            std::size_t length, bool requested) {
  if (closing_ || length == 0) return;
  if (!requested && refusePush(length)) return;
  outbox_.append(buf, offset, length);
  if (length > Outbox::kCopySharedBytes) bump(set_.ctr_.shared_replies);
  queued(length);
}

void Connection::queued(std::size_t n) {
  set_.total_output_ += n;
  set_.turn_output_ += n;
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
  // Closing: a large backlog is freed over later turns (unmapping it here
  // could take tens of ms per connection dropped).
  const std::size_t n =
      c->outbox_.finishWrite(c->closing_ ? &c->set_.dead_chunks_ : nullptr);
  // (Stopping, the loop's handles may be closed already: no idle then; the
  // chunks are freed with the set.)
  if (c->closing_ && !c->set_.stopping_) c->set_.continueSoon();
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

}  // namespace tcpstore::server
