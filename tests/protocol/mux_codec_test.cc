// The relay extension's frame codec (protocol/mux.h): round trips, every
// split point, and each rule the decoder enforces at the header.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>

#include "protocol/mux.h"
#include "protocol/wire.h"

namespace tcpstore::protocol::mux {
namespace {

constexpr std::uint64_t kLimit = 1024;

std::string header(std::uint8_t type, std::uint32_t channel,
                   std::uint32_t length) {
  std::string s;
  appendU8(s, type);
  appendU32(s, channel);
  appendU32(s, length);
  return s;
}

TEST_CASE("mux: every frame type round-trips, and frames follow each other") {
  std::string wire;
  appendFrame(wire, FrameType::kOpen, 1, std::string_view("\x01", 1));
  appendFrame(wire, FrameType::kRequest, 1, "abc");
  appendFrame(wire, FrameType::kData, 7, "reply bytes");
  appendFrame(wire, FrameType::kClosed, 7, "key too long");
  appendFrame(wire, FrameType::kClose, 0xfffffffeu, "");
  const FrameType want[] = {FrameType::kOpen, FrameType::kRequest,
                            FrameType::kData, FrameType::kClosed,
                            FrameType::kClose};
  const std::uint32_t channels[] = {1, 1, 7, 7, 0xfffffffeu};
  const std::string_view payloads[] = {std::string_view("\x01", 1), "abc",
                                       "reply bytes", "key too long", ""};
  std::string_view in = wire;
  for (int i = 0; i < 5; ++i) {
    Frame f;
    auto r = decodeFrame(in, kLimit, f);
    REQUIRE(r.status == FrameDecodeResult::kFrame);
    CHECK(f.type == want[i]);
    CHECK(f.channel == channels[i]);
    CHECK(f.payload == payloads[i]);
    CHECK(r.consumed == kFrameHeaderBytes + payloads[i].size());
    in.remove_prefix(r.consumed);
  }
  CHECK(in.empty());
}

TEST_CASE(
    "mux: every split point of a frame asks for exactly what is missing") {
  std::string wire;
  appendFrame(wire, FrameType::kRequest, 42, "0123456789");
  for (std::size_t cut = 0; cut < wire.size(); ++cut) {
    Frame f;
    auto r = decodeFrame(std::string_view(wire).substr(0, cut), kLimit, f);
    CAPTURE(cut);
    REQUIRE(r.status == FrameDecodeResult::kNeedMore);
    CHECK(r.need_at_least ==
          (cut < kFrameHeaderBytes ? kFrameHeaderBytes : wire.size()));
    CHECK(r.need_at_least > cut);
  }
}

TEST_CASE("mux: a payload length over the limit fails at the header") {
  Frame f;
  auto r = decodeFrame(header(0x02, 1, kLimit + 1), kLimit, f);
  CHECK(r.status == FrameDecodeResult::kError);
  CHECK(r.error.find("over limit") != std::string::npos);
  r = decodeFrame(header(0x04, 1, 0xffffffffu), kLimit, f);
  CHECK(r.status == FrameDecodeResult::kError);
}

TEST_CASE("mux: an unknown frame type fails on its first byte") {
  Frame f;
  for (std::uint8_t t : {0x00, 0x07, 0xff}) {
    CAPTURE(int{t});
    auto r = decodeFrame(std::string(1, static_cast<char>(t)), kLimit, f);
    CHECK(r.status == FrameDecodeResult::kError);
    r = decodeFrame(header(t, 1, 0), kLimit, f);
    CHECK(r.status == FrameDecodeResult::kError);
  }
}

TEST_CASE("mux: OPEN carries exactly one known dialect byte, CLOSE nothing") {
  Frame f;
  CHECK(decodeFrame(header(0x01, 1, 0), kLimit, f).status ==
        FrameDecodeResult::kError);
  CHECK(decodeFrame(header(0x01, 1, 2) + "\x01\x01", kLimit, f).status ==
        FrameDecodeResult::kError);
  CHECK(decodeFrame(header(0x01, 1, 1) + "\x02", kLimit, f).status ==
        FrameDecodeResult::kError);
  CHECK(decodeFrame(header(0x03, 1, 1) + "x", kLimit, f).status ==
        FrameDecodeResult::kError);
  // The payload view points into the decoded bytes: keep them alive.
  const std::string open = header(0x01, 9, 1) + std::string(1, '\0');
  auto r = decodeFrame(open, kLimit, f);
  REQUIRE(r.status == FrameDecodeResult::kFrame);
  CHECK(f.payload == std::string_view("\0", 1));
}

TEST_CASE("mux: a header encoded first is patched to the payload after it") {
  std::string out = "xx";
  appendFrameHeader(out, FrameType::kRequest, 3, 0);
  out += "payload!";
  patchFrameLength(out, 2);
  Frame f;
  auto r = decodeFrame(std::string_view(out).substr(2), kLimit, f);
  REQUIRE(r.status == FrameDecodeResult::kFrame);
  CHECK(f.payload == "payload!");
}

TEST_CASE("mux: the preamble is neither a 2.x VALIDATE nor a 1.13 command") {
  CHECK(kMuxPreamble.size() == 8);
  CHECK(static_cast<std::uint8_t>(kMuxPreamble[0]) > 0x08);
}

}  // namespace
}  // namespace tcpstore::protocol::mux
