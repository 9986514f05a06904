// Wire codec for both dialects. The grammar is at the top of wire.h.
//
// Requests are parsed by a tiny field program per command (key, value,
// integer, key list, pair list), driven by a resumable state: a request that
// arrives in pieces is parsed once, not from its first byte on every piece.
// Every length and count is checked against Limits when it is read, before
// the decoder asks for (or anyone buffers) the bytes it announces.
#include "protocol/codec.h"

#include <fmt/format.h>

#include <array>
#include <limits>

namespace tcpstore::protocol {

std::string_view decodeErrorCodeName(DecodeErrorCode c) noexcept {
  switch (c) {
    case DecodeErrorCode::kNone:
      return "none";
    case DecodeErrorCode::kUnknownCommand:
      return "unknown command";
    case DecodeErrorCode::kKeyTooLong:
      return "key too long";
    case DecodeErrorCode::kValueTooLong:
      return "value too long";
    case DecodeErrorCode::kTooManyKeys:
      return "too many keys";
    case DecodeErrorCode::kNegativeCount:
      return "negative count";
    case DecodeErrorCode::kRequestTooLarge:
      return "request too large";
    case DecodeErrorCode::kBadMagic:
      return "bad VALIDATE magic";
    case DecodeErrorCode::kNotValidated:
      return "first request is not VALIDATE";
    case DecodeErrorCode::kRepeatedValidate:
      return "repeated VALIDATE";
    case DecodeErrorCode::kBadReply:
      return "bad reply";
    case DecodeErrorCode::kTruncated:
      return "truncated message";
  }
  return "unknown";
}

std::string DecodeError::message() const {
  switch (code) {
    case DecodeErrorCode::kUnknownCommand:
      return fmt::format("unknown command byte 0x{:02x} at offset {}", value,
                         offset);
    case DecodeErrorCode::kKeyTooLong:
      return fmt::format(
          "key length {} over limit {} (command 0x{:02x} at offset {})", value,
          limit, command, offset);
    case DecodeErrorCode::kValueTooLong:
      return fmt::format(
          "value length {} over limit {} (command 0x{:02x} at offset {})",
          value, limit, command, offset);
    case DecodeErrorCode::kTooManyKeys:
      return fmt::format(
          "key count {} over limit {} (command 0x{:02x} at offset {})", value,
          limit, command, offset);
    case DecodeErrorCode::kNegativeCount:
      return fmt::format("negative count {} (command 0x{:02x} at offset {})",
                         static_cast<std::int64_t>(value), command, offset);
    case DecodeErrorCode::kRequestTooLarge:
      return fmt::format(
          "request of at least {} bytes over limit {} (command 0x{:02x})",
          value, limit, command);
    case DecodeErrorCode::kBadMagic:
      return fmt::format("VALIDATE with magic 0x{:08x}, expected 0x{:08x}",
                         value, kValidateMagic);
    case DecodeErrorCode::kNotValidated:
      return fmt::format("first request is command 0x{:02x}, not VALIDATE",
                         value);
    case DecodeErrorCode::kRepeatedValidate:
      return fmt::format("VALIDATE repeated after the handshake (offset {})",
                         offset);
    case DecodeErrorCode::kBadReply:
      return fmt::format("bad reply value {} at offset {}",
                         static_cast<std::int64_t>(value), offset);
    case DecodeErrorCode::kTruncated:
      return fmt::format(
          "stream ended inside a message ({} bytes of it received)", value);
    case DecodeErrorCode::kNone:
      break;
  }
  return "no error";
}

namespace {

DecodeResult needMore(std::size_t need) {
  DecodeResult r;
  r.kind = DecodeResult::kNeedMore;
  r.need_at_least = need;
  return r;
}

DecodeResult fail(DecodeErrorCode code, std::uint8_t command,
                  std::uint64_t value, std::uint64_t limit,
                  std::size_t offset) {
  DecodeResult r;
  r.kind = DecodeResult::kError;
  r.error = DecodeError{code, command, value, limit, offset};
  return r;
}

DecodeResult frame(std::size_t consumed) {
  DecodeResult r;
  r.kind = DecodeResult::kFrame;
  r.consumed = consumed;
  r.need_at_least = 0;
  return r;
}

const unsigned char* bytesAt(std::string_view in, std::size_t pos) {
  return reinterpret_cast<const unsigned char*>(in.data()) + pos;
}

// ---- request field programs ------------------------------------------------

enum class Field : std::uint8_t {
  kKey,       // str, key limit -> key
  kValue,     // str, value limit -> value
  kDesired,   // str, value limit -> desired
  kI64,       // -> number
  kU32,       // -> u32
  kKeyList,   // u64 count, count * str (key limit) -> keys
  kPairList,  // i64 count, count * (str key, str value) -> keys, values
};

struct Program {
  std::array<Field, 3> fields;
  std::uint8_t n;
};

Program programOf(Command c) {
  using F = Field;
  switch (c) {
    case Command::kValidate:
    case Command::kPing:
      return {{F::kU32}, 1};
    case Command::kSet:
    case Command::kAppend:
    case Command::kQueuePush:
      return {{F::kKey, F::kValue}, 2};
    case Command::kCompareSet:
      return {{F::kKey, F::kValue, F::kDesired}, 3};
    case Command::kGet:
    case Command::kDeleteKey:
    case Command::kWatchKey:
    case Command::kQueuePop:
    case Command::kQueueLen:
      return {{F::kKey}, 1};
    case Command::kAdd:
    case Command::kBarrier:
      return {{F::kKey, F::kI64}, 2};
    case Command::kCheck:
    case Command::kWait:
    case Command::kMultiGet:
      return {{F::kKeyList}, 1};
    case Command::kMultiSet:
      return {{F::kPairList}, 1};
    case Command::kGetNumKeys:
    case Command::kCancelWait:
    case Command::kListKeys:
      return {{}, 0};
  }
  return {{}, 0};
}

// Parses one str at st.pos: length (checked against `limit`), then bytes.
// Returns kFrame (with consumed unused) once the string is complete and
// stores (offset, length) in *off/*len.
DecodeResult parseStr(std::string_view in, detail::ParseState& st,
                      const Limits& limits, bool is_key, std::size_t* off,
                      std::size_t* len) {
  if (!st.have_len) {
    if (in.size() < st.pos + 8) return needMore(st.pos + 8);
    std::uint64_t n = loadU64(bytesAt(in, st.pos));
    std::uint64_t limit =
        is_key ? limits.max_key_bytes : limits.max_value_bytes;
    if (n > limit) {
      return fail(is_key ? DecodeErrorCode::kKeyTooLong
                         : DecodeErrorCode::kValueTooLong,
                  st.code, n, limit, st.pos);
    }
    // st.pos + 8 + n > max_request_bytes, without wrapping when the limits
    // are near 2^64 ("unlimited").
    const std::uint64_t head = st.pos + 8;
    if (head > limits.max_request_bytes ||
        n > limits.max_request_bytes - head) {
      const std::uint64_t total =
          n > std::numeric_limits<std::uint64_t>::max() - head
              ? std::numeric_limits<std::uint64_t>::max()
              : head + n;
      return fail(DecodeErrorCode::kRequestTooLarge, st.code, total,
                  limits.max_request_bytes, st.pos);
    }
    st.len = n;
    st.have_len = true;
    st.pos += 8;
  }
  if (in.size() < st.pos + st.len) return needMore(st.pos + st.len);
  *off = st.pos;
  *len = static_cast<std::size_t>(st.len);
  st.pos += st.len;
  st.have_len = false;
  return frame(0);
}

// Reads a list count at st.pos. `min_item` is the least bytes one item takes.
DecodeResult parseCount(std::string_view in, detail::ParseState& st,
                        const Limits& limits, bool is_signed,
                        std::uint64_t min_item) {
  if (in.size() < st.pos + 8) return needMore(st.pos + 8);
  std::uint64_t n = loadU64(bytesAt(in, st.pos));
  if (is_signed && static_cast<std::int64_t>(n) < 0) {
    return fail(DecodeErrorCode::kNegativeCount, st.code, n, 0, st.pos);
  }
  if (n > limits.max_keys_per_request) {
    return fail(DecodeErrorCode::kTooManyKeys, st.code, n,
                limits.max_keys_per_request, st.pos);
  }
  // st.pos + 8 + n * min_item > max_request_bytes, without wrapping.
  const std::uint64_t head = st.pos + 8;
  if (head > limits.max_request_bytes ||
      n > (limits.max_request_bytes - head) / min_item) {
    const std::uint64_t total =
        n > (std::numeric_limits<std::uint64_t>::max() - head) / min_item
            ? std::numeric_limits<std::uint64_t>::max()
            : head + n * min_item;
    return fail(DecodeErrorCode::kRequestTooLarge, st.code, total,
                limits.max_request_bytes, st.pos);
  }
  st.count = n;
  st.have_count = true;
  st.items = 0;
  st.pos += 8;
  return frame(0);
}

}  // namespace

namespace detail {

DecodeResult decodeRequestResumable(std::string_view in, Dialect dialect,
                                    const Limits& limits, ParseState& st,
                                    Request& out) {
  if (!st.active) {
    if (in.empty()) return needMore(1);
    st.reset();
    st.code = static_cast<std::uint8_t>(in[0]);
    auto cmd = commandFromCode(dialect, st.code);
    if (!cmd)
      return fail(DecodeErrorCode::kUnknownCommand, st.code, st.code, 0, 0);
    st.command = *cmd;
    st.active = true;
    st.pos = 1;
  }
  const Program prog = programOf(st.command);
  while (st.field < prog.n) {
    DecodeResult r;
    switch (prog.fields[st.field]) {
      case Field::kKey:
        r = parseStr(in, st, limits, true, &st.key_off, &st.key_len);
        break;
      case Field::kValue:
        r = parseStr(in, st, limits, false, &st.value_off, &st.value_len);
        break;
      case Field::kDesired:
        r = parseStr(in, st, limits, false, &st.desired_off, &st.desired_len);
        break;
      case Field::kI64:
        if (in.size() < st.pos + 8) return needMore(st.pos + 8);
        st.number = static_cast<std::int64_t>(loadU64(bytesAt(in, st.pos)));
        st.pos += 8;
        r = frame(0);
        break;
      case Field::kU32:
        if (in.size() < st.pos + 4) return needMore(st.pos + 4);
        st.u32 = loadU32(bytesAt(in, st.pos));
        st.pos += 4;
        r = frame(0);
        break;
      case Field::kKeyList:
        if (!st.have_count) {
          r = parseCount(in, st, limits, false, 8);
          if (!r.frame()) return r;
        }
        while (st.items < st.count) {
          std::size_t off = 0, len = 0;
          r = parseStr(in, st, limits, true, &off, &len);
          if (!r.frame()) return r;
          st.keys.emplace_back(off, len);
          ++st.items;
        }
        r = frame(0);
        break;
      case Field::kPairList:
        if (!st.have_count) {
          r = parseCount(in, st, limits, true, 16);
          if (!r.frame()) return r;
        }
        while (st.items < st.count) {
          std::size_t off = 0, len = 0;
          r = parseStr(in, st, limits, !st.pair_value, &off, &len);
          if (!r.frame()) return r;
          if (!st.pair_value) {
            st.keys.emplace_back(off, len);
            st.pair_value = true;
          } else {
            st.values.emplace_back(off, len);
            st.pair_value = false;
            ++st.items;
          }
        }
        r = frame(0);
        break;
    }
    if (!r.frame()) return r;
    ++st.field;
  }

  // Complete: materialise views into `in`.
  if (st.command == Command::kValidate && st.u32 != kValidateMagic) {
    st.active = false;
    return fail(DecodeErrorCode::kBadMagic, st.code, st.u32, 0, 1);
  }
  out.clear();
  out.command = st.command;
  out.key = in.substr(st.key_off, st.key_len);
  out.value = in.substr(st.value_off, st.value_len);
  out.desired = in.substr(st.desired_off, st.desired_len);
  out.number = st.number;
  out.u32 = st.u32;
  out.keys.reserve(st.keys.size());
  for (auto [off, len] : st.keys) out.keys.push_back(in.substr(off, len));
  out.values.reserve(st.values.size());
  for (auto [off, len] : st.values) out.values.push_back(in.substr(off, len));
  std::size_t consumed = st.pos;
  st.active = false;
  st.releaseLargeLists();
  return frame(consumed);
}

}  // namespace detail

DecodeResult decodeRequest(std::string_view in, Dialect dialect,
                           const Limits& limits, Request& out) {
  detail::ParseState st;
  return detail::decodeRequestResumable(in, dialect, limits, st, out);
}

std::optional<Dialect> detectDialect(std::string_view first) noexcept {
  static constexpr unsigned char kValidate[5] = {0x00, 0xce, 0xf7, 0x85, 0x3c};
  if (first.empty()) return std::nullopt;
  std::size_t n = first.size() < 5 ? first.size() : 5;
  for (std::size_t i = 0; i < n; ++i) {
    if (static_cast<unsigned char>(first[i]) != kValidate[i])
      return Dialect::kV113;
  }
  if (n < 5) return std::nullopt;
  return Dialect::kV2;
}

DecodeResult RequestStream::next(std::string_view in, Request& out) {
  if (!dialect_) {
    dialect_ = detectDialect(in);
    if (!dialect_) return needMore(in.empty() ? 1 : 5);
    // A connection decided as 2.x starts with its (complete) VALIDATE, which
    // the normal path below decodes and checks.
  }
  if (*dialect_ == Dialect::kV2 && !state_.active && !in.empty()) {
    auto code = static_cast<std::uint8_t>(in[0]);
    if (!validated_ && code != 0x00) {
      return fail(DecodeErrorCode::kNotValidated, code, code, 0, 0);
    }
    if (validated_ && code == 0x00) {
      return fail(DecodeErrorCode::kRepeatedValidate, code, code, 0, 0);
    }
  }
  DecodeResult r =
      detail::decodeRequestResumable(in, *dialect_, limits_, state_, out);
  if (r.frame() && out.command == Command::kValidate) validated_ = true;
  return r;
}

DecodeResult RequestStream::finish(std::string_view unconsumed) const {
  if (unconsumed.empty()) return needMore(1);
  DecodeResult r =
      fail(DecodeErrorCode::kTruncated,
           static_cast<std::uint8_t>(unconsumed[0]), unconsumed.size(), 0, 0);
  return r;
}

bool encodeRequest(Dialect dialect, const Request& req, std::string& out) {
  auto code = commandCode(dialect, req.command);
  if (!code) return false;
  appendU8(out, *code);
  switch (req.command) {
    case Command::kValidate:
    case Command::kPing:
      appendU32(out, req.u32);
      break;
    case Command::kSet:
    case Command::kAppend:
    case Command::kQueuePush:
      appendStr(out, req.key);
      appendStr(out, req.value);
      break;
    case Command::kCompareSet:
      appendStr(out, req.key);
      appendStr(out, req.value);
      appendStr(out, req.desired);
      break;
    case Command::kGet:
    case Command::kDeleteKey:
    case Command::kWatchKey:
    case Command::kQueuePop:
    case Command::kQueueLen:
      appendStr(out, req.key);
      break;
    case Command::kAdd:
    case Command::kBarrier:
      appendStr(out, req.key);
      appendI64(out, req.number);
      break;
    case Command::kCheck:
    case Command::kWait:
    case Command::kMultiGet:
      appendU64(out, req.keys.size());
      for (auto k : req.keys) appendStr(out, k);
      break;
    case Command::kMultiSet: {
      appendI64(out, static_cast<std::int64_t>(req.keys.size()));
      for (std::size_t i = 0; i < req.keys.size(); ++i) {
        appendStr(out, req.keys[i]);
        appendStr(out,
                  i < req.values.size() ? req.values[i] : std::string_view());
      }
      break;
    }
    case Command::kGetNumKeys:
    case Command::kCancelWait:
    case Command::kListKeys:
      break;
  }
  return true;
}

// ---- replies
// -----------------------------------------------------------------

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
      if (in.size() < 8) return needMore(8);
      auto n = static_cast<std::int64_t>(loadU64(bytesAt(in, 0)));
      if (n < 0)
        return fail(DecodeErrorCode::kBadReply, 0,
                    static_cast<std::uint64_t>(n), 0, 0);
      if (static_cast<std::uint64_t>(n) > limits.max_keys_per_request) {
        return fail(DecodeErrorCode::kTooManyKeys, 0,
                    static_cast<std::uint64_t>(n), limits.max_keys_per_request,
                    0);
      }
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
      if (in.size() < 8) return needMore(8);
      auto n = static_cast<std::int64_t>(loadU64(bytesAt(in, 0)));
      if (n < 0)
        return fail(DecodeErrorCode::kBadReply, 0,
                    static_cast<std::uint64_t>(n), 0, 0);
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
