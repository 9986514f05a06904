// Outbox: one connection's unsent replies, and FlushList: the connections
// whose outbox got bytes during this loop turn.
//
// Replies are appended during a read batch and written once per loop turn
// (the server's uv_check runs the FlushList), so a pipelined batch leaves in
// one write: uv_try_write first, and only what the kernel did not take goes
// to a uv_write. At most one uv_write is in flight; bytes appended meanwhile
// wait in `pending`.
//
// The bytes are held in chunks: small replies share a chunk of up to
// kChunkBytes, a larger one (or a buffer handed over whole) is a chunk of
// its own. So a large backlog never grows by doubling one buffer (copies of
// tens of MiB), and what the kernel did not take moves to the write in
// flight without a copy. A chunk may also reference a shared buffer
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
  // A uv_write is in flight: the kernel took all it would.
  bool writing() const noexcept { return writing_; }

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
    std::size_t written = 0;  // bytes the kernel took at once
  };
  // Hands the pending bytes to `stream` (no-op while a write is in flight).
  // What uv_try_write leaves goes to a uv_write whose callback is `cb`,
  // with req->data = `data`. Throws std::bad_alloc.
  Flushed flush(uv_stream_t* stream, void* data, uv_write_cb cb);
  // In the write callback: the in-flight write ended. Returns its bytes.
  // Its chunks are freed, or moved to `dead` if given (freed later).
  std::size_t finishWrite(std::vector<OutChunk>* dead = nullptr) noexcept;
  // Closing: moves the pending chunks (and those of a write no longer in
  // flight) to `dead`, to be freed later. Throws std::bad_alloc (then the
  // chunks stay here).
  void takeChunks(std::vector<OutChunk>& dead);

 private:
  template <typename T>
  friend class FlushList;
  // Fills bufs_ with the bytes of `chunks`, the first from `offset`.
  void describe(const std::vector<OutChunk>& chunks, std::size_t offset);

  std::vector<OutChunk> pending_;   // not yet handed to the kernel
  std::vector<OutChunk> inflight_;  // owned by the current uv_write
  std::size_t pending_bytes_ = 0;
  std::size_t inflight_bytes_ = 0;
  std::vector<uv_buf_t> bufs_;  // scratch of flush()
  uv_write_t wreq_{};
  bool writing_ = false;
  bool listed_ = false;  // in a FlushList
};

// T has `Outbox& outbox()`. Loop thread only.
template <typename T>
class FlushList {
 public:
  bool empty() const noexcept { return items_.empty(); }
  // Lists `t` for the next run() unless it is listed already.
  void add(T* t) {
    Outbox& o = t->outbox();
    if (o.listed_) return;
    items_.push_back(t);
    o.listed_ = true;
  }
  // Calls fn(t) for every listed item, also items listed while it runs (a
  // flush may resume a paused connection, whose buffered requests produce
  // more output), then empties the list. fn must not throw.
  template <typename Fn>
  void run(Fn fn) noexcept {
    for (std::size_t i = 0; i < items_.size(); ++i) {
      T* t = items_[i];
      t->outbox().listed_ = false;
      fn(t);
    }
    items_.clear();
  }

 private:
  std::vector<T*> items_;
};

}  // namespace tcpstore::server
