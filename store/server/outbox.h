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
// flight without a copy.
#pragma once

#include <uv.h>

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace tcpstore::server {

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
  std::size_t finishWrite(std::vector<std::string>* dead = nullptr) noexcept;
  // Closing: moves the pending chunks (and those of a write no longer in
  // flight) to `dead`, to be freed later. Throws std::bad_alloc (then the
  // chunks stay here).
  void takeChunks(std::vector<std::string>& dead);

 private:
  template <typename T>
  friend class FlushList;
  // Fills bufs_ with the bytes of `chunks`, the first from `offset`.
  void describe(const std::vector<std::string>& chunks, std::size_t offset);

  std::vector<std::string> pending_;   // not yet handed to the kernel
  std::vector<std::string> inflight_;  // owned by the current uv_write
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
