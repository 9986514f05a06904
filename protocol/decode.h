// What every decoder in protocol/ returns: a DecodeResult (a complete
// message, a need for more bytes, or an error) and, on error, a DecodeError
// saying which field broke which rule.
//
// Decoder contract (decodeRequest, RequestStream::next, decodeReply):
//  - reads only bytes inside `in`, never past in.size(), and keeps no pointer
//    to them after it returns (a Request or Reply it fills does: see
//    message.h for how long those views live);
//  - kFrame: one complete message was decoded from the front of `in`; its
//    first `consumed` bytes belong to it;
//  - kNeedMore: nothing was consumed; at least `need_at_least` bytes (total,
//    counted from in.data()) must be present before calling again can make
//    progress. Callers should not re-decode until that many bytes are there,
//    which keeps decoding of a slowly arriving request linear overall;
//  - kError: `error` names the reason; the stream cannot be resumed (close
//    the connection). Every length or count is checked against Limits before
//    anything is reserved for it, so a hostile length fails here, at its
//    header, and never allocates.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tcpstore::protocol {

enum class DecodeErrorCode : std::uint8_t {
  kNone = 0,
  // Command byte not in this dialect (value: the byte).
  kUnknownCommand,
  // Key length over max_key_bytes.
  kKeyTooLong,
  // Value length over max_value_bytes.
  kValueTooLong,
  // Key count or pair count over max_keys_per_request.
  kTooManyKeys,
  // MULTI_SET count < 0.
  kNegativeCount,
  // The request's total size over max_request_bytes.
  kRequestTooLarge,
  // VALIDATE with a magic other than 0x3C85F7CE.
  kBadMagic,
  // A 2.x stream whose first request is not VALIDATE.
  kNotValidated,
  // VALIDATE after the handshake.
  kRepeatedValidate,
  // Client side: a reply value outside its range (negative count, unknown
  // watch event).
  kBadReply,
  // End of stream inside a message (RequestStream::finish).
  kTruncated,
};
// "key too long", "bad reply", ...
std::string_view decodeErrorCodeName(DecodeErrorCode c) noexcept;

struct DecodeError {
  DecodeErrorCode code = DecodeErrorCode::kNone;
  // Wire byte of the request being decoded (0 for replies).
  std::uint8_t command = 0;
  // The offending length, count, byte or magic.
  std::uint64_t value = 0;
  // The limit it broke, where there is one.
  std::uint64_t limit = 0;
  // Byte offset of the offending field in `in`.
  std::size_t offset = 0;
  // "key length 4611686018427387904 over limit 8192 (command 0x01 at offset 1)"
  std::string message() const;
};

struct DecodeResult {
  enum Kind : std::uint8_t { kFrame, kNeedMore, kError };
  Kind kind = kNeedMore;
  // kFrame: bytes of `in` the message occupied.
  std::size_t consumed = 0;
  // kNeedMore: total bytes needed before decoding can progress.
  std::size_t need_at_least = 1;
  // kError: why.
  DecodeError error;

  bool frame() const noexcept { return kind == kFrame; }
  bool needMore() const noexcept { return kind == kNeedMore; }
  bool failed() const noexcept { return kind == kError; }
};

}  // namespace tcpstore::protocol
