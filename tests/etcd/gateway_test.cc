// Real gateway processes (`tcpstore-server --backend etcd://...`) over a real
// 3-member etcd (tests/etcd/etcd_cluster.h), used through tcpstore::Client:
//   - our client's failover across two gateways when one is killed;
//   - a gateway partitioned from etcd (through tests/etcd/tcp_proxy.h): its
//     clients get errors, never an answer; the other gateway serves; the
//     recorded history is linearizable;
//   - a history through both gateways across an etcd leader kill,
//     linearizable.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <future>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "etcd_cluster.h"
#include "gateway_process.h"
#include "history_check.h"
#include "tcp_proxy.h"
#include "tcpstore/client.h"
#include "tests/support/child.h"
#include "tests/support/deadline.h"

namespace {

using tcpstore::Client;
using tcpstore::ClientOptions;
using tcpstore::StatusCode;
using tcpstore::test::Clock;
using tcpstore::test::EtcdCluster;
using tcpstore::test::GatewayProcess;
using tcpstore::test::LinearizabilityChecker;
using tcpstore::test::LinOp;
using tcpstore::test::scaled;
using tcpstore::test::TcpProxy;
using namespace std::chrono_literals;

const std::string kServer = std::string(TCPSTORE_BIN_DIR) + "/tcpstore-server";
const std::string kCli = std::string(TCPSTORE_BIN_DIR) + "/tcpstore-cli";

std::string dataDir(const char* name) {
  return std::string(TCPSTORE_ETCD_DATA_DIR) + "/gw-" + name + "-" +
         std::to_string(::getpid());
}

Client connectTo(std::vector<std::uint16_t> ports,
                 std::chrono::milliseconds timeout = 60s) {
  ClientOptions o;
  for (auto p : ports) o.endpoints.push_back({"127.0.0.1", p});
  o.timeout = scaled(timeout);
  o.connect_timeout = scaled(20s);
  o.share_connections = false;
  auto c = Client::connect(o);
  REQUIRE_MESSAGE(c.has_value(), c.error().toString());
  return *c;
}

std::int64_t nowTicks() { return Clock::now().time_since_epoch().count(); }

// ---- recorded histories ----------------------------------------------------

constexpr int kKeys = 4;

std::string keyName(int k) { return "lin/" + std::to_string(k); }

struct Recorded {
  LinOp op;
  int key = 0;
  int gateway = 0;  // index of the gateway the client used
  bool ok = false;
};

// One client (its own connections, one gateway) running `n` random SET / GET
// / ADD / COMPARE_SET operations on keys taken round-robin from `first_key`,
// recording each one's interval and result. A failed operation is recorded
// with an unknown outcome; after `max_errors` failures the client stops.
std::vector<Recorded> runClient(std::uint16_t port, int gateway,
                                std::uint32_t seed, int n, int first_key,
                                int max_errors, std::atomic<int>* done) {
  std::vector<Recorded> out;
  Client c = connectTo({port}, 30s);
  std::mt19937 rng(seed);
  int errors = 0;
  for (int i = 0; i < n && errors < max_errors; ++i) {
    Recorded r;
    r.key = (first_key + i) % kKeys;
    r.gateway = gateway;
    const std::string key = keyName(r.key);
    LinOp& o = r.op;
    o.start = nowTicks();
    tcpstore::Status st;
    switch (rng() % 4) {
      case 0: {
        o.kind = LinOp::kSet;
        o.value = std::to_string(rng() % 5);
        st = c.set(key, o.value);
        // SET has no reply: a PING on the same connection proves it applied.
        if (st) st = c.ping();
        break;
      }
      case 1: {
        o.kind = LinOp::kGet;
        auto g = c.get(key);
        st = g.error();
        if (g) o.result = *g;
        break;
      }
      case 2: {
        o.kind = LinOp::kAdd;
        o.delta = 1;
        auto a = c.add(key, 1);
        st = a.error();
        if (a) o.result = std::to_string(*a);
        break;
      }
      default: {
        o.kind = LinOp::kCompareSet;
        o.value = std::to_string(rng() % 5);
        o.desired = std::to_string(rng() % 5);
        auto x = c.compareSet(key, o.value, o.desired);
        st = x.error();
        if (x) o.result = *x;
        break;
      }
    }
    o.end = nowTicks();
    r.ok = st.isOk();
    if (!r.ok) {
      ++errors;
      o.known = false;
      o.end = INT64_MAX;
      MESSAGE("gateway ", gateway, " op failed: ", st.toString());
    }
    out.push_back(r);
    ++done[gateway];
  }
  return out;
}

// Checks every key's history (and that one wrong read would be rejected, so
// the check is not vacuous).
void checkLinearizable(const std::vector<Recorded>& all) {
  std::vector<std::vector<LinOp>> per_key(kKeys);
  for (const auto& r : all) per_key[r.key].push_back(r.op);
  checkLinearizableHistories(per_key);
}

void initKeys(std::uint16_t port) {
  Client c = connectTo({port});
  for (int k = 0; k < kKeys; ++k) REQUIRE(c.set(keyName(k), "0"));
  REQUIRE(c.ping());
}

}  // namespace

TEST_CASE(
    "failover: a client waiting on gateway A completes through B when A is "
    "killed") {
  EtcdCluster cluster(TCPSTORE_ETCD_BIN, dataDir("failover"));
  cluster.start();
  cluster.waitLeader();
  GatewayProcess a(kServer, cluster.url("fo")), b(kServer, cluster.url("fo"));

  // The waiter knows both gateways and starts on A (the first).
  Client waiter = connectTo({a.port(), b.port()});
  auto fut = std::async(std::launch::async, [&] { return waiter.get("late"); });
  REQUIRE(a.waitCount("wait", 1));
  a.kill();
  // Another client sets the key through B.
  Client setter = connectTo({b.port()});
  REQUIRE(setter.set("late", "v"));
  REQUIRE(setter.ping());
  REQUIRE(fut.wait_for(scaled(60s)) == std::future_status::ready);
  auto g = fut.get();
  REQUIRE_MESSAGE(g.has_value(), g.error().toString());
  CHECK(*g == "v");
  // Its re-issued WAIT went to B, and later calls go there too.
  CHECK(b.waitCount("wait", 1));
  auto n = waiter.add("n", 2);
  REQUIRE_MESSAGE(n.has_value(), n.error().toString());
  CHECK(*n == 2);
  CHECK(waiter.set("after", "x"));
  CHECK(*setter.get("after") == "x");

  // tcpstore-cli with both addresses: A is gone, B answers.
  const std::string both = "127.0.0.1:" + std::to_string(a.port()) +
                           ",127.0.0.1:" + std::to_string(b.port());
  auto r = tcpstore::test::runProcess(
      {kCli, "--addr", both, "--timeout", "30", "get", "late"}, 60s);
  INFO("stderr: " << r.err);
  CHECK(r.exit_code == 0);
  CHECK(r.out == "v\n");
}

TEST_CASE(
    "partition: a gateway cut off from etcd answers only errors, the other "
    "serves, the history is linearizable") {
  EtcdCluster cluster(TCPSTORE_ETCD_BIN, dataDir("partition"));
  cluster.start();
  cluster.waitLeader();
  // Gateway A reaches each member through a proxy; B directly.
  std::vector<std::unique_ptr<TcpProxy>> proxies;
  std::string url_a = "etcd://";
  for (const auto& ep : cluster.endpoints()) {
    const int port = std::stoi(ep.substr(ep.rfind(':') + 1));
    proxies.push_back(std::make_unique<TcpProxy>(port));
    url_a += "127.0.0.1:" + std::to_string(proxies.back()->port()) + ",";
  }
  url_a.pop_back();
  url_a += "/part?op-timeout-ms=3000&rpc-timeout-ms=500";
  GatewayProcess a(kServer, url_a), b(kServer, cluster.url("part"));
  initKeys(a.port());

  // A waiter that knows both gateways, on A.
  Client waiter = connectTo({a.port(), b.port()});
  auto wait_fut =
      std::async(std::launch::async, [&] { return waiter.get("pw"); });
  REQUIRE(a.waitCount("wait", 1));

  constexpr int kPerGateway = 4, kOpsB = 16, kOpsA = 40;
  std::atomic<int> done[2] = {0, 0};  // operations finished per gateway
  std::vector<std::future<std::vector<Recorded>>> clients;
  for (int g = 0; g < 2; ++g) {
    for (int i = 0; i < kPerGateway; ++i) {
      const auto seed = static_cast<std::uint32_t>(1000 * g + i);
      clients.push_back(std::async(std::launch::async, [&, g, i, seed] {
        return runClient(g == 0 ? a.port() : b.port(), g, seed,
                         g == 0 ? kOpsA : kOpsB, i, g == 0 ? 2 : 1000, done);
      }));
    }
  }
  REQUIRE(tcpstore::test::eventually(
      [&] { return done[0] >= 8 && done[1] >= 8; }, 60s));
  for (auto& p : proxies) p->partition();
  const std::int64_t cut = nowTicks();

  std::vector<Recorded> all;
  for (auto& f : clients) {
    REQUIRE(f.wait_for(scaled(120s)) == std::future_status::ready);
    auto v = f.get();
    all.insert(all.end(), v.begin(), v.end());
  }
  int a_ok = 0, a_failed = 0, b_failed = 0, a_after = 0;
  for (const auto& r : all) {
    if (r.gateway == 1) {
      b_failed += r.ok ? 0 : 1;
      continue;
    }
    r.ok ? ++a_ok : ++a_failed;
    if (r.op.start > cut) {
      ++a_after;
      // Never an answer from the partitioned gateway.
      CHECK_FALSE(r.ok);
    }
  }
  MESSAGE("A: ", a_ok, " answered (before the cut), ", a_failed,
          " failed; B: ", b_failed, " failed of ", kPerGateway * kOpsB);
  CHECK(a_failed >= kPerGateway);  // every A client ran into it
  CHECK(a_after >= 1);
  CHECK(b_failed == 0);  // the other gateway kept serving
  checkLinearizable(all);

  // The waiter on A is released once A gives up its watch: re-issued on B,
  // where the key is set.
  Client setter = connectTo({b.port()});
  REQUIRE(setter.set("pw", "v"));
  REQUIRE(wait_fut.wait_for(scaled(60s)) == std::future_status::ready);
  auto w = wait_fut.get();
  REQUIRE_MESSAGE(w.has_value(), w.error().toString());
  CHECK(*w == "v");

  // Healed, A serves again (its calls resume on the same etcd connections
  // or new ones).
  for (auto& p : proxies) p->heal();
  Client after = connectTo({a.port()}, 60s);
  auto g = after.get("pw");
  REQUIRE_MESSAGE(g.has_value(), g.error().toString());
  CHECK(*g == "v");
}

TEST_CASE(
    "linearizability: a history through two gateway processes across an etcd "
    "leader kill") {
  EtcdCluster cluster(TCPSTORE_ETCD_BIN, dataDir("lin"));
  cluster.start();
  const int leader = cluster.waitLeader();
  GatewayProcess a(kServer, cluster.url("lin")), b(kServer, cluster.url("lin"));
  initKeys(b.port());

  constexpr int kPerGateway = 4, kOps = 16;
  std::atomic<int> done[2] = {0, 0};  // operations finished per gateway
  std::vector<std::future<std::vector<Recorded>>> clients;
  for (int g = 0; g < 2; ++g) {
    for (int i = 0; i < kPerGateway; ++i) {
      const auto seed = static_cast<std::uint32_t>(77 + 1000 * g + i);
      clients.push_back(std::async(std::launch::async, [&, g, i, seed] {
        return runClient(g == 0 ? a.port() : b.port(), g, seed, kOps, i, 1000,
                         done);
      }));
    }
  }
  REQUIRE(tcpstore::test::eventually(
      [&] { return done[0] >= 8 && done[1] >= 8; }, 60s));
  cluster.kill(leader);
  const std::int64_t killed = nowTicks();
  std::vector<Recorded> all;
  for (auto& f : clients) {
    REQUIRE(f.wait_for(scaled(120s)) == std::future_status::ready);
    auto v = f.get();
    all.insert(all.end(), v.begin(), v.end());
  }
  const auto failed = std::count_if(all.begin(), all.end(),
                                    [](const Recorded& r) { return !r.ok; });
  const auto after =
      std::count_if(all.begin(), all.end(),
                    [&](const Recorded& r) { return r.op.end > killed; });
  MESSAGE(all.size(), " operations, ", failed, " failed (unknown outcome), ",
          after, " ended after the leader kill");
  CHECK(after > 0);
  CHECK(all.size() == 2 * kPerGateway * kOps);
  // A leader kill is absorbed by the gateways' retries: most succeed.
  CHECK(failed * 4 < static_cast<std::int64_t>(all.size()));
  checkLinearizable(all);
}
