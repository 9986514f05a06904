// The vectors and closes of tests/data/tcpstore_vectors.json (docs/protocol.md
// §9.1), read from the file: nothing is retyped here except, for the closes,
// which named error (or which documented exception) each entry gets.
#include <doctest/doctest.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "protocol/codec.h"
#include "tests/protocol/test_util.h"

namespace tcpstore::protocol {
namespace {

using test::describe;
using test::toHex;

// The one vector whose reply is incomplete by design: the classic server
// sent the value of /mg1 and then closed at the missing key (docs/protocol.md
// §3.13). Checked in its own test case below.
constexpr std::string_view kPartialMultiGetOp =
    "MULTI_GET [/mg1, /missing] (raw; missing key last)";

std::uint64_t replyCount(const Request& req) {
  return req.command == Command::kMultiGet ? req.keys.size() : 0;
}

void checkVectors(Dialect d) {
  const auto vectors = test::loadVectors(d);
  REQUIRE(!vectors.empty());
  std::size_t requests = 0;
  std::size_t replies = 0;
  std::size_t partial = 0;
  for (const auto& v : vectors) {
    CAPTURE(v.op);
    CAPTURE(toHex(v.request));
    CAPTURE(toHex(v.reply));
    ReplyShape shape =
        ReplyShape::kWatchNotification;  // a server push has no request
    std::uint64_t count = 0;
    if (!v.request.empty()) {
      ++requests;
      const auto expected =
          test::jsonCommandOfCode(d, static_cast<std::uint8_t>(v.request[0]));
      REQUIRE(expected.has_value());
      Request req;
      DecodeResult res = decodeRequest(v.request, d, Limits{}, req);
      CAPTURE(describe(res));
      REQUIRE(res.frame());
      CHECK(res.consumed == v.request.size());
      CHECK(commandName(req.command) == commandName(*expected));
      std::string again;
      REQUIRE(encodeRequest(d, req, again));
      CHECK(toHex(again) == toHex(v.request));
      shape = replyShapeOf(req.command);
      count = replyCount(req);
    }
    if (v.op == kPartialMultiGetOp) {
      ++partial;
      continue;
    }
    CAPTURE(static_cast<int>(shape));
    if (v.reply.empty()) {
      // "" = no reply: only for commands that expect none.
      CHECK(shape == ReplyShape::kNone);
    } else {
      CHECK(shape != ReplyShape::kNone);
    }
    ++replies;
    Reply reply;
    DecodeResult res = decodeReply(v.reply, shape, Limits{}, reply, count);
    CAPTURE(describe(res));
    REQUIRE(res.frame());
    CHECK(res.consumed == v.reply.size());
    reply.shape = shape;
    std::string again;
    encodeReply(reply, again);
    CHECK(toHex(again) == toHex(v.reply));
  }
  CHECK(requests > 0);
  CHECK(replies > 0);
  CHECK(partial == (d == Dialect::kV2 ? 1u : 0u));
}

TEST_CASE(
    "vectors 1.13: every request decodes to its code's command and re-encodes "
    "- replies too") {
  checkVectors(Dialect::kV113);
}

TEST_CASE(
    "vectors 2.x: every request decodes to its code's command and re-encodes - "
    "replies too") {
  checkVectors(Dialect::kV2);
}

TEST_CASE(
    "vector 2.x MULTI_GET with a missing key: the partial reply is one string "
    "short") {
  // The classic server closed after the first value; our client decoder must
  // see the reply as incomplete for 2 keys (and complete for the 1 it holds).
  const auto vectors = test::loadVectors(Dialect::kV2);
  const test::Vector* v = nullptr;
  for (const auto& x : vectors) {
    if (x.op == kPartialMultiGetOp) v = &x;
  }
  REQUIRE(v != nullptr);
  Request req;
  REQUIRE(decodeRequest(v->request, Dialect::kV2, Limits{}, req).frame());
  REQUIRE(req.command == Command::kMultiGet);
  REQUIRE(req.keys.size() == 2);
  Reply reply;
  DecodeResult res =
      decodeReply(v->reply, ReplyShape::kStrings, Limits{}, reply, 2);
  CAPTURE(describe(res));
  CHECK(res.needMore());
  CHECK(res.need_at_least > v->reply.size());
  res = decodeReply(v->reply, ReplyShape::kStrings, Limits{}, reply, 1);
  REQUIRE(res.frame());
  CHECK(res.consumed == v->reply.size());
  REQUIRE(reply.values.size() == 1);
  CHECK(reply.values[0] == "a");
}

// ---- closes ----------------------------------------------------------------

// What our decoder does with each close entry, by docs/protocol.md §9.1 number.
enum class Outcome {
  kRejected,    // a named decode error (the code given)
  kUnderstood,  // a command our server implements although that server closed
  kSemantic,    // a well-formed request the keyspace refuses, not the codec
};
struct Expect {
  Outcome outcome;
  DecodeErrorCode code = DecodeErrorCode::kNone;
};

const std::map<std::pair<Dialect, std::size_t>, Expect>& closeTable() {
  using E = DecodeErrorCode;
  static const std::map<std::pair<Dialect, std::size_t>, Expect> t = {
      {{Dialect::kV113, 1}, {Outcome::kRejected, E::kUnknownCommand}},  // 09
      {{Dialect::kV113, 2}, {Outcome::kRejected, E::kUnknownCommand}},  // ff
      {{Dialect::kV113, 3}, {Outcome::kSemantic}},  // GET missing
      {{Dialect::kV113, 4}, {Outcome::kSemantic}},  // ADD non-numeric
      {{Dialect::kV113, 5},
       {Outcome::kRejected, E::kKeyTooLong}},  // key len 2^62
      // 2.x handshake on a pinned 1.13 connection: a SET with key length
      // 0x0010920d3c85f7ce. Under detection it is a 2.x connection (own test).
      {{Dialect::kV113, 6}, {Outcome::kRejected, E::kKeyTooLong}},
      {{Dialect::kV2, 1}, {Outcome::kRejected, E::kNotValidated}},  // SET first
      {{Dialect::kV2, 2},
       {Outcome::kRejected, E::kNotValidated}},  // GETNUMKEYS first
      {{Dialect::kV2, 3},
       {Outcome::kRejected, E::kNotValidated}},                 // PING first
      {{Dialect::kV2, 4}, {Outcome::kRejected, E::kBadMagic}},  // wrong magic
      {{Dialect::kV2, 5},
       {Outcome::kRejected, E::kRepeatedValidate}},  // second VALIDATE
      {{Dialect::kV2, 6}, {Outcome::kUnderstood}},   // QUEUE_PUSH
      {{Dialect::kV2, 7}, {Outcome::kUnderstood}},   // LIST_KEYS
      {{Dialect::kV2, 8}, {Outcome::kUnderstood}},   // BARRIER
      {{Dialect::kV2, 9}, {Outcome::kRejected, E::kUnknownCommand}},   // 13
      {{Dialect::kV2, 10}, {Outcome::kRejected, E::kUnknownCommand}},  // ff
      {{Dialect::kV2, 11}, {Outcome::kSemantic}},  // GET missing
      {{Dialect::kV2, 12}, {Outcome::kSemantic}},  // ADD non-numeric
      {{Dialect::kV2, 13}, {Outcome::kSemantic}},  // ADD empty
      {{Dialect::kV2, 14}, {Outcome::kSemantic}},  // ADD 10^20
      {{Dialect::kV2, 15},
       {Outcome::kRejected, E::kKeyTooLong}},  // key len 2^62
      {{Dialect::kV2, 16},
       {Outcome::kRejected, E::kTooManyKeys}},     // WAIT count 2^62
      {{Dialect::kV2, 17}, {Outcome::kSemantic}},  // MULTI_GET missing
      {{Dialect::kV2, 18}, {Outcome::kSemantic}},  // BARRIER non-numeric
  };
  return t;
}

// A forced-dialect stream as the close entry prescribes (2.x: handshake done
// iff after_handshake).
RequestStream streamFor(const test::Close& c) {
  return RequestStream(Limits{}, c.dialect, c.after_handshake);
}

TEST_CASE(
    "closes: every entry of the vectors file is classified (rejected / "
    "understood / semantic)") {
  std::size_t n = 0;
  for (Dialect d : {Dialect::kV113, Dialect::kV2}) {
    for (const auto& c : test::loadCloses(d)) {
      CAPTURE(c.op);
      ++n;
      CHECK(closeTable().count({d, c.number}) == 1);
    }
  }
  CHECK(n == closeTable().size());
}

TEST_CASE(
    "closes: rejected entries give the named error on a forced-dialect "
    "stream") {
  std::size_t rejected = 0;
  for (Dialect d : {Dialect::kV113, Dialect::kV2}) {
    for (const auto& c : test::loadCloses(d)) {
      auto it = closeTable().find({d, c.number});
      REQUIRE(it != closeTable().end());
      if (it->second.outcome != Outcome::kRejected) continue;
      ++rejected;
      CAPTURE(dialectName(d));
      CAPTURE(c.number);
      CAPTURE(c.op);
      CAPTURE(toHex(c.request));
      RequestStream s = streamFor(c);
      Request req;
      DecodeResult res = s.next(c.request, req);
      CAPTURE(describe(res));
      REQUIRE(res.failed());
      CHECK(decodeErrorCodeName(res.error.code) ==
            decodeErrorCodeName(it->second.code));
      CHECK(!decodeErrorCodeName(res.error.code).empty());
      CHECK(!res.error.message().empty());
      CHECK(res.error.command == static_cast<std::uint8_t>(c.request[0]));
      if (it->second.code == DecodeErrorCode::kUnknownCommand) {
        CHECK(res.error.value == static_cast<std::uint8_t>(c.request[0]));
      }
    }
  }
  CHECK(rejected == 13);  // 1.13: C1 C2 C5 C6; 2.x: C1-C5 C9 C10 C15 C16
}

TEST_CASE(
    "closes: the wrong magic and the huge lengths are reported with their "
    "values") {
  {
    const auto& c = test::closeNumber(Dialect::kV2, 4);  // 00 78 56 34 12 07
    RequestStream s = streamFor(c);
    Request req;
    DecodeResult res = s.next(c.request, req);
    REQUIRE(res.failed());
    CHECK(res.error.value == 0x12345678u);
  }
  for (std::size_t n : {15u, 16u}) {  // key length / key count 2^62
    const auto& c = test::closeNumber(Dialect::kV2, n);
    RequestStream s = streamFor(c);
    Request req;
    DecodeResult res = s.next(c.request, req);
    REQUIRE(res.failed());
    CHECK(res.error.value == (std::uint64_t{1} << 62));
    CHECK(res.error.offset == 1);
    CHECK(res.error.limit ==
          (n == 15 ? Limits{}.max_key_bytes : Limits{}.max_keys_per_request));
  }
}

// (c) Semantic closes: the bytes are a well-formed request; PyTorch's server
// closes because of the key space state (missing key, non-numeric counter).
// Our codec must hand them over whole; store/keyspace's tests cover the
// refusal.
void expectSemanticClose(Dialect d, std::size_t number, Command command) {
  const auto& c = test::closeNumber(d, number);
  CAPTURE(c.op);
  REQUIRE(closeTable().at({d, number}).outcome == Outcome::kSemantic);
  RequestStream s = streamFor(c);
  test::Drained r = test::drain(s, c.request);
  CAPTURE(describe(r.last));
  REQUIRE(r.commands.size() == 1);
  CHECK(r.commands[0] == command);
  CHECK(r.consumed == c.request.size());
  CHECK(r.reencode_matches);
  CHECK(r.wire_matches);
  CHECK(r.at_finish.needMore());
}

TEST_CASE(
    "close 1.13 C3 raw GET of a missing key: decodes - the keyspace refuses "
    "(semantic)") {
  expectSemanticClose(Dialect::kV113, 3, Command::kGet);
}
TEST_CASE(
    "close 1.13 C4 ADD on a non-numeric value: decodes - the keyspace refuses "
    "(semantic)") {
  expectSemanticClose(Dialect::kV113, 4, Command::kAdd);
}
TEST_CASE(
    "close 2.x C11 raw GET of a missing key: decodes - the keyspace refuses "
    "(semantic)") {
  expectSemanticClose(Dialect::kV2, 11, Command::kGet);
}
TEST_CASE(
    "close 2.x C12 ADD on a non-numeric value: decodes - the keyspace refuses "
    "(semantic)") {
  expectSemanticClose(Dialect::kV2, 12, Command::kAdd);
}
TEST_CASE(
    "close 2.x C13 ADD on an empty value: decodes - the keyspace refuses "
    "(semantic)") {
  expectSemanticClose(Dialect::kV2, 13, Command::kAdd);
}
TEST_CASE(
    "close 2.x C14 ADD on an out-of-range decimal: decodes - the keyspace "
    "refuses (semantic)") {
  expectSemanticClose(Dialect::kV2, 14, Command::kAdd);
}
TEST_CASE(
    "close 2.x C17 MULTI_GET with a missing key: decodes - the keyspace "
    "refuses (semantic)") {
  expectSemanticClose(Dialect::kV2, 17, Command::kMultiGet);
}
TEST_CASE(
    "close 2.x C18 BARRIER on a non-numeric value: decodes - the keyspace "
    "refuses (semantic)") {
  expectSemanticClose(Dialect::kV2, 18, Command::kBarrier);
}

// (b) 2.x commands newer than the server that closed: we implement the libuv
// and 2.14 command set, so the bare code is a valid prefix (or, LIST_KEYS, a
// whole request), and with its arguments a whole request.
void expectUnderstood(std::size_t number, Command command,
                      std::string_view args) {
  const auto& c = test::closeNumber(Dialect::kV2, number);
  CAPTURE(c.op);
  REQUIRE(closeTable().at({Dialect::kV2, number}).outcome ==
          Outcome::kUnderstood);
  REQUIRE(c.after_handshake);
  {
    RequestStream s = streamFor(c);
    Request req;
    DecodeResult res = s.next(c.request, req);
    CAPTURE(describe(res));
    if (args.empty()) {
      REQUIRE(res.frame());
      CHECK(res.consumed == c.request.size());
      CHECK(req.command == command);
    } else {
      CHECK(res.needMore());
      CHECK(res.need_at_least > c.request.size());
      // At the end of the stream the bare code is a truncated request, not an
      // unknown command.
      DecodeResult fin = s.finish(c.request);
      CHECK(fin.failed());
      CHECK(fin.error.code == DecodeErrorCode::kTruncated);
    }
  }
  RequestStream s = streamFor(c);
  const std::string whole = c.request + std::string(args);
  test::Drained r = test::drain(s, whole);
  CAPTURE(describe(r.last));
  REQUIRE(r.commands.size() == 1);
  CHECK(r.commands[0] == command);
  CHECK(r.consumed == whole.size());
  CHECK(r.reencode_matches);
  CHECK(r.wire_matches);
}

std::string keyArg(std::string_view key) {
  std::string s;
  appendStr(s, key);
  return s;
}

TEST_CASE(
    "close 2.x C6 QUEUE_PUSH code: understood here (we implement the libuv "
    "queue commands)") {
  std::string args = keyArg("/q") + keyArg("job1");
  expectUnderstood(6, Command::kQueuePush, args);
}
TEST_CASE(
    "close 2.x C7 LIST_KEYS code: understood here (2.14 command only 2.6 "
    "closes)") {
  expectUnderstood(7, Command::kListKeys, "");
}
TEST_CASE(
    "close 2.x C8 BARRIER code: understood here (2.14 command only 2.6 "
    "closes)") {
  std::string args = keyArg("/b");
  appendI64(args, 2);
  expectUnderstood(8, Command::kBarrier, args);
}

// (a) 2.x closes C1-C4 and 1.13 C6 under dialect detection (docs/protocol.md §8.1):
// one port serves both dialects, so bytes that a 2.x server closes for not
// starting with VALIDATE are a 1.13 connection to us, and a 2.x handshake that
// a 1.13 server closes is a 2.x connection.
test::Drained detectAndDrain(const test::Close& c) {
  RequestStream s{Limits{}};
  test::Drained r = test::drain(s, c.request);
  CHECK(s.dialect() == std::optional<Dialect>(c.dialect == Dialect::kV2
                                                  ? Dialect::kV113
                                                  : Dialect::kV2));
  return r;
}

TEST_CASE(
    "close 2.x C1 (SET before VALIDATE) under detection: a 1.13 COMPARE_SET "
    "still missing its desired value") {
  const auto& c = test::closeNumber(Dialect::kV2, 1);
  test::Drained r = detectAndDrain(c);
  CAPTURE(describe(r.last));
  CHECK(r.commands.empty());
  REQUIRE(r.last.needMore());
  CHECK(r.last.need_at_least > c.request.size());
  // 01 | str "/nv" | str "x" | (desired length missing): needs >= 8 more bytes.
  CHECK(r.last.need_at_least >= c.request.size() + 8);
  CHECK(r.at_finish.failed());
  CHECK(r.at_finish.error.code == DecodeErrorCode::kTruncated);
}

TEST_CASE(
    "close 2.x C2 (GETNUMKEYS before VALIDATE) under detection: 0x07 is a 1.13 "
    "WATCH_KEY prefix") {
  const auto& c = test::closeNumber(Dialect::kV2, 2);
  test::Drained r = detectAndDrain(c);
  CAPTURE(describe(r.last));
  CHECK(r.commands.empty());
  REQUIRE(r.last.needMore());
  CHECK(r.last.need_at_least >= 9);  // code + key length
  CHECK(r.at_finish.failed());
  CHECK(r.at_finish.error.code == DecodeErrorCode::kTruncated);
}

TEST_CASE(
    "close 2.x C3 (PING before VALIDATE) under detection: 0x0d is an unknown "
    "1.13 command") {
  const auto& c = test::closeNumber(Dialect::kV2, 3);
  test::Drained r = detectAndDrain(c);
  CAPTURE(describe(r.last));
  CHECK(r.commands.empty());
  REQUIRE(r.last.failed());
  CHECK(r.last.error.code == DecodeErrorCode::kUnknownCommand);
  CHECK(r.last.error.command == 0x0d);
}

TEST_CASE(
    "close 2.x C4 (wrong magic) under detection: a 1.13 SET whose key length "
    "is >= 0x0712345678") {
  // 00 | 78 56 34 12 07 ..: the five known low bytes of the key length already
  // exceed any key limit; with the remaining three length bytes the SET is
  // certainly rejected as kKeyTooLong (whatever they are).
  const auto& c = test::closeNumber(Dialect::kV2, 4);
  test::Drained r = detectAndDrain(c);
  CAPTURE(describe(r.last));
  CHECK(r.commands.empty());
  // The decoder waits for the whole 8-byte length field (it does not reject
  // on the 5 low bytes alone), so at EOF this is a truncated request...
  REQUIRE(r.last.needMore());
  CHECK(r.last.need_at_least == 9);
  REQUIRE(r.at_finish.failed());
  CHECK(r.at_finish.error.code == DecodeErrorCode::kTruncated);
  // ...and with it (any high bytes) refuses the key length.
  for (const char* high : {"\x00\x00\x00", "\xff\xff\xff", "\x01\x00\x00"}) {
    RequestStream s{Limits{}};
    Request req;
    DecodeResult res = s.next(c.request + std::string(high, 3), req);
    CAPTURE(describe(res));
    REQUIRE(res.failed());
    CHECK(res.error.code == DecodeErrorCode::kKeyTooLong);
    CHECK(s.dialect() == std::optional<Dialect>(Dialect::kV113));
  }
}

TEST_CASE(
    "close 1.13 C6 (2.x handshake) under detection: a 2.x connection - "
    "VALIDATE then PING") {
  const auto& c = test::closeNumber(Dialect::kV113, 6);
  test::Drained r = detectAndDrain(c);
  CAPTURE(describe(r.last));
  REQUIRE(r.commands.size() == 2);
  CHECK(r.commands[0] == Command::kValidate);
  CHECK(r.commands[1] == Command::kPing);
  CHECK(r.consumed == c.request.size());
  CHECK(r.reencode_matches);
  CHECK(r.wire_matches);
  CHECK(r.at_finish.needMore());
}

}  // namespace
}  // namespace tcpstore::protocol
