#include "protocol/mux.h"

#include <fmt/format.h>

#include "protocol/wire.h"

namespace tcpstore::protocol::mux {

std::string_view frameTypeName(FrameType t) noexcept {
  switch (t) {
    case FrameType::kOpen:
      return "OPEN";
    case FrameType::kRequest:
      return "REQUEST";
    case FrameType::kClose:
      return "CLOSE";
    case FrameType::kData:
      return "DATA";
    case FrameType::kClosed:
      return "CLOSED";
    case FrameType::kShutdown:
      return "SHUTDOWN";
  }
  return "?";
}

namespace {
bool knownType(std::uint8_t t) noexcept { return t >= 0x01 && t <= 0x06; }
}  // namespace

FrameDecodeResult decodeFrame(std::string_view in,
                              std::uint64_t max_payload_bytes, Frame& out) {
  FrameDecodeResult r;
  if (in.size() < kFrameHeaderBytes) {
    r.need_at_least = kFrameHeaderBytes;
    // An unknown type is an error as soon as its byte is here.
    if (!in.empty() && !knownType(static_cast<std::uint8_t>(in[0]))) {
      r.status = FrameDecodeResult::kError;
      r.error =
          fmt::format("unknown frame type 0x{:02x}",
                      static_cast<unsigned>(static_cast<std::uint8_t>(in[0])));
    }
    return r;
  }
  const auto* p = reinterpret_cast<const unsigned char*>(in.data());
  if (!knownType(p[0])) {
    r.status = FrameDecodeResult::kError;
    r.error =
        fmt::format("unknown frame type 0x{:02x}", static_cast<unsigned>(p[0]));
    return r;
  }
  const auto type = static_cast<FrameType>(p[0]);
  const std::uint32_t channel = loadU32(p + 1);
  const std::uint32_t length = loadU32(p + 5);
  if (length > max_payload_bytes) {
    r.status = FrameDecodeResult::kError;
    r.error = fmt::format("{} frame payload of {} bytes over limit {}",
                          frameTypeName(type), length, max_payload_bytes);
    return r;
  }
  if (type == FrameType::kOpen && length != 1) {
    r.status = FrameDecodeResult::kError;
    r.error = fmt::format("OPEN frame payload of {} bytes (must be 1)", length);
    return r;
  }
  if ((type == FrameType::kClose || type == FrameType::kShutdown) &&
      length != 0) {
    r.status = FrameDecodeResult::kError;
    r.error = fmt::format("{} frame payload of {} bytes (must be 0)",
                          frameTypeName(type), length);
    return r;
  }
  const std::size_t total = kFrameHeaderBytes + std::size_t{length};
  if (in.size() < total) {
    r.need_at_least = total;
    return r;
  }
  if (type == FrameType::kOpen && p[kFrameHeaderBytes] > 1) {
    r.status = FrameDecodeResult::kError;
    r.error = fmt::format("OPEN frame with unknown dialect {}",
                          static_cast<unsigned>(p[kFrameHeaderBytes]));
    return r;
  }
  out.type = type;
  out.channel = channel;
  out.payload = in.substr(kFrameHeaderBytes, length);
  r.status = FrameDecodeResult::kFrame;
  r.consumed = total;
  return r;
}

void appendFrameHeader(std::string& out, FrameType type, std::uint32_t channel,
                       std::uint32_t length) {
  appendU8(out, static_cast<std::uint8_t>(type));
  appendU32(out, channel);
  appendU32(out, length);
}

void appendFrame(std::string& out, FrameType type, std::uint32_t channel,
                 std::string_view payload) {
  appendFrameHeader(out, type, channel,
                    static_cast<std::uint32_t>(payload.size()));
  out.append(payload.data(), payload.size());
}

void patchFrameLength(std::string& out, std::size_t header_offset) {
  const std::size_t length = out.size() - header_offset - kFrameHeaderBytes;
  for (int i = 0; i < 4; ++i)
    out[header_offset + 5 + i] = static_cast<char>((length >> (8 * i)) & 0xff);
}

}  // namespace tcpstore::protocol::mux
