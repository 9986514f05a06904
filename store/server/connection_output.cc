// Connection, output side: queueing replies under the output policy,
// flushing them once per loop turn, and resuming a paused connection.
#include <fmt/format.h>

#include "store/server/connection.h"
#include "store/server/connections.h"

namespace tcpstore::server {

// ---- Connection: output ----------------------------------------------------

bool Connection::refusePush(std::size_t n) noexcept {
  const OutputLimits& lim = set_.output_;
  if (!dropUnrequestedPush(lim, set_.total_output_, unsentBytes(), n))
    return false;
  reject(set_.ctr_.rejected_slow_reader,
         fmt::format("{} unsent bytes while the server's unsent output is "
                     "past its budget of {} bytes",
                     unsentBytes() + n, lim.total_budget));
  return true;
}

void Connection::send(std::string_view head, std::string_view body,
                      bool requested) {
  if (closing_) return;
  const std::size_t n = head.size() + body.size();
  if (!requested && refusePush(n)) return;
  Outbox& out = busy().outbox;
  out.append(head);
  if (!body.empty()) out.append(body);
  queued(n);
}

void Connection::sendOwned(std::string bytes) {
  if (closing_) return;
  const std::size_t n = bytes.size();
  busy().outbox.append(std::move(bytes));
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
  busy().outbox.append(buf, offset, length);
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
  BusyState& b = *busy_;
  CapAction action =
      judgeOutput(lim, b.outbox.size(), b.outbox.writing(), paused_);
  // A relay's connection carries many clients' replies: a full kernel buffer
  // is not a reason to drop them all. It is paused (flow control); the stall
  // timer and the memory budget still drop a relay that stopped reading.
  if (b.mux && action == CapAction::kDrop)
    action = paused_ ? CapAction::kNone : CapAction::kPause;
  switch (action) {
    case CapAction::kDrop:
      reject(set_.ctr_.rejected_slow_reader,
             fmt::format("slow reader: {} bytes of replies not taken (limit "
                         "{})",
                         b.outbox.size(), 2 * lim.cap));
      return;
    case CapAction::kPause:
      paused_ = true;
      updateReading();
      if (lim.stall_ms > 0 && !set_.stopping_) {
        b.stall.start(set_.now());
        set_.paused(*this);
      }
      return;
    case CapAction::kNone:
      return;
  }
}

bool Connection::noteWritten(const Outbox::Flushed& f) noexcept {
  bump(set_.ctr_.bytes_out, f.written);
  if (f.written > 0) busy_->stall.progressed(set_.now());
  set_.total_output_ -= f.written;
  if (f.error == 0) return true;
  try {
    set_.log_.log(LogLevel::kDebug,
                  fmt::format("connection {} from {}: write error {}", id_,
                              peerName(), uv_strerror(f.error)));
  } catch (...) {
  }
  close();
  return false;
}

void Connection::flush() noexcept {
  if (closing_ || busy_ == nullptr) return;
  try {
    Outbox::Flushed f = busy_->outbox.flush(fd());
    if (!noteWritten(f)) return;
    if (busy_->outbox.writing()) {
      updateReading();  // polls for writability
      checkOutput();
      if (closing_) return;
    }
  } catch (...) {
    reject(set_.ctr_.rejected_limit, "out of memory while writing");
    return;
  }
  afterOutputDrained();
}

void Connection::handleWritable() noexcept {
  if (closing_ || busy_ == nullptr) return;
  try {
    Outbox::Flushed f = busy_->outbox.writeMore(fd());
    if (!noteWritten(f)) return;
    if (!busy_->outbox.writing()) {
      updateReading();  // stops polling for writability
      if (busy_->outbox.hasPending()) {
        flush();
        return;
      }
    }
  } catch (...) {
    reject(set_.ctr_.rejected_limit, "out of memory while writing");
    return;
  }
  afterOutputDrained();
}

// Some output was handed to the kernel: close a connection that was only
// waiting for that, resume a paused one that drained enough, or let an
// idle one give its busy state back.
void Connection::afterOutputDrained() noexcept {
  if (closing_) return;
  if ((set_.stopping_ || close_after_flush_) && unsentBytes() == 0 &&
      !pending_) {
    close();
    return;
  }
  if (paused_ && !set_.stopping_ && !close_after_flush_ &&
      mayResume(set_.output_, unsentBytes())) {
    paused_ = false;
    try {
      resume();  // settles
    } catch (...) {
      reject(set_.ctr_.rejected_limit, "out of memory while writing");
    }
    return;
  }
  settle();
}

}  // namespace tcpstore::server
