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
#include "tests/support/bound_port.h"
#include "tests/support/scoped_server.h"

// Sanitizers bring their own allocators (malloc_trim does not reach them):
// RSS figures are not checked there.
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define TCPSTORE_SANITIZED_ALLOCATOR 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
#define TCPSTORE_SANITIZED_ALLOCATOR 1
#endif
#endif

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

TEST_CASE("a slow reader holding a partial request is not closed for it") {
  // Both ends' socket buffers pinned small, so the replies stay queued in
  // the server (see tests/server/pinned.h).
  constexpr int kPinned = 16 * 1024;
  BoundPort listen;
  REQUIRE(listen.pinSendBuffer(kPinned));
  tcpstore::ServerOptions o;
  o.port = listen.port();
  o.listen_fd = listen.release();
  o.limits.partial_request_ms = 100;
  o.limits.max_buffered_output_bytes = 256 * 1024;  // paused above this
  o.limits.stalled_reader_ms = 0;                   // never dropped for it
  auto s = ScopedServer::local(o);
  RawConn writer = conn2(*s);
  const std::string value(64 * 1024, 'r');
  REQUIRE(writer.send(byte(v2::kSet) + str("/v") + str(value)));
  REQUIRE(pingFence(writer));
  RawConn slow = RawConn::connect(s->port(), "127.0.0.1", kPinned);
  REQUIRE(slow.ok());
  REQUIRE(slow.handshake());
  // 6 GETs (384 KiB of replies: paused, under the 512 KiB drop line), then
  // the first bytes of a SET.
  std::string m;
  for (int i = 0; i < 6; ++i) m += byte(v2::kGet) + str("/v");
  const std::string set_rest = "abcdefgh";
  m += byte(v2::kSet) + str("/after-slow") + u64le(set_rest.size()) + "abc";
  REQUIRE(slow.send(m));
  // The clock: a partial request sent later, closed by the timeout. The slow
  // reader's partial bytes are older, so it would be closed by then too.
  RawConn clock = conn2(*s);
  REQUIRE(clock.send(byte(v2::kSet) + str("/c") + u64le(50) + "x"));
  CHECK(clock.waitClosed(nullptr, milliseconds(10000)));
  CHECK(s->counters().rejected_partial_timeout == 1);
  // The slow reader reads now: every reply, then finishes its SET.
  std::string want;
  for (int i = 0; i < 6; ++i) want += u64le(value.size()) + value;
  CHECK(slow.recv(want.size(), milliseconds(10000)) == want);
  REQUIRE(slow.send(set_rest.substr(3)));
  REQUIRE(slow.send(byte(v2::kGet) + str("/after-slow")));
  CHECK(slow.recv(8 + set_rest.size()) == u64le(set_rest.size()) + set_rest);
  CHECK(s->counters().rejected_partial_timeout == 1);
  CHECK(s->counters().rejected_slow_reader == 0);
}

TEST_CASE("a request that keeps arriving slowly is not a stalled one") {
  tcpstore::ServerOptions o;
  // A gap between bytes stays far below the timeout even on a loaded
  // machine (a 300 ms timeout failed once when this thread was descheduled).
  o.limits.partial_request_ms = 1000;
  auto s = ScopedServer::local(o);
  RawConn c = conn2(*s);
  RawConn fence = conn2(*s);
  const std::string msg = byte(v2::kSet) + str("/slow") + str("0123456789");
  // One byte per fence round trip on another connection (each a loop turn
  // of the server), spread over more than the timeout.
  const auto t0 = Clock::now();
  for (std::size_t i = 0; i < msg.size(); ++i) {
    REQUIRE(c.send(msg.substr(i, 1)));
    const auto until = Clock::now() + milliseconds(80);
    while (Clock::now() < until) REQUIRE(pingFence(fence));
  }
  CHECK(Clock::now() - t0 > milliseconds(1000));
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
  [[maybe_unused]] int probes = 0;
  const auto end = Clock::now() + scaled(milliseconds(15000));
  while (Clock::now() < end) {
    const auto t = Clock::now();
    REQUIRE(pingFence(probe));
    worst = std::max(
        worst, std::chrono::duration_cast<milliseconds>(Clock::now() - t));
    rss2 = rssBytes();
    if (rss2 < rss0 + (rss1 - rss0) / 4) break;
#ifdef TCPSTORE_SANITIZED_ALLOCATOR
    if (++probes >= 300) break;  // RSS is not judged here: probe a while
#endif
  }
  INFO("rss after " << rss2 / 1024 << " KiB, worst probe " << worst.count()
                    << " ms");
  MESSAGE("rss before " << rss0 / 1024 << " KiB, with waits " << rss1 / 1024
                        << " KiB, after " << rss2 / 1024
                        << " KiB; worst probe round trip " << worst.count()
                        << " ms");
#ifndef TCPSTORE_SANITIZED_ALLOCATOR
  CHECK(rss2 < rss0 + (rss1 - rss0) / 4);
#endif
  CHECK(worst < milliseconds(1000));  // sanity only: targets are in bench/
  CHECK(s->counters().connections_open == 1);
}

// ---- the memory budget ----------------------------------------------------

namespace {

constexpr std::uint64_t kBudget = 8 * 1024 * 1024;

// Sends what the kernel takes of `bytes` until `limit` passes; returns the
// number of bytes sent. For peers the server may stop reading.
std::size_t sendFor(RawConn& c, std::string_view bytes, milliseconds limit) {
  const auto end = Clock::now() + limit;
  std::size_t sent = 0;
  while (sent < bytes.size() && Clock::now() < end) {
    pollfd p{c.fd(), POLLOUT, 0};
    if (::poll(&p, 1, 10) <= 0) continue;
    ssize_t n = ::send(c.fd(), bytes.data() + sent, bytes.size() - sent,
                       MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n <= 0) break;
    sent += static_cast<std::size_t>(n);
  }
  return sent;
}

}  // namespace

TEST_CASE("budget: a client storing values under new keys is refused") {
  tcpstore::ServerOptions o;
  o.limits.max_memory_bytes = kBudget;
  auto s = ScopedServer::local(o);
  RawConn honest = conn2(*s);
  for (int i = 0; i < 50; ++i) {
    REQUIRE(honest.send(byte(v2::kSet) + str("/honest/" + std::to_string(i)) +
                        str("value-" + std::to_string(i))));
  }
  RawConn hog = conn2(*s);
  const std::string value(256 * 1024, 'v');
  int stored = 0;
  bool refused = false;
  for (; stored < 100; ++stored) {  // 25 MiB offered: 3x the budget
    if (!hog.send(byte(v2::kSet) + str("/hog/" + std::to_string(stored)) +
                  str(value)) ||
        !pingFence(hog)) {
      refused = true;
      break;
    }
  }
  MESSAGE("stored " << stored << " values of 256 KiB before the refusal");
  CHECK(refused);
  CHECK(hog.waitClosed());
  CHECK(stored >= 20);  // most of the budget was usable
  CHECK(s->counters().budget_refused == 1);
  CHECK(s->counters().memory_bytes <= kBudget);
  // The honest client's data is exact, and it may still store small values.
  for (int i = 0; i < 50; ++i) {
    REQUIRE(honest.send(byte(v2::kGet) + str("/honest/" + std::to_string(i))));
    const std::string want = "value-" + std::to_string(i);
    CHECK(honest.recv(8 + want.size()) == u64le(want.size()) + want);
  }
  REQUIRE(honest.send(byte(v2::kSet) + str("/honest/late") + str("ok")));
  REQUIRE(honest.send(byte(v2::kGet) + str("/honest/late")));
  CHECK(honest.recv(10) == u64le(2) + "ok");
  CHECK(s->counters().budget_refused == 1);
}

TEST_CASE("budget: clients pipelining GETs and never reading are dropped") {
  tcpstore::ServerOptions o;
  o.limits.max_memory_bytes = 2 * kBudget;  // 16 MiB
  auto s = ScopedServer::local(o);
  RawConn honest = conn2(*s);
  const std::string value(1024 * 1024, 'g');
  REQUIRE(honest.send(byte(v2::kSet) + str("/big") + str(value)));
  REQUIRE(honest.send(byte(v2::kSet) + str("/small") + str("s")));
  REQUIRE(pingFence(honest));
  // Four non-readers asking for 3, 6, 9 and 12 MiB of replies (30 MiB).
  std::vector<RawConn> hogs;
  for (int i = 0; i < 4; ++i) {
    RawConn h = RawConn::connect(s->port(), "127.0.0.1", 16 * 1024);
    REQUIRE(h.ok());
    REQUIRE(h.handshake());
    std::string m;
    for (int k = 0; k < 3 * (i + 1); ++k) m += byte(v2::kGet) + str("/big");
    REQUIRE(h.send(m));
    hogs.push_back(std::move(h));
  }
  // The largest go first, until the server is back under its budget.
  CHECK(eventually([&] {
    return s->counters().budget_dropped + s->counters().budget_refused >= 1;
  }));
  CHECK(eventually(
      [&] { return s->counters().memory_bytes <= o.limits.max_memory_bytes; }));
  CHECK(hogs[3].waitClosed(nullptr, milliseconds(10000)));
  // The honest client is served meanwhile.
  REQUIRE(honest.send(byte(v2::kGet) + str("/small")));
  CHECK(honest.recv(9) == u64le(1) + "s");
  // The smallest non-reader was not dropped: its replies are all there.
  std::string want;
  for (int k = 0; k < 3; ++k) want += u64le(value.size()) + value;
  CHECK(hogs[0].recv(want.size(), milliseconds(10000)) == want);
  CHECK(pingFence(hogs[0]));
  MESSAGE("dropped " << s->counters().budget_dropped << ", refused "
                     << s->counters().budget_refused);
}

TEST_CASE("budget: partial large requests are paused under the budget") {
  tcpstore::ServerOptions o;
  o.limits.max_memory_bytes = kBudget;
  o.limits.max_value_bytes = 16 * 1024 * 1024;
  auto s = ScopedServer::local(o);
  RawConn honest = conn2(*s);
  const std::string body(12 * 1024 * 1024, 'p');
  std::vector<RawConn> hogs;
  std::size_t offered = 0;
  for (int i = 0; i < 6; ++i) {  // each: most of one 16 MiB SET
    RawConn h = conn2(*s);
    const std::string head =
        byte(v2::kSet) + str("/part/" + std::to_string(i)) + u64le(16 << 20);
    REQUIRE(h.send(head));
    offered += sendFor(h, body, milliseconds(300));
    hogs.push_back(std::move(h));
    REQUIRE(pingFence(honest));  // served throughout
  }
  REQUIRE(pingFence(honest));
  const auto c = s->counters();
  MESSAGE("offered " << offered / 1024 << " KiB; server charged "
                     << c.memory_bytes / 1024 << " KiB; input paused "
                     << c.budget_input_paused);
  CHECK(offered > 3 * kBudget);  // the attack is real
  CHECK(c.budget_input_paused >= 1);
  CHECK(c.memory_bytes <= kBudget);
  REQUIRE(honest.send(byte(v2::kSet) + str("/after") + str("fine")));
  REQUIRE(honest.send(byte(v2::kGet) + str("/after")));
  CHECK(honest.recv(12) == u64le(4) + "fine");
}

// One read callback must not answer a whole pipeline of large GETs: past
// Connections::kTurnOutputBytes of replies in a loop turn the connection
// yields, and its requests (and its EOF) continue on later turns, in order.
TEST_CASE("work per loop turn: pipelined large GETs yield and keep order") {
  auto s = ScopedServer::local();
  RawConn other = conn2(*s);
  const std::string value(1024 * 1024, 'g');
  REQUIRE(other.send(byte(v2::kSet) + str("/big") + str(value)));
  REQUIRE(pingFence(other));
  RawConn c = conn2(*s);
  constexpr int kGets = 12;  // 12 MiB of replies: three turns' worth
  std::string m;
  for (int k = 0; k < kGets; ++k) m += byte(v2::kGet) + str("/big");
  m += byte(v2::kSet) + str("/after") + str("x");
  m += byte(v2::kGet) + str("/after");
  REQUIRE(c.send(m));
  c.shutdownWrite();        // the EOF behind them is judged after them
  CHECK(pingFence(other));  // the other client is served meanwhile
  std::string want;
  for (int k = 0; k < kGets; ++k) want += u64le(value.size()) + value;
  want += u64le(1) + "x";
  std::string got;
  CHECK(c.waitClosed(&got, milliseconds(10000)));
  CHECK(got.size() == want.size());
  CHECK(got == want);
  CHECK(s->counters().turn_yields >= 1);
}

// A pipeline of many small requests (no large replies to count) yields too,
// past Connections::kTurnRequests, and its replies stay in order.
TEST_CASE("work per loop turn: a long pipeline of small requests yields") {
  auto s = ScopedServer::local();
  RawConn other = conn2(*s);
  RawConn c = conn2(*s);
  constexpr int kAdds = 50000;  // ~1 MB, sent at once
  std::string m;
  for (int k = 0; k < kAdds; ++k) m += byte(v2::kAdd) + str("/n") + i64le(1);
  REQUIRE(c.send(m));
  CHECK(pingFence(other));  // the other client is served meanwhile
  const std::string got = c.recv(8 * kAdds, milliseconds(20000));
  REQUIRE(got.size() == 8 * kAdds);
  bool in_order = true;
  for (int k = 0; k < kAdds && in_order; ++k)
    in_order = got.compare(8 * k, 8, i64le(k + 1)) == 0;
  CHECK(in_order);
  CHECK(s->counters().turn_yields >= 1);
}

// Freeing large values is work too (unmapping them): a pipeline of DELETEs
// of 1 MiB values yields like a pipeline of large GETs.
TEST_CASE("work per loop turn: pipelined DELETEs of large values yield") {
  auto s = ScopedServer::local();
  RawConn c = conn2(*s);
  const std::string value(1024 * 1024, 'd');
  constexpr int kValues = 12;
  for (int k = 0; k < kValues; ++k) {
    REQUIRE(
        c.send(byte(v2::kSet) + str("/del/" + std::to_string(k)) + str(value)));
  }
  REQUIRE(pingFence(c));
  const auto yields = s->counters().turn_yields;
  std::string m;
  for (int k = 0; k < kValues; ++k)
    m += byte(v2::kDeleteKey) + str("/del/" + std::to_string(k));
  REQUIRE(c.send(m));
  std::string want;
  for (int k = 0; k < kValues; ++k) want += i64le(1);
  CHECK(c.recv(want.size()) == want);
  CHECK(s->counters().turn_yields > yields);
}

// A connection paused for the budget is not read, so its peer's FIN is not
// seen through a read: the server must find it in the TCP state, or the
// paused request's memory stays charged until partial_request_ms (60 s).
TEST_CASE("budget: a paused partial request whose peer hangs up is closed") {
  tcpstore::ServerOptions o;
  o.limits.max_memory_bytes = kBudget;
  o.limits.max_value_bytes = 16 * 1024 * 1024;
  auto s = ScopedServer::local(o);  // partial_request_ms: 60 s
  RawConn honest = conn2(*s);
  // Small SETs (not refused under the budget itself) take the server past
  // its soft line: from there a large partial request is not read.
  const std::string value(60000, 'v');
  const std::uint64_t soft = kBudget - kBudget / 16;
  for (int i = 0; s->counters().memory_bytes <= soft; ++i) {
    REQUIRE(i < 200);
    REQUIRE(honest.send(byte(v2::kSet) + str("/fill/" + std::to_string(i)) +
                        str(value)));
    REQUIRE(pingFence(honest));
  }
  const auto paused = s->counters().budget_input_paused;
  // A small part of a large SET: the server stops reading it at once, and
  // what it did not read fits the kernel's buffers, so the FIN arrives.
  RawConn quitter = conn2(*s);
  REQUIRE(quitter.send(byte(v2::kSet) + str("/quitter") + u64le(16 << 20) +
                       std::string(100 * 1024, 'q')));
  REQUIRE(
      eventually([&] { return s->counters().budget_input_paused > paused; }));
  const auto charged = s->counters().memory_bytes;
  quitter.close();
  CHECK(eventually([&] { return s->counters().rejected_peer_gone == 1; },
                   milliseconds(5000)));
  CHECK(s->counters().rejected_partial_timeout == 0);
  CHECK(eventually([&] { return s->counters().memory_bytes < charged; }));
  CHECK(pingFence(honest));  // the honest client is still served
}

// A MULTI_SET of many values crosses a field boundary after each value; the
// bytes read there (the next key's header and what follows) must be charged
// and paused like the bytes inside a value, or each connection's buffer
// doubles unchecked once per value.
TEST_CASE("budget: partial MULTI_SETs are paused at every field boundary") {
  tcpstore::ServerOptions o;
  o.limits.max_memory_bytes = kBudget;
  auto s = ScopedServer::local(o);
  RawConn honest = conn2(*s);
  constexpr int kValues = 12;
  const std::string value(1024 * 1024, 'm');
  std::string body = u64le(kValues);
  for (int k = 0; k < kValues; ++k) {
    body += str("/mpart/" + std::to_string(k)) + str(value);
  }
  body.resize(body.size() - value.size() / 2);  // stop inside the last value
  std::vector<RawConn> hogs;
  std::size_t offered = 0;
  for (int i = 0; i < 6; ++i) {  // each: most of one 12 MiB MULTI_SET
    RawConn h = conn2(*s);
    REQUIRE(h.send(byte(v2::kMultiSet)));
    offered += sendFor(h, body, milliseconds(300));
    hogs.push_back(std::move(h));
    REQUIRE(pingFence(honest));  // served throughout
  }
  REQUIRE(pingFence(honest));
  const auto c = s->counters();
  MESSAGE("offered " << offered / 1024 << " KiB; server charged "
                     << c.memory_bytes / 1024 << " KiB; input paused "
                     << c.budget_input_paused);
  CHECK(offered > 3 * kBudget);  // the attack is real
  CHECK(c.budget_input_paused >= 1);
  CHECK(c.memory_bytes <= kBudget);
  // A small SET from the honest client is not refused.
  REQUIRE(honest.send(byte(v2::kSet) + str("/after") + str("fine")));
  REQUIRE(honest.send(byte(v2::kGet) + str("/after")));
  CHECK(honest.recv(12) == u64le(4) + "fine");
  CHECK(s->counters().budget_refused == 0);
  CHECK(pingFence(honest));
}

// Replies of normal size are always sent to clients that read; a client
// that does not read and asks for more small replies while the server is
// near its budget is refused, so the last part of the budget stays for the
// honest clients (whose small SETs are refused only at the budget itself).
TEST_CASE("budget: non-readers of small replies do not crowd out honest SETs") {
  tcpstore::ServerOptions o;
  o.limits.max_memory_bytes = kBudget;
  auto s = ScopedServer::local(o);
  RawConn honest = conn2(*s);
  const std::string value(48 * 1024, 's');  // a reply of normal size
  REQUIRE(honest.send(byte(v2::kSet) + str("/s") + str(value)));
  REQUIRE(pingFence(honest));
  std::vector<RawConn> hogs;
  std::string m;
  for (int k = 0; k < 200; ++k) m += byte(v2::kGet) + str("/s");  // 9.6 MiB
  for (int i = 0; i < 2; ++i) {
    RawConn h = RawConn::connect(s->port(), "127.0.0.1", 16 * 1024);
    REQUIRE(h.ok());
    REQUIRE(h.handshake());
    REQUIRE(h.send(m));
    hogs.push_back(std::move(h));
  }
  // The honest client keeps storing and reading small values meanwhile.
  const auto end = Clock::now() + milliseconds(600);
  int round = 0;
  while (Clock::now() < end) {
    const std::string k = "/honest/" + std::to_string(round % 16);
    const std::string v = "v" + std::to_string(round++);
    REQUIRE(honest.send(byte(v2::kSet) + str(k) + str(v) + byte(v2::kGet) +
                        str(k)));
    REQUIRE(honest.recv(8 + v.size()) == u64le(v.size()) + v);
  }
  MESSAGE(round << " honest rounds; refused " << s->counters().budget_refused
                << ", dropped " << s->counters().budget_dropped);
  CHECK(s->counters().budget_refused + s->counters().budget_dropped >= 1);
  CHECK(pingFence(honest));
  CHECK(eventually(
      [&] { return s->counters().memory_bytes <= o.limits.max_memory_bytes; }));
}

// The largest-first drop, end to end: non-readers hold output under the
// soft line (their GETs were accepted), then honest clients' small SETs
// take the total past it. The server drops the largest non-reader, and only
// as many as needed; the smaller non-reader and the honest client keep
// every byte.
TEST_CASE("budget: past the soft line the largest non-reader is dropped") {
  constexpr int kPinned = 16 * 1024;  // both ends: replies stay queued
  BoundPort listen;
  REQUIRE(listen.pinSendBuffer(kPinned));
  tcpstore::ServerOptions o;
  o.port = listen.port();
  o.listen_fd = listen.release();
  o.limits.max_memory_bytes = 2 * kBudget;  // 16 MiB, soft line 15 MiB
  auto s = ScopedServer::local(o);
  RawConn honest = conn2(*s);
  const std::string value(1024 * 1024, 'd');
  REQUIRE(honest.send(byte(v2::kSet) + str("/big") + str(value)));
  REQUIRE(pingFence(honest));
  // Two non-readers: 2 and 9 MiB of replies (12 MiB with the value).
  std::vector<RawConn> hogs;
  for (int gets : {2, 9}) {
    RawConn h = RawConn::connect(s->port(), "127.0.0.1", kPinned);
    REQUIRE(h.ok());
    REQUIRE(h.handshake());
    std::string m;
    for (int k = 0; k < gets; ++k) m += byte(v2::kGet) + str("/big");
    REQUIRE(h.send(m));
    REQUIRE(h.send(pingMsg(77)));  // answered once its GETs were taken
    hogs.push_back(std::move(h));
  }
  REQUIRE(eventually([&] {
    return s->counters().memory_bytes > 11 * 1024 * 1024;  // all queued
  }));
  CHECK(s->counters().budget_refused == 0);
  // The server counts a client as not reading once its output made no
  // progress for 100 ms: round trips on the honest connection until both
  // non-readers are past that (as in the slow-request test above).
  const auto until = Clock::now() + milliseconds(250);
  while (Clock::now() < until) REQUIRE(pingFence(honest));
  // The honest client stores 3.5 MiB in values of normal size (48 KiB): the
  // total passes the soft line (15 MiB), not the budget.
  const std::string small(48 * 1024, 'h');
  for (int i = 0; i < 75; ++i) {
    REQUIRE(honest.send(byte(v2::kSet) + str("/h/" + std::to_string(i)) +
                        str(small)));
  }
  REQUIRE(pingFence(honest));
  CHECK(hogs[1].waitClosed(nullptr, milliseconds(10000)));
  CHECK(eventually([&] { return s->counters().budget_dropped >= 1; }));
  CHECK(s->counters().budget_dropped == 1);
  CHECK(s->counters().memory_bytes <= o.limits.max_memory_bytes);
  // The smaller non-reader reads now: every reply, exact.
  std::string want;
  for (int k = 0; k < 2; ++k) want += u64le(value.size()) + value;
  want += u32le(77);
  CHECK(hogs[0].recv(want.size(), milliseconds(10000)) == want);
  // The honest client's values are all there.
  for (int i = 0; i < 75; i += 12) {
    REQUIRE(honest.send(byte(v2::kGet) + str("/h/" + std::to_string(i))));
    CHECK(honest.recv(8 + small.size()) == u64le(small.size()) + small);
  }
  CHECK(s->counters().budget_refused == 0);
}
