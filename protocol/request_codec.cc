// Requests of both dialects: the resumable decoder and the encoder. The
// grammar is at the top of wire.h.
//
// Requests are parsed by a tiny field program per command (key, value,
// integer, key list, pair list), driven by a resumable state: a request that
// arrives in pieces is parsed once, not from its first byte on every piece.
// Every length and count is checked against Limits when it is read, before
// the decoder asks for (or anyone buffers) the bytes it announces.
#include <array>
#include <limits>

#include "protocol/codec.h"
#include "protocol/decode_internal.h"

namespace tcpstore::protocol {

using detail::bytesAt;
using detail::fail;
using detail::frame;
using detail::needMore;

namespace {

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

}  // namespace tcpstore::protocol
