#include "store/server/outbox.h"

#include <algorithm>
#include <utility>

namespace tcpstore::server {

namespace {
// Largest piece of one uv_buf_t (its length is 32-bit).
constexpr std::size_t kMaxBufBytes = std::size_t{1} << 30;
// A connection keeps one chunk of at most this capacity once its output is
// written (no allocation per reply for the common small ones).
constexpr std::size_t kKeepBytes = 64 * 1024;

// Empties `chunks`, keeping a first chunk whose capacity is small.
void release(std::vector<OutChunk>& chunks) noexcept {
  if (chunks.empty()) return;
  if (chunks.front().capacity() <= kKeepBytes) {
    chunks.front().clear();
    chunks.resize(1);  // shrinking: no allocation
  } else {
    chunks.clear();
  }
  if (chunks.capacity() > 64) std::vector<OutChunk>().swap(chunks);
}
}  // namespace

void Outbox::append(std::string_view bytes) {
  if (bytes.empty()) return;
  if (pending_.empty() || pending_.back().isShared() ||
      pending_.back().size() + bytes.size() > kChunkBytes) {
    if (!pending_.empty() && pending_.back().empty()) {
      // The kept chunk: reuse it.
    } else {
      pending_.emplace_back();
    }
  }
  pending_.back().own().append(bytes.data(), bytes.size());
  pending_bytes_ += bytes.size();
}

void Outbox::append(std::string&& bytes) {
  if (bytes.size() <= kKeepBytes) {
    append(std::string_view(bytes));
    return;
  }
  const std::size_t n = bytes.size();
  if (!pending_.empty() && pending_.back().empty()) {
    pending_.back() = OutChunk(std::move(bytes));
  } else {
    pending_.emplace_back(std::move(bytes));
  }
  pending_bytes_ += n;
}

void Outbox::append(const store::SharedBytes& buf, std::size_t offset,
                    std::size_t length) {
  if (length <= kCopySharedBytes) {
    append(buf.view().substr(offset, length));
    return;
  }
  if (!pending_.empty() && pending_.back().empty()) {
    pending_.back() = OutChunk(buf, offset, length);
  } else {
    pending_.emplace_back(buf, offset, length);
  }
  pending_bytes_ += length;
}

void Outbox::describe(const std::vector<OutChunk>& chunks, std::size_t offset) {
  bufs_.clear();
  for (const OutChunk& c : chunks) {
    for (std::size_t at = offset; at < c.size(); at += kMaxBufBytes) {
      const std::size_t len = std::min(kMaxBufBytes, c.size() - at);
      bufs_.push_back(uv_buf_init(const_cast<char*>(c.data()) + at,
                                  static_cast<unsigned>(len)));
    }
    offset = 0;
  }
}

Outbox::Flushed Outbox::flush(uv_stream_t* stream, void* data, uv_write_cb cb) {
  Flushed f;
  if (writing_ || pending_bytes_ == 0) return f;
  describe(pending_, 0);
  int r =
      uv_try_write(stream, bufs_.data(), static_cast<unsigned>(bufs_.size()));
  if (r == UV_EAGAIN || r == UV_ENOSYS) r = 0;
  if (r < 0) {
    f.error = r;
    return f;
  }
  f.written = static_cast<std::size_t>(r);
  if (f.written == pending_bytes_) {
    pending_bytes_ = 0;
    release(pending_);
    return f;
  }
  // The rest moves to the write in flight: whole chunks, no copy. The
  // first chunk may be partly written.
  std::size_t skip = f.written, first = 0;
  while (skip >= pending_[first].size()) skip -= pending_[first++].size();
  inflight_.clear();
  inflight_.reserve(pending_.size() - first);
  for (std::size_t i = first; i < pending_.size(); ++i)
    inflight_.push_back(std::move(pending_[i]));
  inflight_bytes_ = pending_bytes_ - f.written;
  pending_.clear();
  pending_bytes_ = 0;
  describe(inflight_, skip);
  wreq_.data = data;
  int rc = uv_write(&wreq_, stream, bufs_.data(),
                    static_cast<unsigned>(bufs_.size()), cb);
  if (rc != 0) {
    f.error = rc;
    return f;
  }
  writing_ = true;
  return f;
}

void Outbox::takeChunks(std::vector<OutChunk>& dead) {
  dead.reserve(dead.size() + pending_.size() +
               (writing_ ? 0 : inflight_.size()));
  for (OutChunk& c : pending_) dead.push_back(std::move(c));
  pending_.clear();
  pending_bytes_ = 0;
  if (writing_) return;
  for (OutChunk& c : inflight_) dead.push_back(std::move(c));
  inflight_.clear();
  inflight_bytes_ = 0;
}

std::size_t Outbox::finishWrite(std::vector<OutChunk>* dead) noexcept {
  writing_ = false;
  const std::size_t n = inflight_bytes_;
  inflight_bytes_ = 0;
  if (dead != nullptr) {
    try {
      takeChunks(*dead);
    } catch (...) {  // freed below, now
    }
  }
  inflight_.clear();
  if (inflight_.capacity() > 64) std::vector<OutChunk>().swap(inflight_);
  return n;
}

}  // namespace tcpstore::server
