// The relay (tcpstore-server --upstream, ServerOptions::upstream) against
// real upstream servers: in-process ones, and real tcpstore-server processes
// where the upstream must die and come back.
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <future>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "protocol/wire.h"
#include "tcpstore/client.h"
#include "tcpstore/server.h"
#include "tests/server/raw_client.h"
#include "tests/support/child.h"
#include "tests/support/deadline.h"
#include "tests/support/scoped_server.h"

using namespace std::chrono_literals;
using tcpstore::Client;
using tcpstore::ClientOptions;
using tcpstore::ServerOptions;
using tcpstore::StatusCode;
using tcpstore::test::Child;
using tcpstore::test::Clock;
using tcpstore::test::scaled;
using tcpstore::test::ScopedServer;

namespace {

const std::string kBin = TCPSTORE_BIN_DIR;

// An upstream server and one relay in front of it, in this process.
struct Pair {
  ScopedServer upstream;
  ScopedServer relay;
};

Pair startPair(bool combine = true) {
  Pair p;
  p.upstream = ScopedServer::start([] {
    ServerOptions u;
    u.host = "127.0.0.1";
    u.port = 0;
    u.log_level = "error";
    return u;
  }());
  ServerOptions r;
  r.host = "127.0.0.1";
  r.port = 0;
  r.log_level = "error";
  r.upstream = "127.0.0.1:" + std::to_string(p.upstream->port());
  r.upstream_combine = combine;
  p.relay = ScopedServer::start(r);
  return p;
}

Client connectTo(std::uint16_t port,
                 tcpstore::Dialect d = tcpstore::Dialect::kV2,
                 std::chrono::milliseconds connect_timeout = 10s) {
  ClientOptions o;
  o.port = port;
  o.dialect = d;
  o.timeout = scaled(20s);
  o.connect_timeout = scaled(connect_timeout);
  o.share_connections = false;
  auto c = Client::connect(o);
  REQUIRE_MESSAGE(c.has_value(), c.error().toString());
  return std::move(c).value();
}

// A TCP listener on 127.0.0.1 that accepts one connection at a time and
// closes it after reading whatever comes (a server that does not speak the
// relay extension, like a torch server faced with the preamble).
class ClosingListener {
 public:
  ClosingListener() {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(fd_, 8) == 0);
    socklen_t len = sizeof a;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] {
      for (;;) {
        const int c = ::accept(fd_, nullptr, nullptr);
        if (c < 0) return;
        char buf[64];
        (void)::recv(c, buf, sizeof buf, 0);
        ::close(c);
      }
    });
  }
  ~ClosingListener() {
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    thread_.join();
  }
  std::uint16_t port() const { return port_; }

 private:
  int fd_ = -1;
  std::uint16_t port_ = 0;
  std::thread thread_;
};

// "listening on 127.0.0.1:P" -> P.
std::uint16_t readPort(Child& c) {
  auto line = c.readLine(Clock::now() + scaled(20s));
  REQUIRE(line.has_value());
  const std::string want = "listening on 127.0.0.1:";
  REQUIRE(line->rfind(want, 0) == 0);
  return static_cast<std::uint16_t>(std::stoi(line->substr(want.size())));
}

}  // namespace

TEST_CASE("relay: a WAIT through the relay is released by a SET upstream") {
  Pair p = startPair();
  Client via = connectTo(p.relay->port());
  Client direct = connectTo(p.upstream->port());
  auto waiter = std::async(std::launch::async,
                           [&] { return via.wait({"released-upstream"}); });
  // The WAIT is registered upstream once the upstream counts it.
  REQUIRE(tcpstore::test::eventually(
      [&] {
        return p.upstream->counters().requests[static_cast<int>(
                   tcpstore::protocol::Command::kWait)] >= 1;
      },
      10s));
  CHECK(waiter.wait_for(0ms) == std::future_status::timeout);
  REQUIRE(direct.set("released-upstream", "v"));
  REQUIRE(waiter.wait_for(scaled(10s)) == std::future_status::ready);
  CHECK(waiter.get().isOk());
  auto v = via.get("released-upstream");
  REQUIRE(v.has_value());
  CHECK(*v == "v");
}

TEST_CASE("relay: 1.13 and 2.x clients through one relay share the state") {
  Pair p = startPair();
  Client v1 = connectTo(p.relay->port(), tcpstore::Dialect::kV113);
  Client v2 = connectTo(p.relay->port(), tcpstore::Dialect::kV2);
  REQUIRE(v1.set("from113", "a"));
  REQUIRE(v2.set("from2", "b"));
  auto a = v2.get("from113");
  auto b = v1.get("from2");
  REQUIRE(a.has_value());
  REQUIRE(b.has_value());
  CHECK(*a == "a");
  CHECK(*b == "b");
  CHECK(v1.add("n", 5).value() == 5);
  CHECK(v2.add("n", 2).value() == 7);
  CHECK(v1.check({"from113", "from2"}).value());
  CHECK_FALSE(v2.check({"absent"}).value());
  CHECK(v2.deleteKey("from2").value());
  CHECK(v1.numKeys().value() == 2);  // from113, n
  auto m = v2.multiGet({"from113", "n"});
  REQUIRE(m.has_value());
  CHECK((*m)[0] == "a");
  CHECK((*m)[1] == "7");
  REQUIRE(v2.ping());
  CHECK(p.relay->counters().relay_tunneled > 0);
}

TEST_CASE(
    "relay: concurrent ADDs are combined and each value handed out once") {
  Pair p = startPair();
  constexpr int kClients = 8;
  constexpr int kAdds = 200;
  std::vector<Client> clients;
  for (int i = 0; i < kClients; ++i)
    clients.push_back(connectTo(p.relay->port()));
  Client direct = connectTo(p.upstream->port());
  std::vector<std::vector<std::int64_t>> got(kClients);
  std::atomic<bool> failed{false};
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      for (int j = 0; j < kAdds; ++j) {
        auto r = clients[i].add("counter", 1);
        if (!r) {
          failed = true;
          return;
        }
        got[i].push_back(*r);
      }
    });
  }
  for (auto& t : threads) t.join();
  REQUIRE_FALSE(failed.load());
  std::set<std::int64_t> all;
  for (int i = 0; i < kClients; ++i) {
    // Each client's own values increase (its ADDs are applied in order).
    CHECK(std::is_sorted(got[i].begin(), got[i].end()));
    all.insert(got[i].begin(), got[i].end());
  }
  // N*M distinct values: exactly 1..N*M, each handed out once.
  CHECK(all.size() == static_cast<std::size_t>(kClients * kAdds));
  CHECK(*all.begin() == 1);
  CHECK(*all.rbegin() == kClients * kAdds);
  CHECK(direct.add("counter", 0).value() == kClients * kAdds);
  const auto c = p.relay->counters();
  MESSAGE("combined " << c.relay_combined << " ADDs into "
                      << c.relay_upstream_adds << " upstream ADDs");
  // 8 threads hammering one key: some ADDs met in one loop turn.
  CHECK(c.relay_combined > 0);
  CHECK(c.relay_upstream_adds < c.relay_combined);
  // The upstream saw fewer ADDs than the clients sent.
  CHECK(p.upstream->counters()
            .requests[static_cast<int>(tcpstore::protocol::Command::kAdd)] <
        static_cast<std::uint64_t>(kClients * kAdds) + 1);
}

TEST_CASE("relay: ADDs combined at two stacked relays stay exact") {
  // Two front relays on one middle relay on the upstream: combined ADDs of
  // the fronts may be combined again in the middle.
  Pair p = startPair();
  ServerOptions r;
  r.host = "127.0.0.1";
  r.port = 0;
  r.log_level = "error";
  r.upstream = "127.0.0.1:" + std::to_string(p.relay->port());
  ScopedServer front_a = ScopedServer::start(r);
  ScopedServer front_b = ScopedServer::start(r);
  constexpr int kClients = 8;
  constexpr int kAdds = 150;
  std::vector<Client> clients;
  for (int i = 0; i < kClients; ++i)
    clients.push_back(connectTo((i % 2 == 0 ? front_a : front_b)->port()));
  std::vector<std::vector<std::int64_t>> got(kClients);
  std::atomic<bool> failed{false};
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      for (int j = 0; j < kAdds; ++j) {
        auto v = clients[i].add("stacked", 1);
        if (!v) {
          failed = true;
          return;
        }
        got[i].push_back(*v);
      }
    });
  }
  for (auto& t : threads) t.join();
  REQUIRE_FALSE(failed.load());
  std::set<std::int64_t> all;
  for (const auto& g : got) {
    CHECK(std::is_sorted(g.begin(), g.end()));
    all.insert(g.begin(), g.end());
  }
  CHECK(all.size() == static_cast<std::size_t>(kClients * kAdds));
  CHECK(*all.begin() == 1);
  CHECK(*all.rbegin() == kClients * kAdds);
  const auto a = front_a->counters();
  const auto b = front_b->counters();
  const auto m = p.relay->counters();
  MESSAGE("fronts combined " << a.relay_combined + b.relay_combined
                             << ", middle combined " << m.relay_combined);
  CHECK(a.relay_combined + b.relay_combined > 0);
  // The fronts stop before the pair behind them.
  CHECK(front_a->stop().isOk());
  CHECK(front_b->stop().isOk());
}

TEST_CASE(
    "relay: identical concurrent GETs are answered right, shared or not") {
  Pair p = startPair();
  Client setter = connectTo(p.upstream->port());
  REQUIRE(setter.set("shared", std::string(1000, 'x')));
  constexpr int kClients = 8;
  std::vector<Client> clients;
  for (int i = 0; i < kClients; ++i)
    clients.push_back(connectTo(p.relay->port()));
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      for (int j = 0; j < 200; ++j) {
        auto v = clients[i].get("shared");
        auto c = clients[i].check({"shared"});
        auto m = clients[i].multiGet({"shared", "shared"});
        if (!v || *v != std::string(1000, 'x') || !c || !*c || !m ||
            m->size() != 2 || (*m)[1] != *v)
          ++bad;
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(bad.load() == 0);
  const auto c = p.relay->counters();
  MESSAGE("coalesced " << c.relay_coalesced << " reads into "
                       << c.relay_upstream_reads << " upstream reads");
}

TEST_CASE(
    "relay: a coalesced read's reply is one shared buffer for all its "
    "callers") {
  // Many connections send the same MULTI_GET back to back, so the relay
  // batches several in one turn and answers them from one upstream read:
  // each of those callers' outboxes references the one reply (counted in the
  // relay's shared_replies, exactly once per coalesced caller: the reply is
  // over the outbox's copy threshold), and each gets the exact bytes.
  namespace v2 = tcpstore::test::v2;
  using tcpstore::test::byte;
  using tcpstore::test::RawConn;
  using tcpstore::test::str;
  using tcpstore::test::u64le;
  Pair p = startPair();
  Client setter = connectTo(p.upstream->port());
  std::string want;
  std::string msg = byte(v2::kMultiGet) + u64le(8);
  for (int i = 0; i < 8; ++i) {
    const std::string v(1500, static_cast<char>('a' + i));
    REQUIRE(setter.set("fan" + std::to_string(i), v));
    want += str(v);
    msg += str("/fan" + std::to_string(i));  // the client prefixes "/"
  }
  constexpr int kConns = 32;
  std::vector<RawConn> conns;
  for (int i = 0; i < kConns; ++i) {
    conns.push_back(RawConn::connect(p.relay->port()));
    REQUIRE(conns.back().handshake());
  }
  const auto deadline = Clock::now() + scaled(20s);
  int rounds = 0;
  while (p.relay->counters().relay_coalesced == 0 && Clock::now() < deadline &&
         rounds < 200) {
    ++rounds;
    for (RawConn& c : conns) REQUIRE(c.send(msg));
    for (RawConn& c : conns) REQUIRE(c.recv(want.size()) == want);
  }
  const auto c = p.relay->counters();
  MESSAGE("coalesced " << c.relay_coalesced << " in " << rounds << " rounds");
  REQUIRE(c.relay_coalesced > 0);
  CHECK(c.shared_replies == c.relay_coalesced);
}

TEST_CASE(
    "relay: GETs of a missing key sent together fail alone, GETs beside them "
    "are answered") {
  // Four connections send their GET at once, so the relay usually batches
  // them in one loop turn (two GETs of a missing key, two of a present one,
  // each pair possibly shared upstream). Whatever the batching, the missing
  // key's callers are closed with nothing sent and the others get the value.
  namespace v2 = tcpstore::test::v2;
  using tcpstore::test::byte;
  using tcpstore::test::RawConn;
  using tcpstore::test::str;
  Pair p = startPair();
  Client setter = connectTo(p.upstream->port());
  REQUIRE(setter.set("present", "value"));  // the wire key is "/present"
  const auto before = p.relay->counters();
  for (int round = 0; round < 20; ++round) {
    CAPTURE(round);
    std::vector<RawConn> conns;
    for (int i = 0; i < 4; ++i) {
      conns.push_back(RawConn::connect(p.relay->port()));
      REQUIRE(conns.back().handshake());
    }
    std::vector<std::string> reqs = {
        byte(v2::kGet) + str("/missing"), byte(v2::kGet) + str("/missing"),
        byte(v2::kGet) + str("/present"), byte(v2::kGet) + str("/present")};
    for (int i = 0; i < 4; ++i) REQUIRE(conns[i].send(reqs[i]));
    for (int i = 2; i < 4; ++i) CHECK(conns[i].recv(8 + 5) == str("value"));
    for (int i = 0; i < 2; ++i) {
      std::string got;
      CHECK(conns[i].waitClosed(&got));
      CHECK(got.empty());
    }
  }
  const auto after = p.relay->counters();
  MESSAGE("coalesced " << after.relay_coalesced - before.relay_coalesced
                       << " GETs into "
                       << after.relay_upstream_reads -
                              before.relay_upstream_reads
                       << " upstream GETs over 20 rounds");
  CHECK(setter.get("present").value() == "value");
}

TEST_CASE(
    "relay: a request that breaks a rule upstream closes only its client") {
  Pair p = startPair();
  Client bad = connectTo(p.relay->port());
  Client good = connectTo(p.relay->port());
  REQUIRE(good.set("text", "not a number"));
  auto r = bad.add("text", 1);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code() != StatusCode::kOk);
  CHECK(good.add("fine", 3).value() == 3);
  CHECK(good.get("text").value() == "not a number");
}

TEST_CASE(
    "relay: an upstream that does not speak the extension fails the start") {
  ClosingListener torchish;
  ServerOptions r;
  r.host = "127.0.0.1";
  r.port = 0;
  r.log_level = "error";
  r.upstream = "127.0.0.1:" + std::to_string(torchish.port());
  auto s = tcpstore::Server::start(r);
  REQUIRE_FALSE(s.has_value());
  CHECK(s.error().code() == StatusCode::kProtocolError);
  CHECK(s.error().message().find(
            "does not speak the tcpstore relay extension (is it a torch "
            "server?)") != std::string::npos);

  // The executable: exit 3 with the same words.
  auto res = tcpstore::test::runProcess(
      {kBin + "/tcpstore-server", "--host", "127.0.0.1", "--port", "0",
       "--upstream", "127.0.0.1:" + std::to_string(torchish.port())},
      20s);
  CHECK(res.exit_code == 3);
  CHECK(res.err.find("does not speak the tcpstore relay extension") !=
        std::string::npos);
  CHECK(res.out.find("listening on") == std::string::npos);
}

TEST_CASE("relay: nobody at the upstream address fails the start at once") {
  ClosingListener placeholder;  // holds a port, then we use a closed one
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  const int port = ntohs(a.sin_port);  // bound, not listening: refused
  ServerOptions r;
  r.host = "127.0.0.1";
  r.port = 0;
  r.log_level = "error";
  r.upstream = "127.0.0.1:" + std::to_string(port);
  auto s = tcpstore::Server::start(r);
  ::close(fd);
  REQUIRE_FALSE(s.has_value());
  CHECK(s.error().code() == StatusCode::kRefused);
  r.upstream = "no-port";
  CHECK(tcpstore::Server::start(r).error().code() ==
        StatusCode::kInvalidArgument);
}

TEST_CASE("relay: upstream killed and restarted mid-job (real processes)") {
  Child upstream;
  REQUIRE(upstream.start(
      {kBin + "/tcpstore-server", "--host", "127.0.0.1", "--port", "0"}));
  const std::uint16_t up_port = readPort(upstream);
  Child relay;
  REQUIRE(
      relay.start({kBin + "/tcpstore-server", "--host", "127.0.0.1", "--port",
                   "0", "--upstream", "127.0.0.1:" + std::to_string(up_port)}));
  const std::uint16_t relay_port = readPort(relay);

  // `a` gives up reconnecting after 1 s (the client library retries a
  // closed connection until its connect timeout).
  Client a = connectTo(relay_port, tcpstore::Dialect::kV2, 1s);
  Client b = connectTo(relay_port);
  REQUIRE(a.set("job/k", "v"));
  CHECK(b.check({"job/k"}).value());  // (get() would count a WAIT upstream)
  CHECK(a.add("job/n", 1).value() == 1);
  // A rank blocked in a WAIT that only the dead upstream could release.
  auto waiter =
      std::async(std::launch::async, [&] { return b.wait({"job/never"}); });
  REQUIRE(upstream.waitStderr(" wait=1 ", Clock::now() + scaled(10s),
                              [&] { upstream.signal(SIGUSR1); }));
  // Two more ranks wait for the same key (a shared WAIT's late joiners:
  // held at the relay, nothing sent upstream for them yet).
  std::vector<tcpstore::test::RawConn> joiners;
  for (int i = 0; i < 2; ++i) {
    joiners.push_back(tcpstore::test::RawConn::connect(relay_port));
    REQUIRE(joiners.back().handshake());
    REQUIRE(joiners.back().send(
        tcpstore::test::keysMsg(tcpstore::test::v2::kWait, {"/job/never"})));
  }
  REQUIRE(relay.waitStderr("shared_waits=3 ", Clock::now() + scaled(10s),
                           [&] { relay.signal(SIGUSR1); }));

  REQUIRE(::kill(upstream.pid(), SIGKILL) == 0);
  (void)upstream.wait(Clock::now() + scaled(5s));
  // The waiter gets a clean error (its connection closed), never a hang.
  REQUIRE(waiter.wait_for(scaled(10s)) == std::future_status::ready);
  CHECK_FALSE(waiter.get().isOk());
  for (auto& j : joiners) {
    std::string got;
    CHECK(j.waitClosed(&got));
    CHECK(got.empty());
  }
  // So does a rank that had used the upstream: its connection was closed,
  // and while the upstream is down the relay refuses its requests.
  auto refused = a.add("job/n", 1);
  CHECK_FALSE(refused.has_value());
  REQUIRE(
      relay.waitStderr("lost the upstream", Clock::now() + scaled(10s), [] {}));

  // The upstream comes back on its port: the relay reconnects and serves.
  Child again;
  REQUIRE(again.start({kBin + "/tcpstore-server", "--host", "127.0.0.1",
                       "--port", std::to_string(up_port)}));
  REQUIRE(readPort(again) == up_port);
  REQUIRE(relay.waitStderr("is back", Clock::now() + scaled(10s), [] {}));
  Client c = connectTo(relay_port);
  REQUIRE(c.set("job/k2", "w"));
  CHECK(c.get("job/k2").value() == "w");
  CHECK(c.add("job/n", 1).value() == 1);  // a fresh upstream: state is new
  CHECK_FALSE(c.check({"job/k"}).value());

  relay.signal(SIGUSR1);
  REQUIRE(relay.waitStderr("reconnects=1", Clock::now() + scaled(10s),
                           [&] { relay.signal(SIGUSR1); }));
  relay.terminate();
  auto rr = relay.wait(Clock::now() + scaled(10s));
  CHECK(rr.exit_code == 0);
  again.terminate();
  CHECK(again.wait(Clock::now() + scaled(10s)).exit_code == 0);
}

// ---- shared WAITs (wait_share.h) --------------------------------------------

namespace {

namespace v2w = tcpstore::test::v2;
using tcpstore::test::byte;
using tcpstore::test::RawConn;
using tcpstore::test::str;
using tcpstore::test::u32le;
using tcpstore::test::u64le;

std::uint64_t waitsAt(const ScopedServer& s) {
  return s->counters()
      .requests[static_cast<int>(tcpstore::protocol::Command::kWait)];
}

// `n` handshaken raw 2.x connections to `port`.
std::vector<RawConn> rawConns(std::uint16_t port, int n) {
  std::vector<RawConn> v;
  for (int i = 0; i < n; ++i) {
    v.push_back(RawConn::connect(port));
    REQUIRE(v.back().handshake());
  }
  return v;
}

// Sets `key` through `setter` and fences with a PING (SET has no reply).
void setAndFence(RawConn& setter, const std::string& key,
                 const std::string& value) {
  REQUIRE(setter.send(byte(v2w::kSet) + str(key) + str(value)));
  REQUIRE(setter.send(tcpstore::test::pingMsg(7)));
  REQUIRE(setter.recv(4) == u32le(7));
}

// Every one of `conns` sent the WAIT and the relay took it (its dispatcher
// counted it; what the relay does with it happens in that same call).
void waitAll(std::vector<RawConn>& conns, const ScopedServer& relay,
             std::initializer_list<std::string_view> keys) {
  const std::uint64_t before = waitsAt(relay);
  for (auto& c : conns)
    REQUIRE(c.send(tcpstore::test::keysMsg(v2w::kWait, keys)));
  REQUIRE(tcpstore::test::eventually(
      [&] { return waitsAt(relay) >= before + conns.size(); }, scaled(10s)));
}

}  // namespace

TEST_CASE("relay: identical WAITs share one upstream WAIT") {
  Pair p = startPair();
  RawConn setter = RawConn::connect(p.upstream->port());
  REQUIRE(setter.handshake());
  constexpr int kWaiters = 8;
  std::vector<RawConn> w = rawConns(p.relay->port(), kWaiters);
  const std::uint64_t up_before = waitsAt(p.upstream);
  waitAll(w, p.relay, {"/sa", "/sb"});
  CHECK(waitsAt(p.relay) >= kWaiters);
  // One key of two, then the other: all are released, once each.
  setAndFence(setter, "/sa", "va");
  setAndFence(setter, "/sb", "vb");
  for (int i = 0; i < kWaiters; ++i) {
    CAPTURE(i);
    CHECK(w[i].recv(1) == std::string(1, '\0'));
    // Its later requests are answered in order (no second STOP_WAITING).
    REQUIRE(w[i].send(byte(v2w::kGet) + str("/sa")));
    CHECK(w[i].recv(8 + 2) == str("va"));
  }
  // One WAIT upstream, plus at most one for waiters that arrived after it
  // was sent (they never join a WAIT already in flight).
  const std::uint64_t up = waitsAt(p.upstream) - up_before;
  const auto rc = p.relay->counters();
  MESSAGE(kWaiters << " WAITs at the relay, " << up << " upstream");
  CHECK(up >= 1);
  CHECK(up <= 2);
  CHECK(rc.relay_upstream_waits == up);
  CHECK(rc.relay_shared_waits == kWaiters);
}

TEST_CASE(
    "relay: a shared WAIT's caller cancels or disconnects, the others are "
    "released") {
  Pair p = startPair();
  RawConn setter = RawConn::connect(p.upstream->port());
  REQUIRE(setter.handshake());
  std::vector<RawConn> w = rawConns(p.relay->port(), 4);
  waitAll(w, p.relay, {"/sc"});
  // w[0] times out: CANCEL_WAIT while the key is missing answers 01, as a
  // server does, and the connection stays usable.
  REQUIRE(w[0].send(byte(v2w::kCancelWait)));
  CHECK(w[0].recv(1) == std::string(1, '\x01'));
  REQUIRE(w[0].send(tcpstore::test::pingMsg(9)));
  CHECK(w[0].recv(4) == u32le(9));
  // w[1] goes away.
  w[1].close();
  setAndFence(setter, "/sc", "vc");
  for (int i = 2; i < 4; ++i) {
    CAPTURE(i);
    CHECK(w[i].recv(1) == std::string(1, '\0'));
  }
  // A cancel after the release: the client reads 00 then 01 (00 above).
  REQUIRE(w[2].send(byte(v2w::kCancelWait)));
  CHECK(w[2].recv(1) == std::string(1, '\x01'));
  // A WAIT of a key that exists, cancelled at once (a timeout of 0): a
  // server answers the WAIT first, so the client reads 00 01, never 01
  // alone (the relay must not answer the cancel itself).
  std::vector<RawConn> quick = rawConns(p.relay->port(), 3);
  for (auto& q : quick) {
    REQUIRE(q.send(tcpstore::test::keysMsg(v2w::kWait, {"/sc"}) +
                   byte(v2w::kCancelWait)));
  }
  for (auto& q : quick) CHECK(q.recv(2) == std::string("\0\x01", 2));
  // The cancelled caller got nothing more: its next reply comes first.
  REQUIRE(w[0].send(byte(v2w::kGet) + str("/sc")));
  CHECK(w[0].recv(8 + 2) == str("vc"));
  REQUIRE(w[3].send(byte(v2w::kGet) + str("/sc")));
  CHECK(w[3].recv(8 + 2) == str("vc"));
}

TEST_CASE(
    "relay: every caller of a shared WAIT cancels: the upstream WAIT is "
    "dropped, a later WAIT of the same keys still works") {
  Pair p = startPair();
  RawConn setter = RawConn::connect(p.upstream->port());
  REQUIRE(setter.handshake());
  std::vector<RawConn> w = rawConns(p.relay->port(), 3);
  waitAll(w, p.relay, {"/sd"});
  REQUIRE(tcpstore::test::eventually(
      [&] { return p.relay->counters().relay_upstream_waits >= 1; },
      scaled(10s)));
  for (auto& c : w) {
    REQUIRE(c.send(byte(v2w::kCancelWait)));
    CHECK(c.recv(1) == std::string(1, '\x01'));
  }
  // The shared WAIT's channel is closed upstream (the server forgets the
  // wait); each cancel went upstream on its client's own channel.
  REQUIRE(tcpstore::test::eventually(
      [&] { return p.upstream->counters().mux_channels_closed >= 1; },
      scaled(10s)));
  std::vector<RawConn> again = rawConns(p.relay->port(), 2);
  waitAll(again, p.relay, {"/sd"});
  setAndFence(setter, "/sd", "vd");
  for (auto& c : again) CHECK(c.recv(1) == std::string(1, '\0'));
  for (auto& c : w) {
    REQUIRE(c.send(tcpstore::test::pingMsg(3)));
    CHECK(c.recv(4) == u32le(3));
  }
}

TEST_CASE("relay: a shared WAIT's caller sends another request meanwhile") {
  // The WAIT moves to the client's own channel, ahead of the request: the
  // client still gets its STOP_WAITING, once, and its reply.
  Pair p = startPair();
  RawConn setter = RawConn::connect(p.upstream->port());
  REQUIRE(setter.handshake());
  std::vector<RawConn> w = rawConns(p.relay->port(), 3);
  waitAll(w, p.relay, {"/se"});
  REQUIRE(w[0].send(byte(v2w::kSet) + str("/other") + str("x")));
  setAndFence(setter, "/se", "ve");
  for (auto& c : w) CHECK(c.recv(1) == std::string(1, '\0'));
  REQUIRE(w[0].send(byte(v2w::kGet) + str("/other")));
  CHECK(w[0].recv(8 + 1) == str("x"));
}

TEST_CASE("relay: shared WAITs through two stacked relays stay exact") {
  Pair p = startPair();
  ServerOptions r;
  r.host = "127.0.0.1";
  r.port = 0;
  r.log_level = "error";
  r.upstream = "127.0.0.1:" + std::to_string(p.relay->port());
  ScopedServer front = ScopedServer::start(r);
  RawConn setter = RawConn::connect(p.upstream->port());
  REQUIRE(setter.handshake());
  const std::uint64_t up_before = waitsAt(p.upstream);
  std::vector<RawConn> w = rawConns(front->port(), 6);
  waitAll(w, front, {"/sf", "/sg"});
  REQUIRE(w[0].send(byte(v2w::kCancelWait)));
  CHECK(w[0].recv(1) == std::string(1, '\x01'));
  setAndFence(setter, "/sf", "1");
  setAndFence(setter, "/sg", "2");
  for (int i = 1; i < 6; ++i) {
    CAPTURE(i);
    CHECK(w[i].recv(1) == std::string(1, '\0'));
    REQUIRE(w[i].send(byte(v2w::kGet) + str("/sg")));
    CHECK(w[i].recv(8 + 1) == str("2"));
  }
  REQUIRE(w[0].send(byte(v2w::kGet) + str("/sf")));
  CHECK(w[0].recv(8 + 1) == str("1"));
  const std::uint64_t up = waitsAt(p.upstream) - up_before;
  MESSAGE("6 WAITs at the front relay, " << up << " at the upstream");
  // 1-2 for the group (late joiners wait for the next send), 1 for the
  // cancelled caller (its WAIT goes upstream with its CANCEL_WAIT).
  CHECK(up <= 3);
}

TEST_CASE(
    "relay: 1.13 and 2.x WAITs of the same keys share one upstream WAIT") {
  Pair p = startPair();
  RawConn setter = RawConn::connect(p.upstream->port());
  REQUIRE(setter.handshake());
  std::vector<RawConn> w = rawConns(p.relay->port(), 2);  // 2.x
  for (int i = 0; i < 3; ++i) {
    w.push_back(RawConn::connect(p.relay->port()));  // 1.13: no handshake
    REQUIRE(w.back().ok());
  }
  const std::uint64_t up_before = waitsAt(p.upstream);
  const std::uint64_t relay_before = waitsAt(p.relay);
  for (std::size_t i = 0; i < w.size(); ++i) {
    const std::uint8_t code = i < 2 ? v2w::kWait : tcpstore::test::v113::kWait;
    REQUIRE(w[i].send(tcpstore::test::keysMsg(code, {"/sh"})));
  }
  REQUIRE(tcpstore::test::eventually(
      [&] { return waitsAt(p.relay) >= relay_before + w.size(); },
      scaled(10s)));
  setAndFence(setter, "/sh", "v");
  for (auto& c : w) CHECK(c.recv(1) == std::string(1, '\0'));
  const std::uint64_t up = waitsAt(p.upstream) - up_before;
  MESSAGE("5 WAITs (2 of 2.x, 3 of 1.13) at the relay, " << up << " upstream");
  CHECK(up <= 2);
}

TEST_CASE(
    "relay: a client that half-closes after a pipelined batch gets every "
    "reply and its writes are applied, behind a relay that holds them") {
  // front (no combining: it tunnels the batch at once) -> middle (combines:
  // the channel's ADD is pending there, the SET behind it queued) ->
  // upstream. The client's EOF must not end its channel at the middle
  // before the queued SET has run, nor before the ADD's reply is back.
  Pair p = startPair();
  ServerOptions r;
  r.host = "127.0.0.1";
  r.port = 0;
  r.log_level = "error";
  r.upstream = "127.0.0.1:" + std::to_string(p.relay->port());
  r.upstream_combine = false;
  ScopedServer front = ScopedServer::start(r);
  using namespace tcpstore::test;
  for (int round = 0; round < 20; ++round) {
    CAPTURE(round);
    const std::string k = "/hc-add-" + std::to_string(round);
    const std::string w =
        "hc-set-" + std::to_string(round);  // "/" + w on the wire
    RawConn c = RawConn::connect(front->port());
    REQUIRE(c.ok());
    REQUIRE(c.handshake());
    // One reply owed: the front does not hold the client (a second one
    // could, see overOutput()), so it sees the EOF with the ADD in flight.
    REQUIRE(c.send(byte(v2::kAdd) + str(k) + i64le(5) + byte(v2::kSet) +
                   str("/" + w) + str("written")));
    c.shutdownWrite();
    std::string got;
    CHECK(c.waitClosed(&got));
    CHECK(toHex(got) == toHex(i64le(5)));
    // Closed only once the upstream applied everything: no wait needed.
    Client direct = connectTo(p.upstream->port());
    auto v = direct.get(w);  // the client adds torch's "/"
    REQUIRE_MESSAGE(v.has_value(), v.error().toString());
    CHECK(*v == "written");
  }
  const auto m = p.relay->counters();
  CHECK(m.relay_combined + m.relay_tunneled > 0);
  CHECK(front->stop().isOk());
}

TEST_CASE(
    "relay: the key lists of shared WAITs count in the relay's memory budget") {
  Pair p = startPair();
  using namespace tcpstore::test;
  const auto gauge = [&] { return p.relay->counters().memory_bytes; };
  RawConn poke = RawConn::connect(p.relay->port());
  REQUIRE(poke.handshake());
  REQUIRE(pingFence(poke));
  const std::uint64_t base = gauge();
  constexpr int kWaiters = 4;
  constexpr int kKeys = 20000;
  std::uint64_t request_bytes = 0;
  std::vector<RawConn> waiters;
  for (int w = 0; w < kWaiters; ++w) {
    std::vector<std::string> keys;
    for (int i = 0; i < kKeys; ++i)
      keys.push_back("/mem/" + std::to_string(w) + "/" + std::to_string(i));
    std::string wait = byte(v2::kWait) + u64le(keys.size());
    for (const std::string& k : keys) wait += str(k);
    request_bytes += wait.size();
    RawConn c = RawConn::connect(p.relay->port());
    REQUIRE(c.ok());
    REQUIRE(c.handshake());
    REQUIRE(c.send(wait));
    waiters.push_back(std::move(c));
  }
  // Every WAIT is in a group (and sent upstream) once the relay counts it.
  CHECK(eventually(
      [&] { return p.relay->counters().relay_shared_waits == kWaiters; }));
  CHECK(eventually([&] { return gauge() >= base + request_bytes; }));
  MESSAGE("relay memory gauge " << base << " -> " << gauge() << " for "
                                << request_bytes << " bytes of WAITs");
  waiters.clear();  // the callers leave: the groups go
  CHECK(eventually([&] { return gauge() < base + request_bytes / 8; }));
}

TEST_CASE(
    "relay: the reply owed before a protocol error arrives before the close") {
  // The ADD's reply is still upstream when the relay decodes the bad bytes
  // behind it in the same write: the relay must not close the client before
  // that reply is delivered (a server writes it, then closes).
  Pair p = startPair();
  using namespace tcpstore::test;
  Client setter = connectTo(p.upstream->port());
  REQUIRE(setter.set("owed-text", "abc"));
  for (int round = 0; round < 40; ++round) {
    CAPTURE(round);
    RawConn c = RawConn::connect(p.relay->port());
    REQUIRE(c.ok());
    REQUIRE(c.handshake());
    const std::string add = byte(v2::kAdd) + str("/owed-k") + i64le(1);
    const std::string bad = round % 2 == 0
                                ? byte(0x7f)  // no such command
                                : byte(v2::kAdd) + str("/owed-text") + i64le(1);
    REQUIRE(c.send(add + bad));
    std::string got;
    CHECK(c.waitClosed(&got));
    REQUIRE(got.size() == 8);
    CHECK(loadU64le(got) == static_cast<std::uint64_t>(round + 1));
  }
}

TEST_CASE(
    "relay: a half-closed client's unreleased WAIT ends with it, as on a "
    "server") {
  // A server closes a half-closed connection once its replies are written;
  // a WAIT not yet released is forgotten (no STOP_WAITING follows). Through
  // two relays the same: the SET before it is applied, the client closed.
  Pair p = startPair();
  ServerOptions r;
  r.host = "127.0.0.1";
  r.port = 0;
  r.log_level = "error";
  r.upstream = "127.0.0.1:" + std::to_string(p.relay->port());
  ScopedServer front = ScopedServer::start(r);
  using namespace tcpstore::test;
  RawConn c = RawConn::connect(front->port());
  REQUIRE(c.ok());
  REQUIRE(c.handshake());
  REQUIRE(c.send(byte(v2::kSet) + str("/hcw") + str("v") +
                 keysMsg(v2::kWait, {"/hcw-never"})));
  c.shutdownWrite();
  std::string got;
  CHECK(c.waitClosed(&got));
  CHECK(got.empty());
  Client direct = connectTo(p.upstream->port());
  auto v = direct.get("hcw");
  REQUIRE(v.has_value());
  CHECK(*v == "v");
  // Nothing is left waiting upstream: setting the key wakes nobody.
  REQUIRE(direct.set("hcw-never", "x"));
  CHECK(eventually([&] {
    return p.upstream->counters().mux_channels_open <= 2 &&
           front->counters().connections_open == 0;
  }));
  CHECK(front->stop().isOk());
}
