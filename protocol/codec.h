// Encoders and resumable decoders for both dialects. Pure: no sockets, no
// clocks, no threads, no global state.
//
// Decoder contract (all decode* functions):
//  - reads only bytes inside `in`, never past in.size();
//  - on kFrame: one complete message was decoded from the front of `in`;
//    `consumed` bytes belong to it; views in the output point into `in`;
//  - on kNeedMore: nothing was consumed; at least `need_at_least` bytes (total,
//    counted from in.data()) must be present before calling again can make
//    progress. Callers should not re-decode until that many bytes are there,
//    which keeps decoding of a slowly arriving request linear overall;
//  - on kError: `error` names the reason; the stream cannot be resumed (close
//    the connection). Every length or count is checked against Limits before
//    anything is reserved for it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "protocol/limits.h"
#include "protocol/message.h"
#include "protocol/wire.h"

namespace tcpstore::protocol {

enum class DecodeErrorCode : std::uint8_t {
  kNone = 0,
  kUnknownCommand,    // command byte not in this dialect (detail: the byte)
  kKeyTooLong,        // key length over max_key_bytes
  kValueTooLong,      // value length over max_value_bytes
  kTooManyKeys,       // key count / pair count over max_keys_per_request
  kNegativeCount,     // MULTI_SET count < 0
  kRequestTooLarge,   // the request's total size over max_request_bytes
  kBadMagic,          // VALIDATE with a magic other than 0x3C85F7CE
  kNotValidated,      // 2.x stream whose first request is not VALIDATE
  kRepeatedValidate,  // VALIDATE after the handshake
  kBadReply,          // client side: a reply byte outside its enum
  kTruncated,         // end of stream inside a message (see finish())
};
std::string_view decodeErrorCodeName(DecodeErrorCode c) noexcept;

struct DecodeError {
  DecodeErrorCode code = DecodeErrorCode::kNone;
  std::uint8_t command = 0;  // wire byte of the request being decoded
  std::uint64_t value = 0;   // the offending length/count/byte/magic
  std::uint64_t limit = 0;   // the limit it broke, where there is one
  std::size_t offset = 0;    // byte offset of the offending field in `in`
  // "key length 4611686018427387904 over limit 8192 (command 0x01 at offset 1)"
  std::string message() const;
};

struct DecodeResult {
  enum Kind : std::uint8_t { kFrame, kNeedMore, kError };
  Kind kind = kNeedMore;
  std::size_t consumed = 0;       // kFrame
  std::size_t need_at_least = 1;  // kNeedMore
  DecodeError error;              // kError

  bool frame() const noexcept { return kind == kFrame; }
  bool needMore() const noexcept { return kind == kNeedMore; }
  bool failed() const noexcept { return kind == kError; }
};

// ---- server side: requests -----------------------------------------------

namespace detail {
// Progress through one partially received request, as offsets from the
// request's first byte (so it survives the caller moving its buffer, as long
// as the request's bytes stay at the front of what it passes in). Lets a
// request that arrives in many pieces be parsed in linear time overall.
struct ParseState {
  bool active = false;
  std::uint8_t code = 0;
  Command command = Command::kGetNumKeys;
  std::uint8_t field = 0;   // index into the command's field program
  bool have_len = false;    // str: length read, bytes pending
  bool have_count = false;  // list: count read
  std::uint64_t len = 0;    // pending str length
  std::uint64_t count = 0;  // list length
  std::uint64_t items = 0;  // list items completed
  bool pair_value = false;  // MULTI_SET: key of this pair done, value next
  std::size_t pos = 0;      // bytes of the request parsed so far
  std::size_t key_off = 0, key_len = 0;
  std::size_t value_off = 0, value_len = 0;
  std::size_t desired_off = 0, desired_len = 0;
  std::int64_t number = 0;
  std::uint32_t u32 = 0;
  std::vector<std::pair<std::size_t, std::size_t>> keys;    // (offset, length)
  std::vector<std::pair<std::size_t, std::size_t>> values;  // (offset, length)

  void reset() noexcept {
    auto k = std::move(keys);
    auto v = std::move(values);
    *this = ParseState();
    k.clear();
    v.clear();
    keys = std::move(k);
    values = std::move(v);
  }
  // List storage kept for the next request; beyond this it is freed when a
  // request completes, so a connection that once sent a 128Ki-key request
  // does not hold megabytes for the rest of its life.
  static constexpr std::size_t kKeepListEntries = 256;
  void releaseLargeLists() noexcept {
    if (keys.capacity() > kKeepListEntries) decltype(keys)().swap(keys);
    if (values.capacity() > kKeepListEntries) decltype(values)().swap(values);
  }
};
DecodeResult decodeRequestResumable(std::string_view in, Dialect dialect,
                                    const Limits& limits, ParseState& state,
                                    Request& out);
}  // namespace detail

// Decodes one request of a fixed dialect from the front of `in`. A 2.x
// VALIDATE is decoded like any command (the magic is checked: kBadMagic);
// handshake ordering is RequestStream's job.
DecodeResult decodeRequest(std::string_view in, Dialect dialect,
                           const Limits& limits, Request& out);

// protocol.md §8.1 on the first bytes of a connection: 2.x iff they begin with
// 00 ce f7 85 3c. Returns nullopt while that cannot be decided yet (fewer than
// 5 bytes that are still a prefix of the VALIDATE request).
std::optional<Dialect> detectDialect(std::string_view first_bytes) noexcept;

// Per-connection request decoding: dialect detection, then the 2.x handshake
// rules (VALIDATE once, first), then decodeRequest. The VALIDATE that decides
// a 2.x stream is returned as a kFrame with command kValidate.
class RequestStream {
 public:
  explicit RequestStream(const Limits& limits) : limits_(limits) {}
  // Forces the dialect (for tests and for a server pinned to one dialect).
  RequestStream(const Limits& limits, Dialect dialect, bool validated)
      : limits_(limits), dialect_(dialect), validated_(validated) {}

  DecodeResult next(std::string_view in, Request& out);
  // Call at end of stream with the bytes still unconsumed: kError/kTruncated
  // if they hold a partial message, else kNeedMore with consumed 0.
  DecodeResult finish(std::string_view unconsumed) const;

  std::optional<Dialect> dialect() const noexcept { return dialect_; }
  bool validated() const noexcept { return validated_; }

 private:
  Limits limits_;
  std::optional<Dialect> dialect_;
  bool validated_ = false;
  detail::ParseState state_;
};

// Appends the wire bytes of `req` in `dialect`. Returns false (appending
// nothing) if the dialect lacks the command.
bool encodeRequest(Dialect dialect, const Request& req, std::string& out);

// ---- client side: replies --------------------------------------------------

// Decodes one reply of `shape` from the front of `in`. `count` is the number
// of strings for kStrings (MULTI_GET's key count). Limits apply to string
// lengths and counts as for requests.
DecodeResult decodeReply(std::string_view in, ReplyShape shape,
                         const Limits& limits, Reply& out,
                         std::uint64_t count = 0);

// Appends the wire bytes of a reply (server side). For kStrings the values
// go out without a count; kCountedStrings writes values.size() first.
void encodeReply(const Reply& reply, std::string& out);

}  // namespace tcpstore::protocol
