// Requests and replies as values. Neither owns its bytes: in a decoded one
// every string_view points into the buffer that was decoded (valid until that
// buffer is mutated or freed); in one built for encoding (requests.h) they
// point at the caller's strings, which must outlive the encode.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "protocol/wire.h"

namespace tcpstore::protocol {

// One request. Which fields are meaningful depends on `command`:
//   VALIDATE            u32 (magic)
//   PING                u32 (nonce)
//   SET                 key, value
//   COMPARE_SET         key, value (= expected), desired
//   GET, DELETE_KEY, WATCH_KEY, QUEUE_POP, QUEUE_LEN   key
//   ADD                 key, number (= delta)
//   BARRIER             key, number (= world_size)
//   APPEND, QUEUE_PUSH  key, value
//   CHECK, WAIT, MULTI_GET   keys
//   MULTI_SET           keys, values (same length)
//   GETNUMKEYS, CANCEL_WAIT, LIST_KEYS   nothing
// Reuse one Request across decodes: clear() keeps the vectors' capacity.
struct Request {
  Command command = Command::kGetNumKeys;
  std::string_view key;
  std::string_view value;
  std::string_view desired;
  std::int64_t number = 0;
  std::uint32_t u32 = 0;
  std::vector<std::string_view> keys;
  std::vector<std::string_view> values;
  // The request's own bytes as received, when a RequestStream decoded it
  // from a 2.x stream (they are its one 2.x encoding: encodeRequest(kV2)
  // would write the same bytes); empty otherwise. Points into the caller's
  // input, like the views above.
  std::string_view wire;

  void clear() noexcept {
    key = value = desired = wire = {};
    number = 0;
    u32 = 0;
    keys.clear();
    values.clear();
  }
};

// What reply a request expects; tells the client-side decoder how to parse
// the next bytes (replies are not self-describing).
enum class ReplyShape : std::uint8_t {
  kNone,     // SET, APPEND, MULTI_SET, QUEUE_PUSH, VALIDATE
  kByte,     // CHECK, WAIT, CANCEL_WAIT (one byte each), BARRIER, WATCH_KEY
  kU32,      // PING
  kInt64,    // ADD, GETNUMKEYS, DELETE_KEY, QUEUE_LEN
  kString,   // GET, COMPARE_SET
  kStrings,  // MULTI_GET: exactly `count` strings, no count on the wire
  kCountedStrings,     // LIST_KEYS: i64 n, then n strings
  kQueuePop,           // i64 n, then one string if n > 0
  kWatchNotification,  // 1.13 push: u8 type, str key, str old, str new
};
ReplyShape replyShapeOf(Command c) noexcept;
// Wire bytes of a reply of `shape` when the shape alone fixes them (kNone 0,
// kByte 1, kU32 4, kInt64 8); SIZE_MAX for shapes whose replies carry their
// own lengths.
constexpr std::size_t fixedReplyBytes(ReplyShape shape) noexcept {
  switch (shape) {
    case ReplyShape::kNone:
      return 0;
    case ReplyShape::kByte:
      return 1;
    case ReplyShape::kU32:
      return 4;
    case ReplyShape::kInt64:
      return 8;
    default:
      return SIZE_MAX;
  }
}

// One decoded reply.
struct Reply {
  ReplyShape shape = ReplyShape::kNone;
  std::uint8_t byte = 0;    // kByte; kWatchNotification: WatchEvent
  std::uint32_t u32 = 0;    // kU32
  std::int64_t number = 0;  // kInt64; kCountedStrings / kQueuePop: n
  std::string_view value;   // kString; kQueuePop (if n > 0); notification: key
  std::string_view old_value;            // notification
  std::string_view new_value;            // notification
  std::vector<std::string_view> values;  // kStrings, kCountedStrings

  void clear() noexcept {
    byte = 0;
    u32 = 0;
    number = 0;
    value = old_value = new_value = {};
    values.clear();
  }
};

}  // namespace tcpstore::protocol
