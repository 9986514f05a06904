// libFuzzer target: decodeReply over arbitrary bytes. Input byte 0 picks the
// ReplyShape (mod 9), byte 1 the MULTI_GET count for kStrings (0-255), byte 2
// the limits; the rest is the reply stream, decoded reply after reply.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "tests/fuzz/fuzz_common.h"

using namespace tcpstore::protocol;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data,
                                      std::size_t size) {
  if (size < 3) return 0;
  const auto shape = static_cast<ReplyShape>(data[0] % 9);
  const std::uint64_t count = data[1];
  const Limits limits = fuzz::limitsFor(data[2]);
  const std::string_view all(reinterpret_cast<const char*>(data) + 3, size - 3);
  std::size_t pos = 0;
  Reply reply;
  // kNone consumes nothing: one round is enough. Others consume >= 1 byte
  // per frame (kStrings with count 0 too: stop then).
  for (int round = 0; round < 4096 && pos <= all.size(); ++round) {
    const std::string_view in = all.substr(pos);
    DecodeResult r = decodeReply(in, shape, limits, reply, count);
    if (r.frame()) {
      FUZZ_CHECK(r.consumed <= in.size());
      const std::string_view frame = in.substr(0, r.consumed);
      FUZZ_CHECK(fuzz::within(reply.value, frame));
      FUZZ_CHECK(fuzz::within(reply.old_value, frame));
      FUZZ_CHECK(fuzz::within(reply.new_value, frame));
      for (auto v : reply.values) FUZZ_CHECK(fuzz::within(v, frame));
      reply.shape = shape;
      std::string again;
      encodeReply(reply, again);
      FUZZ_CHECK(again == frame);
      // Every strict prefix waits, within the frame, monotonically.
      if (frame.size() <= 256) {
        std::size_t last = 0;
        for (std::size_t k = 0; k < frame.size(); ++k) {
          Reply part;
          DecodeResult p =
              decodeReply(frame.substr(0, k), shape, limits, part, count);
          FUZZ_CHECK(p.needMore());
          FUZZ_CHECK(p.need_at_least > k);
          FUZZ_CHECK(p.need_at_least <= frame.size());
          FUZZ_CHECK(p.need_at_least >= last);
          last = p.need_at_least;
        }
      }
      if (r.consumed == 0) break;
      pos += r.consumed;
      continue;
    }
    if (r.needMore()) {
      FUZZ_CHECK(r.need_at_least > in.size());
    } else {
      fuzz::checkError(r, in.size());
    }
    break;
  }
  return 0;
}
