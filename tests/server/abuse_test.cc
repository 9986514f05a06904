// Loopback tests of the server against misbehaving clients (issue #13):
// replies owed before a protocol error, partial requests that stall, and
// huge WAIT registrations dropped at once. Scaled down to seconds.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "tcpstore/server.h"
#include "tests/server/raw_client.h"
#include "tests/support/scoped_server.h"

namespace {

using namespace tcpstore::test;
using std::chrono::milliseconds;

RawConn conn113(const tcpstore::Server& s) {
  RawConn c = RawConn::connect(s.port());
  REQUIRE(c.ok());
  return c;
}
RawConn conn2(const tcpstore::Server& s) {
  RawConn c = RawConn::connect(s.port());
  REQUIRE(c.ok());
  REQUIRE(c.handshake());
  return c;
}

// Resident set of this process (the in-process server's heap is in it).
std::size_t rssBytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  unsigned long size = 0, resident = 0;
  int n = std::fscanf(f, "%lu %lu", &size, &resident);
  std::fclose(f);
  return n == 2 ? resident * 4096ul : 0;
}

}  // namespace

TEST_CASE("the replies owed before a protocol error are sent before closing") {
  auto s = ScopedServer::local();
  for (bool v2x : {false, true}) {
    CAPTURE(v2x);
    RawConn c = v2x ? conn2(*s) : conn113(*s);
    const std::uint8_t set = v2x ? v2::kSet : v113::kSet;
    const std::uint8_t add = v2x ? v2::kAdd : v113::kAdd;
    const std::string k = v2x ? "/owed-2" : "/owed-113";
    // One write: SET a text value, ADD to a counter (replies 1), ADD to the
    // text key (an error): the first ADD's reply must arrive, then EOF.
    REQUIRE(c.send(byte(set) + str(k + "-text") + str("abc") + byte(add) +
                   str(k) + i64le(1) + byte(add) + str(k + "-text") +
                   i64le(1)));
    std::string got;
    CHECK(c.waitClosed(&got));
    MESSAGE("got " << got.size() << " bytes before EOF");
    CHECK(got == i64le(1));
  }
  CHECK(s->counters().rejected_semantic == 2);
}

TEST_CASE("bad bytes after a pipelined request still get its reply") {
  auto s = ScopedServer::local();
  RawConn c = conn2(*s);
  REQUIRE(c.send(byte(v2::kAdd) + str("/n") + i64le(5) + byte(0xEE)));
  std::string got;
  CHECK(c.waitClosed(&got));
  MESSAGE("got " << got.size() << " bytes before EOF");
  CHECK(got == i64le(5));
  CHECK(s->counters().rejected_protocol == 1);
}

TEST_CASE("a partial request without progress is closed, idle peers stay") {
  tcpstore::ServerOptions o;
  o.limits.partial_request_ms = 150;
  auto s = ScopedServer::local(o);
  RawConn idle2 = conn2(*s);      // handshake only: nothing buffered
  RawConn idle113 = conn113(*s);  // never sent a byte
  RawConn partial = conn2(*s);
  // A SET whose value is announced as 1000 bytes, and only 10 sent.
  REQUIRE(partial.send(byte(v2::kSet) + str("/p") + u64le(1000) +
                       std::string(10, 'x')));
  const auto t0 = Clock::now();
  CHECK(partial.waitClosed(nullptr, milliseconds(10000)));
  CHECK(Clock::now() - t0 >= milliseconds(100));
  CHECK(s->counters().rejected_partial_timeout == 1);
  // The idle connections outlived the partial one and still answer.
  CHECK(pingFence(idle2));
  REQUIRE(idle113.send(byte(v113::kGetNumKeys)));
  CHECK(idle113.recv(8) == i64le(0));
  CHECK(s->counters().rejected_partial_timeout == 1);
}

TEST_CASE("a request that keeps arriving slowly is not a stalled one") {
  tcpstore::ServerOptions o;
  o.limits.partial_request_ms = 300;
  auto s = ScopedServer::local(o);
  RawConn c = conn2(*s);
  RawConn fence = conn2(*s);
  const std::string msg = byte(v2::kSet) + str("/slow") + str("0123456789");
  // One byte per fence round trip on another connection (each a loop turn
  // of the server), spread over more than the timeout.
  const auto t0 = Clock::now();
  for (std::size_t i = 0; i < msg.size(); ++i) {
    REQUIRE(c.send(msg.substr(i, 1)));
    const auto until = Clock::now() + milliseconds(50);
    while (Clock::now() < until) REQUIRE(pingFence(fence));
  }
  CHECK(Clock::now() - t0 > milliseconds(300));
  REQUIRE(c.send(byte(v2::kGet) + str("/slow")));
  CHECK(c.recv(8 + 10) == u64le(10) + "0123456789");
  CHECK(s->counters().rejected_partial_timeout == 0);
}

TEST_CASE("huge WAITs dropped at once: no stall, memory given back") {
  auto s = ScopedServer::local();
  RawConn probe = conn2(*s);
  REQUIRE(pingFence(probe));
  const std::size_t rss0 = rssBytes();
  constexpr int kConns = 6;
  constexpr std::size_t kKeys = 128 * 1024;
  std::vector<RawConn> waiters;
  for (int i = 0; i < kConns; ++i) {
    waiters.push_back(conn2(*s));
    std::string m = byte(v2::kWait) + u64le(kKeys);
    for (std::size_t k = 0; k < kKeys; ++k)
      m += str("/absent/" + std::to_string(i) + "/" + std::to_string(k));
    REQUIRE(waiters.back().send(m));
    REQUIRE(pingFence(waiters.back()));  // the WAIT is registered
  }
  const std::size_t rss1 = rssBytes();
  INFO("rss before " << rss0 / 1024 << " KiB, with waits " << rss1 / 1024
                     << " KiB");
  REQUIRE(rss1 > rss0 + 64 * 1024 * 1024);  // the scenario is real
  for (RawConn& w : waiters) w.close();
  // The probe's round trips while the registrations are freed.
  milliseconds worst{0};
  std::size_t rss2 = rss1;
  const auto end = Clock::now() + scaled(milliseconds(15000));
  while (Clock::now() < end) {
    const auto t = Clock::now();
    REQUIRE(pingFence(probe));
    worst = std::max(
        worst, std::chrono::duration_cast<milliseconds>(Clock::now() - t));
    rss2 = rssBytes();
    if (rss2 < rss0 + (rss1 - rss0) / 4) break;
  }
  INFO("rss after " << rss2 / 1024 << " KiB, worst probe " << worst.count()
                    << " ms");
  MESSAGE("rss before " << rss0 / 1024 << " KiB, with waits " << rss1 / 1024
                        << " KiB, after " << rss2 / 1024
                        << " KiB; worst probe round trip " << worst.count()
                        << " ms");
  CHECK(rss2 < rss0 + (rss1 - rss0) / 4);
  CHECK(worst < milliseconds(1000));  // sanity only: targets are in bench/
  CHECK(s->counters().connections_open == 1);
}
