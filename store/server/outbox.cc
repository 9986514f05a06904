#include "store/server/outbox.h"

#include <limits.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <utility>

namespace tcpstore::server {

// libuv's uv_buf_t is laid out as struct iovec on Unix: bufs_ goes to
// sendmsg as it is.
static_assert(sizeof(uv_buf_t) == sizeof(iovec));
static_assert(offsetof(uv_buf_t, base) == offsetof(iovec, iov_base));
static_assert(offsetof(uv_buf_t, len) == offsetof(iovec, iov_len));

namespace {
// Largest piece of one uv_buf_t (its length is 32-bit on some platforms).
constexpr std::size_t kMaxBufBytes = std::size_t{1} << 30;
// A connection keeps one chunk of at most this capacity once its output is
// written (no allocation per reply for the common small ones).
constexpr std::size_t kKeepBytes = 64 * 1024;
#ifdef IOV_MAX
constexpr std::size_t kMaxIov = IOV_MAX;
#else
constexpr std::size_t kMaxIov = 1024;
#endif

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

// Drops the whole chunks of `chunks` that `skip` (bytes from the front,
// less than their total) covers; returns the bytes written of the new first.
std::size_t dropWritten(std::vector<OutChunk>& chunks, std::size_t skip) {
  std::size_t first = 0;
  while (skip >= chunks[first].size()) skip -= chunks[first++].size();
  chunks.erase(chunks.begin(),
               chunks.begin() + static_cast<std::ptrdiff_t>(first));
  return skip;
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

Outbox::Flushed Outbox::send(int fd) {
  Flushed f;
  std::size_t i = 0;
  while (i < bufs_.size()) {
    const std::size_t cnt = std::min(bufs_.size() - i, kMaxIov);
    std::size_t offered = 0;
    for (std::size_t k = i; k < i + cnt; ++k) offered += bufs_[k].len;
    ssize_t r = 0;
    if (cnt == 1) {  // the common case; send(2) imports no iovec
      r = ::send(fd, bufs_[i].base, bufs_[i].len, MSG_NOSIGNAL | MSG_DONTWAIT);
    } else {
      msghdr m{};
      m.msg_iov = reinterpret_cast<iovec*>(bufs_.data() + i);
      m.msg_iovlen = cnt;
      r = ::sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    if (r < 0) {
      const int err = errno;
      if (err == EINTR) continue;
      if (err != EAGAIN && err != EWOULDBLOCK)
        f.error = uv_translate_sys_error(err);
      return f;
    }
    auto n = static_cast<std::size_t>(r);
    f.written += n;
    if (n < offered) return f;  // the kernel's buffer is full
    i += cnt;
  }
  return f;
}

Outbox::Flushed Outbox::flush(int fd) {
  Flushed f;
  if (writing_ || pending_bytes_ == 0) return f;
  describe(pending_, 0);
  // Reserved first: once bytes are written, moving the rest cannot fail.
  inflight_.reserve(pending_.size());
  f = send(fd);
  if (f.error != 0) return f;
  if (f.written == pending_bytes_) {
    pending_bytes_ = 0;
    release(pending_);
    return f;
  }
  // The rest waits for writability: whole chunks, no copy. The first chunk
  // may be partly written.
  inflight_.clear();
  for (OutChunk& c : pending_) inflight_.push_back(std::move(c));
  inflight_bytes_ = pending_bytes_ - f.written;
  inflight_skip_ = dropWritten(inflight_, f.written);
  pending_.clear();
  pending_bytes_ = 0;
  writing_ = true;
  return f;
}

Outbox::Flushed Outbox::writeMore(int fd) {
  Flushed f;
  if (!writing_) return f;
  describe(inflight_, inflight_skip_);
  f = send(fd);
  if (f.error != 0) return f;
  inflight_bytes_ -= f.written;
  if (inflight_bytes_ == 0) {
    writing_ = false;
    inflight_.clear();
    inflight_skip_ = 0;
    if (inflight_.capacity() > 64) std::vector<OutChunk>().swap(inflight_);
    return f;
  }
  inflight_skip_ = dropWritten(inflight_, inflight_skip_ + f.written);
  return f;
}

void Outbox::takeChunks(std::vector<OutChunk>& dead) {
  dead.reserve(dead.size() + pending_.size() + inflight_.size());
  for (OutChunk& c : pending_) dead.push_back(std::move(c));
  pending_.clear();
  pending_bytes_ = 0;
  for (OutChunk& c : inflight_) dead.push_back(std::move(c));
  inflight_.clear();
  inflight_bytes_ = 0;
  inflight_skip_ = 0;
  writing_ = false;
}

void Outbox::shrink(std::size_t keep_bytes) noexcept {
  if (size() != 0 || writing_) return;
  if (!pending_.empty() && pending_.front().capacity() > keep_bytes)
    std::vector<OutChunk>().swap(pending_);
  if (pending_.capacity() > 4) std::vector<OutChunk>().swap(pending_);
  if (inflight_.capacity() > 4) std::vector<OutChunk>().swap(inflight_);
  if (bufs_.capacity() > 64) std::vector<uv_buf_t>().swap(bufs_);
}

}  // namespace tcpstore::server
