// A connection's socket I/O (issue 12: connections poll their socket and
// keep no decoder, input or output state while idle): replies the kernel
// does not take at once go out as the socket becomes writable, a half-close
// still gets every reply, a reset after a request still applies it, and a
// connection that went idle between requests decodes the next one in its
// dialect and remembers its 2.x handshake.
#include <doctest/doctest.h>

#include <chrono>
#include <string>

#include "tcpstore/server.h"
#include "tests/server/pinned.h"
#include "tests/server/raw_client.h"
#include "tests/support/deadline.h"
#include "tests/support/scoped_server.h"

namespace {

using namespace tcpstore::test;
using std::chrono::seconds;

constexpr std::size_t kValueBytes = 1024 * 1024;
constexpr int kGets = 8;

// A value whose every byte depends on its position (a misordered or lost
// piece shows).
std::string patterned(std::size_t n) {
  std::string v(n, '\0');
  for (std::size_t i = 0; i < n; ++i)
    v[i] = static_cast<char>((i * 131 + i / 4096) & 0xff);
  return v;
}

// SET /big, then kGets GETs of it and a PING, pipelined in one write.
std::string setThenGets(const std::string& value) {
  std::string batch = byte(v2::kSet) + str("/big") + str(value);
  for (int i = 0; i < kGets; ++i) batch += byte(v2::kGet) + str("/big");
  return batch + pingMsg(77);
}

std::string expectedReplies(const std::string& value) {
  std::string want;
  for (int i = 0; i < kGets; ++i) want += str(value);
  return want + u32le(77);
}

}  // namespace

TEST_CASE("replies the kernel does not take go out as the client reads") {
  auto s = startPinned();
  RawConn c = pinned2(*s);
  const std::string value = patterned(kValueBytes);
  REQUIRE(c.send(setThenGets(value)));
  const std::string want = expectedReplies(value);
  const std::string got = c.recv(want.size(), scaled(seconds(20)));
  REQUIRE(got.size() == want.size());
  CHECK(got == want);
  // Written to the end, the connection serves the next request.
  REQUIRE(c.send(pingMsg(78)));
  CHECK(c.recv(4) == u32le(78));
  CHECK(s->counters().bytes_out >= want.size());
  CHECK(s->counters().rejected_slow_reader == 0);
  CHECK(s->stop().isOk());
}

TEST_CASE("a half-close after large pipelined replies gets all of them") {
  auto s = startPinned();
  RawConn c = pinned2(*s);
  const std::string value = patterned(kValueBytes);
  REQUIRE(c.send(setThenGets(value)));
  c.shutdownWrite();
  std::string got;
  CHECK(c.waitClosed(&got, scaled(seconds(20))));
  const std::string want = expectedReplies(value);
  REQUIRE(got.size() == want.size());
  CHECK(got == want);
  CHECK(s->counters().rejected_protocol == 0);
  CHECK(eventually([&] { return s->counters().connections_closed == 1; }));
  CHECK(s->stop().isOk());
}

TEST_CASE("a reset right after a request: the request is applied") {
  auto s = ScopedServer::local({});
  {
    RawConn c = RawConn::connect(s->port());
    REQUIRE(c.ok());
    REQUIRE(c.handshake());
    REQUIRE(c.send(byte(v2::kSet) + str("/reset") + str("applied")));
    c.setAbortiveClose();
    c.close();  // RST: the server sees the SET, then the error
  }
  CHECK(eventually([&] { return s->counters().connections_closed == 1; }));
  RawConn d = RawConn::connect(s->port());
  REQUIRE(d.ok());
  REQUIRE(d.handshake());
  REQUIRE(d.send(byte(v2::kGet) + str("/reset")));
  CHECK(d.recv(8 + 7) == str("applied"));
  CHECK(s->stop().isOk());
}

TEST_CASE(
    "a connection idle between requests keeps its dialect and handshake") {
  auto s = ScopedServer::local({});
  // 2.x: validated once; after going idle a request needs no new VALIDATE,
  // and a second VALIDATE is still refused.
  RawConn c = RawConn::connect(s->port());
  REQUIRE(c.ok());
  REQUIRE(c.handshake());
  for (int i = 0; i < 3; ++i) {  // each round trip leaves it idle
    REQUIRE(c.send(byte(v2::kAdd) + str("/idle") + i64le(1)));
    CHECK(c.recv(8) == i64le(i + 1));
  }
  // 1.13: decoded as 1.13 after idling too.
  RawConn d = RawConn::connect(s->port());
  REQUIRE(d.ok());
  for (int i = 0; i < 3; ++i) {
    REQUIRE(d.send(byte(v113::kAdd) + str("/idle") + i64le(1)));
    CHECK(d.recv(8) == i64le(i + 4));
  }
  CHECK(s->counters().rejected_protocol == 0);
  REQUIRE(c.send(validateMsg()));
  CHECK(c.waitClosed());
  CHECK(s->counters().rejected_protocol == 1);
  CHECK(s->counters().connections_v2 == 1);
  CHECK(s->counters().connections_v113 == 1);
  CHECK(s->stop().isOk());
}
