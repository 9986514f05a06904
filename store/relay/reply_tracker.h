// ReplyTracker: follows one channel's reply stream (the DATA bytes the
// upstream sends for it) with the client-side reply decoder, so the relay
// knows how many replies are still owed on the channel and where each one
// ends. Replies are not self-describing: the tracker is told the shape of
// every request sent (expect()) and decodes the stream in that order.
//
// A stream the tracker cannot follow (a 1.13 WATCH_KEY's notifications, an
// odd CANCEL_WAIT pattern, a reply over the limits) makes it `lost`: from
// then on it knows nothing, and the relay treats the channel as always busy
// (it never answers that client locally again). Pure: no I/O.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <string_view>

#include "protocol/codec.h"

namespace tcpstore::store::relay {

class ReplyTracker {
 public:
  // What the caller learns about each complete reply.
  struct Done {
    std::uint64_t tag;       // the tag given to expect()
    std::string_view bytes;  // the reply's bytes (valid during the callback)
    bool sized;  // of a variable size (GET, MULTI_GET, LIST_KEYS, QUEUE_POP)
  };

  explicit ReplyTracker(const protocol::Limits& limits) : limits_(limits) {}

  // A request of `cmd` was sent (for MULTI_GET, `count` keys). `tag` comes
  // back with its reply (0: nobody needs the bytes).
  void expect(protocol::Command cmd, std::uint64_t count, std::uint64_t tag);

  // Feeds DATA bytes; calls on_done(Done) once per complete reply, in
  // order. Bytes past the expected replies, or that do not decode, make the
  // tracker lost (returns false then; on_done is not called for them).
  template <typename F>
  bool feed(std::string_view data, F&& on_done);

  // Replies owed and not yet complete (meaningless once lost()).
  std::size_t outstanding() const noexcept { return q_.size(); }
  // Of those, WAIT and BARRIER bytes: they come when the keys exist, maybe
  // only after a later request of the same client.
  std::size_t waitsOutstanding() const noexcept { return waits_; }
  // Of the others: the bytes of those whose size the command fixes (PING,
  // ADD, CHECK, ...), and how many have a size only the data decides.
  std::uint64_t fixedBytesOutstanding() const noexcept { return fixed_bytes_; }
  std::size_t sizedOutstanding() const noexcept { return sized_; }
  // Owes no reply, and every request sent without a reply (SET, APPEND,
  // MULTI_SET, QUEUE_PUSH) is known to be applied: a later reply on the
  // channel came back. Only then may the relay answer this client from
  // another channel (a read on the shared channel must see its own writes).
  bool idle() const noexcept { return !lost_ && q_.empty() && settled_; }
  bool lost() const noexcept { return lost_; }
  void markLost() noexcept;

 private:
  enum class Kind : std::uint8_t {
    kShape,         // a reply of `shape`
    kWaitOrCancel,  // WAIT then CANCEL_WAIT: u8 1, or u8 0 then u8 1
  };
  struct Expect {
    std::uint64_t seq;
    Kind kind;
    protocol::ReplyShape shape;
    std::uint64_t count;
    std::uint64_t tag;
  };
  // Length of the reply at the front of `in`, 0 if incomplete (need_ set),
  // or SIZE_MAX if it cannot be decoded.
  std::size_t measure(std::string_view in);

  protocol::Limits limits_;
  std::deque<Expect> q_;
  std::string buf_;       // the partial reply at the front of the stream
  std::size_t need_ = 1;  // bytes of buf_ before decoding again
  bool lost_ = false;
  bool settled_ = true;
  std::size_t waits_ = 0;          // entries of q_ that are isWait()
  std::size_t sized_ = 0;          // entries of q_ of a variable size
  std::uint64_t fixed_bytes_ = 0;  // reply bytes of the other entries
  // Bytes of `e`'s reply if the command fixes them (a WAIT's: 0, not
  // counted), else SIZE_MAX.
  static std::size_t fixedSize(const Expect& e) noexcept;
  void noteQueued(const Expect& e, int sign) noexcept;
  std::uint64_t seq_ = 0;            // requests expect()ed so far
  std::uint64_t unsettled_seq_ = 0;  // seq of the last reply-less request
  protocol::Reply scratch_;
  static bool isWait(const Expect& e) noexcept {
    return e.kind == Kind::kWaitOrCancel ||
           (e.shape == protocol::ReplyShape::kByte && e.count == 1);
  }
  void popFront() noexcept {
    if (q_.front().seq > unsettled_seq_) settled_ = true;
    noteQueued(q_.front(), -1);
    q_.pop_front();
  }
};

template <typename F>
bool ReplyTracker::feed(std::string_view data, F&& on_done) {
  if (lost_) return false;
  // Whole replies straight from `data` while nothing is buffered; the tail
  // (a partial reply) is copied and completed by later calls.
  while (!data.empty()) {
    if (q_.empty()) {
      markLost();
      return false;
    }
    if (buf_.empty()) {
      const std::size_t n = measure(data);
      if (n == SIZE_MAX) return false;
      if (n > 0) {
        const std::uint64_t tag = q_.front().tag;
        const bool sized = fixedSize(q_.front()) == SIZE_MAX;
        popFront();
        on_done(Done{tag, data.substr(0, n), sized});
        data.remove_prefix(n);
        continue;
      }
      buf_.assign(data);
      return true;
    }
    // Top up the buffered reply to what it needs, then measure again.
    const std::size_t want = need_ > buf_.size() ? need_ - buf_.size() : 1;
    const std::size_t take = want < data.size() ? want : data.size();
    buf_.append(data.substr(0, take));
    data.remove_prefix(take);
    if (buf_.size() < need_) continue;
    const std::size_t n = measure(buf_);
    if (n == SIZE_MAX) return false;
    if (n == 0) continue;
    const std::uint64_t tag = q_.front().tag;
    const bool sized = fixedSize(q_.front()) == SIZE_MAX;
    popFront();
    on_done(Done{tag, std::string_view(buf_).substr(0, n), sized});
    need_ = 1;
    if (n == buf_.size()) {
      buf_.clear();
      continue;
    }
    // The decoder asked for more than the reply needed: replay the rest.
    std::string rest = buf_.substr(n);
    buf_.clear();
    if (!feed(rest, on_done)) return false;
  }
  return true;
}

}  // namespace tcpstore::store::relay
