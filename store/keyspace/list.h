// The keyspace's one intrusive list: doubly linked through a Link<T> member
// of T, one head pointer per list (the head's prev is the tail), O(1)
// pushBack and remove. A list owns nothing.
#pragma once

namespace tcpstore::store::keyspace {

template <typename T>
struct Link {
  T* prev = nullptr;
  T* next = nullptr;
};

template <typename T, Link<T> T::*kLink>
class List {
 public:
  T* front() const noexcept { return head_; }
  bool empty() const noexcept { return head_ == nullptr; }
  static T* next(const T* x) noexcept { return (x->*kLink).next; }

  void pushBack(T* x) noexcept {
    Link<T>& l = x->*kLink;
    l.next = nullptr;
    if (head_ == nullptr) {
      l.prev = x;
      head_ = x;
      return;
    }
    T* tail = (head_->*kLink).prev;
    l.prev = tail;
    (tail->*kLink).next = x;
    (head_->*kLink).prev = x;
  }

  // `x` must be in this list.
  void remove(T* x) noexcept {
    Link<T>& l = x->*kLink;
    if (x == head_) {
      head_ = l.next;
      if (head_ != nullptr) (head_->*kLink).prev = l.prev;
    } else {
      (l.prev->*kLink).next = l.next;
      T* after_prev = l.next != nullptr ? l.next : head_;
      (after_prev->*kLink).prev = l.prev;
    }
    l.prev = l.next = nullptr;
  }

 private:
  T* head_ = nullptr;
};

}  // namespace tcpstore::store::keyspace
