// The request side of one connection: which dialect it speaks (decided by its
// first bytes) and the 2.x handshake rules, in front of decodeRequest.
#include "protocol/codec.h"
#include "protocol/decode_internal.h"

namespace tcpstore::protocol {

using detail::fail;
using detail::needMore;

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
  if (r.frame()) {
    if (out.command == Command::kValidate) validated_ = true;
    out.wire = *dialect_ == Dialect::kV2 ? in.substr(0, r.consumed)
                                         : std::string_view();
  }
  return r;
}

DecodeResult RequestStream::finish(std::string_view unconsumed) const {
  if (unconsumed.empty()) return needMore(1);
  DecodeResult r =
      fail(DecodeErrorCode::kTruncated,
           static_cast<std::uint8_t>(unconsumed[0]), unconsumed.size(), 0, 0);
  return r;
}
}  // namespace tcpstore::protocol
