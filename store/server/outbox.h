// Outbox: one connection's unsent replies, and FlushList: the connections
// whose outbox got bytes during this loop turn.
//
// Replies are appended during a read batch and written once per loop turn
// (the server's uv_check runs the FlushList), so a pipelined batch leaves in
// one write: uv_try_write first, and only what the kernel did not take goes
// to a uv_write (in 1 GiB pieces: uv_buf_t lengths are 32-bit). At most one
// uv_write is in flight; bytes appended meanwhile wait in `pending`.
#pragma once

#include <uv.h>

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace tcpstore::server {

class Outbox {
 public:
  // Unsent bytes (pending and in flight).
  std::size_t size() const noexcept {
    return pending_.size() + inflight_.size();
  }
  bool hasPending() const noexcept { return !pending_.empty(); }
  // A uv_write is in flight: the kernel took all it would.
  bool writing() const noexcept { return writing_; }

  // Throws std::bad_alloc.
  void append(std::string_view bytes) {
    pending_.append(bytes.data(), bytes.size());
  }

  struct Flushed {
    int error = 0;            // a libuv error: the connection must close
    std::size_t written = 0;  // bytes the kernel took at once
  };
  // Hands the pending bytes to `stream` (no-op while a write is in flight).
  // What uv_try_write leaves goes to a uv_write whose callback is `cb`,
  // with req->data = `data`. Throws std::bad_alloc.
  Flushed flush(uv_stream_t* stream, void* data, uv_write_cb cb);
  // In the write callback: the in-flight write ended. Returns its bytes.
  std::size_t finishWrite() noexcept;

 private:
  template <typename T>
  friend class FlushList;
  std::string pending_;   // not yet handed to the kernel
  std::string inflight_;  // owned by the current uv_write
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
