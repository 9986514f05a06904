// The relay's pure pieces: the upstream address parser and the reply
// tracker that follows a channel's reply stream (store/relay/).
#include <doctest/doctest.h>

#include <string>
#include <utility>
#include <vector>

#include "protocol/codec.h"
#include "store/relay/relay_options.h"
#include "store/relay/reply_tracker.h"

namespace {

using tcpstore::protocol::Command;
using tcpstore::store::relay::ReplyTracker;

std::string str(std::string_view s) {
  std::string out;
  tcpstore::protocol::appendStr(out, s);
  return out;
}
std::string i64(std::int64_t v) {
  std::string out;
  tcpstore::protocol::appendI64(out, v);
  return out;
}

// Feeds `bytes` in pieces of `step` and returns the tags completed.
std::vector<std::uint64_t> feedAll(ReplyTracker& t, const std::string& bytes,
                                   std::size_t step, bool* ok = nullptr) {
  std::vector<std::uint64_t> tags;
  bool good = true;
  for (std::size_t i = 0; i < bytes.size(); i += step) {
    good =
        t.feed(std::string_view(bytes).substr(i, step),
               [&](const ReplyTracker::Done& d) { tags.push_back(d.tag); }) &&
        good;
  }
  if (ok != nullptr) *ok = good;
  return tags;
}

}  // namespace

TEST_CASE("parseUpstream: host:port, [v6]:port, and clear errors") {
  tcpstore::store::relay::RelayOptions o;
  CHECK(tcpstore::store::relay::parseUpstream("127.0.0.1:29500", o).isOk());
  CHECK(o.host == "127.0.0.1");
  CHECK(o.port == 29500);
  CHECK(tcpstore::store::relay::parseUpstream("[::1]:7", o).isOk());
  CHECK(o.host == "::1");
  CHECK(o.port == 7);
  CHECK(tcpstore::store::relay::parseUpstream("store.example:1", o).isOk());
  for (const char* bad : {"", "host", "host:", ":29500", "host:0", "host:65536",
                          "host:12x", "::1:29500", "[::1]29500"}) {
    CAPTURE(bad);
    const auto st = tcpstore::store::relay::parseUpstream(bad, o);
    CHECK(st.code() == tcpstore::StatusCode::kInvalidArgument);
  }
}

TEST_CASE("ReplyTracker: replies in order, whole or byte by byte") {
  const std::string stream = i64(7) + str("value") + std::string(1, '\0') +
                             str("a") + str("") + i64(2) + str("k1") +
                             str("k2");
  for (std::size_t step : {std::size_t{1}, std::size_t{3}, stream.size()}) {
    CAPTURE(step);
    ReplyTracker t{tcpstore::protocol::Limits{}};
    t.expect(Command::kAdd, 0, 1);
    t.expect(Command::kSet, 0, 0);  // no reply
    t.expect(Command::kGet, 0, 2);
    t.expect(Command::kCheck, 1, 3);
    t.expect(Command::kMultiGet, 2, 4);
    t.expect(Command::kListKeys, 0, 5);
    CHECK(t.outstanding() == 5);
    CHECK_FALSE(t.idle());
    const auto tags = feedAll(t, stream, step);
    CHECK(tags == std::vector<std::uint64_t>{1, 2, 3, 4, 5});
    CHECK(t.outstanding() == 0);
    CHECK(t.idle());
  }
}

TEST_CASE("ReplyTracker: a reply-less request settles only at a later reply") {
  ReplyTracker t{tcpstore::protocol::Limits{}};
  CHECK(t.idle());
  t.expect(Command::kSet, 0, 0);
  CHECK_FALSE(t.idle());               // applied upstream? not known yet
  t.expect(Command::kMultiGet, 0, 0);  // no keys: no reply either
  CHECK_FALSE(t.idle());
  t.expect(Command::kGet, 0, 9);
  CHECK(feedAll(t, str("v"), 1) == std::vector<std::uint64_t>{9});
  CHECK(t.idle());
}

TEST_CASE("ReplyTracker: WAIT then CANCEL_WAIT is 01 or 00 01") {
  for (const std::string& bytes :
       {std::string("\x01", 1), std::string("\x00\x01", 2)}) {
    ReplyTracker t{tcpstore::protocol::Limits{}};
    t.expect(Command::kWait, 1, 0);
    t.expect(Command::kCancelWait, 0, 4);
    CHECK(t.outstanding() == 1);
    CHECK(feedAll(t, bytes + i64(3), 1).size() == 1);
    CHECK(t.lost());  // the ADD-less extra bytes were not expected
  }
  ReplyTracker t{tcpstore::protocol::Limits{}};
  t.expect(Command::kWait, 1, 0);
  t.expect(Command::kCancelWait, 0, 0);
  t.expect(Command::kAdd, 0, 8);
  CHECK(feedAll(t, std::string("\x00\x01", 2) + i64(5), 2) ==
        std::vector<std::uint64_t>{0, 8});
  CHECK(t.idle());
  // A cancel with no WAIT owed: one byte.
  t.expect(Command::kCancelWait, 0, 6);
  CHECK(feedAll(t, std::string("\x01", 1), 1) == std::vector<std::uint64_t>{6});
}

TEST_CASE("ReplyTracker: WAIT and BARRIER bytes are counted apart") {
  ReplyTracker t{tcpstore::protocol::Limits{}};
  t.expect(Command::kGet, 0, 1);
  t.expect(Command::kWait, 1, 2);
  t.expect(Command::kBarrier, 0, 3);
  t.expect(Command::kCancelWait, 0, 4);  // joins the BARRIER's byte
  t.expect(Command::kAdd, 0, 5);
  CHECK(t.outstanding() == 4);
  CHECK(t.waitsOutstanding() == 2);
  CHECK(feedAll(t, str("v") + std::string("\x00", 1), 1) ==
        std::vector<std::uint64_t>{1, 2});
  CHECK(t.waitsOutstanding() == 1);
  CHECK(feedAll(t, std::string("\x01", 1) + i64(1), 1) ==
        std::vector<std::uint64_t>{4, 5});
  CHECK(t.outstanding() == 0);
  CHECK(t.waitsOutstanding() == 0);
  // A lone CANCEL_WAIT's byte comes at once: not a wait.
  t.expect(Command::kCancelWait, 0, 6);
  CHECK(t.waitsOutstanding() == 0);
  t.expect(Command::kWait, 1, 7);
  t.markLost();
  CHECK(t.waitsOutstanding() == 0);
}

TEST_CASE(
    "ReplyTracker: replies of a fixed size count their bytes, the others "
    "are counted and reported sized") {
  ReplyTracker t{tcpstore::protocol::Limits{}};
  t.expect(Command::kPing, 0, 1);      // 4 bytes
  t.expect(Command::kMultiGet, 2, 2);  // sized
  t.expect(Command::kAdd, 0, 3);       // 8 bytes
  t.expect(Command::kWait, 1, 4);      // a wait: neither
  t.expect(Command::kCheck, 1, 5);     // 1 byte
  t.expect(Command::kGet, 0, 6);       // sized
  t.expect(Command::kSet, 0, 0);       // no reply: nothing
  CHECK(t.fixedBytesOutstanding() == 13);
  CHECK(t.sizedOutstanding() == 2);
  CHECK(t.waitsOutstanding() == 1);
  std::vector<std::pair<std::uint64_t, bool>> done;
  const auto note = [&](const ReplyTracker::Done& d) {
    done.emplace_back(d.tag, d.sized);
  };
  std::string ping;
  tcpstore::protocol::appendU32(ping, 7);
  CHECK(t.feed(ping + str("a") + str("bc") + i64(2), note));
  CHECK(done == std::vector<std::pair<std::uint64_t, bool>>{
                    {1, false}, {2, true}, {3, false}});
  CHECK(t.fixedBytesOutstanding() == 1);
  CHECK(t.sizedOutstanding() == 1);
  done.clear();
  CHECK(t.feed(std::string("\x00\x01", 2) + str("v"), note));
  CHECK(done == std::vector<std::pair<std::uint64_t, bool>>{
                    {4, false}, {5, false}, {6, true}});
  CHECK(t.fixedBytesOutstanding() == 0);
  CHECK(t.sizedOutstanding() == 0);
  CHECK(t.waitsOutstanding() == 0);
  t.expect(Command::kGet, 0, 7);
  t.expect(Command::kPing, 0, 8);
  t.markLost();
  CHECK(t.fixedBytesOutstanding() == 0);
  CHECK(t.sizedOutstanding() == 0);
}

TEST_CASE("ReplyTracker: WATCH_KEY, bad bytes and surplus bytes make it lost") {
  ReplyTracker a{tcpstore::protocol::Limits{}};
  a.expect(Command::kWatchKey, 0, 0);
  CHECK(a.lost());
  CHECK_FALSE(a.idle());
  a.expect(Command::kGet, 0, 0);  // ignored once lost
  bool ok = true;
  feedAll(a, str("x"), 1, &ok);
  CHECK_FALSE(ok);

  ReplyTracker b{tcpstore::protocol::Limits{}};
  b.expect(Command::kGet, 0, 0);
  feedAll(b, str("x") + "!", 9, &ok);  // a byte nobody asked for
  CHECK_FALSE(ok);
  CHECK(b.lost());

  tcpstore::protocol::Limits small;
  small.max_value_bytes = 4;
  ReplyTracker c{small};
  c.expect(Command::kGet, 0, 0);
  feedAll(c, str("too long"), 1, &ok);
  CHECK_FALSE(ok);
  CHECK(c.lost());
}
