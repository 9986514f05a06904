// libFuzzer target: decodeRequest of one fixed dialect over arbitrary bytes
// (built twice: fuzz_request_v113 and fuzz_request_v2). Input byte 0 picks the
// limits; the rest is decoded request after request until it stops.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "tests/fuzz/fuzz_common.h"

#ifndef TCPSTORE_FUZZ_DIALECT
#error "define TCPSTORE_FUZZ_DIALECT (kV113 or kV2)"
#endif

using namespace tcpstore::protocol;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data,
                                      std::size_t size) {
  if (size == 0) return 0;
  constexpr Dialect kDialect = Dialect::TCPSTORE_FUZZ_DIALECT;
  const Limits limits = fuzz::limitsFor(data[0]);
  const std::string_view all(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::size_t pos = 0;
  Request req;
  while (pos <= all.size()) {
    const std::string_view in = all.substr(pos);
    req.clear();
    DecodeResult r = decodeRequest(in, kDialect, limits, req);
    if (r.frame()) {
      fuzz::checkRequestFrame(kDialect, r, req, in);
      fuzz::checkRequestPrefixes(kDialect, limits, in.substr(0, r.consumed));
      // Decoding the frame alone gives the same request.
      Request alone;
      DecodeResult r2 =
          decodeRequest(in.substr(0, r.consumed), kDialect, limits, alone);
      FUZZ_CHECK(r2.frame() && r2.consumed == r.consumed);
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
