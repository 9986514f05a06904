// Shared checks for the codec fuzz targets. A violated property prints what
// broke and aborts, which libFuzzer reports as a crash with the input saved.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <string_view>

#include "protocol/codec.h"

#define FUZZ_CHECK(cond)                                               \
  do {                                                                 \
    if (!(cond)) {                                                     \
      std::fprintf(stderr, "%s:%d: property violated: %s\n", __FILE__, \
                   __LINE__, #cond);                                   \
      std::abort();                                                    \
    }                                                                  \
  } while (0)

namespace tcpstore::protocol::fuzz {

// Three limit sets: PyTorch libuv's defaults, tiny ones (so that every limit
// is reachable by short inputs), and "unlimited" (every limit at its maximum,
// as a server configured like 1.13, which has none, would have them).
inline Limits limitsFor(std::uint8_t selector) {
  Limits l;
  switch (selector % 3) {
    case 0:
      break;
    case 1:
      l.max_key_bytes = 16;
      l.max_value_bytes = 64;
      l.max_keys_per_request = 4;
      l.max_request_bytes = 200;
      break;
    default:
      l.max_key_bytes = l.max_value_bytes = l.max_keys_per_request =
          l.max_request_bytes = std::numeric_limits<std::uint64_t>::max();
      break;
  }
  return l;
}

inline bool within(std::string_view view, std::string_view buf) {
  if (view.empty()) return true;
  return view.data() >= buf.data() &&
         view.data() + view.size() <= buf.data() + buf.size();
}

inline void checkViews(const Request& r, std::string_view frame) {
  FUZZ_CHECK(within(r.key, frame));
  FUZZ_CHECK(within(r.value, frame));
  FUZZ_CHECK(within(r.desired, frame));
  for (auto k : r.keys) FUZZ_CHECK(within(k, frame));
  for (auto v : r.values) FUZZ_CHECK(within(v, frame));
}

inline void checkError(const DecodeResult& r, std::size_t in_size) {
  FUZZ_CHECK(r.error.code != DecodeErrorCode::kNone);
  FUZZ_CHECK(!decodeErrorCodeName(r.error.code).empty());
  FUZZ_CHECK(!r.error.message().empty());
  FUZZ_CHECK(r.error.offset <= in_size);
}

// One decoded request frame at the front of `in`: sizes, views, and that
// re-encoding reproduces exactly the consumed bytes.
inline void checkRequestFrame(Dialect d, const DecodeResult& r,
                              const Request& req, std::string_view in) {
  FUZZ_CHECK(r.consumed > 0);
  FUZZ_CHECK(r.consumed <= in.size());
  const std::string_view frame = in.substr(0, r.consumed);
  checkViews(req, frame);
  std::string again;
  FUZZ_CHECK(encodeRequest(d, req, again));
  FUZZ_CHECK(again == frame);
}

// Every strict prefix of a (short) frame must be kNeedMore, asking for more
// than it has but no more than the frame, monotonically.
inline void checkRequestPrefixes(Dialect d, const Limits& limits,
                                 std::string_view frame) {
  if (frame.size() > 256) return;
  std::size_t last = 0;
  for (std::size_t k = 0; k < frame.size(); ++k) {
    Request req;
    DecodeResult r = decodeRequest(frame.substr(0, k), d, limits, req);
    FUZZ_CHECK(r.needMore());
    FUZZ_CHECK(r.need_at_least > k);
    FUZZ_CHECK(r.need_at_least <= frame.size());
    FUZZ_CHECK(r.need_at_least >= last);
    last = r.need_at_least;
  }
}

}  // namespace tcpstore::protocol::fuzz
