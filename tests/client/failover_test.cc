// Loopback tests of the client's failover across several endpoints
// (client.h, "Several endpoints"). Two in-process servers stand in for two
// gateways of one store: these tests check the client's mechanics (which
// endpoint, what is re-issued, what is not); tests/etcd/gateway_test.cc runs
// the same against real gateway processes over a real etcd.
#include <doctest/doctest.h>

#include <future>
#include <string>
#include <vector>

#include "protocol/wire.h"
#include "tcpstore/client.h"
#include "tcpstore/server.h"
#include "tests/support/bound_port.h"
#include "tests/support/deadline.h"
#include "tests/support/scoped_server.h"

using namespace std::chrono_literals;
using tcpstore::Client;
using tcpstore::ClientOptions;
using tcpstore::Dialect;
using tcpstore::Endpoint;
using tcpstore::parseEndpoints;
using tcpstore::Server;
using tcpstore::ServerOptions;
using tcpstore::StatusCode;
using tcpstore::protocol::Command;
using tcpstore::test::BoundPort;
using tcpstore::test::eventually;
using tcpstore::test::scaled;
using tcpstore::test::ScopedServer;

namespace {

ScopedServer startLocal() { return ScopedServer::local(ServerOptions{}); }

std::uint64_t count(const Server& s, Command c) {
  return s.counters().requests[static_cast<int>(c)];
}

Client connectAll(std::vector<std::uint16_t> ports, Dialect d = Dialect::kV2) {
  ClientOptions o;
  for (auto p : ports) o.endpoints.push_back({"127.0.0.1", p});
  o.dialect = d;
  o.timeout = scaled(10s);
  o.connect_timeout = scaled(10s);
  o.share_connections = false;
  auto c = Client::connect(o);
  REQUIRE_MESSAGE(c.has_value(), c.error().toString());
  return *c;
}

Client connectOne(const Server& s) { return connectAll({s.port()}); }

}  // namespace

TEST_CASE("parseEndpoints: lists, IPv6 brackets and errors") {
  auto e = parseEndpoints("127.0.0.1:1,[::1]:65535,host.example:29500");
  REQUIRE(e.has_value());
  REQUIRE(e->size() == 3);
  CHECK((*e)[0].host == "127.0.0.1");
  CHECK((*e)[0].port == 1);
  CHECK((*e)[1].host == "::1");
  CHECK((*e)[1].port == 65535);
  CHECK((*e)[2].host == "host.example");
  for (const char* bad : {"", "h", "h:", ":1", "h:0", "h:65536", "h:1,",
                          "h:1,,h:2", "::1:5", "h:1x"}) {
    CAPTURE(bad);
    auto r = parseEndpoints(bad);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code() == StatusCode::kInvalidArgument);
  }
}

TEST_CASE("failover: connect skips an endpoint where nobody listens") {
  auto b = startLocal();
  BoundPort dead;  // connects refused
  Client c = connectAll({dead.port(), b->port()});
  REQUIRE(c.set("k", "v"));
  CHECK(*connectOne(*b).get("k") == "v");
  // Port 0 anywhere in the list is refused before dialling.
  ClientOptions o;
  o.endpoints = {{"127.0.0.1", b->port()}, {"127.0.0.1", 0}};
  CHECK(Client::connect(o).error().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("failover: a wait whose server stops is re-issued on the next") {
  auto a = startLocal();
  auto b = startLocal();
  Client c = connectAll({a->port(), b->port()});
  auto fut = std::async(std::launch::async,
                        [&] { return c.get("late", scaled(30s)); });
  REQUIRE(eventually([&] { return count(*a, Command::kWait) >= 1; }));
  REQUIRE(a->stop());
  // The re-issued WAIT reaches b (which stands in for a gateway over the
  // same store), then a setter there releases it.
  REQUIRE(eventually([&] { return count(*b, Command::kWait) >= 1; }));
  REQUIRE(connectOne(*b).set("late", "v"));
  REQUIRE(fut.wait_for(scaled(10s)) == std::future_status::ready);
  auto g = fut.get();
  REQUIRE_MESSAGE(g.has_value(), g.error().toString());
  CHECK(*g == "v");
  // Later calls go to b without an error.
  CHECK(c.check({"late"}).value());
  auto n = c.add("n", 1);
  REQUIRE(n.has_value());
  CHECK(*n == 1);
}

TEST_CASE("failover: a write whose connection is lost is not re-sent") {
  auto a = startLocal();
  auto b = startLocal();
  Client c = connectAll({a->port(), b->port()});
  // Reply-less writes are confirmed (a PING in the same write) with several
  // endpoints: OK means applied.
  const auto pings = count(*a, Command::kPing);
  REQUIRE(c.set("x", "not a number"));
  CHECK(count(*a, Command::kPing) == pings + 1);
  // a closes the connection on ADD of a non-numeric value: to the client,
  // a lost connection with the request in flight.
  auto r = c.add("x", 1);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code() == StatusCode::kClosed);
  CHECK(r.error().message().find("outcome unknown") != std::string::npos);
  CHECK(count(*b, Command::kAdd) == 0);  // not re-sent
  // The next call went to b.
  auto n = c.add("y", 5);
  REQUIRE(n.has_value());
  CHECK(*n == 5);
  CHECK(count(*b, Command::kAdd) == 1);
  CHECK(count(*a, Command::kAdd) == 1);
}

TEST_CASE("failover: with every endpoint down, typed errors and no hang") {
  BoundPort d1, d2;
  ClientOptions o;
  o.endpoints = {{"127.0.0.1", d1.port()}, {"127.0.0.1", d2.port()}};
  o.connect_timeout = 300ms;
  o.retry.initial_backoff = 20ms;
  const auto start = tcpstore::test::Clock::now();
  auto c = Client::connect(o);
  REQUIRE_FALSE(c.has_value());
  CHECK(c.error().code() == StatusCode::kRefused);
  CHECK(c.error().message().find(std::to_string(d2.port())) !=
        std::string::npos);
  CHECK(tcpstore::test::Clock::now() - start < scaled(5s));
}

TEST_CASE("failover: the 1.13 dialect confirms writes with an empty CHECK") {
  auto a = startLocal();
  auto b = startLocal();
  Client c = connectAll({a->port(), b->port()}, Dialect::kV113);
  const auto checks = count(*a, Command::kCheck);
  REQUIRE(c.set("k", "v"));
  CHECK(count(*a, Command::kCheck) == checks + 1);
  CHECK(*c.get("k") == "v");
}
