// Connection, socket side: the poll handle's events, reads into the
// scratch or the connection's own buffer, and what is polled for.
#include <fmt/format.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>

#include "store/server/connection.h"
#include "store/server/connections.h"
#include "store/server/net.h"

namespace tcpstore::server {

namespace {
// A connection reading in place gets at least this much free tail.
constexpr std::size_t kMinFreeTail = 64 * 1024;
// Largest read into a connection's own buffer: every fresh page read into
// is a page fault.
constexpr std::size_t kMaxReadBytes = 1024 * 1024;
// Reads per readable event (as libuv's streams): the socket is polled
// level-triggered, so what is left is read on the next loop turn.
constexpr int kMaxReadsPerEvent = 32;
}  // namespace

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
    // recv(2), not read(2): a socket read through the VFS costs the
    // server ~3% more CPU in the 16K-rank heartbeat (vfs_read, fdget_pos).
    const ssize_t r = ::recv(fd(), buf, len, 0);
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

}  // namespace tcpstore::server
