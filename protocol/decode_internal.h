// Builders for DecodeResult and byte access shared by the decoders in
// protocol/*.cc. Not installed; not for use outside protocol/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "protocol/decode.h"

namespace tcpstore::protocol::detail {

inline DecodeResult needMore(std::size_t need) {
  DecodeResult r;
  r.kind = DecodeResult::kNeedMore;
  r.need_at_least = need;
  return r;
}

inline DecodeResult fail(DecodeErrorCode code, std::uint8_t command,
                         std::uint64_t value, std::uint64_t limit,
                         std::size_t offset) {
  DecodeResult r;
  r.kind = DecodeResult::kError;
  r.error = DecodeError{code, command, value, limit, offset};
  return r;
}

inline DecodeResult frame(std::size_t consumed) {
  DecodeResult r;
  r.kind = DecodeResult::kFrame;
  r.consumed = consumed;
  r.need_at_least = 0;
  return r;
}

inline const unsigned char* bytesAt(std::string_view in, std::size_t pos) {
  return reinterpret_cast<const unsigned char*>(in.data()) + pos;
}

}  // namespace tcpstore::protocol::detail
