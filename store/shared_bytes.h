// SharedBytes: an immutable byte buffer held by reference count, so one
// reply built once (a MULTI_GET many ranks send alike, a relay's coalesced
// read) is queued to many connections without a copy per connection.
//
// Why not std::shared_ptr<const std::string>: the handle is one pointer (8
// bytes in every outbox chunk and Effects send, not 16), and the count is a
// plain integer: every holder lives on one loop thread, so the atomic
// read-modify-write libstdc++ does per copy in a threaded binary buys
// nothing. The price: a SharedBytes and its copies must be used by one
// thread at a time (handing all of them over to another thread together,
// with the usual happens-before, is fine).
//
// The bytes live in a std::string inside the block, so a reply built in a
// std::string is adopted without a copy.
#pragma once

#include <cstddef>
#include <new>
#include <string>
#include <string_view>
#include <utility>

namespace tcpstore::store {

class SharedBytes {
 public:
  SharedBytes() noexcept = default;
  // Takes `bytes` over (no copy of its contents). Throws std::bad_alloc.
  static SharedBytes adopt(std::string bytes) {
    SharedBytes s;
    s.b_ = new Block{1, std::move(bytes)};
    return s;
  }
  // A new buffer holding a copy of `bytes`. Throws std::bad_alloc.
  static SharedBytes copyOf(std::string_view bytes) {
    return adopt(std::string(bytes));
  }

  SharedBytes(const SharedBytes& o) noexcept : b_(o.b_) {
    if (b_ != nullptr) ++b_->refs;
  }
  SharedBytes(SharedBytes&& o) noexcept : b_(std::exchange(o.b_, nullptr)) {}
  SharedBytes& operator=(const SharedBytes& o) noexcept {
    SharedBytes(o).swap(*this);
    return *this;
  }
  SharedBytes& operator=(SharedBytes&& o) noexcept {
    SharedBytes(std::move(o)).swap(*this);
    return *this;
  }
  ~SharedBytes() { reset(); }

  void swap(SharedBytes& o) noexcept { std::swap(b_, o.b_); }
  // Drops this reference (the buffer is freed with its last one).
  void reset() noexcept {
    if (b_ != nullptr && --b_->refs == 0) delete b_;
    b_ = nullptr;
  }

  // The bytes (empty for a null handle); valid while a reference lives.
  std::string_view view() const noexcept {
    return b_ == nullptr ? std::string_view() : std::string_view(b_->bytes);
  }
  const char* data() const noexcept { return view().data(); }
  std::size_t size() const noexcept { return view().size(); }
  bool empty() const noexcept { return size() == 0; }
  explicit operator bool() const noexcept { return b_ != nullptr; }
  // References to this buffer (0 for a null handle; for tests and counters).
  std::size_t refs() const noexcept { return b_ == nullptr ? 0 : b_->refs; }
  // Same buffer (not: equal bytes).
  friend bool operator==(const SharedBytes& a, const SharedBytes& b) noexcept {
    return a.b_ == b.b_;
  }

 private:
  struct Block {
    std::size_t refs;
    std::string bytes;
  };
  Block* b_ = nullptr;
};

}  // namespace tcpstore::store
