// InputBuffer: one connection's unparsed request bytes.
//
// One contiguous buffer with a consumed front [0, begin), the live bytes
// [begin, end) and a free tail [end, cap). The reader writes into the tail
// (reserveTail/commit or append), the decoder consumes from the front, and
// trim() once per read batch keeps memory bounded. Grows geometrically; never
// shrinks while it holds bytes. Pure data, no I/O.
//
// Growth is a realloc(): a large buffer is its own mapping (the server sets
// glibc's mmap threshold, see main.cc), which glibc grows with mremap, moving
// page-table entries instead of copying the bytes. So a 96 MiB partial
// request grows to its size without copies of tens of MiB.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

namespace tcpstore::server {

class InputBuffer {
 public:
  // Smallest allocation.
  static constexpr std::size_t kMinCapacity = 256;
  // Buffers above this are released when they become empty, so one large
  // request does not pin memory on an idle connection.
  static constexpr std::size_t kKeepBytes = 64 * 1024;

  std::size_t size() const noexcept { return end_ - begin_; }
  bool empty() const noexcept { return end_ == begin_; }
  char* data() noexcept { return buf_.get() + begin_; }
  std::size_t capacity() const noexcept { return cap_; }
  std::size_t freeTail() const noexcept { return cap_ - end_; }
  char* tail() noexcept { return buf_.get() + end_; }

  // Makes sure at least `n` bytes are free after the data (compacting or
  // growing); returns the tail. Throws std::bad_alloc.
  char* reserveTail(std::size_t n) {
    if (cap_ - end_ >= n) return buf_.get() + end_;
    const std::size_t live = size();
    if (begin_ > 0 && cap_ - live >= n) {  // enough room once compacted
      std::memmove(buf_.get(), buf_.get() + begin_, live);
      begin_ = 0;
      end_ = live;
      return buf_.get() + end_;
    }
    const std::size_t want = live + n;
    std::size_t cap = cap_ < kMinCapacity ? kMinCapacity : cap_ * 2;
    while (cap < want) cap *= 2;
    if (live == 0) {
      buf_.reset();  // nothing to keep: realloc would copy the old bytes
      cap_ = 0;
    } else if (begin_ > 0) {
      std::memmove(buf_.get(), data(), live);
    }
    void* next = std::realloc(buf_.get(), cap);  // keeps the live bytes
    if (next == nullptr) {
      begin_ = 0;  // still valid: the bytes were moved to the front
      end_ = live;
      throw std::bad_alloc();
    }
    (void)buf_.release();
    buf_.reset(static_cast<char*>(next));
    cap_ = cap;
    begin_ = 0;
    end_ = live;
    return buf_.get() + end_;
  }
  // `n` bytes were written at tail(); n <= freeTail().
  void commit(std::size_t n) noexcept { end_ += n; }
  // Copies `n` bytes to the end. Throws std::bad_alloc.
  void append(const char* p, std::size_t n) {
    if (n == 0) return;
    std::memcpy(reserveTail(n), p, n);
    end_ += n;
  }
  // The first `n` live bytes were parsed; n <= size().
  void consume(std::size_t n) noexcept { begin_ += n; }
  // Once per read batch: when empty, rewind (and release a large buffer);
  // when the consumed front is past half, move the live bytes to the front.
  void trim() noexcept {
    if (begin_ == end_) {
      begin_ = end_ = 0;
      if (cap_ > kKeepBytes) {
        buf_.reset();
        cap_ = 0;
      }
    } else if (begin_ > cap_ / 2) {
      const std::size_t live = size();
      std::memmove(buf_.get(), buf_.get() + begin_, live);
      begin_ = 0;
      end_ = live;
    }
  }

  struct Free {
    void operator()(char* p) const noexcept { std::free(p); }
  };
  using Storage = std::unique_ptr<char, Free>;
  // Hands over the allocation (to be freed later) and empties this buffer.
  Storage takeStorage() noexcept {
    cap_ = begin_ = end_ = 0;
    return std::move(buf_);
  }

 private:
  Storage buf_;
  std::size_t cap_ = 0;
  std::size_t begin_ = 0;
  std::size_t end_ = 0;
};

}  // namespace tcpstore::server
