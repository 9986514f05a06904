#include "store/relay/reply_tracker.h"

namespace tcpstore::store::relay {

using protocol::Command;
using protocol::DecodeResult;
using protocol::ReplyShape;

void ReplyTracker::expect(Command cmd, std::uint64_t count, std::uint64_t tag) {
  if (lost_) return;
  ++seq_;
  switch (cmd) {
    case Command::kWatchKey:
      // Notifications follow on the same stream at any time.
      markLost();
      return;
    case Command::kCancelWait:
      // A WAIT still owed is answered either by the cancel alone (01) or by
      // its own STOP_WAITING and then the cancel's byte (00 01).
      if (!q_.empty() && q_.back().kind == Kind::kShape &&
          q_.back().shape == ReplyShape::kByte && q_.back().count == 1) {
        // Still a wait: nothing else to count.
        q_.back().kind = Kind::kWaitOrCancel;
        q_.back().tag = tag;
        return;
      }
      if (!q_.empty()) {
        markLost();  // a cancel behind other replies: ambiguous
        return;
      }
      q_.push_back(Expect{seq_, Kind::kShape, ReplyShape::kByte, 0, tag});
      noteQueued(q_.back(), 1);
      return;
    default:
      break;
  }
  const ReplyShape shape = protocol::replyShapeOf(cmd);
  // No bytes come back (a MULTI_GET of no keys answers with nothing).
  if (shape == ReplyShape::kNone) {
    settled_ = false;
    unsettled_seq_ = seq_;
    return;
  }
  if (shape == ReplyShape::kStrings && count == 0) return;
  // count 1 marks a WAIT's byte (one a CANCEL_WAIT may replace).
  const std::uint64_t c = shape == ReplyShape::kStrings ? count
                          : (cmd == Command::kWait || cmd == Command::kBarrier)
                              ? 1
                              : 0;
  q_.push_back(Expect{seq_, Kind::kShape, shape, c, tag});
  noteQueued(q_.back(), 1);
}

std::size_t ReplyTracker::fixedSize(const Expect& e) noexcept {
  if (isWait(e)) return 0;
  return protocol::fixedReplyBytes(e.shape);
}

void ReplyTracker::noteQueued(const Expect& e, int sign) noexcept {
  const std::size_t n = fixedSize(e);
  std::size_t& count = isWait(e) ? waits_ : sized_;
  if (isWait(e) || n == SIZE_MAX) {
    count = sign > 0 ? count + 1 : count - 1;
  } else {
    fixed_bytes_ = sign > 0 ? fixed_bytes_ + n : fixed_bytes_ - n;
  }
}

void ReplyTracker::markLost() noexcept {
  lost_ = true;
  q_.clear();
  waits_ = 0;
  sized_ = 0;
  fixed_bytes_ = 0;
  buf_.clear();
  buf_.shrink_to_fit();
}

std::size_t ReplyTracker::measure(std::string_view in) {
  const Expect& e = q_.front();
  if (e.kind == Kind::kWaitOrCancel) {
    const auto b0 = static_cast<unsigned char>(in[0]);
    if (b0 == protocol::kWaitCanceled) return 1;
    if (b0 != protocol::kStopWaiting) {
      markLost();
      return SIZE_MAX;
    }
    if (in.size() < 2) {
      need_ = 2;
      return 0;
    }
    if (static_cast<unsigned char>(in[1]) != protocol::kWaitCanceled) {
      markLost();
      return SIZE_MAX;
    }
    return 2;
  }
  const std::uint64_t count = e.shape == ReplyShape::kStrings ? e.count : 0;
  const DecodeResult r =
      protocol::decodeReply(in, e.shape, limits_, scratch_, count);
  scratch_.clear();
  if (r.kind == DecodeResult::kFrame) return r.consumed;
  if (r.kind == DecodeResult::kNeedMore) {
    need_ = r.need_at_least > in.size() ? r.need_at_least : in.size() + 1;
    return 0;
  }
  markLost();
  return SIZE_MAX;
}

}  // namespace tcpstore::store::relay
