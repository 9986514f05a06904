// Replies: which shape each command's reply has, the client-side decoder and
// the server-side encoder. The grammar is at the top of wire.h.
#include <limits>

#include "protocol/codec.h"
#include "protocol/decode_internal.h"

namespace tcpstore::protocol {

using detail::bytesAt;
using detail::fail;
using detail::frame;
using detail::needMore;

ReplyShape replyShapeOf(Command c) noexcept {
  switch (c) {
    case Command::kValidate:
    case Command::kSet:
    case Command::kAppend:
    case Command::kMultiSet:
    case Command::kQueuePush:
      return ReplyShape::kNone;
    case Command::kCheck:
    case Command::kWait:
    case Command::kCancelWait:
    case Command::kBarrier:
    case Command::kWatchKey:
      return ReplyShape::kByte;
    case Command::kPing:
      return ReplyShape::kU32;
    case Command::kAdd:
    case Command::kGetNumKeys:
    case Command::kDeleteKey:
    case Command::kQueueLen:
      return ReplyShape::kInt64;
    case Command::kGet:
    case Command::kCompareSet:
      return ReplyShape::kString;
    case Command::kMultiGet:
      return ReplyShape::kStrings;
    case Command::kListKeys:
      return ReplyShape::kCountedStrings;
    case Command::kQueuePop:
      return ReplyShape::kQueuePop;
  }
  return ReplyShape::kNone;
}

namespace {

// Reads one str at *pos without resumable state (replies are re-decoded from
// their start; callers wait for need_at_least first).
DecodeResult replyStr(std::string_view in, std::size_t* pos,
                      std::uint64_t limit, bool is_key, std::string_view* out) {
  if (in.size() < *pos + 8) return needMore(*pos + 8);
  std::uint64_t n = loadU64(bytesAt(in, *pos));
  if (n > limit) {
    return fail(
        is_key ? DecodeErrorCode::kKeyTooLong : DecodeErrorCode::kValueTooLong,
        0, n, limit, *pos);
  }
  // A length whose end does not fit in size_t can never arrive (only
  // reachable when the limits are near 2^64).
  const std::size_t head = *pos + 8;
  if (n > std::numeric_limits<std::size_t>::max() - head) {
    return fail(
        is_key ? DecodeErrorCode::kKeyTooLong : DecodeErrorCode::kValueTooLong,
        0, n, std::numeric_limits<std::size_t>::max() - head, *pos);
  }
  if (in.size() - head < n) return needMore(head + n);
  *out = in.substr(head, n);
  *pos += 8 + n;
  return frame(0);
}

// Reads the i64 count that starts a count-prefixed reply (LIST_KEYS,
// QUEUE_POP) into *n. kBadReply if negative, kTooManyKeys if over `limit`.
DecodeResult readCount(std::string_view in, std::uint64_t limit,
                       std::int64_t* n) {
  if (in.size() < 8) return needMore(8);
  const auto v = static_cast<std::int64_t>(loadU64(bytesAt(in, 0)));
  if (v < 0) {
    return fail(DecodeErrorCode::kBadReply, 0, static_cast<std::uint64_t>(v), 0,
                0);
  }
  if (static_cast<std::uint64_t>(v) > limit) {
    return fail(DecodeErrorCode::kTooManyKeys, 0, static_cast<std::uint64_t>(v),
                limit, 0);
  }
  *n = v;
  return frame(8);
}

}  // namespace

DecodeResult decodeReply(std::string_view in, ReplyShape shape,
                         const Limits& limits, Reply& out,
                         std::uint64_t count) {
  out.clear();
  out.shape = shape;
  std::size_t pos = 0;
  DecodeResult r;
  switch (shape) {
    case ReplyShape::kNone:
      return frame(0);
    case ReplyShape::kByte:
      if (in.empty()) return needMore(1);
      out.byte = static_cast<std::uint8_t>(in[0]);
      return frame(1);
    case ReplyShape::kU32:
      if (in.size() < 4) return needMore(4);
      out.u32 = loadU32(bytesAt(in, 0));
      return frame(4);
    case ReplyShape::kInt64:
      if (in.size() < 8) return needMore(8);
      out.number = static_cast<std::int64_t>(loadU64(bytesAt(in, 0)));
      return frame(8);
    case ReplyShape::kString:
      r = replyStr(in, &pos, limits.max_value_bytes, false, &out.value);
      return r.frame() ? frame(pos) : r;
    case ReplyShape::kStrings:
      if (count > limits.max_keys_per_request) {
        return fail(DecodeErrorCode::kTooManyKeys, 0, count,
                    limits.max_keys_per_request, 0);
      }
      for (std::uint64_t i = 0; i < count; ++i) {
        std::string_view v;
        r = replyStr(in, &pos, limits.max_value_bytes, false, &v);
        if (!r.frame()) return r;
        out.values.push_back(v);
      }
      return frame(pos);
    case ReplyShape::kCountedStrings: {
      std::int64_t n = 0;
      r = readCount(in, limits.max_keys_per_request, &n);
      if (!r.frame()) return r;
      out.number = n;
      pos = 8;
      for (std::int64_t i = 0; i < n; ++i) {
        std::string_view v;
        r = replyStr(in, &pos, limits.max_key_bytes, true, &v);
        if (!r.frame()) return r;
        out.values.push_back(v);
      }
      return frame(pos);
    }
    case ReplyShape::kQueuePop: {
      // n is a flag here (0: empty, > 0: one value follows), not a length.
      std::int64_t n = 0;
      r = readCount(in, std::numeric_limits<std::uint64_t>::max(), &n);
      if (!r.frame()) return r;
      out.number = n;
      pos = 8;
      if (n == 0) return frame(pos);
      r = replyStr(in, &pos, limits.max_value_bytes, false, &out.value);
      return r.frame() ? frame(pos) : r;
    }
    case ReplyShape::kWatchNotification: {
      if (in.empty()) return needMore(1);
      out.byte = static_cast<std::uint8_t>(in[0]);
      if (out.byte > static_cast<std::uint8_t>(WatchEvent::kRegistered)) {
        return fail(DecodeErrorCode::kBadReply, 0, out.byte, 0, 0);
      }
      if (out.byte == static_cast<std::uint8_t>(WatchEvent::kRegistered))
        return frame(1);
      pos = 1;
      r = replyStr(in, &pos, limits.max_key_bytes, true, &out.value);
      if (!r.frame()) return r;
      r = replyStr(in, &pos, limits.max_value_bytes, false, &out.old_value);
      if (!r.frame()) return r;
      r = replyStr(in, &pos, limits.max_value_bytes, false, &out.new_value);
      if (!r.frame()) return r;
      return frame(pos);
    }
  }
  return frame(0);
}

void encodeReply(const Reply& reply, std::string& out) {
  switch (reply.shape) {
    case ReplyShape::kNone:
      break;
    case ReplyShape::kByte:
      appendU8(out, reply.byte);
      break;
    case ReplyShape::kU32:
      appendU32(out, reply.u32);
      break;
    case ReplyShape::kInt64:
      appendI64(out, reply.number);
      break;
    case ReplyShape::kString:
      appendStr(out, reply.value);
      break;
    case ReplyShape::kStrings:
      for (auto v : reply.values) appendStr(out, v);
      break;
    case ReplyShape::kCountedStrings:
      appendI64(out, static_cast<std::int64_t>(reply.values.size()));
      for (auto v : reply.values) appendStr(out, v);
      break;
    case ReplyShape::kQueuePop:
      appendI64(out, reply.number);
      if (reply.number > 0) appendStr(out, reply.value);
      break;
    case ReplyShape::kWatchNotification:
      appendU8(out, reply.byte);
      if (reply.byte != static_cast<std::uint8_t>(WatchEvent::kRegistered)) {
        appendStr(out, reply.value);
        appendStr(out, reply.old_value);
        appendStr(out, reply.new_value);
      }
      break;
  }
}

}  // namespace tcpstore::protocol
