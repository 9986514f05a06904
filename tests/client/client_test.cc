// Loopback tests of tcpstore::Client against the in-process tcpstore::Server.
#include "tcpstore/client.h"

#include <doctest/doctest.h>
#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "protocol/codec.h"
#include "store/client/connection.h"
#include "tcpstore/server.h"
#include "tests/support/bound_port.h"
#include "tests/support/deadline.h"
#include "tests/support/scoped_server.h"

using namespace std::chrono_literals;
using tcpstore::Client;
using tcpstore::ClientOptions;
using tcpstore::Dialect;
using tcpstore::Server;
using tcpstore::ServerOptions;
using tcpstore::StatusCode;
using tcpstore::protocol::Command;
using tcpstore::test::Clock;
using tcpstore::test::eventually;
using tcpstore::test::scaled;
using tcpstore::test::ScopedServer;

namespace {

ScopedServer startServer(std::uint16_t port = 0) {
  ServerOptions o;
  o.port = port;
  return ScopedServer::local(o);
}

ClientOptions optionsFor(const Server& s, Dialect d = Dialect::kV2) {
  ClientOptions o;
  o.host = "127.0.0.1";
  o.port = s.port();
  o.dialect = d;
  o.timeout = scaled(10s);
  o.connect_timeout = scaled(10s);
  return o;
}

Client connectTo(const Server& s, Dialect d = Dialect::kV2, bool share = true) {
  auto o = optionsFor(s, d);
  o.share_connections = share;
  auto c = Client::connect(o);
  REQUIRE_MESSAGE(c.has_value(), c.error().toString());
  return *c;
}

std::uint64_t count(const Server& s, Command c) {
  return s.counters().requests[static_cast<int>(c)];
}

// A raw request on a fresh connection (no key mapping): what is on the wire.
tcpstore::Result<tcpstore::client_detail::OwnedReply> raw(
    const Server& s, tcpstore::protocol::Request req, std::uint64_t n = 0) {
  tcpstore::client_detail::ConnectConfig cfg;
  cfg.endpoints = {{"127.0.0.1", s.port()}};
  auto dl = tcpstore::client_detail::deadlineAfter(scaled(5s));
  auto c = tcpstore::client_detail::Connection::open(cfg, dl);
  if (!c) return c.error();
  return (*c)->roundTrip(req, dl, n);
}

std::string rawGet(const Server& s, std::string key) {
  tcpstore::protocol::Request req;
  req.command = Command::kGet;
  req.key = key;
  auto r = raw(s, req);
  REQUIRE_MESSAGE(r.has_value(), r.error().toString());
  return r->value;
}

bool rawExists(const Server& s, std::string key) {
  tcpstore::protocol::Request req;
  req.command = Command::kCheck;
  req.keys.emplace_back(key);
  auto r = raw(s, req);
  REQUIRE_MESSAGE(r.has_value(), r.error().toString());
  return r->byte == tcpstore::protocol::kCheckReady;
}

}  // namespace

TEST_CASE("every operation against our server (2.x)") {
  auto server = startServer();
  Client c = connectTo(*server);
  CHECK(c.dialect() == Dialect::kV2);

  REQUIRE(c.set("k", "v"));
  auto g = c.get("k");
  REQUIRE(g.has_value());
  CHECK(*g == "v");
  CHECK(rawGet(*server, "/k") == "v");  // user key "k" is "/k" on the wire

  auto a = c.add("n", 5);
  REQUIRE(a.has_value());
  CHECK(*a == 5);
  a = c.add("n", -7);
  REQUIRE(a.has_value());
  CHECK(*a == -2);
  CHECK(rawGet(*server, "/n") == "-2");

  // compare_set, the four rows of docs/protocol.md §3.6.
  auto cs = c.compareSet("cs", "", "first");  // missing, expected empty: stores
  REQUIRE(cs.has_value());
  CHECK(*cs == "first");
  cs = c.compareSet("cs2", "x",
                    "y");  // missing, expected non-empty: echoes expected
  REQUIRE(cs.has_value());
  CHECK(*cs == "x");
  auto chk = c.check({"cs2"});
  REQUIRE(chk.has_value());
  CHECK_FALSE(*chk);
  cs = c.compareSet("cs", "first", "second");  // match: replaced
  REQUIRE(cs.has_value());
  CHECK(*cs == "second");
  cs = c.compareSet("cs", "nope", "third");  // mismatch: current value
  REQUIRE(cs.has_value());
  CHECK(*cs == "second");

  chk = c.check({"k", "n"});
  REQUIRE(chk.has_value());
  CHECK(*chk);
  chk = c.check({"k", "missing"});
  REQUIRE(chk.has_value());
  CHECK_FALSE(*chk);
  chk = c.check({});
  REQUIRE(chk.has_value());
  CHECK(*chk);

  CHECK(c.wait({"k", "n"}));
  CHECK(c.wait({}));

  auto nk = c.numKeys();
  REQUIRE(nk.has_value());
  CHECK(*nk == 3);  // /k /n /cs

  auto d = c.deleteKey("cs");
  REQUIRE(d.has_value());
  CHECK(*d);
  d = c.deleteKey("cs");
  REQUIRE(d.has_value());
  CHECK_FALSE(*d);

  REQUIRE(c.append("ap", "xy"));
  REQUIRE(c.append("ap", "z"));
  g = c.get("ap");
  REQUIRE(g.has_value());
  CHECK(*g == "xyz");

  REQUIRE(c.multiSet({"m1", "m2", "m3"}, {"a", "", "c"}));
  auto mg = c.multiGet({"m3", "m1", "m2"});
  REQUIRE(mg.has_value());
  CHECK(*mg == std::vector<std::string>{"c", "a", ""});
  mg = c.multiGet({});
  REQUIRE(mg.has_value());
  CHECK(mg->empty());
  CHECK(c.multiSet({"a"}, {}).code() == StatusCode::kInvalidArgument);

  REQUIRE(c.queuePush("q", "one"));
  REQUIRE(c.queuePush("q", "two"));
  auto ql = c.queueLen("q");
  REQUIRE(ql.has_value());
  CHECK(*ql == 2);
  auto qp = c.queuePop("q");
  REQUIRE(qp.has_value());
  CHECK(*qp == "one");
  qp = c.queuePop("q", false);
  REQUIRE(qp.has_value());
  CHECK(*qp == "two");
  qp = c.queuePop("q", false);
  CHECK(qp.error().code() == StatusCode::kNotFound);

  // A raw, unprefixed key is not a user key: hidden by listKeys.
  tcpstore::protocol::Request req;
  req.command = Command::kAdd;
  req.key = "init/";
  req.number = 1;
  REQUIRE(raw(*server, req).has_value());
  auto lk = c.listKeys();
  REQUIRE(lk.has_value());
  CHECK(*lk == std::vector<std::string>{"ap", "k", "m1", "m2", "m3", "n"});

  CHECK(c.ping());

  // Empty values and binary bytes survive.
  REQUIRE(c.set("empty", ""));
  g = c.get("empty");
  REQUIRE(g.has_value());
  CHECK(g->empty());
  std::string bin("\0\x01\xff/k\xc3\xa9", 7);
  REQUIRE(c.set(bin, bin));
  g = c.get(bin);
  REQUIRE(g.has_value());
  CHECK(*g == bin);

  CHECK(c.barrier("b", 1));
  CHECK(rawGet(*server, "/b") == "1");
  CHECK(c.waitForWorkers(1).code() ==
        StatusCode::kOk);  // init/ was 1: now 2 >= 1
  CHECK(rawGet(*server, "init/") == "2");
  CHECK(c.barrier("x", 0).code() == StatusCode::kInvalidArgument);
}

TEST_CASE("get blocks until another client sets the key") {
  auto server = startServer();
  Client reader = connectTo(*server, Dialect::kV2, false);
  Client writer = connectTo(*server, Dialect::kV2, false);
  auto fut = std::async(std::launch::async,
                        [&] { return reader.get("late", scaled(20s)); });
  REQUIRE(eventually([&] { return count(*server, Command::kWait) >= 1; }));
  REQUIRE(writer.set("late", "here"));
  auto r = fut.get();
  REQUIRE(r.has_value());
  CHECK(*r == "here");
}

TEST_CASE(
    "1.13 dialect against our server: operations, 2.x-only commands refused "
    "locally") {
  auto server = startServer();
  Client c = connectTo(*server, Dialect::kV113);
  CHECK(c.dialect() == Dialect::kV113);
  REQUIRE(c.set("k", "v"));
  auto g = c.get("k");
  REQUIRE(g.has_value());
  CHECK(*g == "v");
  auto a = c.add("n", 3);
  REQUIRE(a.has_value());
  CHECK(*a == 3);
  auto cs = c.compareSet("k", "v", "w");
  REQUIRE(cs.has_value());
  CHECK(*cs == "w");
  auto chk = c.check({"k", "n"});
  REQUIRE(chk.has_value());
  CHECK(*chk);
  CHECK(c.wait({"k"}));
  auto nk = c.numKeys();
  REQUIRE(nk.has_value());
  CHECK(*nk == 2);
  auto d = c.deleteKey("k");
  REQUIRE(d.has_value());
  CHECK(*d);

  const auto before = server->counters().requests_total;
  CHECK(c.append("k", "x").code() == StatusCode::kNotSupported);
  CHECK(c.multiGet({"n"}).error().code() == StatusCode::kNotSupported);
  CHECK(c.multiSet({"n"}, {"1"}).code() == StatusCode::kNotSupported);
  CHECK(c.queuePush("q", "x").code() == StatusCode::kNotSupported);
  CHECK(c.queuePop("q").error().code() == StatusCode::kNotSupported);
  CHECK(c.queueLen("q").error().code() == StatusCode::kNotSupported);
  CHECK(c.listKeys().error().code() == StatusCode::kNotSupported);
  CHECK(c.ping().code() == StatusCode::kNotSupported);
  CHECK(server->counters().requests_total == before);  // nothing was sent
  CHECK(server->counters().requests[static_cast<int>(Command::kValidate)] == 0);

  // Barrier falls back to ADD + SET done (world size 1: this one is last).
  CHECK(c.barrier("b", 1));
  CHECK(rawGet(*server, "/b") == "1");
  CHECK(rawGet(*server, "/b:done") == "1");
}

TEST_CASE("16 threads x 1000 adds on one shared client") {
  auto server = startServer();
  Client c = connectTo(*server);
  std::vector<std::thread> ts;
  std::atomic<int> failures{0};
  for (int t = 0; t < 16; ++t) {
    ts.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) {
        if (!c.add("counter", 1).has_value()) ++failures;
      }
    });
  }
  for (auto& t : ts) t.join();
  CHECK(failures == 0);
  auto v = c.add("counter", 0);
  REQUIRE(v.has_value());
  CHECK(*v == 16000);
  CHECK(server->counters().connections_accepted ==
        1);  // all on the primary connection
}

TEST_CASE("a client started before its server connects through retry") {
  // Until the server starts, the port belongs to a listen socket of the test
  // that accepts each attempt and closes it at once (what a client sees of a
  // server still starting): every retry is an event the test observes, so it
  // waits for three of them instead of sleeping. Then the server adopts that
  // socket, and the next attempt is served.
  tcpstore::test::BoundPort reserved;
  const std::uint16_t port = reserved.port();
  REQUIRE(port != 0);
  const int lfd = reserved.release();
  REQUIRE(::listen(lfd, 16) == 0);
  ClientOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.connect_timeout = scaled(30s);
  o.timeout = scaled(10s);
  o.retry.initial_backoff = 10ms;
  o.retry.max_backoff = 50ms;
  o.share_connections = false;
  auto fut = std::async(std::launch::async, [&] { return Client::connect(o); });
  int refused = 0;
  const auto deadline = Clock::now() + scaled(10s);
  while (refused < 3 && Clock::now() < deadline) {
    pollfd p{lfd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    const int fd = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    linger l{1, 0};  // a reset, like a server that is not there yet
    ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    ::close(fd);
    ++refused;
  }
  REQUIRE(refused == 3);
  // The client has been retrying all along and is still at it.
  CHECK(fut.wait_for(0s) == std::future_status::timeout);
  ServerOptions so;
  so.port = port;
  so.listen_fd = lfd;
  auto server = ScopedServer::local(so);
  REQUIRE(fut.wait_for(scaled(10s)) == std::future_status::ready);
  auto c = fut.get();
  REQUIRE_MESSAGE(c.has_value(), c.error().toString());
  REQUIRE(c->set("k", "v"));
  CHECK(rawGet(*server, "/k") == "v");
}

TEST_CASE("connect deadline: refused, typed, not overshot") {
  tcpstore::test::BoundPort reserved;  // refused for as long as it lives
  const std::uint16_t port = reserved.port();
  ClientOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.connect_timeout = 700ms;
  o.share_connections = false;
  const auto t0 = Clock::now();
  auto c = Client::connect(o);
  const auto took = Clock::now() - t0;
  REQUIRE_FALSE(c.has_value());
  CHECK(c.error().code() == StatusCode::kRefused);
  // Behavioural bound (not a speed claim): the deadline is not exceeded by a
  // whole backoff step as torch's client does (it overshoots by seconds).
  CHECK(took < 700ms + scaled(600ms));
  CHECK(took >= 690ms);
}

TEST_CASE("server stopped during a wait: typed error, no hang") {
  auto server = startServer();
  Client c = connectTo(*server);
  auto fut = std::async(std::launch::async,
                        [&] { return c.wait({"never"}, scaled(30s)); });
  REQUIRE(eventually([&] { return count(*server, Command::kWait) >= 1; }));
  REQUIRE(server->stop());
  REQUIRE(fut.wait_for(scaled(10s)) == std::future_status::ready);
  auto s = fut.get();
  CHECK(s.code() == StatusCode::kClosed);
  // The client fails fast (typed) while nobody listens.
  c.setTimeout(500ms);
  auto r = c.add("x", 1);
  REQUIRE_FALSE(r.has_value());
  CHECK((r.error().code() == StatusCode::kRefused ||
         r.error().code() == StatusCode::kClosed));
}

TEST_CASE("timed-out wait leaves the client usable (2.x: CANCEL_WAIT)") {
  auto server = startServer();
  Client c = connectTo(*server, Dialect::kV2, false);
  Client other = connectTo(*server, Dialect::kV2, false);
  auto s = c.wait({"late"}, 200ms);
  CHECK(s.code() == StatusCode::kTimeout);
  CHECK(count(*server, Command::kCancelWait) == 1);
  auto g = c.get("late", 200ms);
  CHECK(g.error().code() == StatusCode::kTimeout);
  CHECK(count(*server, Command::kCancelWait) == 2);
  REQUIRE(other.set("late", "v"));
  g = c.get("late");
  REQUIRE(g.has_value());
  CHECK(*g == "v");
  // Same pooled connection was kept and reused (primary + one wait conn).
  CHECK(server->counters().connections_accepted == 3);
  // A timeout of 0 on an existing key: the wait completed in the race
  // ("00 01" after CANCEL_WAIT) or at once; either way it is OK.
  CHECK(c.wait({"late"}, 0ms));
  auto a = c.add("after", 1);
  REQUIRE(a.has_value());
  CHECK(*a == 1);
}

TEST_CASE(
    "timed-out wait leaves the client usable (1.13: drop and reconnect)") {
  auto server = startServer();
  Client c = connectTo(*server, Dialect::kV113, false);
  Client other = connectTo(*server, Dialect::kV113, false);
  auto s = c.wait({"late"}, 200ms);
  CHECK(s.code() == StatusCode::kTimeout);
  REQUIRE(
      eventually([&] { return server->counters().connections_closed >= 1; }));
  REQUIRE(
      other.set("late", "v"));  // would make a stale 00 on the old connection
  auto g = c.get("late");
  REQUIRE(g.has_value());
  CHECK(*g == "v");
  auto a = c.add("after", 2);
  REQUIRE(a.has_value());
  CHECK(*a == 2);
  CHECK(count(*server, Command::kCancelWait) == 0);
}

TEST_CASE("a thread blocked in wait does not block another thread's set") {
  auto server = startServer();
  Client c = connectTo(*server);
  auto waiter = std::async(std::launch::async,
                           [&] { return c.wait({"go"}, scaled(20s)); });
  REQUIRE(eventually([&] { return count(*server, Command::kWait) >= 1; }));
  // Same client, other thread: must not queue behind the wait.
  REQUIRE(c.set("go", "1"));
  REQUIRE(waiter.wait_for(scaled(10s)) == std::future_status::ready);
  CHECK(waiter.get());
  auto a = c.add("n", 1);
  REQUIRE(a.has_value());
}

TEST_CASE("read-your-writes across the primary and a wait connection") {
  auto server = startServer();
  Client c = connectTo(*server);
  for (int i = 0; i < 200; ++i) {
    std::string v = std::to_string(i);
    REQUIRE(c.set("ryw", v));
    auto g = c.get("ryw");  // WAIT+GET on a pooled connection
    REQUIRE(g.has_value());
    REQUIRE(*g == v);
  }
}

TEST_CASE("handles to one endpoint share one connection set") {
  auto server = startServer();
  Client a = connectTo(*server);
  Client b = connectTo(*server);
  Client p = a.withPrefix("pg1");
  REQUIRE(a.set("x", "1"));
  REQUIRE(b.set("y", "2"));
  REQUIRE(p.set("z", "3"));
  CHECK(a.add("cnt", 1).value() == 1);
  CHECK(b.add("cnt", 1).value() == 2);
  CHECK(server->counters().connections_accepted == 1);
  CHECK(a.openConnections() == 1);
  CHECK(b.openConnections() == 1);
  // Another dialect is another endpoint.
  Client old = connectTo(*server, Dialect::kV113);
  CHECK(old.add("cnt", 1).value() == 3);
  CHECK(server->counters().connections_accepted == 2);
  // Once every handle is gone, a new connect opens a new set.
  auto port = server->port();
  (void)port;
}

TEST_CASE("prefix views map keys like torch PrefixStore") {
  auto server = startServer();
  Client c = connectTo(*server);
  Client pg = c.withPrefix("pg1");
  CHECK(pg.prefix() == "pg1/");
  REQUIRE(pg.set("k", "v"));
  CHECK(rawGet(*server, "/pg1/k") == "v");
  CHECK(c.get("pg1/k").value() == "v");
  // Nested: PrefixStore("inner", PrefixStore("outer", store)).
  Client nested = c.withPrefix("outer").withPrefix("inner");
  REQUIRE(nested.set("k", "n"));
  CHECK(rawGet(*server, "/outer/inner/k") == "n");
  // torch 2.x group prefixes end in '/': doubled slashes.
  Client g0 = c.withPrefix("default_pg").withPrefix("0/");
  REQUIRE(g0.set("k", "g"));
  CHECK(rawGet(*server, "/default_pg/0//k") == "g");
  // Every keyed op is mapped, key lists element-wise.
  CHECK(pg.add("n", 2).value() == 2);
  CHECK(rawGet(*server, "/pg1/n") == "2");
  CHECK(pg.check({"k", "n"}).value());
  CHECK(pg.wait({"k", "n"}));
  CHECK(pg.multiGet({"k", "n"}).value() == std::vector<std::string>{"v", "2"});
  CHECK(pg.barrier("bar", 1));
  CHECK(rawGet(*server, "/pg1/bar") == "1");
  // numKeys is unprefixed (whole server).
  CHECK(pg.numKeys().value() == c.numKeys().value());
  // listKeys under a view: only that view's keys, stripped.
  auto lk = pg.listKeys();
  REQUIRE(lk.has_value());
  CHECK(*lk == std::vector<std::string>{"bar", "k", "n"});
  auto all = c.listKeys();
  REQUIRE(all.has_value());
  CHECK(*all == std::vector<std::string>{"default_pg/0//k", "outer/inner/k",
                                         "pg1/bar", "pg1/k", "pg1/n"});
  // ClientOptions::prefix is the same as withPrefix.
  auto o = optionsFor(*server);
  o.prefix = "pg1";
  auto viaOpt = Client::connect(o);
  REQUIRE(viaOpt.has_value());
  CHECK(viaOpt->get("k").value() == "v");
  // waitForWorkers ignores the prefix: torch's raw init/.
  CHECK(pg.waitForWorkers(1));
  CHECK(rawGet(*server, "init/") == "1");
  CHECK_FALSE(rawExists(*server, "/pg1/init/"));
}

TEST_CASE(
    "barrier and waitForWorkers release everyone, server-side (2.x BARRIER)") {
  auto server = startServer();
  constexpr int kN = 4;
  std::vector<Client> cs;
  for (int i = 0; i < kN; ++i)
    cs.push_back(connectTo(*server, Dialect::kV2, false));
  std::vector<std::future<tcpstore::Status>> fs;
  for (int i = 0; i < kN; ++i) {
    fs.push_back(std::async(std::launch::async, [&, i] {
      auto s = cs[i].waitForWorkers(kN, scaled(20s));
      if (!s) return s;
      return cs[i].barrier("round1", kN, scaled(20s));
    }));
  }
  for (auto& f : fs) CHECK(f.get());
  CHECK(count(*server, Command::kBarrier) == 2 * kN);
  CHECK(count(*server, Command::kGet) == kN);  // waitForWorkers' count check
  CHECK(count(*server, Command::kSet) == kN);  // init/done
  CHECK(count(*server, Command::kAdd) == 0);
  CHECK(count(*server, Command::kWait) == 0);
  CHECK(rawGet(*server, "init/") == std::to_string(kN));
  CHECK(rawGet(*server, "/round1") == std::to_string(kN));
}

TEST_CASE("barrier fallback (1.13 dialect) releases everyone without polling") {
  auto server = startServer();
  constexpr int kN = 4;
  std::vector<Client> cs;
  for (int i = 0; i < kN; ++i)
    cs.push_back(connectTo(*server, Dialect::kV113, false));
  std::vector<std::future<tcpstore::Status>> fs;
  for (int i = 0; i < kN; ++i) {
    fs.push_back(std::async(std::launch::async, [&, i] {
      auto s = cs[i].waitForWorkers(kN, scaled(20s));
      if (!s) return s;
      return cs[i].barrier("round1", kN, scaled(20s));
    }));
  }
  for (auto& f : fs) CHECK(f.get());
  CHECK(count(*server, Command::kAdd) == 2 * kN);
  CHECK(count(*server, Command::kSet) == 2);
  CHECK(count(*server, Command::kWait) == 2 * (kN - 1));
  CHECK(count(*server, Command::kGet) == 0);
  CHECK(rawGet(*server, "init/") == std::to_string(kN));
  CHECK(rawGet(*server, "init/done") == "1");
  CHECK(rawGet(*server, "/round1:done") == "1");
}

TEST_CASE("barrier timeout is typed and leaves the arrival counted") {
  auto server = startServer();
  Client c = connectTo(*server);
  auto s = c.barrier("bt", 2, 200ms);
  CHECK(s.code() == StatusCode::kTimeout);
  CHECK(rawGet(*server, "/bt") == "1");
  // One later arrival completes it at once.
  Client d = connectTo(*server, Dialect::kV2, false);
  CHECK(d.barrier("bt", 2, scaled(5s)));
  CHECK(c.add("still-usable", 1).value() == 1);
}

TEST_CASE("waitForWorkers counts together with torch-style ADD init/ ranks") {
  auto server = startServer();
  Client c = connectTo(*server);
  auto fut = std::async(std::launch::async,
                        [&] { return c.waitForWorkers(3, scaled(20s)); });
  REQUIRE(eventually([&] { return count(*server, Command::kBarrier) >= 1; }));
  // Two torch ranks: they only send ADD init/ 1 (no prefix).
  for (int i = 0; i < 2; ++i) {
    tcpstore::protocol::Request req;
    req.command = Command::kAdd;
    req.key = "init/";
    req.number = 1;
    auto r = raw(*server, req);
    REQUIRE(r.has_value());
    CHECK(r->number == 2 + i);
  }
  REQUIRE(fut.wait_for(scaled(10s)) == std::future_status::ready);
  CHECK(fut.get());
}

TEST_CASE("host names and IPv6") {
  auto server = startServer();
  auto o = optionsFor(*server);
  o.host = "localhost";
  o.share_connections = false;
  auto c = Client::connect(o);
  REQUIRE_MESSAGE(c.has_value(), c.error().toString());
  CHECK(c->set("h", "1"));

  // IPv6 loopback, with and without brackets, against a dual-stack server.
  ServerOptions so;
  so.port = 0;
  so.log_level = "error";
  auto s6 = ScopedServer::start(so);  // "::" dual stack by default
  o.port = s6->port();
  o.host = "[::1]";
  auto c6 = Client::connect(o);
  REQUIRE_MESSAGE(c6.has_value(), c6.error().toString());
  CHECK(c6->set("v6", "1"));
  CHECK(c6->get("v6").value() == "1");

  o.host = "no-such-host.invalid";
  o.connect_timeout = 300ms;
  auto bad = Client::connect(o);
  REQUIRE_FALSE(bad.has_value());
  CHECK(bad.error().code() == StatusCode::kRefused);
}

TEST_CASE("invalid arguments") {
  ClientOptions o;
  o.port = 0;
  CHECK(Client::connect(o).error().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("a restarted server is reconnected to lazily on the next call") {
  auto server = startServer();
  const std::uint16_t port = server->port();
  auto o = optionsFor(*server);
  o.share_connections = false;
  auto c = Client::connect(o);
  REQUIRE(c.has_value());
  REQUIRE(c->set("k", "1"));
  CHECK(c->get("k").value() == "1");  // opens a pooled wait connection too
  REQUIRE(server->stop());
  server = startServer(port);  // same port, empty store
  // Both the primary and the idle pooled connection are dead: detected
  // before use and replaced (the request was never sent on a dead socket).
  REQUIRE(c->set("k", "2"));
  CHECK(c->get("k").value() == "2");
  CHECK(c->numKeys().value() == 1);
}

TEST_CASE("large values and many keys in one reply") {
  auto server = startServer();
  Client c = connectTo(*server);
  std::string big(5 * 1024 * 1024, 'x');
  for (std::size_t i = 0; i < big.size(); i += 4093)
    big[i] = static_cast<char>(i);
  REQUIRE(c.set("big", big));
  auto g = c.get("big");
  REQUIRE(g.has_value());
  CHECK(*g == big);
  std::vector<std::string> keys;
  std::vector<std::string> values;
  for (int i = 0; i < 2000; ++i) {
    keys.push_back("mk" + std::to_string(i));
    values.push_back(std::string(static_cast<std::size_t>(i % 50), 'v'));
  }
  REQUIRE(c.multiSet(keys, values));
  auto mg = c.multiGet(keys);
  REQUIRE(mg.has_value());
  CHECK(*mg == values);
  auto lk = c.listKeys();
  REQUIRE(lk.has_value());
  CHECK(lk->size() == 2001);
}

TEST_CASE(
    "many concurrent waiters each get a connection, and the idle pool is "
    "bounded") {
  auto server = startServer();
  auto o = optionsFor(*server);
  o.max_idle_wait_connections = 2;
  o.share_connections = false;
  auto c = Client::connect(o);
  REQUIRE(c.has_value());
  constexpr int kWaiters = 12;
  std::vector<std::future<tcpstore::Status>> fs;
  for (int i = 0; i < kWaiters; ++i) {
    fs.push_back(std::async(std::launch::async, [&, i] {
      return c->wait({"w" + std::to_string(i)}, scaled(20s));
    }));
  }
  REQUIRE(
      eventually([&] { return count(*server, Command::kWait) == kWaiters; }));
  CHECK(c->openConnections() == 1 + kWaiters);
  for (int i = 0; i < kWaiters; ++i)
    REQUIRE(c->set("w" + std::to_string(i), "1"));
  for (auto& f : fs) CHECK(f.get());
  CHECK(c->openConnections() == 1 + 2);  // primary + max idle
}
