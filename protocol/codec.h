// Encoders and resumable decoders for both dialects. Pure: no sockets, no
// clocks, no threads, no global state; every function may be called from any
// thread on its own arguments.
//
// Files: requests in request_codec.cc, the per-connection handshake and
// dialect detection in request_stream.cc, replies in reply_codec.cc, error
// texts in decode.cc. What every decoder returns is in decode.h; what the
// decoded Request and Reply hold (and how long their views live) in
// message.h; the byte grammar in wire.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "protocol/decode.h"
#include "protocol/limits.h"
#include "protocol/message.h"
#include "protocol/wire.h"

namespace tcpstore::protocol {

// ---- server side: requests -------------------------------------------------

namespace detail {
// Progress through one partially received request, as offsets from the
// request's first byte (so it survives the caller moving its buffer, as long
// as the request's bytes stay at the front of what it passes in). Lets a
// request that arrives in many pieces be parsed in linear time overall.
struct ParseState {
  bool active = false;
  std::uint8_t code = 0;
  Command command = Command::kGetNumKeys;
  // Index into the command's field program.
  std::uint8_t field = 0;
  // str: length read, bytes pending.
  bool have_len = false;
  // list: count read.
  bool have_count = false;
  // Pending str length.
  std::uint64_t len = 0;
  // List length and list items completed.
  std::uint64_t count = 0;
  std::uint64_t items = 0;
  // MULTI_SET: key of this pair done, value next.
  bool pair_value = false;
  // Bytes of the request parsed so far.
  std::size_t pos = 0;
  std::size_t key_off = 0, key_len = 0;
  std::size_t value_off = 0, value_len = 0;
  std::size_t desired_off = 0, desired_len = 0;
  std::int64_t number = 0;
  std::uint32_t u32 = 0;
  // (offset, length) of each list entry.
  std::vector<std::pair<std::size_t, std::size_t>> keys;
  std::vector<std::pair<std::size_t, std::size_t>> values;

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

// decodeRequest that resumes from `state` (kept by the caller between calls
// while the answer is kNeedMore; `in` must start at the same request's first
// byte every time). On kFrame `out` is filled and `state` is ready for the
// next request; on kError `state` must be discarded with the stream.
DecodeResult decodeRequestResumable(std::string_view in, Dialect dialect,
                                    const Limits& limits, ParseState& state,
                                    Request& out);
}  // namespace detail

// Decodes one request of a fixed dialect from the front of `in` (see decode.h
// for kFrame / kNeedMore / kError). On kFrame `out` is overwritten and its
// views point into `in`. Errors: kUnknownCommand, kKeyTooLong, kValueTooLong,
// kTooManyKeys, kNegativeCount, kRequestTooLarge, and kBadMagic for a 2.x
// VALIDATE with the wrong magic (handshake order is RequestStream's job).
DecodeResult decodeRequest(std::string_view in, Dialect dialect,
                           const Limits& limits, Request& out);

// docs/protocol.md §8.1 on the first bytes of a connection: 2.x iff they begin with
// 00 ce f7 85 3c. Returns nullopt while that cannot be decided yet (no bytes,
// or fewer than 5 that are still a prefix of the VALIDATE request).
std::optional<Dialect> detectDialect(std::string_view first_bytes) noexcept;

// Per-connection request decoding: dialect detection, then the 2.x handshake
// rules (VALIDATE once, first), then decodeRequest. The VALIDATE that decides
// a 2.x stream is returned as a kFrame with command kValidate. One object per
// connection, used by one thread at a time.
class RequestStream {
 public:
  explicit RequestStream(const Limits& limits) : limits_(limits) {}
  // Forces the dialect (for tests and for a server pinned to one dialect).
  RequestStream(const Limits& limits, Dialect dialect, bool validated)
      : limits_(limits), dialect_(dialect), validated_(validated) {}

  // Decodes the next request from the front of `in`, which holds the
  // connection's unconsumed bytes (resuming a request begun in an earlier
  // call: pass its bytes again, from its first one). Errors: those of
  // decodeRequest, plus kNotValidated and kRepeatedValidate on 2.x streams.
  DecodeResult next(std::string_view in, Request& out);
  // Call at end of stream with the bytes still unconsumed: kError/kTruncated
  // if they hold a partial message, else kNeedMore with consumed 0.
  DecodeResult finish(std::string_view unconsumed) const;

  // nullopt until the first bytes decided it.
  std::optional<Dialect> dialect() const noexcept { return dialect_; }
  bool validated() const noexcept { return validated_; }

 private:
  Limits limits_;
  std::optional<Dialect> dialect_;
  bool validated_ = false;
  detail::ParseState state_;
};

// Appends the wire bytes of `req` in `dialect`. Returns false (appending
// nothing) if the dialect lacks the command. MULTI_SET writes one pair per
// key, with an empty value where `values` is shorter.
bool encodeRequest(Dialect dialect, const Request& req, std::string& out);

// ---- client side: replies --------------------------------------------------

// Decodes one reply of `shape` from the front of `in` (replies are not
// self-describing: the caller knows what it asked). `count` is the number of
// strings for kStrings (MULTI_GET's key count). On kFrame `out` is
// overwritten and its views point into `in`. Stateless: after kNeedMore,
// call again with the same reply's bytes from its first one. Errors:
// kKeyTooLong / kValueTooLong (a string over its limit: LIST_KEYS entries
// and notification keys count as keys), kTooManyKeys (`count` or a count
// prefix over max_keys_per_request), kBadReply (a negative count prefix, an
// unknown watch event).
DecodeResult decodeReply(std::string_view in, ReplyShape shape,
                         const Limits& limits, Reply& out,
                         std::uint64_t count = 0);

// Appends the wire bytes of a reply (server side). For kStrings the values
// go out without a count; kCountedStrings writes values.size() first.
void encodeReply(const Reply& reply, std::string& out);

}  // namespace tcpstore::protocol
