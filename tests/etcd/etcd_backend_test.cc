// EtcdBackend against a real 3-member etcd cluster (tests/etcd/etcd_cluster.h)
// through BackendHarness (the dispatcher's side of the seam).
#include "store/etcd/etcd_backend.h"

#include <doctest/doctest.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <random>
#include <set>

#include "backend_harness.h"
#include "etcd_cluster.h"
#include "history_check.h"
#include "store/etcd/etcd_admin.h"
#include "store/keyspace.h"
#include "tests/support/child.h"

namespace {

using tcpstore::Status;
using tcpstore::store::EtcdBackend;
using tcpstore::store::EtcdOptions;
using tcpstore::store::parseEtcdUrl;
using tcpstore::test::BackendHarness;
using tcpstore::test::EtcdCluster;
using tcpstore::test::OwnedRequest;
using Command = tcpstore::protocol::Command;
using namespace std::chrono_literals;

std::string dataDir(const char* name) {
  return std::string(TCPSTORE_ETCD_DATA_DIR) + "/" + name + "-" +
         std::to_string(::getpid());
}

EtcdOptions optionsFor(const EtcdCluster& c, const std::string& prefix) {
  auto r = parseEtcdUrl(c.url(prefix));
  REQUIRE(r.has_value());
  EtcdOptions o = *r;
  o.rpc_timeout = 1000ms;
  o.op_timeout = 20000ms;
  return o;
}

// ---- request builders ------------------------------------------------------
OwnedRequest req(Command c) {
  OwnedRequest r;
  r.command = c;
  return r;
}
OwnedRequest set(std::string k, std::string v) {
  auto r = req(Command::kSet);
  r.key = std::move(k);
  r.value = std::move(v);
  return r;
}
OwnedRequest get(std::string k) {
  auto r = req(Command::kGet);
  r.key = std::move(k);
  return r;
}
OwnedRequest add(std::string k, std::int64_t d) {
  auto r = req(Command::kAdd);
  r.key = std::move(k);
  r.number = d;
  return r;
}
OwnedRequest cas(std::string k, std::string expected, std::string desired) {
  auto r = req(Command::kCompareSet);
  r.key = std::move(k);
  r.value = std::move(expected);
  r.desired = std::move(desired);
  return r;
}
OwnedRequest append(std::string k, std::string v) {
  auto r = req(Command::kAppend);
  r.key = std::move(k);
  r.value = std::move(v);
  return r;
}
OwnedRequest del(std::string k) {
  auto r = req(Command::kDeleteKey);
  r.key = std::move(k);
  return r;
}
OwnedRequest keysReq(Command c, std::vector<std::string> keys) {
  auto r = req(c);
  r.keys = std::move(keys);
  return r;
}
OwnedRequest multiSet(std::vector<std::string> keys,
                      std::vector<std::string> values) {
  auto r = req(Command::kMultiSet);
  r.keys = std::move(keys);
  r.values = std::move(values);
  return r;
}
OwnedRequest barrier(std::string k, std::int64_t world_size) {
  auto r = req(Command::kBarrier);
  r.key = std::move(k);
  r.number = world_size;
  return r;
}
OwnedRequest queue(Command c, std::string k, std::string v = {}) {
  auto r = req(c);
  r.key = std::move(k);
  r.value = std::move(v);
  return r;
}
OwnedRequest ping(std::uint32_t nonce) {
  auto r = req(Command::kPing);
  r.u32 = nonce;
  return r;
}

std::int64_t i64(const std::string& b) {
  REQUIRE(b.size() == 8);
  return static_cast<std::int64_t>(tcpstore::protocol::loadU64(
      reinterpret_cast<const unsigned char*>(b.data())));
}

// The Keyspace's answer to one request: its bytes for `conn`, or "closed".
struct Answer {
  bool closed = false;
  std::string bytes;
  bool operator==(const Answer&) const = default;
};

Answer keyspaceAnswer(tcpstore::store::Keyspace& ks,
                      tcpstore::store::ConnId conn, const OwnedRequest& r) {
  tcpstore::store::Effects fx;
  const auto view = r.view();
  Status st = ks.apply(conn, view, fx);
  Answer a;
  if (!st.isOk()) {
    a.closed = true;
    ks.disconnect(conn);
    return a;
  }
  for (const auto& s : fx.sends())
    if (s.conn == conn) a.bytes.append(fx.bytesOf(s));
  return a;
}

Answer etcdAnswer(BackendHarness& h, tcpstore::store::ConnId conn,
                  const OwnedRequest& r) {
  Answer a;
  a.bytes = h.roundTrip(conn, r);
  a.closed = h.conn(conn).closed;
  if (a.closed) a.bytes.clear();
  return a;
}

}  // namespace

TEST_CASE("parseEtcdUrl: endpoints and prefix and errors") {
  auto o = parseEtcdUrl("etcd://127.0.0.1:2379,10.0.0.2:2380/jobA");
  REQUIRE(o.has_value());
  CHECK(o->endpoints ==
        std::vector<std::string>{"127.0.0.1:2379", "10.0.0.2:2380"});
  CHECK(o->prefix == "/jobA/");
  auto d = parseEtcdUrl("etcd://h:1");
  REQUIRE(d.has_value());
  CHECK(d->prefix == "/tcpstore/");
  CHECK_FALSE(parseEtcdUrl("http://h:1").has_value());
  CHECK_FALSE(parseEtcdUrl("etcd://").has_value());
  CHECK_FALSE(parseEtcdUrl("etcd://h").has_value());
  CHECK_FALSE(parseEtcdUrl("etcd://h:0").has_value());
  CHECK_FALSE(parseEtcdUrl("etcd://h:70000/x").has_value());
  auto q = parseEtcdUrl(
      "etcd://h:1/j?op-timeout-ms=3000&rpc-timeout-ms=500&combine-adds=0");
  REQUIRE(q.has_value());
  CHECK(q->prefix == "/j/");
  CHECK(q->op_timeout == std::chrono::milliseconds(3000));
  CHECK(q->rpc_timeout == std::chrono::milliseconds(500));
  CHECK_FALSE(q->combine_adds);
  auto q2 = parseEtcdUrl("etcd://h:1?combine-adds=1");
  REQUIRE(q2.has_value());
  CHECK(q2->prefix == "/tcpstore/");
  CHECK(q2->combine_adds);
  for (const char* bad :
       {"etcd://h:1?x=1", "etcd://h:1?op-timeout-ms=0",
        "etcd://h:1?op-timeout-ms", "etcd://h:1/p?combine-adds=2",
        "etcd://h:1?rpc-timeout-ms=1s"}) {
    CAPTURE(bad);
    CHECK_FALSE(parseEtcdUrl(bad).has_value());
  }
  CHECK(tcpstore::store::prefixRangeEnd("/a/") == "/a0");
}

TEST_CASE(
    "differential: the same requests give the same bytes as the in-memory "
    "keyspace") {
  EtcdCluster cluster(TCPSTORE_ETCD_BIN, dataDir("diff"));
  cluster.start();
  EtcdBackend backend(optionsFor(cluster, "diff"));
  BackendHarness h(backend);
  REQUIRE(h.openStatus().isOk());
  tcpstore::store::Keyspace ks;

  // Each error closes the connection on both sides: move on to a new one.
  tcpstore::store::ConnId conn = 1;
  const std::vector<OwnedRequest> script = {
      ping(77),
      req(Command::kGetNumKeys),
      set("a", "1"),
      get("a"),
      get("missing"),  // closes
      set(std::string("bin\0key", 7), std::string("\0\xff\x01", 3)),
      get(std::string("bin\0key", 7)),
      add("a", 41),
      add("a", -2),
      add("fresh", 5),
      add("fresh", 0),
      set("text", "abc"),
      add("text", 1),  // closes: non-numeric
      set("spaced", "  12xyz"),
      add("spaced", 1),
      keysReq(Command::kCheck, {"a", "text"}),
      keysReq(Command::kCheck, {"a", "nope"}),
      keysReq(Command::kCheck, {}),
      cas("c", "", "first"),       // missing, expected empty: stores
      cas("c", "", "second"),      // present, mismatch: current value
      cas("c", "first", "third"),  // match: stores
      cas("d", "x", "y"),          // missing, expected non-empty: expected
      cas("e", "", ""),            // stores the empty value
      cas("e", "", "z"),           // present empty value equal to "": stores
      get("e"),
      append("ap", "he"),
      append("ap", "llo"),
      get("ap"),
      multiSet({"m1", "m2", "m1"}, {"x", "y", "z"}),
      keysReq(Command::kMultiGet, {"m1", "m2", "a"}),
      keysReq(Command::kMultiGet, {"m1", "absent"}),  // closes
      keysReq(Command::kMultiGet, {}),
      keysReq(Command::kWait, {"a", "m2"}),  // all present: released at once
      req(Command::kCancelWait),
      del("m2"),
      del("m2"),
      keysReq(Command::kCheck, {"m2"}),
      barrier("bar", 1),  // completes at once
      barrier("bar", 2),
      barrier("text", 1),  // closes: non-numeric
      req(Command::kGetNumKeys),
      // Queues: FIFO, the length before the pop in its reply, 0 when empty;
      // a non-empty queue makes its key exist for CHECK and WAIT but not
      // for GET or GETNUMKEYS.
      queue(Command::kQueuePush, "q", "one"),
      queue(Command::kQueuePush, "q", std::string("t\0wo", 4)),
      queue(Command::kQueuePush, "q", ""),
      queue(Command::kQueueLen, "q"),
      queue(Command::kQueueLen, "q2"),
      keysReq(Command::kCheck, {"q"}),
      keysReq(Command::kWait, {"q", "a"}),  // released at once
      req(Command::kGetNumKeys),
      queue(Command::kQueuePop, "q"),
      queue(Command::kQueuePop, "q"),
      queue(Command::kQueueLen, "q"),
      queue(Command::kQueuePop, "q"),
      queue(Command::kQueuePop, "q"),  // empty
      queue(Command::kQueueLen, "q"),
      keysReq(Command::kCheck, {"q"}),
      queue(Command::kQueuePush, std::string("b\0", 2), "x"),
      queue(Command::kQueuePush, "b", "y"),  // another queue
      queue(Command::kQueuePop, "b"),
      queue(Command::kQueuePop, std::string("b\0", 2)),
      queue(Command::kQueuePush, "a", "queue under a key with a value"),
      get("a"),
      queue(Command::kQueuePop, "a"),
      req(Command::kGetNumKeys),
  };
  for (std::size_t i = 0; i < script.size(); ++i) {
    CAPTURE(i);
    const Answer want = keyspaceAnswer(ks, conn, script[i]);
    const Answer got = etcdAnswer(h, conn, script[i]);
    CHECK(got.closed == want.closed);
    CHECK(got.bytes == want.bytes);
    if (want.closed || got.closed) ++conn;
  }

  // MULTI_SET / MULTI_GET over etcd's 128-op Txn limit (several Txns).
  std::vector<std::string> keys, values;
  for (int i = 0; i < 300; ++i) {
    keys.push_back("bulk/" + std::to_string(i));
    values.push_back(std::string(static_cast<std::size_t>(i % 7), 'v'));
  }
  for (const auto& r :
       {multiSet(keys, values), keysReq(Command::kMultiGet, keys),
        keysReq(Command::kCheck, keys), req(Command::kGetNumKeys)}) {
    const Answer want = keyspaceAnswer(ks, conn, r);
    const Answer got = etcdAnswer(h, conn, r);
    CHECK_FALSE(got.closed);
    CHECK(got.bytes == want.bytes);
  }
}

TEST_CASE(
    "differential: 1.13 WATCH_KEY notifications are the in-memory keyspace's") {
  EtcdCluster cluster(TCPSTORE_ETCD_BIN, dataDir("watchkey"));
  cluster.start();
  EtcdBackend backend(optionsFor(cluster, "wk"));
  BackendHarness h(backend);
  REQUIRE(h.openStatus().isOk());
  tcpstore::store::Keyspace ks;
  // Connection 1 watches "wk" twice (two copies of each notification) and
  // "other" once; connection 2 writes.
  std::string want_watcher;
  auto both = [&](tcpstore::store::ConnId c, const OwnedRequest& r) {
    tcpstore::store::Effects fx;
    const auto view = r.view();
    const Status st = ks.apply(c, view, fx);
    std::string mine;
    for (const auto& snd : fx.sends()) {
      if (snd.conn == 1) want_watcher.append(fx.bytesOf(snd));
      if (snd.conn == c && c != 1) mine.append(fx.bytesOf(snd));
    }
    const std::string got = h.roundTrip(c, r);
    CHECK(st.isOk());
    if (c != 1) CHECK(got == mine);
  };
  both(1, queue(Command::kWatchKey, "wk"));
  both(1, queue(Command::kWatchKey, "wk"));
  both(1, queue(Command::kWatchKey, "other"));
  const std::vector<OwnedRequest> writes = {
      set("wk", "a"),                         // created
      set("wk", "b"),                         // updated a -> b
      append("wk", "c"),                      // updated b -> bc
      cas("wk", "bc", "d"),                   // stores: updated
      cas("wk", "zz", "e"),                   // mismatch: nothing
      set("unwatched", "1"),                  // nothing
      del("wk"),                              // deleted d -> ''
      del("wk"),                              // missing: nothing
      add("wk", 5),                           // created
      multiSet({"wk", "other"}, {"m", "o"}),  // updated, created
      set("other", std::string("\0\xff", 2)),
  };
  for (const auto& w : writes) both(2, w);
  CHECK(h.waitFor(
      [&] { return h.connLocked(1).bytes.size() >= want_watcher.size(); },
      30s));
  // The three registration replies, then the notifications.
  CHECK(want_watcher.substr(0, 3) == std::string(3, '\x03'));
  CHECK(h.conn(1).bytes == want_watcher);
  CHECK_FALSE(h.conn(1).closed);
  // A watcher that goes away gets nothing more; the others still do.
  h.disconnect(1);
  CHECK(h.roundTrip(3, queue(Command::kWatchKey, "wk")) == "\x03");
  CHECK(h.roundTrip(2, set("wk", "z")).empty());
  CHECK(h.waitFor([&] { return h.connLocked(3).bytes.size() > 1; }, 30s));
  const std::size_t before = h.bytesOf(1);
  CHECK(h.roundTrip(4, ping(1)).size() == 4);  // fence
  CHECK(h.bytesOf(1) == before);
}

TEST_CASE("queues: a push through another gateway releases one waiter") {
  EtcdCluster cluster(TCPSTORE_ETCD_BIN, dataDir("queue"));
  cluster.start();
  EtcdBackend a(optionsFor(cluster, "job")), b(optionsFor(cluster, "job"));
  BackendHarness ha(a), hb(b);
  REQUIRE(ha.openStatus().isOk());
  REQUIRE(hb.openStatus().isOk());
  const std::string released(1, '\0');
  // Two blocking pops on A (WAIT, as the clients send before QUEUE_POP).
  CHECK(ha.roundTrip(1, keysReq(Command::kWait, {"jobs"})).empty());
  CHECK(ha.roundTrip(2, keysReq(Command::kWait, {"jobs"})).empty());
  // One item pushed through B: the oldest waiter only is released.
  CHECK(hb.roundTrip(1, queue(Command::kQueuePush, "jobs", "j1")).empty());
  CHECK(ha.waitFor([&] { return ha.connLocked(1).bytes == released; }, 30s));
  auto pop = [] {
    std::string out;
    tcpstore::protocol::appendI64(out, 1);
    tcpstore::protocol::appendStr(out, "j1");
    return out;
  }();
  CHECK(ha.roundTrip(1, queue(Command::kQueuePop, "jobs")) == pop);
  // The second waiter is still waiting; the next push releases it.
  CHECK(ha.bytesOf(2) == 0);
  CHECK(hb.roundTrip(1, queue(Command::kQueuePush, "jobs", "j2")).empty());
  CHECK(ha.waitFor([&] { return ha.connLocked(2).bytes == released; }, 30s));
  CHECK(hb.roundTrip(3, queue(Command::kQueueLen, "jobs")) == [] {
    std::string out;
    tcpstore::protocol::appendI64(out, 1);
    return out;
  }());
  // Concurrent pops through both gateways of 20 items: each item once.
  for (int i = 0; i < 20; ++i) {
    CHECK(hb.roundTrip(4, queue(Command::kQueuePush, "many", std::to_string(i)))
              .empty());
  }
  for (int i = 0; i < 12; ++i) {
    ha.send(10 + i % 3, queue(Command::kQueuePop, "many"));
    hb.send(10 + i % 3, queue(Command::kQueuePop, "many"));
  }
  auto all_done = [&](BackendHarness& h) {
    return h.waitFor(
        [&] {
          for (tcpstore::store::ConnId c = 10; c < 13; ++c)
            if (h.connLocked(c).done < 4) return false;
          return true;
        },
        60s);
  };
  REQUIRE(all_done(ha));
  REQUIRE(all_done(hb));
  std::multiset<std::string> got;
  int empty = 0;
  for (BackendHarness* h : {&ha, &hb}) {
    for (tcpstore::store::ConnId c = 10; c < 13; ++c) {
      const auto conn = h->conn(c);
      CHECK_FALSE(conn.closed);
      std::string_view rest = conn.bytes;
      for (int k = 0; k < 4; ++k) {
        REQUIRE(rest.size() >= 8);
        const auto n = i64(std::string(rest.substr(0, 8)));
        rest.remove_prefix(8);
        if (n == 0) {
          ++empty;
          continue;
        }
        const auto len =
            static_cast<std::size_t>(i64(std::string(rest.substr(0, 8))));
        got.insert(std::string(rest.substr(8, len)));
        rest.remove_prefix(8 + len);
      }
    }
  }
  CHECK(empty == 4);
  CHECK(got.size() == 20);
  CHECK(std::set<std::string>(got.begin(), got.end()).size() == 20);
}

TEST_CASE("wait: released by a set through another gateway") {
  EtcdCluster cluster(TCPSTORE_ETCD_BIN, dataDir("wait"));
  cluster.start();
  EtcdBackend a(optionsFor(cluster, "job")), b(optionsFor(cluster, "job"));
  BackendHarness ha(a), hb(b);
  REQUIRE(ha.openStatus().isOk());
  REQUIRE(hb.openStatus().isOk());

  // Four waiters on gateway A (one watch serves them all).
  for (tcpstore::store::ConnId c = 1; c <= 4; ++c) {
    CHECK(ha.roundTrip(c, keysReq(Command::kWait, {"k1", "k2"})).empty());
  }
  CHECK(a.numWaitingConnections() == 4);
  hb.roundTrip(1, set("k1", "v"));
  // Fence: a round trip through A's etcd client after the watch had time to
  // deliver k1 still leaves the waiters waiting on k2.
  CHECK(ha.roundTrip(9, keysReq(Command::kCheck, {"k1"})) ==
        std::string(1, '\0'));
  for (tcpstore::store::ConnId c = 1; c <= 4; ++c)
    CHECK(ha.conn(c).bytes.empty());
  hb.roundTrip(1, set("k2", "v"));
  CHECK(ha.waitFor(
      [&] {
        for (tcpstore::store::ConnId c = 1; c <= 4; ++c)
          if (ha.connLocked(c).bytes != std::string(1, '\0')) return false;
        return true;
      },
      10s));
  CHECK(a.numWaitingConnections() == 0);

  // A cancelled wait is not released later.
  CHECK(ha.roundTrip(5, keysReq(Command::kWait, {"k3"})).empty());
  CHECK(ha.roundTrip(5, req(Command::kCancelWait)) == std::string(1, '\x01'));
  hb.roundTrip(1, set("k3", "v"));
  hb.roundTrip(1, set("k4", "v"));
  CHECK(ha.roundTrip(6, keysReq(Command::kWait, {"k4"})) ==
        std::string(1, '\0'));
  CHECK(ha.conn(5).bytes == std::string(1, '\x01'));
}

TEST_CASE("add: concurrent adds from two gateways are exact and combined") {
  EtcdCluster cluster(TCPSTORE_ETCD_BIN, dataDir("add"));
  cluster.start();
  EtcdBackend a(optionsFor(cluster, "job")), b(optionsFor(cluster, "job"));
  BackendHarness ha(a), hb(b);
  REQUIRE(ha.openStatus().isOk());
  REQUIRE(hb.openStatus().isOk());

  constexpr int kConns = 32, kAdds = 10;  // per gateway
  for (int round = 0; round < kAdds; ++round) {
    for (tcpstore::store::ConnId c = 1; c <= kConns; ++c) {
      ha.send(c, add("init/", 1));
      hb.send(c, add("init/", 1));
    }
  }
  auto allDone = [&](BackendHarness& h) {
    return h.waitFor(
        [&] {
          for (tcpstore::store::ConnId c = 1; c <= kConns; ++c)
            if (h.connLocked(c).done < kAdds || h.connLocked(c).closed)
              return false;
          return true;
        },
        60s);
  };
  REQUIRE(allDone(ha));
  REQUIRE(allDone(hb));
  // Every caller got its own value: together exactly 1..N.
  std::set<std::int64_t> seen;
  for (auto* h : {&ha, &hb}) {
    for (tcpstore::store::ConnId c = 1; c <= kConns; ++c) {
      const std::string bytes = h->conn(c).bytes;
      REQUIRE(bytes.size() == 8 * kAdds);
      std::int64_t prev = 0;
      for (int i = 0; i < kAdds; ++i) {
        const std::int64_t v = i64(bytes.substr(8 * i, 8));
        CHECK(v > prev);  // one connection's adds in its own order
        prev = v;
        CHECK(seen.insert(v).second);
      }
    }
  }
  const std::int64_t total = 2 * kConns * kAdds;
  CHECK(seen.size() == static_cast<std::size_t>(total));
  CHECK(*seen.begin() == 1);
  CHECK(*seen.rbegin() == total);
  CHECK(ha.roundTrip(100, get("init/")) == [&] {
    std::string out;
    tcpstore::protocol::appendStr(out, std::to_string(total));
    return out;
  }());
  // Combining: far fewer Txns than adds.
  MESSAGE("ADD Txns: gateway A ", a.addTxns(), ", gateway B ", b.addTxns(),
          " for ", total, " adds");
  CHECK(a.addTxns() + b.addTxns() < static_cast<std::uint64_t>(total));
}

TEST_CASE("faults: the etcd leader is killed mid-run and operations complete") {
  EtcdCluster cluster(TCPSTORE_ETCD_BIN, dataDir("leader"));
  cluster.start();
  const int leader = cluster.waitLeader();
  // Count the backends' failover log lines (called on their loop threads).
  std::atomic<int> failovers{0};
  auto opts = optionsFor(cluster, "job");
  opts.log = [&failovers](std::string_view line) {
    if (line.find("failed") != std::string_view::npos ||
        line.find("broke") != std::string_view::npos)
      failovers.fetch_add(1);
  };
  EtcdBackend a(opts), b(opts);
  BackendHarness ha(a), hb(b);
  REQUIRE(ha.openStatus().isOk());
  REQUIRE(hb.openStatus().isOk());

  // A waiter on A that is released after the kill, through B.
  CHECK(ha.roundTrip(1000, keysReq(Command::kWait, {"after-kill"})).empty());

  constexpr int kConns = 8, kOps = 40;
  auto queueWork = [&](BackendHarness& h, const std::string& tag) {
    for (tcpstore::store::ConnId c = 1; c <= kConns; ++c) {
      for (int i = 0; i < kOps; ++i) {
        const std::string k =
            tag + "/" + std::to_string(c) + "/" + std::to_string(i);
        h.send(c, set(k, k));
        h.send(c, get(k));
      }
      for (int i = 0; i < kOps; ++i) h.send(100 + c, add("counter", 1));
    }
  };
  queueWork(ha, "a");
  queueWork(hb, "b");
  // Kill the leader once some work went through.
  REQUIRE(ha.waitFor([&] { return ha.connLocked(1).done >= 10; }, 30s));
  cluster.kill(leader);
  MESSAGE("killed etcd member ", leader, " (the leader)");

  auto finished = [&](BackendHarness& h) {
    return h.waitFor(
        [&] {
          for (tcpstore::store::ConnId c = 1; c <= kConns; ++c) {
            const auto& s = h.connLocked(c);
            const auto& n = h.connLocked(100 + c);
            if (!s.closed && s.done < 2 * kOps) return false;
            if (!n.closed && n.done < kOps) return false;
          }
          return true;
        },
        120s);
  };
  REQUIRE(finished(ha));
  REQUIRE(finished(hb));

  // Sets and gets are retried across the failover: all complete, right values.
  std::int64_t acked = 0, unknown = 0;
  for (auto pr : {std::make_pair(&ha, std::string("a")),
                  std::make_pair(&hb, std::string("b"))}) {
    BackendHarness& h = *pr.first;
    for (tcpstore::store::ConnId c = 1; c <= kConns; ++c) {
      const auto s = h.conn(c);
      CHECK_MESSAGE(!s.closed, s.close_reason);
      std::string want;
      for (int i = 0; i < kOps; ++i) {
        tcpstore::protocol::appendStr(
            want,
            pr.second + "/" + std::to_string(c) + "/" + std::to_string(i));
      }
      CHECK(s.bytes == want);
      const auto n = h.conn(100 + c);
      acked += static_cast<std::int64_t>(n.bytes.size() / 8);
      if (n.closed) {
        // An ADD whose Txn outcome is unknown closes its connection: it may
        // or may not have been applied, never applied twice.
        MESSAGE("add connection closed: ", n.close_reason);
        unknown += 1;
      }
    }
  }
  const std::string final_bytes = hb.roundTrip(2000, get("counter"));
  REQUIRE(final_bytes.size() > 8);
  const std::int64_t final_value = std::stoll(final_bytes.substr(8));
  MESSAGE("counter ", final_value, ", acknowledged adds ", acked,
          ", adds with unknown outcome ", unknown);
  MESSAGE("failover log lines: ", failovers.load());
  CHECK(final_value >= acked);
  CHECK(final_value <= acked + unknown);
  // Unknown Txn outcomes are resolved (marker keys): every ADD completes,
  // exactly once.
  CHECK(unknown == 0);
  CHECK(final_value == 2 * kConns * kOps);

  // The watch resumed on another member: the waiter on A is released.
  hb.roundTrip(2000, set("after-kill", "1"));
  CHECK(ha.waitFor(
      [&] { return ha.connLocked(1000).bytes == std::string(1, '\0'); }, 20s));

  // The member comes back and the cluster goes on.
  cluster.restart(leader);
  CHECK(ha.roundTrip(2001, set("back", "1")).empty());
  CHECK_FALSE(ha.conn(2001).closed);
}

TEST_CASE("barrier: ranks on two gateways are released together") {
  EtcdCluster cluster(TCPSTORE_ETCD_BIN, dataDir("barrier"));
  cluster.start();
  EtcdBackend a(optionsFor(cluster, "job")), b(optionsFor(cluster, "job"));
  BackendHarness ha(a), hb(b);
  REQUIRE(ha.openStatus().isOk());
  REQUIRE(hb.openStatus().isOk());
  const std::string stop(1, '\0');

  // Three of four ranks arrive: all wait (the BARRIER itself completes with
  // no bytes; the release comes later).
  CHECK(ha.roundTrip(1, barrier("b/", 4)).empty());
  CHECK(hb.roundTrip(1, barrier("b/", 4)).empty());
  CHECK(ha.roundTrip(2, barrier("b/", 4)).empty());
  CHECK(ha.roundTrip(9, get("b/")) == [] {
    std::string out;
    tcpstore::protocol::appendStr(out, "3");
    return out;
  }());
  CHECK(ha.conn(1).bytes.empty());
  CHECK(hb.conn(1).bytes.empty());
  // The last one completes at once and releases the others.
  CHECK(hb.roundTrip(2, barrier("b/", 4)) == stop);
  CHECK(ha.waitFor(
      [&] {
        return ha.connLocked(1).bytes == stop && ha.connLocked(2).bytes == stop;
      },
      10s));
  CHECK(hb.waitFor([&] { return hb.connLocked(1).bytes == stop; }, 10s));

  // A waiter is also released by an ADD that brings the count to the size.
  CHECK(ha.roundTrip(3, barrier("c/", 3)).empty());
  CHECK(hb.roundTrip(3, add("c/", 5)).size() == 8);
  CHECK(ha.waitFor([&] { return ha.connLocked(3).bytes == stop; }, 10s));
  // CANCEL_WAIT drops a barrier wait.
  CHECK(ha.roundTrip(4, barrier("d/", 2)).empty());
  CHECK(ha.roundTrip(4, req(Command::kCancelWait)) == std::string(1, '\x01'));
  CHECK(hb.roundTrip(4, barrier("d/", 2)) == stop);
  CHECK(ha.roundTrip(5, get("d/")).size() == 9);
  CHECK(ha.conn(4).bytes == std::string(1, '\x01'));
}

TEST_CASE("linearizability checker: accepts and rejects hand-made histories") {
  using tcpstore::test::LinearizabilityChecker;
  using tcpstore::test::LinOp;
  auto op = [](LinOp::Kind k, std::string v, std::string result,
               std::int64_t start, std::int64_t end) {
    LinOp o;
    o.kind = k;
    o.value = std::move(v);
    o.delta = k == LinOp::kAdd ? 1 : 0;
    o.result = std::move(result);
    o.start = start;
    o.end = end;
    return o;
  };
  // Concurrent set and get: the get may see either value.
  CHECK(LinearizabilityChecker(
            {op(LinOp::kSet, "1", "", 0, 10), op(LinOp::kGet, "", "0", 5, 15)},
            std::string("0"))
            .check());
  CHECK(LinearizabilityChecker(
            {op(LinOp::kSet, "1", "", 0, 10), op(LinOp::kGet, "", "1", 5, 15)},
            std::string("0"))
            .check());
  // A stale read after the write finished is not linearizable.
  CHECK_FALSE(LinearizabilityChecker({op(LinOp::kSet, "1", "", 0, 10),
                                      op(LinOp::kGet, "", "0", 11, 15)},
                                     std::string("0"))
                  .check());
  // Two adds handed the same value are not linearizable.
  CHECK_FALSE(LinearizabilityChecker({op(LinOp::kAdd, "", "1", 0, 10),
                                      op(LinOp::kAdd, "", "1", 0, 10)},
                                     std::nullopt)
                  .check());
  // An add whose outcome is unknown may or may not have been applied.
  auto lost = op(LinOp::kAdd, "", "", 0, 10);
  lost.known = false;
  CHECK(LinearizabilityChecker({lost, op(LinOp::kGet, "", "0", 20, 30)},
                               std::string("0"))
            .check());
  CHECK(LinearizabilityChecker({lost, op(LinOp::kGet, "", "1", 20, 30)},
                               std::string("0"))
            .check());
}

TEST_CASE(
    "linearizability: a history through two gateways across a leader kill") {
  using tcpstore::test::LinearizabilityChecker;
  using tcpstore::test::LinOp;
  EtcdCluster cluster(TCPSTORE_ETCD_BIN, dataDir("lin"));
  cluster.start();
  const int leader = cluster.waitLeader();
  EtcdBackend a(optionsFor(cluster, "job")), b(optionsFor(cluster, "job"));
  BackendHarness ha(a), hb(b);
  REQUIRE(ha.openStatus().isOk());
  REQUIRE(hb.openStatus().isOk());
  constexpr int kKeys = 3, kConns = 4, kOps = 12;  // per gateway
  for (int k = 0; k < kKeys; ++k)
    CHECK(ha.roundTrip(999, set("lin/" + std::to_string(k), "0")).empty());

  // Each connection's script, kept to decode its replies afterwards.
  std::mt19937 rng(12345);
  std::map<std::pair<int, tcpstore::store::ConnId>, std::vector<LinOp>> scripts;
  std::map<std::pair<int, tcpstore::store::ConnId>, std::vector<int>>
      script_keys;
  for (int g = 0; g < 2; ++g) {
    BackendHarness& h = g == 0 ? ha : hb;
    for (tcpstore::store::ConnId c = 1; c <= kConns; ++c) {
      for (int i = 0; i < kOps; ++i) {
        const int k = static_cast<int>(rng() % kKeys);
        const std::string key = "lin/" + std::to_string(k);
        LinOp o;
        switch (rng() % 4) {
          case 0:
            o.kind = LinOp::kSet;
            o.value = std::to_string(rng() % 5);
            h.send(c, set(key, o.value));
            break;
          case 1:
            o.kind = LinOp::kGet;
            h.send(c, get(key));
            break;
          case 2:
            o.kind = LinOp::kAdd;
            o.delta = 1;
            h.send(c, add(key, 1));
            break;
          default:
            o.kind = LinOp::kCompareSet;
            o.value = std::to_string(rng() % 5);
            o.desired = std::to_string(rng() % 5);
            h.send(c, cas(key, o.value, o.desired));
            break;
        }
        scripts[{g, c}].push_back(o);
        script_keys[{g, c}].push_back(k);
      }
    }
  }
  REQUIRE(ha.waitFor([&] { return ha.connLocked(1).done >= 3; }, 30s));
  cluster.kill(leader);
  auto finished = [&](BackendHarness& h) {
    return h.waitFor(
        [&] {
          for (tcpstore::store::ConnId c = 1; c <= kConns; ++c) {
            const auto& s = h.connLocked(c);
            if (!s.closed && s.done < kOps) return false;
          }
          return true;
        },
        120s);
  };
  REQUIRE(finished(ha));
  REQUIRE(finished(hb));

  // Decode every op's result and timing, then check key by key.
  std::vector<std::vector<LinOp>> per_key(kKeys);
  int unknown = 0;
  for (auto& [gc, ops] : scripts) {
    BackendHarness& h = gc.first == 0 ? ha : hb;
    const auto conn = h.conn(gc.second);
    for (std::size_t i = 0; i < ops.size(); ++i) {
      LinOp o = ops[i];
      if (i >= conn.timings.size() || conn.timings[i].failed ||
          !conn.timings[i].finished) {
        if (i < conn.timings.size()) {
          o.known = false;
          o.start = conn.timings[i].start.time_since_epoch().count();
          o.end = INT64_MAX;
          ++unknown;
          per_key[script_keys[gc][i]].push_back(o);
        }
        continue;  // never submitted: not in the history
      }
      const auto& t = conn.timings[i];
      o.start = t.start.time_since_epoch().count();
      o.end = t.end.time_since_epoch().count();
      const std::string bytes = conn.bytes.substr(t.begin, t.finish - t.begin);
      switch (o.kind) {
        case LinOp::kSet:
          CHECK(bytes.empty());
          break;
        case LinOp::kAdd:
          o.result = std::to_string(i64(bytes));
          break;
        default:  // GET, COMPARE_SET: one string
          REQUIRE(bytes.size() >= 8);
          o.result = bytes.substr(8);
          break;
      }
      per_key[script_keys[gc][i]].push_back(o);
    }
  }
  MESSAGE("operations with unknown outcome: ", unknown);
  checkLinearizableHistories(per_key);
}

TEST_CASE("faults: a frozen member under a gateway is left for another") {
  EtcdCluster cluster(TCPSTORE_ETCD_BIN, dataDir("frozen"));
  cluster.start();
  cluster.waitLeader();
  auto opts_a = optionsFor(cluster, "job");  // member 0 first
  auto opts_b = opts_a;                      // member 1 first
  std::rotate(opts_b.endpoints.begin(), opts_b.endpoints.begin() + 1,
              opts_b.endpoints.end());
  EtcdBackend a(opts_a), b(opts_b);
  BackendHarness ha(a), hb(b);
  REQUIRE(ha.openStatus().isOk());
  REQUIRE(hb.openStatus().isOk());

  // A's waiter (its watch is on member 0), then member 0 freezes.
  CHECK(ha.roundTrip(1, keysReq(Command::kWait, {"late"})).empty());
  cluster.pause(0);
  // B writes through member 1 (after an election if 0 led).
  CHECK(hb.roundTrip(1, set("late", "v")).empty());
  CHECK_FALSE(hb.conn(1).closed);
  // A's watch notices its member is silent, resumes elsewhere, releases.
  CHECK(ha.waitFor(
      [&] { return ha.connLocked(1).bytes == std::string(1, '\0'); }, 30s));
  // A's requests fail over too.
  CHECK(ha.roundTrip(2, get("late")) == [] {
    std::string out;
    tcpstore::protocol::appendStr(out, "v");
    return out;
  }());
  CHECK_FALSE(ha.conn(2).closed);
  cluster.resume(0);
}

TEST_CASE("tls: the backend reaches etcd over TLS with a client certificate") {
  namespace fs = std::filesystem;
  const std::string dir = dataDir("tls");
  fs::remove_all(dir);
  fs::create_directories(dir);
  struct Cleanup {
    std::string dir;
    pid_t pid = -1;
    ~Cleanup() {
      if (pid > 0) {
        ::kill(pid, SIGKILL);
        int st = 0;
        ::waitpid(pid, &st, 0);
      }
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } cleanup{dir};
  // A CA, a server certificate for 127.0.0.1 and a client certificate.
  const std::string script =
      "set -e; cd '" + dir +
      "'\n"
      "printf 'subjectAltName=IP:127.0.0.1\\nextendedKeyUsage=serverAuth\\n' "
      "> server.ext\n"
      "printf 'extendedKeyUsage=clientAuth\\n' > client.ext\n"
      "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=test-ca "
      "-keyout ca.key -out ca.pem 2>/dev/null\n"
      "for n in server client; do\n"
      "  openssl req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 "
      "-keyout $n.key -out $n.csr 2>/dev/null\n"
      "  openssl x509 -req -in $n.csr -CA ca.pem -CAkey ca.key "
      "-CAcreateserial -days 1 -extfile $n.ext -out $n.pem 2>/dev/null\n"
      "done\n";
  auto made = tcpstore::test::runProcess({"/bin/sh", "-c", script}, 60s);
  INFO("openssl: " << made.err);
  REQUIRE(made.exit_code == 0);

  // One etcd member serving clients over TLS only, client certificates
  // required.
  int ports[2];
  {
    int fds[2];
    for (int i = 0; i < 2; ++i) {
      fds[i] = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      REQUIRE(::bind(fds[i], reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
      socklen_t len = sizeof(a);
      ::getsockname(fds[i], reinterpret_cast<sockaddr*>(&a), &len);
      ports[i] = ntohs(a.sin_port);
    }
    for (int fd : fds) ::close(fd);
  }
  const std::string client = "127.0.0.1:" + std::to_string(ports[0]);
  const std::string peer = "http://127.0.0.1:" + std::to_string(ports[1]);
  std::vector<std::string> args = {TCPSTORE_ETCD_BIN,
                                   "--name=tls",
                                   "--data-dir=" + dir + "/data",
                                   "--listen-client-urls=https://" + client,
                                   "--advertise-client-urls=https://" + client,
                                   "--listen-peer-urls=" + peer,
                                   "--initial-advertise-peer-urls=" + peer,
                                   "--initial-cluster=tls=" + peer,
                                   "--cert-file=" + dir + "/server.pem",
                                   "--key-file=" + dir + "/server.key",
                                   "--trusted-ca-file=" + dir + "/ca.pem",
                                   "--client-cert-auth",
                                   "--log-outputs=stderr",
                                   "--logger=zap"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  const std::string log = dir + "/etcd.log";
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(),
                                   O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  REQUIRE(posix_spawn(&cleanup.pid, args[0].c_str(), &fa, nullptr, argv.data(),
                      environ) == 0);
  posix_spawn_file_actions_destroy(&fa);

  const std::string tls = "cacert=" + dir + "/ca.pem&cert=" + dir +
                          "/client.pem&key=" + dir + "/client.key";
  auto o = parseEtcdUrl("etcd://" + client + "/tls?" + tls);
  REQUIRE(o.has_value());
  CHECK(o->tls());
  o->rpc_timeout = 1000ms;
  o->op_timeout = 30000ms;
  {
    EtcdBackend b(*o);
    BackendHarness h(b);
    REQUIRE(h.openStatus().isOk());
    CHECK(h.roundTrip(1, set("k", "over tls")).empty());  // waits for etcd
    CHECK_FALSE(h.conn(1).closed);
    std::string want;
    tcpstore::protocol::appendStr(want, "over tls");
    CHECK(h.roundTrip(1, get("k")) == want);
    CHECK_FALSE(h.conn(1).closed);
    // --delete-prefix's call goes over TLS too.
    auto n = tcpstore::store::deleteJobKeys(*o);
    REQUIRE(n.has_value());
    CHECK(*n >= 1);
  }
  // Without a client certificate, or without TLS, the member refuses: the
  // connection gets an error, never an answer.
  for (const std::string& url :
       {"etcd://" + client + "/tls?op-timeout-ms=3000&cacert=" + dir +
            "/ca.pem",
        "etcd://" + client + "/tls?op-timeout-ms=3000"}) {
    CAPTURE(url);
    auto bad = parseEtcdUrl(url);
    REQUIRE(bad.has_value());
    bad->rpc_timeout = 500ms;
    EtcdBackend b(*bad);
    BackendHarness h(b);
    REQUIRE(h.openStatus().isOk());
    CHECK(h.roundTrip(1, get("k")).empty());
    CHECK(h.conn(1).closed);
  }
  // Parameter errors.
  CHECK_FALSE(parseEtcdUrl("etcd://h:1?cacert=" + dir + "/missing.pem"));
  CHECK_FALSE(parseEtcdUrl("etcd://h:1?cacert=" + dir + "/ca.pem&cert=" + dir +
                           "/client.pem"));
  CHECK_FALSE(parseEtcdUrl("etcd://h:1?cert=" + dir + "/client.pem&key=" + dir +
                           "/client.key"));
}

TEST_CASE("lifetime: a gateway's marker keys go with its orderly close") {
  EtcdCluster cluster(TCPSTORE_ETCD_BIN, dataDir("markers"));
  cluster.start();
  const EtcdOptions o = optionsFor(cluster, "mk");
  {
    EtcdBackend a(o);
    BackendHarness h(a);
    REQUIRE(h.openStatus().isOk());
    CHECK(h.roundTrip(1, set("x", "1")).empty());  // writes a marker key
    CHECK(h.roundTrip(1, add("n", 1)).size() == 8);
    h.stop();
  }
  // Left: the two job keys only (each write also wrote a marker key).
  auto n = tcpstore::store::deleteJobKeys(o);
  REQUIRE(n.has_value());
  CHECK(*n == 2);
}
