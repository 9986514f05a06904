// Shared replies through real connections (store/shared_bytes.h, the
// keyspace's reply cache): many clients MULTI_GET the same keys, each gets
// the exact bytes, the reply is queued by reference (shared_replies), and a
// write in between changes the later replies.
#include <doctest/doctest.h>

#include <string>
#include <thread>
#include <vector>

#include "tcpstore/server.h"
#include "tests/server/raw_client.h"
#include "tests/support/deadline.h"
#include "tests/support/scoped_server.h"

namespace {

using namespace tcpstore::test;
using std::chrono::milliseconds;

constexpr int kKeys = 16;
constexpr std::size_t kValueBytes = 2048;

struct Keys {
  Keys() {
    for (int i = 0; i < kKeys; ++i) {
      names.push_back("/shared/" + std::to_string(i));
      vals.push_back(std::string(kValueBytes, static_cast<char>('a' + i)));
    }
  }
  std::string multiGet() const {
    std::string m = byte(v2::kMultiGet) + u64le(names.size());
    for (const std::string& k : names) m += str(k);
    return m;
  }
  std::string reply() const {
    std::string r;
    for (const std::string& v : vals) r += str(v);
    return r;
  }
  std::vector<std::string> names;
  std::vector<std::string> vals;
};

RawConn conn2(const tcpstore::Server& s) {
  RawConn c = RawConn::connect(s.port());
  REQUIRE(c.ok());
  REQUIRE(c.handshake());
  return c;
}

std::uint64_t sharedReplies(const ScopedServer& s) {
  return s->counters().shared_replies;
}

// Through relays: true once the front relay has tunneled requests and then
// neither tunneled more nor written a byte for 100 ms (polled by
// eventually()): it holds its client, whose socket buffers are full.
class RelayQuiet {
 public:
  bool operator()(const ScopedServer& s) {
    const tcpstore::ServerCounters c = s->counters();
    const auto now = Clock::now();
    if (c.relay_tunneled != tunneled_ || c.bytes_out != out_) {
      tunneled_ = c.relay_tunneled;
      out_ = c.bytes_out;
      since_ = now;
      return false;
    }
    return tunneled_ > 0 && now - since_ >= milliseconds(100);
  }

 private:
  std::uint64_t tunneled_ = 0;
  std::uint64_t out_ = 0;
  Clock::time_point since_ = Clock::now();
};

TEST_CASE(
    "many clients' identical MULTI_GETs share one reply, and a SET between "
    "changes the later ones") {
  auto s = ScopedServer::local();
  // Through relays the origin's replies travel as mux frames (copied) and
  // the front relay shares only reads coalesced in one turn: the bytes are
  // checked there too, the counter only against a direct server.
  const bool direct = testRelays() == 0;
  Keys k;
  RawConn writer = conn2(*s);
  for (int i = 0; i < kKeys; ++i) {
    REQUIRE(writer.send(byte(v2::kSet) + str(k.names[i]) + str(k.vals[i])));
  }
  REQUIRE(pingFence(writer));
  constexpr int kClients = 24;
  std::vector<RawConn> clients;
  for (int i = 0; i < kClients; ++i) clients.push_back(conn2(*s));

  for (int round = 0; round < 2; ++round) {
    CAPTURE(round);
    const std::uint64_t before = sharedReplies(s);
    const std::string want = k.reply();
    // All ask, then all read: the replies sit in the outboxes together.
    for (RawConn& c : clients) REQUIRE(c.send(k.multiGet()));
    for (RawConn& c : clients) {
      REQUIRE(c.recv(want.size(), scaled(milliseconds(10000))) == want);
    }
    // The first sighting is built plainly; from the second on the one
    // cached buffer is queued by reference.
    if (direct) CHECK(sharedReplies(s) - before == kClients - 1);
    // A SET of one cached key: the next round must see it.
    k.vals[5] = std::string(kValueBytes + 7, 'Z');
    REQUIRE(writer.send(byte(v2::kSet) + str(k.names[5]) + str(k.vals[5])));
    REQUIRE(pingFence(writer));
  }
  // APPEND and DELETE_KEY of a cached key, read by one client each time.
  for (RawConn& c : clients) REQUIRE(c.send(k.multiGet()));
  for (RawConn& c : clients) REQUIRE(c.recv(k.reply().size()) == k.reply());
  REQUIRE(writer.send(byte(v2::kAppend) + str(k.names[0]) + str("++")));
  REQUIRE(pingFence(writer));
  k.vals[0] += "++";
  REQUIRE(clients[0].send(k.multiGet()));
  CHECK(clients[0].recv(k.reply().size()) == k.reply());
  REQUIRE(writer.send(byte(v2::kDeleteKey) + str(k.names[1])));
  CHECK(writer.recv(8) == i64le(1));
  // A MULTI_GET of a missing key is an error: the connection is closed,
  // not answered from the cache.
  REQUIRE(clients[1].send(k.multiGet()));
  std::string got;
  CHECK(clients[1].waitClosed(&got, scaled(milliseconds(10000))));
  CHECK(got.empty());
  CHECK(s->stop().isOk());
}

TEST_CASE(
    "a client pipelining shared replies without reading is not dropped "
    "and gets every byte") {
  // Through relays the front relay holds the client (stops decoding it)
  // before its replies in flight could pass twice its cap: it must not drop
  // it either. Only a direct server queues these replies shared (the
  // relay shares only reads it coalesced): the counters are checked there.
  const bool direct = testRelays() == 0;
  tcpstore::ServerOptions o;
  o.limits.max_buffered_output_bytes = 64 * 1024;
  auto s = ScopedServer::local(o);
  Keys k;
  RawConn c = conn2(*s);
  for (int i = 0; i < kKeys; ++i) {
    REQUIRE(c.send(byte(v2::kSet) + str(k.names[i]) + str(k.vals[i])));
  }
  REQUIRE(pingFence(c));
  const std::string want = k.reply();  // ~33 KiB
  constexpr int kGets = 300;           // ~10 MB of replies
  std::string batch;
  for (int i = 0; i < kGets; ++i) batch += k.multiGet();
  std::thread sender([&] { (void)c.send(batch); });
  // Read nothing until the server holds replies past the cap (shared
  // ones: queued, not sent), so the connection is paused with shared
  // chunks partly written.
  if (direct) {
    CHECK(eventually([&] { return sharedReplies(s) > 10; }));
  } else {
    // The front relay has held the client: it tunnels no more requests
    // and writes no more bytes (the client's socket buffers are full).
    RelayQuiet quiet;
    CHECK(eventually([&] { return quiet(s); }));
  }
  int ok = 0;
  for (int i = 0; i < kGets; ++i) {
    if (c.recv(want.size(), scaled(milliseconds(10000))) != want) break;
    ++ok;
  }
  sender.join();
  CHECK(ok == kGets);
  if (direct) CHECK(sharedReplies(s) == kGets - 1);
  CHECK(s->counters().rejected_slow_reader == 0);
  // Still served after draining.
  REQUIRE(c.send(k.multiGet()));
  CHECK(c.recv(want.size()) == want);
  CHECK(s->stop().isOk());
}

}  // namespace
