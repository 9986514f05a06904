// Loopback tests of the server side of the relay extension (protocol/mux.h,
// docs/relay.md): a raw byte-level mux client (independent of the relay)
// against an in-process server. Channels must behave exactly like plain
// connections (same reply bytes, own waits and order, own errors), frame
// rule breaches must close the whole mux connection, and torch-style
// clients must not notice any of it.
#include "protocol/mux.h"

#include <doctest/doctest.h>
#include <uv.h>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "protocol/codec.h"
#include "protocol/requests.h"
#include "store/memory_backend.h"
#include "store/server/options.h"
#include "store/server/start.h"
#include "tcpstore/server.h"
#include "tests/server/raw_client.h"
#include "tests/support/scoped_server.h"

namespace {

using namespace tcpstore::test;
namespace mux = tcpstore::protocol::mux;
namespace rq = tcpstore::protocol::requests;
using tcpstore::protocol::Dialect;
using tcpstore::protocol::Request;
using FT = mux::FrameType;
using std::chrono::milliseconds;

std::string frame(FT t, std::uint32_t ch, std::string_view payload) {
  std::string s;
  mux::appendFrame(s, t, ch, payload);
  return s;
}
std::string openFrame(std::uint32_t ch, Dialect d) {
  return frame(FT::kOpen, ch, byte(static_cast<std::uint8_t>(d)));
}
std::string encode(Dialect d, const Request& r) {
  std::string s;
  REQUIRE(tcpstore::protocol::encodeRequest(d, r, s));
  return s;
}

// A relay's side of one mux connection, byte by byte.
class MuxClient {
 public:
  // recv_buffer > 0: the socket's receive buffer (RawConn::connect).
  explicit MuxClient(std::uint16_t port, int recv_buffer = 0) {
    c_ = RawConn::connect(port, "127.0.0.1", recv_buffer);
    REQUIRE(c_.ok());
    REQUIRE(c_.send(mux::kMuxPreamble));
    REQUIRE(c_.recv(8) == std::string(mux::kMuxPreamble));
  }
  RawConn& raw() { return c_; }
  bool send(std::string_view bytes) { return c_.send(bytes); }
  bool open(std::uint32_t ch, Dialect d) {
    dialect_[ch] = d;
    return send(openFrame(ch, d));
  }
  bool request(std::uint32_t ch, std::string_view bytes) {
    return send(frame(FT::kRequest, ch, bytes));
  }
  bool request(std::uint32_t ch, const Request& r) {
    return request(ch, encode(dialect_.at(ch), r));
  }
  bool close(std::uint32_t ch) { return send(frame(FT::kClose, ch, "")); }
  // For channels opened by frames sent with send().
  void setDialect(std::uint32_t ch, Dialect d) { dialect_[ch] = d; }

  // The next `n` DATA bytes of channel `ch` (fewer if the deadline passes or
  // the connection ends first).
  std::string data(std::uint32_t ch, std::size_t n,
                   milliseconds timeout = scaled(std::chrono::seconds(5))) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    while (data_[ch].size() < n && readFrame(end)) {
    }
    std::string out = data_[ch].substr(0, n);
    data_[ch].erase(0, out.size());
    return out;
  }
  // DATA of `ch` up to and including `suffix` (a fence's reply).
  std::string dataUntil(std::uint32_t ch, std::string_view suffix) {
    const auto end =
        std::chrono::steady_clock::now() + scaled(std::chrono::seconds(5));
    for (;;) {
      std::string& d = data_[ch];
      if (d.size() >= suffix.size() &&
          d.compare(d.size() - suffix.size(), suffix.size(), suffix) == 0) {
        std::string out;
        out.swap(d);
        return out;
      }
      if (!readFrame(end)) return "<deadline: " + toHex(d) + ">";
    }
  }
  // The reason of `ch`'s CLOSED, or nullopt if none came before the deadline.
  std::optional<std::string> closed(std::uint32_t ch) {
    const auto end =
        std::chrono::steady_clock::now() + scaled(std::chrono::seconds(5));
    while (closed_.count(ch) == 0 && readFrame(end)) {
    }
    auto it = closed_.find(ch);
    if (it == closed_.end()) return std::nullopt;
    return it->second;
  }
  bool sawClosed(std::uint32_t ch) const { return closed_.count(ch) != 0; }
  std::size_t closedCount() const { return closed_.size(); }
  // DATA frames received for `ch` so far.
  int frames(std::uint32_t ch) { return frames_[ch]; }
  // Unread DATA bytes of `ch`.
  std::size_t buffered(std::uint32_t ch) { return data_[ch].size(); }
  // A round trip on `ch`: everything the server sent `ch` before reading
  // the fence is in buffered(ch) afterwards.
  bool fence(std::uint32_t ch) {
    if (dialect_.at(ch) == Dialect::kV2) {
      constexpr std::uint32_t kNonce = 0xC0DEFE4Cu;
      std::string before = data_[ch];
      data_[ch].clear();
      if (!request(ch, rq::ping(kNonce))) return false;
      std::string got = dataUntil(ch, u32le(kNonce));
      data_[ch] = before + got.substr(0, got.size() - 4);
      return got.size() >= 4;
    }
    std::string before = data_[ch];
    data_[ch].clear();
    if (!request(ch, rq::numKeys())) return false;
    std::string got = data(ch, 8);
    data_[ch] = before;
    return got.size() == 8;
  }
  // Reads until the server closes the connection; true if it did.
  bool waitConnClosed() {
    std::string rest;
    return c_.waitClosed(&rest);
  }

 private:
  bool readFrame(std::chrono::steady_clock::time_point end) {
    auto left = [&] {
      auto l = std::chrono::duration_cast<milliseconds>(
          end - std::chrono::steady_clock::now());
      return l.count() > 0 ? l : milliseconds(0);
    };
    std::string head = c_.recv(mux::kFrameHeaderBytes, left());
    if (head.size() < mux::kFrameHeaderBytes) return false;
    const auto type = static_cast<FT>(head[0]);
    const auto ch = static_cast<std::uint32_t>(loadU64le(head + "\0\0\0\0", 1));
    const auto len = static_cast<std::uint32_t>(
        loadU64le(head.substr(5) + std::string(4, '\0')));
    std::string payload = c_.recv(len, left());
    if (payload.size() < len) return false;
    if (type == FT::kData) {
      data_[ch] += payload;
      ++frames_[ch];
    } else if (type == FT::kClosed) {
      closed_[ch] = payload;
    } else {
      FAIL("unexpected frame type " << static_cast<int>(head[0]));
    }
    return true;
  }

  RawConn c_;
  std::map<std::uint32_t, Dialect> dialect_;
  std::map<std::uint32_t, std::string> data_;
  std::map<std::uint32_t, std::string> closed_;
  std::map<std::uint32_t, int> frames_;
};

// The reply bytes of `script` on a plain connection of a fresh server.
std::string plainReplies(Dialect d, const std::vector<Request>& script,
                         std::string_view fence_reply) {
  auto s = ScopedServer::local();
  RawConn c = RawConn::connect(s->port());
  REQUIRE(c.ok());
  if (d == Dialect::kV2) REQUIRE(c.send(encode(d, rq::validate())));
  std::string all;
  for (const Request& r : script) all += encode(d, r);
  REQUIRE(c.send(all));
  std::string got;
  while (got.size() < fence_reply.size() ||
         got.compare(got.size() - fence_reply.size(), fence_reply.size(),
                     fence_reply) != 0) {
    std::string b = c.recv(1, milliseconds(5000));
    if (b.empty()) return "<deadline: " + toHex(got) + ">";
    got += b;
  }
  return got;
}

}  // namespace

TEST_CASE("mux: the preamble is echoed and counted") {
  auto s = ScopedServer::local();
  MuxClient m(s->port());
  CHECK(m.open(1, Dialect::kV2));
  CHECK(m.request(1, rq::set("/k", "v")));
  CHECK(m.request(1, rq::get("/k")));
  CHECK(m.data(1, 9) == u64le(1) + "v");
  auto c = s->counters();
  CHECK(c.mux_connections == 1);
  CHECK(c.mux_channels_opened == 1);
  CHECK(c.mux_channels_open == 1);
  CHECK(c.requests_total == 2);
  CHECK(c.requests[static_cast<int>(tcpstore::protocol::Command::kSet)] == 1);
  CHECK(c.connections_v2 == 0);  // the mux connection itself has no dialect
  CHECK(s->countersLine().find("mux conns=1 channels opened=1") !=
        std::string::npos);
}

TEST_CASE("mux: channels of both dialects reply exactly like plain ones") {
  const std::string fence_value = "FENCE-5a17c3";
  const std::string fence_reply = u64le(fence_value.size()) + fence_value;
  std::vector<std::string> an = {"/a", "/n"};
  std::vector<std::string> absent = {"/zz"};
  std::vector<std::string> ms_keys = {"/m1", "/m2"};
  std::vector<std::string> ms_vals = {"x", ""};
  std::vector<std::string> mg_keys = {"/m1", "/a", "/m2"};
  std::vector<std::string> watch_w = {"/w"};
  const std::vector<Request> v113 = {
      rq::set("/fence", fence_value),
      rq::set("/a", "one"),
      rq::get("/a"),
      rq::add("/n", 5),
      rq::add("/n", -2),
      rq::check(an),
      rq::check(absent),
      rq::compareSet("/a", "one", "two"),
      rq::compareSet("/a", "nope", "three"),
      rq::wait(an),
      rq::numKeys(),
      rq::deleteKey("/n"),
      rq::deleteKey("/n"),
      rq::keyed(tcpstore::protocol::Command::kWatchKey, "/w"),
      rq::set("/w", "watched"),
      rq::deleteKey("/w"),
      rq::get("/fence"),
  };
  const std::vector<Request> v2 = {
      rq::set("/fence", fence_value),
      rq::set("/a", "one"),
      rq::get("/a"),
      rq::add("/n", 5),
      rq::add("/n", -2),
      rq::check(an),
      rq::check(absent),
      rq::multiSet(ms_keys, ms_vals),
      rq::multiGet(mg_keys),
      rq::append("/a", "+"),
      rq::compareSet("/a", "one+", "two"),
      rq::wait(an),
      rq::ping(99),
      rq::numKeys(),
      rq::queuePush("/q", "item"),
      rq::queueLen("/q"),
      rq::queuePop("/q"),
      rq::listKeys(),
      rq::deleteKey("/n"),
      rq::get("/fence"),
  };
  for (Dialect d : {Dialect::kV113, Dialect::kV2}) {
    CAPTURE(tcpstore::protocol::dialectName(d));
    const auto& script = d == Dialect::kV2 ? v2 : v113;
    const std::string want = plainReplies(d, script, fence_reply);
    // Spot checks, so that a bug shared by both paths is caught too.
    CHECK(want.substr(0, 11) == u64le(3) + "one");
    CHECK(want.substr(11, 16) == i64le(5) + i64le(3));

    auto s = ScopedServer::local();
    MuxClient m(s->port());
    // Channel 1 is opened and closed first: ids need not be dense.
    REQUIRE(m.open(1, d));
    REQUIRE(m.close(1));
    REQUIRE(m.open(7, d));
    std::string all;
    for (const Request& r : script) REQUIRE(m.request(7, r));
    CHECK(toHex(m.dataUntil(7, fence_reply)) == toHex(want));
    CHECK(!m.sawClosed(7));
  }
}

TEST_CASE("mux: a WAIT holds its channel, not the connection") {
  auto s = ScopedServer::local();
  MuxClient m(s->port());
  for (std::uint32_t ch : {1u, 2u, 3u}) REQUIRE(m.open(ch, Dialect::kV2));
  std::vector<std::string> k = {"/late"};
  REQUIRE(m.request(1, rq::wait(k)));
  REQUIRE(m.fence(3));  // the WAIT is registered (requests are in order)
  for (int i = 0; i < 20; ++i) {
    REQUIRE(m.request(3, rq::add("/counter", 1)));
    CHECK(m.data(3, 8) == i64le(i + 1));
  }
  CHECK(m.buffered(1) == 0);
  REQUIRE(m.request(2, rq::set("/late", "now")));
  CHECK(m.data(1, 1) == byte(0x00));  // STOP_WAITING
  REQUIRE(m.request(1, rq::get("/counter")));
  CHECK(m.data(1, 10) == u64le(2) + "20");
  CHECK(!m.sawClosed(1));
}

TEST_CASE("mux: plain connections and channels share keys and wake waits") {
  auto s = ScopedServer::local();
  MuxClient m(s->port());
  REQUIRE(m.open(1, Dialect::kV2));
  REQUIRE(m.open(2, Dialect::kV113));
  RawConn p2 = RawConn::connect(s->port());
  REQUIRE(p2.handshake());
  RawConn p113 = RawConn::connect(s->port());
  REQUIRE(p113.ok());

  std::vector<std::string> from_plain = {"/from-plain"};
  std::vector<std::string> from_chan = {"/from-channel"};
  // Channels wait for a plain connection's SET.
  REQUIRE(m.request(1, rq::wait(from_plain)));
  REQUIRE(m.request(2, rq::wait(from_plain)));
  REQUIRE(m.fence(1));
  REQUIRE(m.fence(2));
  // Plain connections wait for a channel's SET.
  REQUIRE(p2.send(encode(Dialect::kV2, rq::wait(from_chan))));
  REQUIRE(p113.send(encode(Dialect::kV113, rq::wait(from_chan))));
  REQUIRE(pingFence(p2));
  REQUIRE(checkFence(p113));

  REQUIRE(p2.send(encode(Dialect::kV2, rq::set("/from-plain", "p"))));
  CHECK(m.data(1, 1) == byte(0x00));
  CHECK(m.data(2, 1) == byte(0x00));
  REQUIRE(m.request(2, rq::set("/from-channel", "c")));
  CHECK(p2.recv(1) == byte(0x00));
  CHECK(p113.recv(1) == byte(0x00));
  // Each sees the other's values.
  REQUIRE(m.request(1, rq::get("/from-plain")));
  CHECK(m.data(1, 9) == u64le(1) + "p");
  REQUIRE(p113.send(encode(Dialect::kV113, rq::get("/from-channel"))));
  CHECK(p113.recv(9) == u64le(1) + "c");
  REQUIRE(p2.send(encode(Dialect::kV2, rq::add("/sum", 3))));
  CHECK(p2.recv(8) == i64le(3));
  REQUIRE(m.request(2, rq::add("/sum", 4)));
  CHECK(m.data(2, 8) == i64le(7));
}

TEST_CASE("mux: a bad request closes only its channel") {
  auto s = ScopedServer::local();
  MuxClient m(s->port());
  REQUIRE(m.open(1, Dialect::kV2));
  REQUIRE(m.open(2, Dialect::kV2));
  REQUIRE(m.open(3, Dialect::kV113));
  REQUIRE(m.open(4, Dialect::kV2));
  REQUIRE(m.open(5, Dialect::kV2));
  REQUIRE(m.request(2, rq::set("/kept", "yes")));

  // An unknown command (protocol), a key over the limit (limit), a GET of a
  // missing key (semantic), a repeated VALIDATE (protocol).
  REQUIRE(m.request(1, byte(0x7f)));
  REQUIRE(m.request(3, byte(tcpstore::test::v113::kGet) + u64le(1u << 20) +
                           std::string(1u << 20, 'k')));
  REQUIRE(m.request(4, rq::get("/missing")));
  REQUIRE(m.request(5, rq::validate()));
  auto r1 = m.closed(1);
  REQUIRE(r1.has_value());
  CHECK(r1->find("unknown command") != std::string::npos);
  auto r3 = m.closed(3);
  REQUIRE(r3.has_value());
  CHECK(r3->find("key") != std::string::npos);
  auto r4 = m.closed(4);
  REQUIRE(r4.has_value());
  CHECK(r4->find("GET rejected") != std::string::npos);
  auto r5 = m.closed(5);
  REQUIRE(r5.has_value());
  CHECK(m.buffered(1) + m.buffered(3) + m.buffered(4) + m.buffered(5) == 0);

  // Frames for the closed channels are ignored; the rest goes on.
  REQUIRE(m.request(1, rq::get("/kept")));
  REQUIRE(m.close(3));
  REQUIRE(m.request(2, rq::get("/kept")));
  CHECK(m.data(2, 11) == u64le(3) + "yes");
  REQUIRE(m.fence(2));
  CHECK(m.buffered(1) == 0);
  auto c = s->counters();
  CHECK(c.rejected_protocol == 2);
  CHECK(c.rejected_limit == 1);
  CHECK(c.rejected_semantic == 1);
  CHECK(c.mux_channels_closed == 4);
  CHECK(c.mux_channels_open == 1);
  CHECK(c.connections_open == 1);
}

TEST_CASE("mux: each frame rule breach closes the whole mux connection") {
  auto s = ScopedServer::local();
  const std::string ok_req = encode(Dialect::kV2, rq::get("/x"));
  struct Case {
    const char* name;
    std::string bytes;
  };
  std::string two_reqs = ok_req + ok_req;
  const std::vector<Case> cases = {
      {"OPEN of channel 0", openFrame(0, Dialect::kV2)},
      {"OPEN not increasing",
       openFrame(5, Dialect::kV2) + openFrame(5, Dialect::kV2)},
      {"OPEN decreasing",
       openFrame(5, Dialect::kV2) + openFrame(4, Dialect::kV2)},
      {"OPEN with an unknown dialect", frame(FT::kOpen, 1, byte(2))},
      {"OPEN with a long payload", frame(FT::kOpen, 1, "\x01\x01")},
      {"REQUEST for a channel never opened",
       openFrame(1, Dialect::kV2) + frame(FT::kRequest, 2, ok_req)},
      {"CLOSE for a channel never opened", frame(FT::kClose, 3, "")},
      {"CLOSE with a payload",
       openFrame(1, Dialect::kV2) + frame(FT::kClose, 1, "x")},
      {"unknown frame type", std::string("\x09", 1)},
      {"DATA from the relay", frame(FT::kData, 1, "x")},
      {"CLOSED from the relay", frame(FT::kClosed, 1, "x")},
      {"REQUEST of two requests",
       openFrame(1, Dialect::kV2) + frame(FT::kRequest, 1, two_reqs)},
      {"REQUEST of half a request",
       openFrame(1, Dialect::kV2) +
           frame(FT::kRequest, 1, ok_req.substr(0, 5))},
      {"empty REQUEST",
       openFrame(1, Dialect::kV2) + frame(FT::kRequest, 1, "")},
      {"REQUEST over the payload limit",
       openFrame(1, Dialect::kV2) + byte(0x02) + u32le(1) + u32le(0xfffffff0u)},
  };
  std::uint64_t protocol_before = s->counters().rejected_protocol;
  for (const Case& c : cases) {
    CAPTURE(c.name);
    MuxClient m(s->port());
    REQUIRE(m.open(100, Dialect::kV2));  // a live channel dies with it
    REQUIRE(m.request(100, rq::set("/alive", "1")));
    REQUIRE(m.fence(100));
    MuxClient fresh(s->port());
    CHECK(fresh.send(c.bytes));
    CHECK(fresh.waitConnClosed());
    CHECK(s->counters().rejected_protocol == ++protocol_before);
    // The other mux connection is untouched.
    REQUIRE(m.request(100, rq::get("/alive")));
    CHECK(m.data(100, 9) == u64le(1) + "1");
  }
  // A breach with live channels: they all go, and their waits with them.
  MuxClient m(s->port());
  REQUIRE(m.open(1, Dialect::kV2));
  REQUIRE(m.open(2, Dialect::kV2));
  std::vector<std::string> k = {"/never"};
  REQUIRE(m.request(1, rq::wait(k)));
  REQUIRE(m.fence(2));
  const auto open_before = s->counters().mux_channels_open;
  REQUIRE(m.send(frame(FT::kData, 1, "")));
  CHECK(m.waitConnClosed());
  CHECK(eventually(
      [&] { return s->counters().mux_channels_open == open_before - 2; }));
}

// The server's memory gauge once it has settled (reclaim runs when idle):
// each poll is a round trip on `fence`, so the loop turns and updates it.
std::uint64_t settledMemory(tcpstore::Server& s, RawConn& fence) {
  std::uint64_t last = UINT64_MAX;
  for (int same = 0; same < 3;) {
    REQUIRE(pingFence(fence));
    const std::uint64_t now = s.counters().memory_bytes;
    same = now == last ? same + 1 : 0;
    last = now;
  }
  return last;
}

TEST_CASE("mux: CLOSE and the connection's close forget the channels' waits") {
  auto s = ScopedServer::local();
  RawConn poke = RawConn::connect(s->port());
  REQUIRE(poke.handshake());
  std::vector<std::string> keys, keys2;
  for (int i = 0; i < 20000; ++i) {
    keys.push_back("/wait/" + std::to_string(i));
    keys2.push_back("/wait2/" + std::to_string(i));
  }
  const std::uint64_t base = settledMemory(*s, poke);
  const std::uint64_t big = 20000 * 64;  // well under what the waits hold

  MuxClient m(s->port());
  REQUIRE(m.open(1, Dialect::kV2));
  REQUIRE(m.open(2, Dialect::kV113));
  REQUIRE(m.request(1, rq::wait(keys)));
  REQUIRE(m.fence(2));
  const std::uint64_t one_wait = settledMemory(*s, poke) - base;
  MESSAGE("one WAIT of 20000 keys holds " << one_wait << " bytes");
  CHECK(one_wait > big);
  REQUIRE(m.close(1));
  REQUIRE(m.fence(2));
  CHECK(eventually([&] { return settledMemory(*s, poke) < base + big / 8; }));
  CHECK(s->counters().mux_channels_open == 1);

  // The same through the mux connection's close, with a pending WAIT on
  // each of two channels.
  REQUIRE(m.open(3, Dialect::kV113));
  REQUIRE(m.request(3, rq::wait(keys)));
  REQUIRE(m.request(2, rq::wait(keys2)));
  CHECK(eventually(
      [&] { return settledMemory(*s, poke) > base + one_wait + big; }));
  m.raw().close();
  CHECK(eventually([&] { return settledMemory(*s, poke) < base + big / 8; }));
  CHECK(eventually([&] { return s->counters().mux_channels_open == 0; }));
  CHECK(s->counters().mux_channels_closed == 3);
  // A later WAIT on one of those keys is released as usual.
  MuxClient m2(s->port());
  REQUIRE(m2.open(1, Dialect::kV2));
  std::vector<std::string> one = {"/wait/7"};
  REQUIRE(m2.request(1, rq::wait(one)));
  REQUIRE(poke.send(encode(Dialect::kV2, rq::set("/wait/7", "x"))));
  CHECK(m2.data(1, 1) == byte(0x00));
}

TEST_CASE("mux: channels past the limit are refused with CLOSED") {
  tcpstore::ServerOptions o;
  o.limits.max_mux_channels = 3;
  auto s = ScopedServer::local(o);
  MuxClient m(s->port());
  for (std::uint32_t ch : {1u, 2u, 3u, 4u}) REQUIRE(m.open(ch, Dialect::kV2));
  auto why = m.closed(4);
  REQUIRE(why.has_value());
  CHECK(why->find("too many channels") != std::string::npos);
  REQUIRE(m.request(4, rq::ping(1)));  // ignored: it was refused
  REQUIRE(m.close(2));
  REQUIRE(m.open(5, Dialect::kV2));
  REQUIRE(m.request(5, rq::add("/n", 2)));
  CHECK(m.data(5, 8) == i64le(2));
  CHECK(m.buffered(4) == 0);
  auto c = s->counters();
  CHECK(c.mux_channels_refused == 1);
  CHECK(c.mux_channels_opened == 4);
  CHECK(c.mux_channels_open == 3);
}

TEST_CASE("mux: open channels count against the memory budget") {
  tcpstore::ServerOptions o;
  o.limits.max_memory_bytes = 256 * 1024;
  auto s = ScopedServer::local(o);
  MuxClient m(s->port());
  constexpr std::uint32_t kChannels = 2000;  // 192 bytes each: not all fit
  std::string batch;
  for (std::uint32_t ch = 1; ch <= kChannels; ++ch) {
    m.setDialect(ch, Dialect::kV2);
    batch += openFrame(ch, Dialect::kV2);
  }
  REQUIRE(m.send(batch));
  REQUIRE(m.fence(1));  // after every OPEN was handled
  auto c = s->counters();
  const std::uint64_t refused = c.mux_channels_refused;
  MESSAGE((kChannels - refused) << " of " << kChannels << " channels fit");
  CHECK(refused > 0);
  CHECK(refused < kChannels);
  CHECK(c.budget_refused == refused);
  CHECK(c.mux_channels_open == kChannels - refused);
  CHECK(m.closedCount() == refused);
  const auto why = m.closed(kChannels);
  REQUIRE(why.has_value());
  CHECK(why->find("memory budget") != std::string::npos);
  // Closing channels gives their share back.
  batch.clear();
  for (std::uint32_t ch = 2; ch <= 101; ++ch)
    batch += frame(FT::kClose, ch, "");
  REQUIRE(m.send(batch));
  REQUIRE(m.open(kChannels + 1, Dialect::kV2));
  CHECK(m.fence(kChannels + 1));
  CHECK(!m.sawClosed(kChannels + 1));
}

TEST_CASE("mux: 10,000 channels on one connection") {
  constexpr std::uint32_t kChannels = 10000;
  auto s = ScopedServer::local();
  MuxClient m(s->port());
  std::string batch;
  for (std::uint32_t ch = 1; ch <= kChannels; ++ch) {
    const Dialect d = ch % 2 == 0 ? Dialect::kV2 : Dialect::kV113;
    batch += openFrame(ch, d);
    m.setDialect(ch, d);
    batch += frame(FT::kRequest, ch, encode(d, rq::add("/count", 1)));
  }
  REQUIRE(m.send(batch));
  std::vector<bool> seen(kChannels + 1, false);
  int distinct = 0;
  for (std::uint32_t ch = 1; ch <= kChannels; ++ch) {
    std::string r = m.data(ch, 8);
    REQUIRE(r.size() == 8);
    const std::uint64_t v = loadU64le(r);
    REQUIRE(v >= 1);
    REQUIRE(v <= kChannels);
    if (!seen[v]) ++distinct;
    seen[v] = true;
  }
  CHECK(distinct == static_cast<int>(kChannels));
  CHECK(s->counters().mux_channels_open == kChannels);
  batch.clear();
  for (std::uint32_t ch = 1; ch <= kChannels; ch += 2)
    batch += frame(FT::kClose, ch, "");
  REQUIRE(m.send(batch));
  REQUIRE(m.fence(2));
  CHECK(s->counters().mux_channels_open == kChannels / 2);
  m.raw().close();
  CHECK(eventually([&] { return s->counters().mux_channels_open == 0; }));
  CHECK(s->counters().mux_channels_closed == kChannels);
}

TEST_CASE("mux: torch-style clients are unaffected") {
  auto s = ScopedServer::local();
  // Garbage starting with 0xff, or a preamble of another version, is not a
  // mux connection: it is rejected as before (a lone 0xff at once, as
  // torch's servers do).
  for (std::string g :
       {std::string("\xff\x01\x02\x03\x04\x05\x06\x07", 8),
        std::string("\xffTSMUX\x00\x02", 8), std::string("\xff", 1)}) {
    CAPTURE(toHex(g));
    RawConn c = RawConn::connect(s->port());
    REQUIRE(c.ok());
    REQUIRE(c.send(g));
    std::string got;
    CHECK(c.waitClosed(&got));
    CHECK(got.empty());
  }
  CHECK(s->counters().rejected_protocol == 3);
  CHECK(s->counters().mux_connections == 0);
  // A preamble that arrives in pieces (of 2 bytes or more).
  RawConn c = RawConn::connect(s->port());
  REQUIRE(c.ok());
  const std::uint64_t in0 = s->counters().bytes_in;
  const std::string_view pre = mux::kMuxPreamble;
  REQUIRE(c.send(pre.substr(0, 2)));
  CHECK(eventually([&] { return s->counters().bytes_in == in0 + 2; }));
  REQUIRE(c.send(pre.substr(2, 4)));
  CHECK(eventually([&] { return s->counters().bytes_in == in0 + 6; }));
  REQUIRE(c.send(pre.substr(6)));
  CHECK(c.recv(8) == std::string(pre));
  REQUIRE(
      c.send(openFrame(1, Dialect::kV113) +
             frame(FT::kRequest, 1, encode(Dialect::kV113, rq::add("/p", 9)))));
  std::string f = c.recv(9 + 8);
  CHECK(f == frame(FT::kData, 1, i64le(9)));
  // Plain clients of both dialects on the same server meanwhile.
  RawConn p = RawConn::connect(s->port());
  REQUIRE(p.handshake());
  REQUIRE(p.send(encode(Dialect::kV2, rq::get("/p"))));
  CHECK(p.recv(9) == u64le(1) + "9");
  CHECK(s->counters().connections_v2 == 1);
}

TEST_CASE("mux: replies over 16 MiB are split into several DATA frames") {
  auto s = ScopedServer::local();
  MuxClient m(s->port());
  REQUIRE(m.open(1, Dialect::kV2));
  const std::string value(8u << 20, 'v');  // the largest value (8 MiB)
  std::vector<std::string> keys = {"/big1", "/big2", "/big3"};
  std::vector<std::string> values = {value, value, value};
  REQUIRE(m.request(1, rq::multiSet(keys, values)));
  REQUIRE(m.request(1, rq::multiGet(keys)));
  std::string want;
  for (int i = 0; i < 3; ++i) want += u64le(value.size()) + value;
  const std::string got = m.data(1, want.size(), milliseconds(20000));
  CHECK(got.size() == want.size());
  CHECK((got == want));
  CHECK(m.frames(1) == 2);  // 24 MiB + 24 bytes: 16 MiB, then the rest
}

TEST_CASE("mux: a relay behind on its reads is paused, never dropped") {
  tcpstore::ServerOptions o;
  o.limits.max_buffered_output_bytes = 64 * 1024;
  auto s = ScopedServer::local(o);
  RawConn setter = RawConn::connect(s->port());
  REQUIRE(setter.handshake());
  const std::string value(200 * 1024, 'r');
  REQUIRE(setter.send(encode(Dialect::kV2, rq::set("/v", value))));
  REQUIRE(pingFence(setter));
  // A small receive window: the server's writes back up at once.
  MuxClient m(s->port(), 16 * 1024);
  constexpr std::uint32_t kChannels = 16;
  constexpr int kGets = 4;
  std::string batch;
  for (std::uint32_t ch = 1; ch <= kChannels; ++ch) {
    m.setDialect(ch, Dialect::kV2);
    batch += openFrame(ch, Dialect::kV2);
    for (int i = 0; i < kGets; ++i)
      batch += frame(FT::kRequest, ch, encode(Dialect::kV2, rq::get("/v")));
  }
  REQUIRE(m.send(batch));  // ~13 MB of replies for a 64 KiB output cap
  // Only once the server is paused (its output past twice the cap, which
  // drops a plain connection that does not read) does the relay read.
  CHECK(eventually([&] {
    REQUIRE(pingFence(setter));
    return s->counters().memory_bytes > 2 * o.limits.max_buffered_output_bytes;
  }));
  const std::string one = u64le(value.size()) + value;
  for (std::uint32_t ch = 1; ch <= kChannels; ++ch) {
    for (int i = 0; i < kGets; ++i) {
      CAPTURE(ch);
      CHECK((m.data(ch, one.size(), milliseconds(20000)) == one));
    }
  }
  CHECK(s->counters().rejected_slow_reader == 0);
  CHECK(s->counters().mux_channels_open == kChannels);
}

namespace {

using tcpstore::store::Backend;
using tcpstore::store::BackendHost;
using tcpstore::store::ConnId;
using tcpstore::store::Effects;

// The in-memory backend, except that a SET of a "hold/..." key stays pending
// until a request on a "release/..." key (which completes the held SETs
// inside its own submit()) or on a "later/..." key (which completes them
// from a timer, on a later loop turn). A held "hold/fail..." completes with
// an error; a held "hold/close..." is closed by the backend instead.
class HoldBackend final : public Backend {
 public:
  explicit HoldBackend(tcpstore::store::KeyspaceOptions o) : inner_(o) {}

  tcpstore::Status open(BackendHost& host, uv_loop_s* loop) override {
    host_ = &host;
    timer_ = new uv_timer_t;
    uv_timer_init(loop, timer_);
    timer_->data = this;
    return inner_.open(host, loop);
  }
  tcpstore::Result<Outcome> submit(ConnId conn, const Request& req,
                                   Effects& fx) override {
    auto starts = [&](std::string_view p) {
      return req.key.substr(0, p.size()) == p;
    };
    if (starts("release/")) runHeld();
    if (starts("later/"))
      uv_timer_start(
          timer_,
          [](uv_timer_t* t) { static_cast<HoldBackend*>(t->data)->runHeld(); },
          0, 0);
    if (req.command == tcpstore::protocol::Command::kSet && starts("hold/")) {
      held_.push_back(Held{conn, std::string(req.key), std::string(req.value)});
      return Outcome::kPending;
    }
    return inner_.submit(conn, req, fx);
  }
  void disconnect(ConnId conn) override { inner_.disconnect(conn); }
  void close() override {
    inner_.close();
    uv_close(reinterpret_cast<uv_handle_t*>(timer_),
             [](uv_handle_t* h) { delete reinterpret_cast<uv_timer_t*>(h); });
  }

 private:
  struct Held {
    ConnId conn;
    std::string key, value;
  };
  void runHeld() {
    std::vector<Held> held;
    held.swap(held_);
    for (Held& h : held) {
      Effects fx;
      if (h.key.rfind("hold/fail", 0) == 0) {
        host_->complete(h.conn, tcpstore::Status::ioError("injected failure"),
                        fx);
        continue;
      }
      if (h.key.rfind("hold/close", 0) == 0) {
        host_->close(h.conn, tcpstore::Status::ioError("upstream gone"));
        continue;
      }
      auto r = inner_.submit(h.conn, rq::set(h.key, h.value), fx);
      host_->complete(h.conn, r ? tcpstore::Status::ok() : r.error(), fx);
    }
  }

  tcpstore::store::MemoryBackend inner_;
  BackendHost* host_ = nullptr;
  uv_timer_t* timer_ = nullptr;
  std::vector<Held> held_;
};

ScopedServer holdServer() {
  tcpstore::ServerOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  o.log_level = "error";
  auto r = tcpstore::server::startServer(
      o, std::make_unique<HoldBackend>(tcpstore::server::keyspaceOptions(o)));
  REQUIRE_MESSAGE(r.ok(), r.error().toString());
  return ScopedServer(r.value());
}

}  // namespace

TEST_CASE("mux: a pending request holds its channel only, in order") {
  auto s = holdServer();
  MuxClient m(s->port());
  for (std::uint32_t ch : {1u, 2u, 3u}) REQUIRE(m.open(ch, Dialect::kV2));
  REQUIRE(m.open(4, Dialect::kV113));
  // Channel 1's SET is pending: its GET and ADD queue behind it.
  REQUIRE(m.request(1, rq::set("hold/a", "first")));
  REQUIRE(m.request(1, rq::get("hold/a")));
  REQUIRE(m.request(1, rq::add("/n1", 1)));
  // Other channels go on meanwhile, 1.13 and 2.x.
  for (int i = 1; i <= 3; ++i) {
    REQUIRE(m.request(2, rq::add("/n2", 1)));
    CHECK(m.data(2, 8) == i64le(i));
    REQUIRE(m.request(4, rq::add("/n4", 2)));
    CHECK(m.data(4, 8) == i64le(2 * i));
  }
  REQUIRE(m.fence(2));
  CHECK(m.buffered(1) == 0);
  // Released inside another channel's submit(): channel 1 resumes after
  // that dispatch, and its queued requests run in order.
  REQUIRE(m.request(2, rq::add("release/x", 1)));
  CHECK(m.data(2, 8) == i64le(1));
  CHECK(m.data(1, 13 + 8) == u64le(5) + "first" + i64le(1));

  // Released from a timer (no dispatch on the stack), with more queued
  // requests than fit one read, some sent after the release.
  REQUIRE(m.request(1, rq::set("hold/b", "second")));
  std::string want;
  for (int i = 0; i < 2000; ++i) {
    REQUIRE(m.request(1, rq::add("/n1", 1)));
    want += i64le(i + 2);
  }
  REQUIRE(m.request(3, rq::add("later/x", 1)));
  CHECK(m.data(3, 8) == i64le(1));
  REQUIRE(m.request(1, rq::get("hold/b")));
  want += u64le(6) + "second";
  CHECK(toHex(m.data(1, want.size())) == toHex(want));

  // A channel closed while pending: its completion is dropped, its queued
  // requests never run, and the others are unaffected.
  REQUIRE(m.request(3, rq::set("hold/c", "gone")));
  REQUIRE(m.request(3, rq::add("/n3", 100)));
  REQUIRE(m.close(3));
  REQUIRE(m.request(2, rq::add("release/y", 1)));
  CHECK(m.data(2, 8) == i64le(1));
  REQUIRE(m.request(2, rq::get("hold/c")));  // the SET itself was applied
  CHECK(m.data(2, 12) == u64le(4) + "gone");
  REQUIRE(m.request(2, rq::add("/n3", 1)));
  CHECK(m.data(2, 8) == i64le(1));
  REQUIRE(m.fence(2));
  CHECK(m.buffered(3) == 0);
  // The mux connection closing with a channel pending.
  REQUIRE(m.request(1, rq::set("hold/d", "x")));
  REQUIRE(m.request(1, rq::get("hold/d")));
  REQUIRE(m.fence(2));
  m.raw().close();
  RawConn p = RawConn::connect(s->port());
  REQUIRE(p.handshake());
  CHECK(eventually([&] { return s->counters().mux_channels_open == 0; }));
  REQUIRE(p.send(encode(Dialect::kV2, rq::add("release/z", 1))));
  CHECK(p.recv(8) == i64le(1));
  CHECK(s->counters().memory_bytes < 1024 * 1024);
}

TEST_CASE("mux: a backend's failure or close ends only that channel") {
  auto s = holdServer();
  MuxClient m(s->port());
  for (std::uint32_t ch : {1u, 2u, 3u}) REQUIRE(m.open(ch, Dialect::kV2));
  REQUIRE(m.request(1, rq::set("hold/fail1", "x")));
  REQUIRE(m.request(1, rq::get("/never-run")));  // queued, then dropped
  REQUIRE(m.request(2, rq::set("hold/close2", "x")));
  REQUIRE(m.request(3, rq::add("release/now", 1)));
  CHECK(m.data(3, 8) == i64le(1));
  auto r1 = m.closed(1);
  REQUIRE(r1.has_value());
  CHECK(r1->find("injected failure") != std::string::npos);
  auto r2 = m.closed(2);
  REQUIRE(r2.has_value());
  CHECK(r2->find("upstream gone") != std::string::npos);
  REQUIRE(m.fence(3));
  CHECK(m.buffered(1) + m.buffered(2) == 0);
  // Closed from a timer (no read on the stack): the CLOSED still leaves at
  // once, without waiting for other traffic to turn the loop.
  REQUIRE(m.open(4, Dialect::kV2));
  REQUIRE(m.request(4, rq::set("hold/close4", "x")));
  REQUIRE(m.request(3, rq::add("later/now", 1)));
  CHECK(m.data(3, 8) == i64le(1));
  auto r4 = m.closed(4);
  REQUIRE(r4.has_value());
  CHECK(r4->find("upstream gone") != std::string::npos);
  auto c = s->counters();
  CHECK(c.rejected_semantic == 1);  // the failed request, as on a connection
  CHECK(c.mux_channels_open == 1);
  CHECK(c.connections_open == 1);
}

TEST_CASE("mux: a relay that stops reading is still dropped after a stall") {
  tcpstore::ServerOptions o;
  o.limits.max_buffered_output_bytes = 64 * 1024;
  o.limits.stalled_reader_ms = 200;
  auto s = ScopedServer::local(o);
  RawConn setter = RawConn::connect(s->port());
  REQUIRE(setter.handshake());
  const std::string value(200 * 1024, 's');
  REQUIRE(setter.send(encode(Dialect::kV2, rq::set("/v", value))));
  REQUIRE(pingFence(setter));
  MuxClient m(s->port(), 16 * 1024);
  REQUIRE(m.open(1, Dialect::kV2));
  std::string batch;
  for (int i = 0; i < 64; ++i)
    batch += frame(FT::kRequest, 1, encode(Dialect::kV2, rq::get("/v")));
  REQUIRE(m.send(batch));  // ~13 MB of replies, never read
  CHECK(eventually([&] { return s->counters().rejected_slow_reader == 1; }));
  CHECK(eventually([&] { return s->counters().mux_channels_open == 0; }));
  REQUIRE(pingFence(setter));  // everyone else is served
}

TEST_CASE("mux: SHUTDOWN ends a channel like a peer's half-close") {
  auto s = ScopedServer::local();
  MuxClient m(s->port());
  REQUIRE(m.open(1, Dialect::kV2));
  REQUIRE(m.open(2, Dialect::kV2));
  // A batch, then SHUTDOWN: every reply, then an empty CLOSED.
  REQUIRE(m.request(1, rq::set("/sd", "v")));
  REQUIRE(m.request(1, rq::get("/sd")));
  REQUIRE(m.request(1, rq::add("/sd-n", 3)));
  REQUIRE(m.send(frame(FT::kShutdown, 1, "")));
  auto reason = m.closed(1);
  REQUIRE(reason.has_value());
  CHECK(reason->empty());
  CHECK(toHex(m.data(1, 100, milliseconds(50))) == toHex(str("v") + i64le(3)));
  // A WAIT that is not released is dropped as on a half-closed connection.
  REQUIRE(m.request(2, rq::wait({"/never"})));
  REQUIRE(m.send(frame(FT::kShutdown, 2, "")));
  reason = m.closed(2);
  REQUIRE(reason.has_value());
  CHECK(reason->empty());
  CHECK(m.buffered(2) == 0);
  CHECK(eventually([&] { return s->counters().mux_channels_open == 0; }));
  // A REQUEST that crossed the CLOSED is ignored; the connection serves on.
  REQUIRE(m.request(1, rq::numKeys()));
  REQUIRE(m.open(3, Dialect::kV2));
  CHECK(m.fence(3));
  CHECK(m.buffered(1) == 0);
  CHECK(s->counters().rejected_protocol == 0);
}
