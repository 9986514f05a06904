// Loopback tests of a huge WAIT (issue #13): its 128Ki keys are registered
// over several loop turns while other clients keep being served, with the
// result of registering them at once. In-process server, port 0.
#include <doctest/doctest.h>
#include <poll.h>

#include <chrono>
#include <string>
#include <vector>

#include "protocol/message.h"
#include "tcpstore/server.h"
#include "tests/server/raw_client.h"
#include "tests/support/deadline.h"
#include "tests/support/scoped_server.h"

namespace {

using namespace tcpstore::test;
using std::chrono::milliseconds;

constexpr std::size_t kKeys = 128 * 1024;

std::string key(std::size_t i) { return "/big/" + std::to_string(i); }

std::string waitMsg() {
  std::string m = byte(v2::kWait) + u64le(kKeys);
  for (std::size_t i = 0; i < kKeys; ++i) m += str(key(i));
  return m;
}

std::uint64_t waitsReceived(const tcpstore::test::ScopedServer& s) {
  return s->counters()
      .requests[static_cast<int>(tcpstore::protocol::Command::kWait)];
}

// Whether `c` has bytes to read now (no waiting).
bool readable(const RawConn& c) {
  pollfd p{c.fd(), POLLIN, 0};
  return ::poll(&p, 1, 0) > 0;
}

RawConn conn2(const tcpstore::test::ScopedServer& s) {
  RawConn c = RawConn::connect(s->port());
  REQUIRE(c.ok());
  REQUIRE(c.handshake());
  return c;
}

// SET of `k` and a fence: the SET has been applied when this returns.
void setFenced(RawConn& c, const std::string& k) {
  REQUIRE(c.send(byte(v2::kSet) + str(k) + str("v")));
  REQUIRE(pingFence(c));
}

}  // namespace

TEST_CASE("a 128Ki-key WAIT is registered while other clients are served") {
  skipInRelayMode("counts the WAITs the server itself received");
  auto s = ScopedServer::local();
  RawConn other = conn2(s);
  RawConn waiter = conn2(s);
  // The WAIT and a PING in one write: the PING's reply comes once the WAIT
  // is registered (its connection decodes nothing before).
  constexpr std::uint32_t kNonce = 0x7E57B16Bu;
  REQUIRE(waiter.send(waitMsg() + pingMsg(kNonce)));
  // Wait (bounded) until the server has decoded the WAIT.
  const auto deadline = Clock::now() + scaled(milliseconds(20000));
  while (waitsReceived(s) == 0) {
    REQUIRE(Clock::now() < deadline);
    REQUIRE(pingFence(other));
  }
  // From now on the other client writes keys of the WAIT, from both ends of
  // its key list, one fenced SET per round trip, until the waiter's PING
  // reply arrives. Registered at once (one event), the WAIT would leave
  // room for at most one or two of these round trips.
  std::size_t served = 0;
  while (!readable(waiter)) {
    REQUIRE(Clock::now() < deadline);
    REQUIRE(served < kKeys / 2);
    setFenced(other, key(served));
    setFenced(other, key(kKeys - 1 - served));
    ++served;
  }
  MESSAGE(served << " round trip pairs of another client were served while "
                    "the WAIT was registered");
  CHECK(served >= 3);
  REQUIRE(waiter.recv(4) == u32le(kNonce));  // registered, not released
  // The keys written during the registration counted, wherever their turn
  // was: every other key but the last releases nothing; the last releases
  // the WAIT once.
  constexpr std::size_t kBatch = 4096;
  std::vector<std::string> batch;
  for (std::size_t i = served; i < kKeys - served - 1; i += kBatch) {
    const std::size_t end = std::min(i + kBatch, kKeys - served - 1);
    std::string m = byte(v2::kMultiSet) + u64le(end - i);
    for (std::size_t k = i; k < end; ++k) m += str(key(k)) + str("v");
    REQUIRE(other.send(m));
  }
  REQUIRE(pingFence(other));
  REQUIRE(pingFence(waiter));  // no STOP_WAITING before the fence's reply
  setFenced(other, key(kKeys - 1 - served));
  CHECK(waiter.recv(1) == byte(0x00));
  REQUIRE(pingFence(waiter));  // and only one
  CHECK(s->counters().connections_open == 2);
}

TEST_CASE(
    "a client that closes during its WAIT's registration leaves nothing") {
  skipInRelayMode("reads the server's own memory gauge");
  auto s = ScopedServer::local();
  RawConn other = conn2(s);
  const std::uint64_t mem0 = s->counters().memory_bytes;
  for (int round = 0; round < 3; ++round) {
    RawConn waiter = conn2(s);
    REQUIRE(waiter.send(waitMsg()));
    const auto deadline = Clock::now() + scaled(milliseconds(20000));
    while (waitsReceived(s) == static_cast<std::uint64_t>(round)) {
      REQUIRE(Clock::now() < deadline);
      REQUIRE(pingFence(other));
    }
    waiter.close();  // most likely while its keys are being registered
  }
  // The server frees what was registered; the other client is served and a
  // write of the keys goes to nobody.
  const auto deadline = Clock::now() + scaled(milliseconds(20000));
  while (s->counters().connections_open != 1 ||
         s->counters().memory_bytes > mem0 + 64 * 1024) {
    REQUIRE(Clock::now() < deadline);
    REQUIRE(pingFence(other));
  }
  setFenced(other, key(0));
  setFenced(other, key(kKeys - 1));
  CHECK(s->counters().connections_open == 1);
}
