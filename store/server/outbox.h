// Outbox: one connection's unsent replies, and FlushList: the connections
// whose outbox got bytes during this loop turn.
//
// Replies are appended during a read batch and written at its end (those
// queued outside a read batch: once per loop turn, when the server's
// uv_check runs the FlushList), so a pipelined batch leaves in one
// sendmsg(2). What the kernel does not take waits in `inflight` (the
// connection then polls for writability and calls writeMore()); bytes
// appended meanwhile wait in `pending`. No libuv write request: the socket
// is written directly (non-blocking, MSG_NOSIGNAL).
//
// The bytes are held in chunks: small replies share a chunk of up to
// kChunkBytes, a larger one (or a buffer handed over whole) is a chunk of
// its own. So a large backlog never grows by doubling one buffer (copies of
// tens of MiB), and what the kernel did not take moves to `inflight`
// without a copy. A chunk may also reference a shared buffer
// (store/shared_bytes.h: one reply queued to many connections): the outbox
// then holds a reference to those bytes, never a copy.
#pragma once

#include <uv.h>

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "store/shared_bytes.h"

namespace tcpstore::server {

// One piece of an outbox's bytes: owned bytes (a std::string, appended to
// while it is the last pending chunk), or a range of a shared buffer
// (never appended to). Moves cheaply; describe() reads data()/size().
class OutChunk {
 public:
  OutChunk() = default;
  explicit OutChunk(std::string bytes) noexcept : own_(std::move(bytes)) {}
  OutChunk(store::SharedBytes buf, std::size_t offset,
           std::size_t length) noexcept
      : shared_(std::move(buf)), offset_(offset), length_(length) {}

  const char* data() const noexcept {
    return shared_ ? shared_.data() + offset_ : own_.data();
  }
  std::size_t size() const noexcept { return shared_ ? length_ : own_.size(); }
  bool empty() const noexcept { return size() == 0; }
  bool isShared() const noexcept { return static_cast<bool>(shared_); }
  // Bytes this chunk keeps alive: its own capacity, or the shared range
  // (the buffer itself may outlive it).
  std::size_t capacity() const noexcept {
    return own_.capacity() + (shared_ ? length_ : 0);
  }
  // Empties it as an owned chunk (keeping its own capacity).
  void clear() noexcept {
    own_.clear();
    shared_.reset();
    offset_ = length_ = 0;
  }
  // The owned bytes (append target); only for a chunk that is not shared.
  std::string& own() noexcept { return own_; }

 private:
  std::string own_;
  store::SharedBytes shared_;
  std::size_t offset_ = 0;
  std::size_t length_ = 0;
};

class Outbox {
 public:
  // Small appends share a chunk up to this size.
  static constexpr std::size_t kChunkBytes = 256 * 1024;

  // Unsent bytes (pending and in flight).
  std::size_t size() const noexcept { return pending_bytes_ + inflight_bytes_; }
  bool hasPending() const noexcept { return pending_bytes_ > 0; }
  // The kernel took all it would: the rest waits for the socket to become
  // writable (writeMore()).
  bool writing() const noexcept { return writing_; }
  // Bytes the kernel did not take yet (the rest of the last flush()).
  std::size_t inflightBytes() const noexcept { return inflight_bytes_; }

  // Copies `bytes` to the end. Throws std::bad_alloc.
  void append(std::string_view bytes);
  // Moves `bytes` to the end (no copy when it is large). Throws
  // std::bad_alloc.
  void append(std::string&& bytes);
  // Queues `length` bytes of `buf` from `offset` by reference (a small range
  // is copied instead: a chunk of its own would cost more). Throws
  // std::bad_alloc.
  void append(const store::SharedBytes& buf, std::size_t offset,
              std::size_t length);
  // Ranges of a shared buffer at most this long are copied.
  static constexpr std::size_t kCopySharedBytes = 512;

  struct Flushed {
    int error = 0;            // a libuv error: the connection must close
    std::size_t written = 0;  // bytes the kernel took
  };
  // Writes the pending bytes to the non-blocking socket `fd` (no-op while
  // writing()). What the kernel does not take is kept for writeMore() and
  // writing() turns true. Throws std::bad_alloc.
  Flushed flush(int fd);
  // The socket became writable: writes more of what the kernel did not
  // take. writing() turns false once all of it is written (pending bytes
  // then wait for the next flush()). Throws std::bad_alloc.
  Flushed writeMore(int fd);
  // Closing: moves every chunk to `dead`, to be freed later. Throws
  // std::bad_alloc (then the chunks stay here).
  void takeChunks(std::vector<OutChunk>& dead);
  // Empty outbox kept for reuse: frees its chunks and scratch unless their
  // capacity is at most `keep_bytes`.
  void shrink(std::size_t keep_bytes) noexcept;

 private:
  // Fills bufs_ with the bytes of `chunks`, the first from `offset`.
  void describe(const std::vector<OutChunk>& chunks, std::size_t offset);
  // sendmsg of bufs_ (IOV_MAX at a time) until all or EAGAIN.
  Flushed send(int fd);

  std::vector<OutChunk> pending_;   // not yet handed to the kernel
  std::vector<OutChunk> inflight_;  // the rest of the last flush()
  std::size_t pending_bytes_ = 0;
  std::size_t inflight_bytes_ = 0;
  std::size_t inflight_skip_ = 0;  // bytes of inflight_[0] already written
  std::vector<uv_buf_t> bufs_;     // scratch of flush()
  bool writing_ = false;
};

// T has `bool listed() const` and `void setListed(bool)`. Loop thread only.
template <typename T>
class FlushList {
 public:
  bool empty() const noexcept { return items_.empty(); }
  // Lists `t` for the next run() unless it is listed already.
  void add(T* t) {
    if (t->listed()) return;
    items_.push_back(t);
    t->setListed(true);
  }
  // Calls fn(t) for every listed item, also items listed while it runs (a
  // flush may resume a paused connection, whose buffered requests produce
  // more output), then empties the list. fn must not throw.
  template <typename Fn>
  void run(Fn fn) noexcept {
    for (std::size_t i = 0; i < items_.size(); ++i) {
      T* t = items_[i];
      t->setListed(false);
      fn(t);
    }
    items_.clear();
  }

 private:
  std::vector<T*> items_;
};

}  // namespace tcpstore::server
