// Hostile input, one test per attack: absurd lengths and counts, unknown
// command bytes, truncation, handshake abuse, oversized requests, and the
// dialect detection rule of docs/protocol.md §8.1.
#include <doctest/doctest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "protocol/codec.h"
#include "tests/protocol/alloc_counter.h"
#include "tests/protocol/test_util.h"

namespace tcpstore::protocol {
namespace {

using test::describe;
using test::toHex;
using E = DecodeErrorCode;

using test::AllocationWindow;

std::string u64(std::uint64_t v) {
  std::string s;
  appendU64(s, v);
  return s;
}
std::string str(std::string_view v) {
  std::string s;
  appendStr(s, v);
  return s;
}
std::string code(Dialect d, Command c) {
  auto b = commandCode(d, c);
  REQUIRE(b.has_value());
  return std::string(1, static_cast<char>(*b));
}

DecodeResult decode(Dialect d, std::string_view in,
                    const Limits& limits = Limits{}) {
  Request req;
  return decodeRequest(in, d, limits, req);
}

void expectError(const DecodeResult& res, E code) {
  CAPTURE(describe(res));
  REQUIRE(res.failed());
  CHECK(decodeErrorCodeName(res.error.code) == decodeErrorCodeName(code));
  CHECK(!res.error.message().empty());
}

constexpr Dialect kBoth[] = {Dialect::kV113, Dialect::kV2};

TEST_CASE(
    "hostile: key length one over the limit is refused at the length field") {
  Limits lim;
  lim.max_key_bytes = 16;
  for (Dialect d : kBoth) {
    for (Command c : {Command::kSet, Command::kGet, Command::kAdd,
                      Command::kCompareSet, Command::kDeleteKey}) {
      CAPTURE(commandName(c));
      // Exactly at the limit: fine, waits for the key.
      DecodeResult ok = decode(d, code(d, c) + u64(16), lim);
      CHECK(ok.needMore());
      CHECK(ok.need_at_least >= 1 + 8 + 16);
      DecodeResult res = decode(d, code(d, c) + u64(17), lim);
      expectError(res, E::kKeyTooLong);
      CHECK(res.error.value == 17);
      CHECK(res.error.limit == 16);
      CHECK(res.error.offset == 1);
      CHECK(res.error.command == static_cast<std::uint8_t>(code(d, c)[0]));
    }
    // A key inside a key list (WAIT/CHECK) and the second key of a MULTI_GET.
    for (Command c : {Command::kWait, Command::kCheck}) {
      DecodeResult res =
          decode(d, code(d, c) + u64(2) + str("/a") + u64(17), lim);
      expectError(res, E::kKeyTooLong);
      CHECK(res.error.offset == 1 + 8 + 10);
    }
  }
  DecodeResult res =
      decode(Dialect::kV2,
             code(Dialect::kV2, Command::kMultiSet) + u64(1) + u64(17), lim);
  expectError(res, E::kKeyTooLong);
}

TEST_CASE(
    "hostile: value length one over the limit is refused at the length field") {
  Limits lim;
  lim.max_value_bytes = 100;
  for (Dialect d : kBoth) {
    DecodeResult ok =
        decode(d, code(d, Command::kSet) + str("/k") + u64(100), lim);
    CHECK(ok.needMore());
    DecodeResult res =
        decode(d, code(d, Command::kSet) + str("/k") + u64(101), lim);
    expectError(res, E::kValueTooLong);
    CHECK(res.error.value == 101);
    CHECK(res.error.limit == 100);
    CHECK(res.error.offset == 1 + 10);
    // COMPARE_SET: expected and desired are values.
    expectError(
        decode(d, code(d, Command::kCompareSet) + str("/k") + u64(101), lim),
        E::kValueTooLong);
    expectError(
        decode(d,
               code(d, Command::kCompareSet) + str("/k") + str("e") + u64(101),
               lim),
        E::kValueTooLong);
  }
  for (Command c : {Command::kAppend, Command::kQueuePush}) {
    CAPTURE(commandName(c));
    expectError(
        decode(Dialect::kV2, code(Dialect::kV2, c) + str("/k") + u64(101), lim),
        E::kValueTooLong);
  }
  expectError(decode(Dialect::kV2,
                     code(Dialect::kV2, Command::kMultiSet) + u64(2) +
                         str("/a") + str("1") + str("/b") + u64(101),
                     lim),
              E::kValueTooLong);
}

TEST_CASE(
    "hostile: a 2^63 (and 2^64-1) length or count is refused - not wrapped") {
  for (std::uint64_t huge : {std::uint64_t{1} << 63, ~std::uint64_t{0},
                             (std::uint64_t{1} << 63) + 9}) {
    CAPTURE(huge);
    for (Dialect d : kBoth) {
      expectError(decode(d, code(d, Command::kSet) + u64(huge)),
                  E::kKeyTooLong);
      expectError(decode(d, code(d, Command::kSet) + str("/k") + u64(huge)),
                  E::kValueTooLong);
      expectError(decode(d, code(d, Command::kWait) + u64(huge)),
                  E::kTooManyKeys);
      expectError(decode(d, code(d, Command::kCheck) + u64(huge)),
                  E::kTooManyKeys);
    }
    expectError(decode(Dialect::kV2,
                       code(Dialect::kV2, Command::kMultiGet) + u64(huge)),
                E::kTooManyKeys);
    // As MULTI_SET's i64 count these are negative.
    expectError(decode(Dialect::kV2,
                       code(Dialect::kV2, Command::kMultiSet) + u64(huge)),
                E::kNegativeCount);
  }
}

TEST_CASE(
    "hostile: key count one over the limit is refused at the count field") {
  Limits lim;
  lim.max_keys_per_request = 4;
  for (Dialect d : kBoth) {
    for (Command c : {Command::kWait, Command::kCheck}) {
      CHECK(decode(d, code(d, c) + u64(4), lim).needMore());
      DecodeResult res = decode(d, code(d, c) + u64(5), lim);
      expectError(res, E::kTooManyKeys);
      CHECK(res.error.value == 5);
      CHECK(res.error.limit == 4);
      CHECK(res.error.offset == 1);
    }
  }
  for (Command c : {Command::kMultiGet, Command::kMultiSet}) {
    CAPTURE(commandName(c));
    CHECK(decode(Dialect::kV2, code(Dialect::kV2, c) + u64(4), lim).needMore());
    expectError(decode(Dialect::kV2, code(Dialect::kV2, c) + u64(5), lim),
                E::kTooManyKeys);
  }
  // The default is PyTorch libuv's MAX_KEY_COUNT.
  const Limits def;
  CHECK(
      decode(Dialect::kV2, code(Dialect::kV2, Command::kWait) + u64(128 * 1024))
          .needMore());
  expectError(
      decode(Dialect::kV2,
             code(Dialect::kV2, Command::kWait) + u64(128 * 1024 + 1), def),
      E::kTooManyKeys);
}

TEST_CASE("hostile: MULTI_SET with a negative count") {
  for (std::int64_t n : {std::int64_t{-1}, std::int64_t{-2},
                         std::numeric_limits<std::int64_t>::min()}) {
    CAPTURE(n);
    std::string in = code(Dialect::kV2, Command::kMultiSet);
    appendI64(in, n);
    DecodeResult res = decode(Dialect::kV2, in);
    expectError(res, E::kNegativeCount);
    CHECK(res.error.offset == 1);
  }
  // Count 0 is legal and complete.
  DecodeResult res =
      decode(Dialect::kV2, code(Dialect::kV2, Command::kMultiSet) + u64(0));
  REQUIRE(res.frame());
  CHECK(res.consumed == 9);
}

TEST_CASE(
    "hostile: unknown command byte - 1.13 (0x09..0xff) and 2.x (0x13..0xff)") {
  for (Dialect d : kBoth) {
    for (int b = 0; b < 256; ++b) {
      CAPTURE(b);
      const std::string in(1, static_cast<char>(b));
      DecodeResult res = decode(d, in);
      const bool known =
          commandFromCode(d, static_cast<std::uint8_t>(b)).has_value();
      CHECK(known == (d == Dialect::kV113 ? b <= 0x08 : b <= 0x12));
      if (known) {
        CHECK(!res.failed());
        continue;
      }
      expectError(res, E::kUnknownCommand);
      CHECK(res.error.command == b);
      CHECK(res.error.value == static_cast<std::uint64_t>(b));
      CHECK(res.error.offset == 0);
      // Also on a stream (pinned and validated).
      RequestStream s(Limits{}, d, true);
      Request req;
      expectError(s.next(in + "more", req), E::kUnknownCommand);
    }
  }
  // A 1.13 first byte that is unknown is refused by the detecting stream.
  RequestStream s{Limits{}};
  Request req;
  expectError(s.next("\x09", req), E::kUnknownCommand);
}

TEST_CASE("hostile: truncated at end of stream is reported by finish()") {
  for (Dialect d : kBoth) {
    std::size_t n = 0;
    for (const auto& v : test::loadVectors(d)) {
      if (v.request.empty()) continue;
      Request first;
      REQUIRE(decodeRequest(v.request, d, Limits{}, first).frame());
      const bool validate = first.command == Command::kValidate;
      CAPTURE(v.op);
      for (std::size_t k = 1; k < v.request.size(); ++k) {
        CAPTURE(k);
        RequestStream s(Limits{}, d, !validate);
        Request req;
        CHECK(s.next(std::string_view(v.request).substr(0, k), req).needMore());
        DecodeResult fin = s.finish(std::string_view(v.request).substr(0, k));
        expectError(fin, E::kTruncated);
        ++n;
      }
      RequestStream s(Limits{}, d, !validate);
      CHECK(s.finish("").needMore());
      CHECK(s.finish("").consumed == 0);
    }
    CHECK(n > 100);
  }
  // Undecided detection (a prefix of VALIDATE) at EOF is truncated too.
  RequestStream s{Limits{}};
  Request req;
  CHECK(s.next(std::string_view("\x00\xce\xf7", 3), req).needMore());
  expectError(s.finish(std::string_view("\x00\xce\xf7", 3)), E::kTruncated);
}

TEST_CASE("hostile: zero-key WAIT and CHECK are valid and decodable at once") {
  for (Dialect d : kBoth) {
    for (Command c : {Command::kWait, Command::kCheck}) {
      CAPTURE(commandName(c));
      Request req;
      req.keys.push_back("stale");
      const std::string in = code(d, c) + u64(0);
      DecodeResult res = decodeRequest(in, d, Limits{}, req);
      REQUIRE(res.frame());
      CHECK(res.consumed == 9);
      CHECK(req.command == c);
      CHECK(req.keys.empty());
    }
  }
  Request req;
  DecodeResult res =
      decodeRequest(code(Dialect::kV2, Command::kMultiGet) + u64(0),
                    Dialect::kV2, Limits{}, req);
  REQUIRE(res.frame());
  CHECK(req.keys.empty());
}

TEST_CASE("hostile: VALIDATE with a wrong magic") {
  const std::string bad = std::string("\x00\x78\x56\x34\x12", 5);
  DecodeResult res = decode(Dialect::kV2, bad);
  expectError(res, E::kBadMagic);
  CHECK(res.error.value == 0x12345678u);
  // Magic off by one bit, on a pinned stream.
  std::string in(1, '\0');
  appendU32(in, kValidateMagic ^ 1u);
  RequestStream s(Limits{}, Dialect::kV2, false);
  Request req;
  expectError(s.next(in, req), E::kBadMagic);
  CHECK_FALSE(s.validated());
}

TEST_CASE("hostile: a second VALIDATE after the handshake") {
  std::string validate(1, '\0');
  appendU32(validate, kValidateMagic);
  for (bool detected : {true, false}) {
    CAPTURE(detected);
    RequestStream s = detected ? RequestStream(Limits{})
                               : RequestStream(Limits{}, Dialect::kV2, false);
    Request req;
    DecodeResult res = s.next(validate + validate, req);
    REQUIRE(res.frame());
    CHECK(req.command == Command::kValidate);
    CHECK(res.consumed == 5);
    CHECK(s.validated());
    res = s.next(validate, req);
    expectError(res, E::kRepeatedValidate);
    CHECK(res.error.command == 0x00);
  }
}

TEST_CASE("hostile: first 2.x request not VALIDATE on a pinned 2.x stream") {
  for (const std::string& in :
       {std::string("\x07"), std::string("\x0d\x63\x00\x00\x00", 5),
        std::string("\x01") + str("/k") + str("v")}) {
    CAPTURE(toHex(in));
    RequestStream s(Limits{}, Dialect::kV2, false);
    Request req;
    expectError(s.next(in, req), E::kNotValidated);
  }
}

TEST_CASE(
    "hostile: a request over max_request_bytes is refused before its data "
    "arrives") {
  Limits lim;
  lim.max_request_bytes = 1000;
  for (Dialect d : kBoth) {
    // One value that alone exceeds the request cap but not the value cap.
    DecodeResult res =
        decode(d, code(d, Command::kSet) + str("/k") + u64(2000), lim);
    expectError(res, E::kRequestTooLarge);
    CHECK(res.error.limit == 1000);
    // Many keys, each fine, together over the cap: refused at the first
    // length that makes the total exceed it, with only that much present.
    std::string in = code(d, Command::kWait) + u64(100);
    DecodeResult r2;
    for (int i = 0; i < 100; ++i) {
      in += str(std::string(20, 'k'));
      r2 = decode(d, in, lim);
      if (!r2.needMore()) break;
    }
    expectError(r2, E::kRequestTooLarge);
    CHECK(in.size() <= 1000 + 8 + 20);
    // Exactly at the cap: accepted.
    const std::size_t head = 1 + 10 + 8;
    std::string exact =
        code(d, Command::kSet) + str("/k") + str(std::string(1000 - head, 'v'));
    REQUIRE(exact.size() == 1000);
    CHECK(decode(d, exact, lim).frame());
  }
  // MULTI_SET pairs.
  std::string in =
      code(Dialect::kV2, Command::kMultiSet) + u64(3) + str("/a") + u64(990);
  expectError(decode(Dialect::kV2, in, lim), E::kRequestTooLarge);
}

TEST_CASE(
    "hostile: the decoder does not allocate for an absurd length or count") {
  Limits small;
  small.max_key_bytes = 16;
  small.max_value_bytes = 64;
  small.max_keys_per_request = 8;
  small.max_request_bytes = 4096;
  struct Case {
    Dialect d;
    std::string in;
    E code;
  };
  const std::vector<Case> cases = {
      {Dialect::kV113, std::string("\x00", 1) + u64(1ull << 62) + "abc",
       E::kKeyTooLong},
      {Dialect::kV2,
       code(Dialect::kV2, Command::kSet) + str("/k") + u64(1ull << 40),
       E::kValueTooLong},
      {Dialect::kV2, code(Dialect::kV2, Command::kWait) + u64(1ull << 62),
       E::kTooManyKeys},
      {Dialect::kV2, code(Dialect::kV2, Command::kMultiGet) + u64(9),
       E::kTooManyKeys},
      {Dialect::kV2, code(Dialect::kV2, Command::kMultiSet) + u64(100000),
       E::kTooManyKeys},
      {Dialect::kV2, code(Dialect::kV2, Command::kSet) + str("/k") + u64(65),
       E::kValueTooLong},
  };
  for (const auto& c : cases) {
    CAPTURE(toHex(c.in));
    Request req;
    req.keys.reserve(4);  // a reused Request: no growth needed for an error
    req.values.reserve(4);
    DecodeResult res;
    std::size_t allocated = 0;
    {
      AllocationWindow w;
      res = decodeRequest(c.in, c.d, small, req);
      allocated = w.stop();
    }
    expectError(res, c.code);
    CHECK(allocated == 0);
  }
  // A count within the limits with no keys yet: waits, and reserves at most
  // what the limit allows.
  Request req;
  std::size_t allocated = 0;
  DecodeResult res;
  {
    const std::string in = code(Dialect::kV2, Command::kWait) + u64(8);
    AllocationWindow w;
    res = decodeRequest(in, Dialect::kV2, small, req);
    allocated = w.stop();
  }
  CHECK(res.needMore());
  CHECK(allocated <= 8 * sizeof(std::string_view) * 2);
}

TEST_CASE("hostile: dialect detection (docs/protocol.md §8.1)") {
  const std::string magic("\x00\xce\xf7\x85\x3c", 5);
  // Every strict prefix of VALIDATE stays undecided.
  for (std::size_t k = 0; k < magic.size(); ++k) {
    CAPTURE(k);
    CHECK_FALSE(detectDialect(magic.substr(0, k)).has_value());
    RequestStream s{Limits{}};
    Request req;
    DecodeResult res = s.next(magic.substr(0, k), req);
    CHECK(res.needMore());
    CHECK(res.need_at_least > k);
    CHECK(res.need_at_least <= 5);
    CHECK_FALSE(s.dialect().has_value());
  }
  CHECK(detectDialect(magic) == std::optional<Dialect>(Dialect::kV2));
  CHECK(detectDialect(magic + "\x0d") == std::optional<Dialect>(Dialect::kV2));
  // 00 ce f7 85 00: the low half of a 1.13 SET key length.
  const std::string almost("\x00\xce\xf7\x85\x00", 5);
  CHECK(detectDialect(almost) == std::optional<Dialect>(Dialect::kV113));
  {
    RequestStream s{Limits{}};
    Request req;
    DecodeResult res = s.next(almost, req);
    CAPTURE(describe(res));
    CHECK(s.dialect() == std::optional<Dialect>(Dialect::kV113));
    CHECK(!res.frame());
  }
  {
    // With a generous key limit it really is a SET of an 8.8 MB key.
    Limits big;
    big.max_key_bytes = 16 * 1024 * 1024;
    RequestStream s{big};
    Request req;
    DecodeResult res = s.next(almost + std::string(4, '\0'), req);
    CAPTURE(describe(res));
    REQUIRE(res.needMore());
    CHECK(res.need_at_least > 0x0085f7ceu);
    CHECK(s.dialect() == std::optional<Dialect>(Dialect::kV113));
  }
  // Decided as soon as the bytes stop matching the magic.
  CHECK(detectDialect(std::string("\x00\x05", 2)) ==
        std::optional<Dialect>(Dialect::kV113));
  CHECK(detectDialect(std::string("\x00\xce\xf7\x00", 4)) ==
        std::optional<Dialect>(Dialect::kV113));
  // Any first byte other than 00 is 1.13.
  for (int b = 1; b < 256; ++b) {
    CAPTURE(b);
    CHECK(detectDialect(std::string(1, static_cast<char>(b))) ==
          std::optional<Dialect>(Dialect::kV113));
  }
  // A 1.13 SET of a small key is decided and decoded.
  RequestStream s{Limits{}};
  Request req;
  const std::string set = std::string(1, '\0') + str("/k") + str("v");
  DecodeResult res = s.next(set, req);
  REQUIRE(res.frame());
  CHECK(req.command == Command::kSet);
  CHECK(req.key == "/k");
  CHECK(s.dialect() == std::optional<Dialect>(Dialect::kV113));
}

TEST_CASE("hostile: 1.13 vs 2.x code coincidences (0x07 0x03 0x00 0x08)") {
  // 0x07: WATCH_KEY in 1.13, GETNUMKEYS in 2.x.
  const std::string k = str("/wk");
  Request a;
  DecodeResult ra = decodeRequest("\x07" + k, Dialect::kV113, Limits{}, a);
  REQUIRE(ra.frame());
  CHECK(a.command == Command::kWatchKey);
  CHECK(ra.consumed == 1 + k.size());
  Request b;
  DecodeResult rb = decodeRequest("\x07" + k, Dialect::kV2, Limits{}, b);
  REQUIRE(rb.frame());
  CHECK(b.command == Command::kGetNumKeys);
  CHECK(rb.consumed == 1);
  // 0x03: ADD in 1.13 (key + i64), GET in 2.x (key).
  // Built step by step: GCC 12 -O2 reports a false -Wrestrict on
  // `"literal" + std::string` (GCC bug 105329).
  std::string add = "\x03";
  add += str("/c");
  add += u64(5);
  REQUIRE(decodeRequest(add, Dialect::kV113, Limits{}, a).frame());
  CHECK(a.command == Command::kAdd);
  CHECK(a.number == 5);
  rb = decodeRequest(add, Dialect::kV2, Limits{}, b);
  REQUIRE(rb.frame());
  CHECK(b.command == Command::kGet);
  CHECK(rb.consumed == 1 + 10);
  // 0x00: SET in 1.13, VALIDATE in 2.x.
  std::string v(1, '\0');
  appendU32(v, kValidateMagic);
  // As 1.13, VALIDATE+PING is a SET with key length 0x0010920d3c85f7ce.
  const std::string vp = v + std::string("\x0d\x92\x10\x00", 4);
  DecodeResult r113 = decodeRequest(vp, Dialect::kV113, Limits{}, a);
  expectError(r113, E::kKeyTooLong);
  CHECK(r113.error.value == 0x0010920d3c85f7ceull);
  REQUIRE(decodeRequest(v, Dialect::kV2, Limits{}, b).frame());
  CHECK(b.command == Command::kValidate);
  CHECK(b.u32 == kValidateMagic);
  const std::string set = std::string(1, '\0') + str("/s") + str("v");
  REQUIRE(decodeRequest(set, Dialect::kV113, Limits{}, a).frame());
  CHECK(a.command == Command::kSet);
  CHECK(decodeRequest(set, Dialect::kV2, Limits{}, b).failed());  // bad magic
  // 0x08: DELETE_KEY in both.
  for (Dialect d : kBoth) {
    REQUIRE(decodeRequest("\x08" + k, d, Limits{}, a).frame());
    CHECK(a.command == Command::kDeleteKey);
  }
}

// ---- replies ---------------------------------------------------------------

TEST_CASE("hostile replies: absurd string lengths and counts are refused") {
  Limits small;
  small.max_key_bytes = 16;
  small.max_value_bytes = 64;
  small.max_keys_per_request = 8;
  auto reply = [&](std::string_view in, ReplyShape shape,
                   std::uint64_t count = 0) {
    Reply r;
    return decodeReply(in, shape, small, r, count);
  };
  DecodeResult res = reply(u64(1ull << 63), ReplyShape::kString);
  REQUIRE(res.failed());
  CHECK(res.error.code != E::kNone);
  res = reply(u64(65), ReplyShape::kString);
  REQUIRE(res.failed());
  CHECK(res.error.code == E::kValueTooLong);
  CHECK(reply(u64(64), ReplyShape::kString).needMore());
  res = reply("", ReplyShape::kStrings, 9);  // MULTI_GET count over the limit
  REQUIRE(res.failed());
  CHECK(res.error.code == E::kTooManyKeys);
  res = reply(u64(9), ReplyShape::kCountedStrings);
  REQUIRE(res.failed());
  CHECK(res.error.code == E::kTooManyKeys);
  std::string neg;
  appendI64(neg, -1);
  res = reply(neg, ReplyShape::kCountedStrings);
  REQUIRE(res.failed());
  CHECK(res.error.code != E::kNone);
  res = reply(std::string("\x01") + u64(1ull << 62),
              ReplyShape::kWatchNotification);
  REQUIRE(res.failed());
  CHECK(res.error.code != E::kNone);
}

TEST_CASE(
    "hostile replies: a watch notification type outside WatchEvent is a bad "
    "reply") {
  const std::string rest = str("/wk") + str("") + str("a");
  for (int t : {0x04, 0x7f, 0xff}) {
    CAPTURE(t);
    Reply r;
    DecodeResult res = decodeReply(std::string(1, static_cast<char>(t)) + rest,
                                   ReplyShape::kWatchNotification, Limits{}, r);
    REQUIRE(res.failed());
    CHECK(res.error.code == E::kBadReply);
  }
}

}  // namespace
}  // namespace tcpstore::protocol

namespace tcpstore::protocol {
namespace {

// A server may configure "no limits" (1.13 has none) as the largest value.
// Lengths whose message end does not fit in 64 bits must still be refused,
// not wrapped around into a short, bogus frame.
Limits unlimited() {
  Limits l;
  l.max_key_bytes = l.max_value_bytes = l.max_keys_per_request =
      l.max_request_bytes = std::numeric_limits<std::uint64_t>::max();
  return l;
}

TEST_CASE(
    "hostile: with unlimited Limits a 2^64-1 length is refused - not wrapped "
    "(requests)") {
  for (std::uint64_t len :
       {~std::uint64_t{0}, ~std::uint64_t{0} - 4, ~std::uint64_t{0} - 8}) {
    CAPTURE(len);
    for (Dialect d : {Dialect::kV113, Dialect::kV2}) {
      CAPTURE(dialectName(d));
      const std::string key_len =
          code(d, Command::kSet) + u64(len) + std::string(40, 'k');
      const std::string value_len =
          code(d, Command::kSet) + str("/k") + u64(len) + std::string(40, 'v');
      for (const std::string& in : {key_len, value_len}) {
        CAPTURE(toHex(in.substr(0, 24)));
        Request req;
        DecodeResult res = decodeRequest(in, d, unlimited(), req);
        CAPTURE(describe(res));
        CHECK(res.failed());
        RequestStream s(unlimited(), d, true);
        res = s.next(in, req);
        CAPTURE(describe(res));
        CHECK(res.failed());
      }
    }
  }
}

TEST_CASE(
    "hostile: with unlimited Limits a 2^64-1 length is refused - not wrapped "
    "(replies)") {
  for (std::uint64_t len :
       {~std::uint64_t{0}, ~std::uint64_t{0} - 4, ~std::uint64_t{0} - 7}) {
    CAPTURE(len);
    const std::string in = u64(len) + "xyz";
    Reply reply;
    DecodeResult res = decodeReply(in, ReplyShape::kString, unlimited(), reply);
    CAPTURE(describe(res));
    CHECK(res.failed());
    res = decodeReply(in, ReplyShape::kStrings, unlimited(), reply, 1);
    CHECK(res.failed());
    res = decodeReply(u64(1) + in, ReplyShape::kCountedStrings, unlimited(),
                      reply);
    CHECK(res.failed());
  }
}

TEST_CASE("a 128Ki-key request leaves no per-connection list storage behind") {
  // A connection's parse state outlives its requests: one large CHECK (or
  // MULTI_SET) must not pin megabytes of (offset, length) pairs per
  // connection for the rest of its life.
  Limits limits;
  std::string msg = code(Dialect::kV2, Command::kCheck) + u64(100000);
  for (int i = 0; i < 100000; ++i) msg += str("");
  std::string pairs = code(Dialect::kV2, Command::kMultiSet) + u64(50000);
  for (int i = 0; i < 50000; ++i) pairs += str("k") + str("");
  for (const std::string* m : {&msg, &pairs}) {
    detail::ParseState st;
    Request out;
    DecodeResult r =
        detail::decodeRequestResumable(*m, Dialect::kV2, limits, st, out);
    REQUIRE(r.frame());
    CHECK(r.consumed == m->size());
    CHECK(out.keys.size() >= 50000);
    CHECK(st.keys.capacity() <= detail::ParseState::kKeepListEntries);
    CHECK(st.values.capacity() <= detail::ParseState::kKeepListEntries);
  }
}

}  // namespace
}  // namespace tcpstore::protocol
