// The relay extension: many client connections multiplexed over one TCP
// connection between a relay (tcpstore-server --upstream) and its upstream
// (a tcpstore-server, or another relay). Torch clients never see it.
// docs/relay.md gives the design and why; this header is the wire contract.
//
// Negotiation: the relay's first 8 bytes are kMuxPreamble. A tcpstore
// server answers with the same 8 bytes and from then on both directions
// carry frames only. A torch server closes the connection instead (the bytes
// are neither a 1.13 command nor a 2.x VALIDATE), which is how a relay
// learns that its upstream does not speak the extension.
//
// clang-format off
//   frame  := u8 type, u32 channel, u32 length, length bytes of payload
//
//   type        dir            payload
//   OPEN   0x01 relay->server  u8 dialect (0 = 1.13, 1 = 2.x): a new client
//   REQUEST 0x02 relay->server  exactly one complete request in the
//                               channel's dialect (2.x: never VALIDATE)
//   CLOSE  0x03 relay->server  empty: the client left (forget its waits)
//   DATA   0x04 server->relay  the next bytes of the channel's reply stream
//                               (any split: a reply may span frames)
//   CLOSED 0x05 server->relay  UTF-8 reason: the server closed the channel
//                               (its request broke a rule); no DATA follows.
//                               Empty: the channel ended after SHUTDOWN,
//                               every reply it was owed sent before it
//   SHUTDOWN 0x06 relay->server empty: the client half-closed after its
//                               last REQUEST. The server serves the channel
//                               as a connection whose peer half-closed: its
//                               requests are applied and answered, then
//                               CLOSED (empty) ends it. No REQUEST follows
//                               on the channel (CLOSE may)
// clang-format on
//
// Channels: the relay numbers them with strictly increasing u32 values, from
// 1, never reused on one connection. The server treats each open channel as
// one client connection of its own (its own waits, its own order). A REQUEST
// or CLOSE for a channel at or below the highest opened id that is no longer
// open is ignored (it crossed a CLOSED on the wire); anything else out of
// rule (unknown type, payload over the limit, OPEN of a used id, a REQUEST
// for an id never opened, a REQUEST that is not exactly one request) is a
// relay bug and closes the whole connection.
//
// Pure: no sockets, no clocks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tcpstore::protocol::mux {

inline constexpr std::string_view kMuxPreamble{"\xffTSMUX\x00\x01", 8};
inline constexpr std::size_t kFrameHeaderBytes = 9;

enum class FrameType : std::uint8_t {
  kOpen = 0x01,
  kRequest = 0x02,
  kClose = 0x03,
  kData = 0x04,
  kClosed = 0x05,
  kShutdown = 0x06,
};
std::string_view frameTypeName(FrameType t) noexcept;  // "OPEN", ...

// A decoded frame; `payload` points into the decoded buffer.
struct Frame {
  FrameType type = FrameType::kData;
  std::uint32_t channel = 0;
  std::string_view payload;
};

struct FrameDecodeResult {
  enum Status : std::uint8_t { kFrame, kNeedMore, kError };
  Status status = kNeedMore;
  // kFrame: bytes of the frame (header + payload) at the front of `in`.
  std::size_t consumed = 0;
  // kNeedMore: total bytes that must be present before decoding again.
  std::size_t need_at_least = 0;
  // kError: why (unknown type, payload over the limit, bad OPEN payload).
  std::string error;
};

// Decodes one frame from the front of `in`. Checks the type and the payload
// length (against `max_payload_bytes`, at the header, before any of the
// payload is needed) and an OPEN's payload. Channel rules are the caller's.
FrameDecodeResult decodeFrame(std::string_view in,
                              std::uint64_t max_payload_bytes, Frame& out);

// Appends one frame. `payload.size()` must fit in u32 (the caller splits
// DATA; a REQUEST is bounded by the request limit, far below 4 GiB).
void appendFrame(std::string& out, FrameType type, std::uint32_t channel,
                 std::string_view payload);
// Appends only the header of a frame whose `length` payload bytes the caller
// appends next (to encode a request in place).
void appendFrameHeader(std::string& out, FrameType type, std::uint32_t channel,
                       std::uint32_t length);
// Rewrites the length of the frame whose header starts at `header_offset`
// in `out` to everything after that header (encode-in-place helper).
void patchFrameLength(std::string& out, std::size_t header_offset);

}  // namespace tcpstore::protocol::mux
