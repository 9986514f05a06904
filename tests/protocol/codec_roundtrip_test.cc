// Round trips of every command in each dialect and of every reply shape,
// against an independent encoding written out here from the grammar in
// protocol/wire.h (not from the codec).
#include <doctest/doctest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "protocol/codec.h"
#include "tests/protocol/test_util.h"

namespace tcpstore::protocol {
namespace {

using test::describe;
using test::toHex;

const std::string kBin("\x00\x01\xff\x00", 4);
const std::string kBig(3000, 'v');
const std::string kSlashKey = "/key0";
const std::string kUtf8Key = "/k\xc3\xa9";
const std::string kEmpty;

// The grammar of protocol/wire.h, written out independently of codec.cc.
std::string grammarEncode(Dialect d, const Request& r) {
  std::string out;
  auto code = commandCode(d, r.command);
  REQUIRE(code.has_value());
  appendU8(out, *code);
  auto keys = [&](const std::vector<std::string_view>& ks) {
    appendU64(out, ks.size());
    for (auto k : ks) appendStr(out, k);
  };
  switch (r.command) {
    case Command::kValidate:
    case Command::kPing:
      appendU32(out, r.u32);
      break;
    case Command::kSet:
    case Command::kAppend:
    case Command::kQueuePush:
      appendStr(out, r.key);
      appendStr(out, r.value);
      break;
    case Command::kCompareSet:
      appendStr(out, r.key);
      appendStr(out, r.value);
      appendStr(out, r.desired);
      break;
    case Command::kGet:
    case Command::kDeleteKey:
    case Command::kWatchKey:
    case Command::kQueuePop:
    case Command::kQueueLen:
      appendStr(out, r.key);
      break;
    case Command::kAdd:
    case Command::kBarrier:
      appendStr(out, r.key);
      appendI64(out, r.number);
      break;
    case Command::kCheck:
    case Command::kWait:
    case Command::kMultiGet:
      keys(r.keys);
      break;
    case Command::kMultiSet:
      REQUIRE(r.keys.size() == r.values.size());
      appendI64(out, static_cast<std::int64_t>(r.keys.size()));
      for (std::size_t i = 0; i < r.keys.size(); ++i) {
        appendStr(out, r.keys[i]);
        appendStr(out, r.values[i]);
      }
      break;
    case Command::kGetNumKeys:
    case Command::kCancelWait:
    case Command::kListKeys:
      break;
  }
  return out;
}

// Representative requests for a command: ordinary, empty and binary fields,
// extreme numbers, zero and several keys.
std::vector<Request> samples(Command c) {
  std::vector<Request> out;
  auto make = [&](auto&& fill) {
    Request r;
    r.command = c;
    fill(r);
    out.push_back(r);
  };
  switch (c) {
    case Command::kValidate:
      make([](Request& r) { r.u32 = kValidateMagic; });
      break;
    case Command::kPing:
      make([](Request& r) { r.u32 = 4242; });
      make([](Request& r) { r.u32 = 0; });
      make([](Request& r) { r.u32 = 0xffffffffu; });
      break;
    case Command::kSet:
    case Command::kAppend:
    case Command::kQueuePush:
      make([](Request& r) {
        r.key = kSlashKey;
        r.value = "value0";
      });
      make([](Request& r) {
        r.key = kEmpty;
        r.value = kEmpty;
      });
      make([](Request& r) {
        r.key = kUtf8Key;
        r.value = kBin;
      });
      make([](Request& r) {
        r.key = kBin;
        r.value = kBig;
      });
      break;
    case Command::kCompareSet:
      make([](Request& r) {
        r.key = "/cas";
        r.value = "";
        r.desired = "new";
      });
      make([](Request& r) {
        r.key = "/cas";
        r.value = "new";
        r.desired = "newer";
      });
      make([](Request& r) {
        r.key = kBin;
        r.value = kBig;
        r.desired = kBin;
      });
      make([](Request& r) {
        r.key = kEmpty;
        r.value = kEmpty;
        r.desired = kEmpty;
      });
      break;
    case Command::kGet:
    case Command::kDeleteKey:
    case Command::kWatchKey:
    case Command::kQueuePop:
    case Command::kQueueLen:
      make([](Request& r) { r.key = kSlashKey; });
      make([](Request& r) { r.key = kEmpty; });
      make([](Request& r) { r.key = kBin; });
      break;
    case Command::kAdd:
    case Command::kBarrier:
      make([](Request& r) {
        r.key = "/cnt";
        r.number = 5;
      });
      make([](Request& r) {
        r.key = "/cnt";
        r.number = -2;
      });
      make([](Request& r) {
        r.key = kEmpty;
        r.number = 0;
      });
      make([](Request& r) {
        r.key = kBin;
        r.number = std::numeric_limits<std::int64_t>::min();
      });
      make([](Request& r) {
        r.key = "init/";
        r.number = std::numeric_limits<std::int64_t>::max();
      });
      break;
    case Command::kCheck:
    case Command::kWait:
    case Command::kMultiGet:
      make([](Request&) {});
      make([](Request& r) { r.keys = {kSlashKey}; });
      make([](Request& r) { r.keys = {"/cnt", kEmpty, kBin, kUtf8Key}; });
      break;
    case Command::kMultiSet:
      make([](Request&) {});
      make([](Request& r) {
        r.keys = {"/m1"};
        r.values = {"a"};
      });
      make([](Request& r) {
        r.keys = {"/m1", "/m2", kEmpty, kBin};
        r.values = {"a", kEmpty, kBig, kBin};
      });
      break;
    case Command::kGetNumKeys:
    case Command::kCancelWait:
    case Command::kListKeys:
      make([](Request&) {});
      break;
  }
  return out;
}

void roundTripDialect(Dialect d) {
  std::size_t commands_seen = 0;
  for (std::size_t i = 0; i < kCommandCount; ++i) {
    const auto c = static_cast<Command>(i);
    if (!commandCode(d, c)) continue;
    ++commands_seen;
    for (const Request& r : samples(c)) {
      CAPTURE(describe(r));
      const std::string expected = grammarEncode(d, r);
      std::string encoded = "prefix";
      REQUIRE(encodeRequest(d, r, encoded));
      CHECK(encoded.substr(0, 6) == "prefix");  // appends, keeps what was there
      CHECK(toHex(encoded.substr(6)) == toHex(expected));

      // Decode alone and followed by another request (decoder must stop at the
      // end).
      for (const std::string& input :
           {expected, expected + grammarEncode(d, samples(c).front())}) {
        Request back;
        back.keys.push_back("stale");  // decoder must reset reused state
        DecodeResult res = decodeRequest(input, d, Limits{}, back);
        CAPTURE(describe(res));
        REQUIRE(res.frame());
        CHECK(res.consumed == expected.size());
        CHECK(describe(back) == describe(r));
        CHECK(test::sameRequest(back, r));
        // Views point into the decoded buffer.
        if (!back.key.empty()) {
          CHECK(back.key.data() >= input.data());
          CHECK(back.key.data() + back.key.size() <=
                input.data() + input.size());
        }
      }
    }
  }
  // Every code of the dialect (vectors file) has a command we encode.
  CHECK(commands_seen == test::dialectJson(d).at("codes").size());
}

TEST_CASE(
    "round trip: every 1.13 command encodes to the grammar and decodes back") {
  roundTripDialect(Dialect::kV113);
}

TEST_CASE(
    "round trip: every 2.x command encodes to the grammar and decodes back") {
  roundTripDialect(Dialect::kV2);
}

TEST_CASE("command tables match the vectors file's codes - both directions") {
  for (Dialect d : {Dialect::kV113, Dialect::kV2}) {
    CAPTURE(dialectName(d));
    for (int b = 0; b < 256; ++b) {
      CAPTURE(b);
      const auto code = static_cast<std::uint8_t>(b);
      const auto expected = test::jsonCommandOfCode(d, code);
      const auto got = commandFromCode(d, code);
      REQUIRE(got.has_value() == expected.has_value());
      if (!got) continue;
      CHECK(*got == *expected);
      CHECK(commandCode(d, *got) == std::optional<std::uint8_t>(code));
    }
  }
  CHECK(dialectName(Dialect::kV113) == "1.13");
  CHECK(dialectName(Dialect::kV2) == "2.x");
}

TEST_CASE(
    "encodeRequest refuses a command the dialect lacks and appends nothing") {
  const std::vector<std::pair<Dialect, Command>> missing = {
      {Dialect::kV113, Command::kValidate},
      {Dialect::kV113, Command::kPing},
      {Dialect::kV113, Command::kAppend},
      {Dialect::kV113, Command::kMultiGet},
      {Dialect::kV113, Command::kMultiSet},
      {Dialect::kV113, Command::kCancelWait},
      {Dialect::kV113, Command::kQueuePush},
      {Dialect::kV113, Command::kQueuePop},
      {Dialect::kV113, Command::kQueueLen},
      {Dialect::kV113, Command::kListKeys},
      {Dialect::kV113, Command::kBarrier},
      {Dialect::kV2, Command::kWatchKey},
  };
  for (const auto& entry : missing) {
    const Dialect d = entry.first;
    const Command c = entry.second;
    CAPTURE(commandName(c));
    CHECK_FALSE(commandCode(d, c).has_value());
    Request r;
    r.command = c;
    std::string out = "x";
    CHECK_FALSE(encodeRequest(d, r, out));
    CHECK(out == "x");
  }
}

TEST_CASE("replyShapeOf follows the table in protocol/message.h") {
  const std::vector<std::pair<Command, ReplyShape>> table = {
      {Command::kValidate, ReplyShape::kNone},
      {Command::kSet, ReplyShape::kNone},
      {Command::kAppend, ReplyShape::kNone},
      {Command::kMultiSet, ReplyShape::kNone},
      {Command::kQueuePush, ReplyShape::kNone},
      {Command::kCheck, ReplyShape::kByte},
      {Command::kWait, ReplyShape::kByte},
      {Command::kCancelWait, ReplyShape::kByte},
      {Command::kBarrier, ReplyShape::kByte},
      {Command::kWatchKey, ReplyShape::kByte},
      {Command::kPing, ReplyShape::kU32},
      {Command::kAdd, ReplyShape::kInt64},
      {Command::kGetNumKeys, ReplyShape::kInt64},
      {Command::kDeleteKey, ReplyShape::kInt64},
      {Command::kQueueLen, ReplyShape::kInt64},
      {Command::kGet, ReplyShape::kString},
      {Command::kCompareSet, ReplyShape::kString},
      {Command::kMultiGet, ReplyShape::kStrings},
      {Command::kListKeys, ReplyShape::kCountedStrings},
      {Command::kQueuePop, ReplyShape::kQueuePop},
  };
  REQUIRE(table.size() == kCommandCount);
  for (const auto& entry : table) {
    const Command c = entry.first;
    const ReplyShape shape = entry.second;
    CAPTURE(commandName(c));
    CHECK(static_cast<int>(replyShapeOf(c)) == static_cast<int>(shape));
  }
}

// ---- replies ---------------------------------------------------------------

struct ReplySample {
  Reply reply;
  std::string wire;  // independent encoding
  std::uint64_t count = 0;
};

std::vector<ReplySample> replySamples() {
  std::vector<ReplySample> out;
  auto add = [&](auto&& fill) {
    ReplySample s;
    fill(s.reply, s.wire, s.count);
    out.push_back(std::move(s));
  };
  using R = Reply;
  using S = std::string;
  using N = std::uint64_t;
  add([](R& r, S&, N&) { r.shape = ReplyShape::kNone; });
  for (std::uint8_t b : {std::uint8_t{0}, std::uint8_t{1}, std::uint8_t{3}}) {
    add([b](R& r, S& w, N&) {
      r.shape = ReplyShape::kByte;
      r.byte = b;
      appendU8(w, b);
    });
  }
  for (std::uint32_t v : {0u, 4242u, 0xffffffffu}) {
    add([v](R& r, S& w, N&) {
      r.shape = ReplyShape::kU32;
      r.u32 = v;
      appendU32(w, v);
    });
  }
  for (std::int64_t v : {std::int64_t{0}, std::int64_t{-2}, std::int64_t{6},
                         std::numeric_limits<std::int64_t>::min(),
                         std::numeric_limits<std::int64_t>::max()}) {
    add([v](R& r, S& w, N&) {
      r.shape = ReplyShape::kInt64;
      r.number = v;
      appendI64(w, v);
    });
  }
  for (const std::string* v : {&kEmpty, &kBin, &kBig}) {
    add([v](R& r, S& w, N&) {
      r.shape = ReplyShape::kString;
      r.value = *v;
      appendStr(w, *v);
    });
  }
  add([](R& r, S&, N& n) {
    r.shape = ReplyShape::kStrings;
    n = 0;
  });
  add([](R& r, S& w, N& n) {
    r.shape = ReplyShape::kStrings;
    r.values = {"a", kEmpty, kBin, kBig};
    for (auto v : r.values) appendStr(w, v);
    n = 4;
  });
  add([](R& r, S& w, N&) {
    r.shape = ReplyShape::kCountedStrings;
    appendI64(w, 0);
  });
  add([](R& r, S& w, N&) {
    r.shape = ReplyShape::kCountedStrings;
    r.values = {"init/", "/m1", kEmpty};
    r.number = 3;
    appendI64(w, 3);
    for (auto v : r.values) appendStr(w, v);
  });
  add([](R& r, S& w, N&) {
    r.shape = ReplyShape::kQueuePop;
    r.number = 0;
    appendI64(w, 0);
  });
  add([](R& r, S& w, N&) {
    r.shape = ReplyShape::kQueuePop;
    r.number = 5;
    r.value = "job1";
    appendI64(w, 5);
    appendStr(w, "job1");
  });
  add([](R& r, S& w, N&) {
    r.shape = ReplyShape::kQueuePop;
    r.number = 1;
    r.value = kEmpty;
    appendI64(w, 1);
    appendStr(w, kEmpty);
  });
  for (auto ev :
       {WatchEvent::kUpdated, WatchEvent::kCreated, WatchEvent::kDeleted}) {
    add([ev](R& r, S& w, N&) {
      r.shape = ReplyShape::kWatchNotification;
      r.byte = static_cast<std::uint8_t>(ev);
      r.value = "/wk";
      r.old_value = ev == WatchEvent::kCreated ? std::string_view() : "a";
      r.new_value = ev == WatchEvent::kDeleted ? std::string_view() : kBin;
      appendU8(w, r.byte);
      appendStr(w, r.value);
      appendStr(w, r.old_value);
      appendStr(w, r.new_value);
    });
  }
  return out;
}

bool sameReply(const Reply& a, const Reply& b) {
  return a.shape == b.shape && a.byte == b.byte && a.u32 == b.u32 &&
         a.number == b.number && a.value == b.value &&
         a.old_value == b.old_value && a.new_value == b.new_value &&
         a.values == b.values;
}

TEST_CASE(
    "round trip: every reply shape encodes to the grammar and decodes back") {
  const auto all = replySamples();
  std::vector<bool> shape_seen(9, false);
  for (const ReplySample& s : all) {
    CAPTURE(describe(s.reply));
    shape_seen[static_cast<std::size_t>(s.reply.shape)] = true;
    std::string encoded = "p";
    encodeReply(s.reply, encoded);
    CHECK(toHex(encoded) == toHex("p" + s.wire));

    const std::string trailing = s.wire + std::string("\x07\x07\x07", 3);
    for (const std::string& input : {s.wire, trailing}) {
      Reply back;
      back.values.push_back("stale");
      DecodeResult res =
          decodeReply(input, s.reply.shape, Limits{}, back, s.count);
      CAPTURE(describe(res));
      REQUIRE(res.frame());
      CHECK(res.consumed == s.wire.size());
      back.shape = s.reply.shape;  // the decoder may or may not set it
      CHECK(describe(back) == describe(s.reply));
      CHECK(sameReply(back, s.reply));
    }
  }
  for (std::size_t i = 0; i < shape_seen.size(); ++i) {
    CAPTURE(i);
    CHECK(shape_seen[i]);
  }
}

}  // namespace
}  // namespace tcpstore::protocol
