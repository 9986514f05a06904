// libFuzzer target: RequestStream over arbitrary bytes, as a server uses it.
// Input byte 0: bits 0-1 pick the stream (0 detect the dialect, 1 pinned to
// 1.13, 2 pinned to 2.x before VALIDATE, 3 pinned to 2.x after it); bits 2-3
// pick the limits; bits 4-7 pick the chunk pattern of the second feeding.
//
// The stream is fed twice: all bytes at once, and in small chunks (calling
// next() only once need_at_least bytes are there, like the server). Both
// must give the same frames and end the same way. Every frame must re-encode
// to exactly the bytes it consumed.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tests/fuzz/fuzz_common.h"

using namespace tcpstore::protocol;

namespace {

struct Outcome {
  std::vector<std::string> frames;  // re-encoded requests
  DecodeResult::Kind last = DecodeResult::kNeedMore;
  DecodeErrorCode error = DecodeErrorCode::kNone;
  std::size_t consumed = 0;
  bool initially_validated = false;
};

RequestStream makeStream(std::uint8_t mode, const Limits& limits) {
  switch (mode & 3) {
    case 1:
      return RequestStream(limits, Dialect::kV113, false);
    case 2:
      return RequestStream(limits, Dialect::kV2, false);
    case 3:
      return RequestStream(limits, Dialect::kV2, true);
    default:
      return RequestStream(limits);
  }
}

// Records a frame from `s` decoded at the front of `in`.
void onFrame(const RequestStream& s, const DecodeResult& r, const Request& req,
             std::string_view in, Outcome& out) {
  FUZZ_CHECK(s.dialect().has_value());
  fuzz::checkRequestFrame(*s.dialect(), r, req, in);
  if (*s.dialect() == Dialect::kV2) {
    // The handshake rules: VALIDATE exactly once, first.
    FUZZ_CHECK(s.validated());
    if (req.command == Command::kValidate) {
      FUZZ_CHECK(out.frames.empty() && !out.initially_validated);
    }
  }
  out.frames.emplace_back(in.substr(0, r.consumed));
  out.consumed += r.consumed;
}

Outcome feedWhole(RequestStream s, std::string_view all) {
  Outcome out;
  out.initially_validated = s.validated();
  Request req;
  while (true) {
    const std::string_view in = all.substr(out.consumed);
    req.clear();
    DecodeResult r = s.next(in, req);
    out.last = r.kind;
    if (r.frame()) {
      onFrame(s, r, req, in, out);
      continue;
    }
    if (r.needMore()) {
      FUZZ_CHECK(r.need_at_least > in.size());
      DecodeResult fin = s.finish(in);
      if (in.empty()) {
        FUZZ_CHECK(fin.needMore() && fin.consumed == 0);
      } else {
        FUZZ_CHECK(fin.failed() &&
                   fin.error.code == DecodeErrorCode::kTruncated);
      }
    } else {
      fuzz::checkError(r, in.size());
      out.error = r.error.code;
    }
    return out;
  }
}

Outcome feedChunked(RequestStream s, std::string_view all,
                    std::uint8_t pattern) {
  static constexpr std::size_t kChunks[16][4] = {
      {1, 1, 1, 1}, {1, 2, 3, 5},  {7, 1, 1, 13}, {2, 2, 2, 2},
      {3, 1, 4, 1}, {5, 9, 2, 6},  {8, 8, 8, 8},  {1, 8, 1, 8},
      {4, 4, 1, 1}, {16, 1, 1, 1}, {9, 9, 9, 1},  {1, 1, 2, 64},
      {5, 5, 5, 5}, {6, 1, 6, 1},  {10, 3, 1, 2}, {1, 4, 9, 16}};
  Outcome out;
  out.initially_validated = s.validated();
  std::string buf;  // grows like a connection's input buffer
  std::size_t fed = 0;
  std::size_t need = 1;
  std::size_t step = 0;
  Request req;
  while (true) {
    // Deliver the next chunk.
    if (fed < all.size()) {
      std::size_t n = kChunks[pattern % 16][step++ % 4];
      if (n > all.size() - fed) n = all.size() - fed;
      buf.append(all.substr(fed, n));
      fed += n;
    }
    const bool eof = fed == all.size();
    // Decode while enough bytes are there.
    while (buf.size() - out.consumed >= need) {
      const std::string_view in = std::string_view(buf).substr(out.consumed);
      req.clear();
      DecodeResult r = s.next(in, req);
      out.last = r.kind;
      if (r.frame()) {
        onFrame(s, r, req, in, out);
        need = 1;
        continue;
      }
      if (r.failed()) {
        fuzz::checkError(r, in.size());
        out.error = r.error.code;
        return out;
      }
      FUZZ_CHECK(r.need_at_least > in.size());
      need = r.need_at_least;
      break;
    }
    if (eof) {
      out.last = DecodeResult::kNeedMore;
      return out;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data,
                                      std::size_t size) {
  if (size == 0) return 0;
  const std::uint8_t mode = data[0];
  const Limits limits =
      fuzz::limitsFor(static_cast<std::uint8_t>((mode >> 2) & 3));
  const std::string_view all(reinterpret_cast<const char*>(data) + 1, size - 1);
  const Outcome whole = feedWhole(makeStream(mode, limits), all);
  const Outcome chunked = feedChunked(makeStream(mode, limits), all,
                                      static_cast<std::uint8_t>(mode >> 4));
  FUZZ_CHECK(whole.consumed <= all.size());
  FUZZ_CHECK(whole.frames == chunked.frames);
  FUZZ_CHECK(whole.consumed == chunked.consumed);
  FUZZ_CHECK(whole.last == chunked.last);
  FUZZ_CHECK(whole.error == chunked.error);
  return 0;
}
