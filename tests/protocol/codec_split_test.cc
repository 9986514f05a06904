// Every vector (request and reply) cut at every offset, and whole streams fed
// one byte at a time through RequestStream: the decoders must wait (kNeedMore)
// on every strict prefix without ever asking for bytes past the message end,
// ask for monotonically more, and decode exactly one frame from the whole.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "protocol/codec.h"
#include "tests/protocol/test_util.h"

namespace tcpstore::protocol {
namespace {

using test::describe;
using test::toHex;

// Checks the prefix contract of one message through `decode(prefix)`.
template <typename Decode>
void checkPrefixes(const std::string& whole, Decode&& decode) {
  std::size_t last_need = 0;
  for (std::size_t k = 0; k < whole.size(); ++k) {
    CAPTURE(k);
    DecodeResult res = decode(std::string_view(whole).substr(0, k));
    CAPTURE(describe(res));
    REQUIRE(res.needMore());
    CHECK(res.need_at_least > k);
    CHECK(res.need_at_least <= whole.size());
    CHECK(res.need_at_least >= last_need);
    last_need = res.need_at_least;
  }
  DecodeResult res = decode(whole);
  CAPTURE(describe(res));
  REQUIRE(res.frame());
  CHECK(res.consumed == whole.size());
}

TEST_CASE(
    "split: every vector request cut at every offset waits - then decodes "
    "once") {
  std::size_t n = 0;
  for (Dialect d : {Dialect::kV113, Dialect::kV2}) {
    for (const auto& v : test::loadVectors(d)) {
      if (v.request.empty()) continue;
      CAPTURE(v.op);
      ++n;
      checkPrefixes(v.request, [&](std::string_view in) {
        Request req;
        return decodeRequest(in, d, Limits{}, req);
      });
      // The same through a forced, validated stream (the stream adds nothing
      // for a request after the handshake; a VALIDATE there is an error).
      Request first;
      REQUIRE(decodeRequest(v.request, d, Limits{}, first).frame());
      if (first.command == Command::kValidate) continue;
      checkPrefixes(v.request, [&](std::string_view in) {
        RequestStream s(Limits{}, d, true);
        Request req;
        return s.next(in, req);
      });
    }
  }
  CHECK(n > 40);
}

TEST_CASE(
    "split: every vector reply cut at every offset waits - then decodes once") {
  std::size_t n = 0;
  for (Dialect d : {Dialect::kV113, Dialect::kV2}) {
    for (const auto& v : test::loadVectors(d)) {
      if (v.reply.empty()) continue;
      CAPTURE(v.op);
      ReplyShape shape = ReplyShape::kWatchNotification;
      std::uint64_t count = 0;
      if (!v.request.empty()) {
        Request req;
        REQUIRE(decodeRequest(v.request, d, Limits{}, req).frame());
        shape = replyShapeOf(req.command);
        // MULTI_GET: one string per key; the partial reply of the
        // missing-key vector holds exactly one.
        if (req.command == Command::kMultiGet) {
          count =
              v.op.find("missing") != std::string::npos ? 1 : req.keys.size();
        }
      }
      ++n;
      checkPrefixes(v.reply, [&](std::string_view in) {
        Reply reply;
        return decodeReply(in, shape, Limits{}, reply, count);
      });
    }
  }
  CHECK(n > 40);
}

struct Expected {
  Command command;
  std::size_t size;
};

// Feeds `stream` one byte at a time the way a server would (calling next()
// only once need_at_least bytes are there) and checks every frame against
// `expected`.
void feedByteByByte(RequestStream& stream, const std::string& bytes,
                    const std::vector<Expected>& expected) {
  std::string buf;
  std::size_t pos = 0;        // start of the unconsumed bytes in buf
  std::size_t need = 1;       // bytes (from pos) before next() is worth calling
  std::size_t frame = 0;      // index into expected
  std::size_t last_need = 0;  // need_at_least seen within the current message
  std::size_t calls = 0;
  for (char c : bytes) {
    buf.push_back(c);
    while (buf.size() - pos >= need) {
      ++calls;
      Request req;
      DecodeResult res = stream.next(std::string_view(buf).substr(pos), req);
      CAPTURE(frame);
      CAPTURE(describe(res));
      REQUIRE(frame < expected.size());
      if (res.needMore()) {
        REQUIRE(res.need_at_least > buf.size() - pos);
        CHECK(res.need_at_least <=
              expected[frame].size);  // never past the message end
        CHECK(res.need_at_least >= last_need);
        last_need = need = res.need_at_least;
        break;
      }
      REQUIRE(res.frame());
      CHECK(req.command == expected[frame].command);
      CHECK(res.consumed == expected[frame].size);
      std::string again;
      REQUIRE(stream.dialect().has_value());
      REQUIRE(encodeRequest(*stream.dialect(), req, again));
      CHECK(toHex(again) ==
            toHex(std::string_view(buf).substr(pos, res.consumed)));
      pos += res.consumed;
      ++frame;
      need = 1;
      last_need = 0;
    }
  }
  CHECK(frame == expected.size());
  CHECK(pos == bytes.size());
  CHECK(stream.finish(std::string_view(buf).substr(pos)).needMore());
  MESSAGE("next() calls: " << calls << " for " << bytes.size() << " bytes");
}

// All of a dialect's vector requests as one stream; 2.x starts with
// VALIDATE + PING (vectors 1 and 2) and has no further VALIDATE.
void buildStream(Dialect d, std::string& bytes,
                 std::vector<Expected>& expected) {
  for (const auto& v : test::loadVectors(d)) {
    if (v.request.empty()) continue;
    auto c =
        test::jsonCommandOfCode(d, static_cast<std::uint8_t>(v.request[0]));
    REQUIRE(c.has_value());
    if (*c == Command::kValidate && !bytes.empty()) continue;
    bytes += v.request;
    expected.push_back({*c, v.request.size()});
  }
  if (d == Dialect::kV2) {
    REQUIRE(expected.size() > 2);
    REQUIRE(expected[0].command == Command::kValidate);
    REQUIRE(expected[1].command == Command::kPing);
  }
}

TEST_CASE(
    "split: a 2.x stream (VALIDATE+PING then every vector) one byte at a time "
    "- detected") {
  std::string bytes;
  std::vector<Expected> expected;
  buildStream(Dialect::kV2, bytes, expected);
  RequestStream s{Limits{}};
  feedByteByByte(s, bytes, expected);
  CHECK(s.dialect() == std::optional<Dialect>(Dialect::kV2));
  CHECK(s.validated());
}

TEST_CASE("split: a 2.x stream one byte at a time on a stream pinned to 2.x") {
  std::string bytes;
  std::vector<Expected> expected;
  buildStream(Dialect::kV2, bytes, expected);
  RequestStream s(Limits{}, Dialect::kV2, false);
  feedByteByByte(s, bytes, expected);
  CHECK(s.validated());
}

TEST_CASE("split: a 1.13 stream (every vector) one byte at a time - detected") {
  std::string bytes;
  std::vector<Expected> expected;
  buildStream(Dialect::kV113, bytes, expected);
  REQUIRE(bytes[0] == '\0');  // starts with SET: detection must look past 00
  RequestStream s{Limits{}};
  feedByteByByte(s, bytes, expected);
  CHECK(s.dialect() == std::optional<Dialect>(Dialect::kV113));
}

TEST_CASE(
    "split: a 100 kB SET arriving byte by byte needs a handful of next() calls "
    "(no re-parse per byte)") {
  for (Dialect d : {Dialect::kV113, Dialect::kV2}) {
    Request set;
    set.command = Command::kSet;
    const std::string value(100000, 'x');
    set.key = "/big";
    set.value = value;
    std::string bytes;
    REQUIRE(encodeRequest(d, set, bytes));
    RequestStream s(Limits{}, d, true);
    std::size_t need = 1;
    std::size_t calls = 0;
    bool done = false;
    for (std::size_t have = 1; have <= bytes.size() && !done; ++have) {
      if (have < need) continue;
      ++calls;
      Request req;
      DecodeResult res = s.next(std::string_view(bytes).substr(0, have), req);
      if (res.frame()) {
        CHECK(res.consumed == bytes.size());
        CHECK(req.value.size() == value.size());
        done = true;
      } else {
        REQUIRE(res.needMore());
        need = res.need_at_least;
      }
    }
    CHECK(done);
    // code, key length, key, value length, value: one call each at most.
    CHECK(calls <= 6);
  }
}

TEST_CASE(
    "split: whole streams in one buffer (pipelined) decode to the same "
    "frames") {
  for (Dialect d : {Dialect::kV113, Dialect::kV2}) {
    std::string bytes;
    std::vector<Expected> expected;
    buildStream(d, bytes, expected);
    RequestStream s{Limits{}};
    test::Drained r = test::drain(s, bytes);
    CAPTURE(describe(r.last));
    REQUIRE(r.commands.size() == expected.size());
    for (std::size_t i = 0; i < expected.size(); ++i) {
      CHECK(r.commands[i] == expected[i].command);
      CHECK(r.sizes[i] == expected[i].size);
    }
    CHECK(r.consumed == bytes.size());
    CHECK(r.reencode_matches);
    CHECK(r.wire_matches);
    CHECK(r.last.needMore());
    CHECK(r.at_finish.needMore());
  }
}

}  // namespace
}  // namespace tcpstore::protocol
