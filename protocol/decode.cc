// Names and messages of decode errors (decode.h).
#include "protocol/decode.h"

#include <fmt/format.h>

#include "protocol/wire.h"

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
}  // namespace tcpstore::protocol
