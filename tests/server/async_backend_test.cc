// The Backend seam's asynchronous path, for real: a server started over a
// test backend that wraps the in-memory backend and answers every request on
// a later loop turn (kPending, then BackendHost::complete()), driven by raw
// sockets on loopback. Replies must come back in order and exact.
//
// The test backend also holds SETs of keys "hold/..." until a request
// on "release/..." arrives (and completes them inside that submit(), which
// exercises a completion re-entering the dispatcher), and fails requests on
// "fail/..." with a backend error.
#include <doctest/doctest.h>
#include <sys/socket.h>
#include <uv.h>

#include <atomic>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "store/memory_backend.h"
#include "store/server/options.h"
#include "store/server/start.h"
#include "tests/server/raw_client.h"

namespace {

using namespace tcpstore::test;
using tcpstore::Status;
using tcpstore::store::Backend;
using tcpstore::store::BackendHost;
using tcpstore::store::ConnId;
using tcpstore::store::Effects;

// What the test thread may read while the loop thread runs the backend.
struct Stats {
  std::atomic<int> submitted{0};
  std::atomic<int> held{0};
  std::atomic<int> completions_after_close{0};
};

bool startsWith(std::string_view s, std::string_view p) {
  return s.substr(0, p.size()) == p;
}

// A request copied out of the connection's buffer.
struct Job {
  ConnId conn = 0;
  tcpstore::protocol::Request req;
  std::string key, value, desired;
  std::vector<std::string> keys, values;

  Job(ConnId c, const tcpstore::protocol::Request& r)
      : conn(c), key(r.key), value(r.value), desired(r.desired) {
    req.command = r.command;
    req.number = r.number;
    req.u32 = r.u32;
    for (auto k : r.keys) keys.emplace_back(k);
    for (auto v : r.values) values.emplace_back(v);
  }
  const tcpstore::protocol::Request& view() {
    req.key = key;
    req.value = value;
    req.desired = desired;
    req.keys.assign(keys.begin(), keys.end());
    req.values.assign(values.begin(), values.end());
    return req;
  }
};

class LaterBackend final : public Backend {
 public:
  LaterBackend(tcpstore::store::KeyspaceOptions o, Stats& stats)
      : inner_(o), stats_(stats) {}

  Status open(BackendHost& host, uv_loop_s* loop) override {
    host_ = &host;
    timer_ = new uv_timer_t;
    uv_timer_init(loop, timer_);
    timer_->data = this;
    return inner_.open(host, loop);
  }

  tcpstore::Result<Outcome> submit(ConnId conn,
                                   const tcpstore::protocol::Request& req,
                                   Effects&) override {
    ++stats_.submitted;
    if (startsWith(req.key, "release/")) {
      // Completes the held requests inside this submit().
      std::vector<Job> held;
      held.swap(held_);
      for (Job& j : held) run(j);
    }
    if (req.command == tcpstore::protocol::Command::kSet &&
        startsWith(req.key, "hold/")) {
      held_.emplace_back(conn, req);
      ++stats_.held;
    } else {
      queue_.emplace_back(conn, req);
      if (!uv_is_active(reinterpret_cast<uv_handle_t*>(timer_))) {
        uv_timer_start(timer_, &LaterBackend::onTimer, 0, 0);
      }
    }
    return Outcome::kPending;
  }

  void disconnect(ConnId conn) override {
    inner_.disconnect(conn);
    gone_.insert(conn);
  }

  void close() override {
    inner_.close();
    uv_close(reinterpret_cast<uv_handle_t*>(timer_),
             [](uv_handle_t* h) { delete reinterpret_cast<uv_timer_t*>(h); });
  }

 private:
  static void onTimer(uv_timer_t* t) {
    auto* b = static_cast<LaterBackend*>(t->data);
    std::vector<Job> jobs;
    jobs.swap(b->queue_);  // requests submitted from here wait a turn
    for (Job& j : jobs) b->run(j);
  }

  void run(Job& j) {
    Effects fx;
    if (startsWith(j.key, "fail/")) {
      host_->complete(j.conn, Status::ioError("injected backend failure"), fx);
      return;
    }
    auto r = inner_.submit(j.conn, j.view(), fx);
    if (gone_.count(j.conn) != 0) {
      inner_.disconnect(j.conn);  // forget what it registered meanwhile
      ++stats_.completions_after_close;
    }
    host_->complete(j.conn, r ? Status::ok() : r.error(), fx);
  }

  tcpstore::store::MemoryBackend inner_;
  Stats& stats_;
  BackendHost* host_ = nullptr;
  uv_timer_t* timer_ = nullptr;
  std::vector<Job> queue_;
  std::vector<Job> held_;
  std::set<ConnId> gone_;
};

struct AsyncServer {
  Stats stats;
  std::shared_ptr<tcpstore::Server> server;

  AsyncServer() {
    tcpstore::ServerOptions o;
    o.host = "127.0.0.1";
    o.port = 0;
    o.log_level = "error";
    auto r = tcpstore::server::startServer(
        o, std::make_unique<LaterBackend>(tcpstore::server::keyspaceOptions(o),
                                          stats));
    REQUIRE_MESSAGE(r.ok(), r.error().toString());
    server = r.value();
  }
  ~AsyncServer() { CHECK(server->stop().isOk()); }

  RawConn conn() {
    RawConn c = RawConn::connect(server->port());
    REQUIRE(c.ok());
    REQUIRE(c.handshake());
    return c;
  }
};

std::string setMsg(std::string_view k, std::string_view v) {
  return byte(v2::kSet) + str(k) + str(v);
}
std::string getMsg(std::string_view k) { return byte(v2::kGet) + str(k); }
std::string addMsg(std::string_view k, std::int64_t n) {
  return byte(v2::kAdd) + str(k) + i64le(n);
}
std::string numKeysMsg() { return byte(v2::kGetNumKeys); }

}  // namespace

TEST_CASE("async backend: pipelined requests are answered in order") {
  AsyncServer s;
  RawConn c = s.conn();
  std::string batch = setMsg("/a", "one") + getMsg("/a") + addMsg("/n", 5) +
                      addMsg("/n", 2) + setMsg("/a", "two") +
                      keysMsg(v2::kCheck, {"/a", "/n"}) + getMsg("/a") +
                      pingMsg(77) + numKeysMsg();
  auto expect = [](std::int64_t n) {
    return str("one") + i64le(n + 5) + i64le(n + 7) + byte(0x00) + str("two") +
           u32le(77) + i64le(2);
  };
  // Twice, the second time as single bytes: decoding stops and resumes in
  // the middle of buffered requests as well as between reads.
  REQUIRE(c.send(batch));
  CHECK(toHex(c.recv(expect(0).size())) == toHex(expect(0)));
  for (char ch : batch) REQUIRE(c.send(std::string(1, ch)));
  CHECK(toHex(c.recv(expect(7).size())) == toHex(expect(7)));
  CHECK(s.stats.submitted.load() >= 2 * 9 + 2);
  CHECK(s.server->counters().requests_total ==
        static_cast<std::uint64_t>(s.stats.submitted.load()));
}

TEST_CASE("async backend: a WAIT is released by another connection") {
  AsyncServer s;
  RawConn w = s.conn();
  RawConn setter = s.conn();
  REQUIRE(w.send(keysMsg(v2::kWait, {"/w1", "/w2"})));
  // Fence: the WAIT is registered once a later request on w is answered.
  REQUIRE(w.send(numKeysMsg()));
  CHECK(w.recv(8) == i64le(0));
  REQUIRE(setter.send(setMsg("/w1", "x") + numKeysMsg()));
  CHECK(setter.recv(8) == i64le(1));
  REQUIRE(setter.send(setMsg("/w2", "y") + getMsg("/w2")));
  CHECK(setter.recv(9) == str("y"));
  CHECK(w.recv(1) == byte(0x00));  // STOP_WAITING, once
  REQUIRE(w.send(getMsg("/w1")));
  CHECK(w.recv(9) == str("x"));
}

TEST_CASE("async backend: a connection closing while its request is pending") {
  AsyncServer s;
  {
    RawConn c = s.conn();
    c.setAbortiveClose();  // a reset: a FIN would be a half-close
    // Held until released; the GET behind it stays buffered.
    REQUIRE(c.send(setMsg("hold/x", "v") + getMsg("hold/x")));
    REQUIRE(eventually([&] { return s.stats.held.load() == 1; }));
  }  // closed while pending
  REQUIRE(
      eventually([&] { return s.server->counters().connections_closed == 1; }));
  RawConn r = s.conn();
  // The release completes the held SET (inside this submit) for a closed
  // connection: the host must drop its completion.
  REQUIRE(r.send(setMsg("release/1", "") + getMsg("hold/x")));
  CHECK(r.recv(9) == str("v"));
  CHECK(s.stats.completions_after_close.load() == 1);

  // A held request of a live connection, released by another connection:
  // its buffered requests are decoded once it completes.
  RawConn c = s.conn();
  REQUIRE(c.send(setMsg("hold/y", "w") + getMsg("hold/y") + pingMsg(5)));
  REQUIRE(eventually([&] { return s.stats.held.load() == 2; }));
  REQUIRE(r.send(setMsg("release/2", "") + numKeysMsg()));
  CHECK(r.recv(8) == i64le(4));
  CHECK(toHex(c.recv(13)) == toHex(str("w") + u32le(5)));

  // Half-closed while pending: the replies still come, then the close.
  REQUIRE(c.send(setMsg("hold/z", "z") + getMsg("hold/z")));
  REQUIRE(eventually([&] { return s.stats.held.load() == 3; }));
  REQUIRE(::shutdown(c.fd(), SHUT_WR) == 0);
  REQUIRE(r.send(setMsg("release/3", "") + numKeysMsg()));
  CHECK(r.recv(8) == i64le(6));
  std::string got;
  CHECK(c.waitClosed(&got));
  CHECK(toHex(got) == toHex(str("z")));
  CHECK(s.server->counters().rejected_protocol == 0);
}

TEST_CASE("async backend: an error completion closes only its connection") {
  AsyncServer s;
  RawConn c = s.conn();
  RawConn other = s.conn();
  REQUIRE(c.send(setMsg("/k", "v") + getMsg("/k")));
  CHECK(c.recv(9) == str("v"));
  REQUIRE(c.send(setMsg("fail/1", "") + numKeysMsg()));
  std::string got;
  CHECK(c.waitClosed(&got));
  CHECK(got.empty());  // nothing for the failed request or after it
  CHECK(s.server->counters().rejected_semantic == 1);
  REQUIRE(other.send(getMsg("/k")));
  CHECK(other.recv(9) == str("v"));
}

TEST_CASE("async backend: stop with a request still pending") {
  AsyncServer s;
  RawConn c = s.conn();
  REQUIRE(c.send(setMsg("hold/s", "v") + numKeysMsg()));
  REQUIRE(eventually([&] { return s.stats.held.load() == 1; }));
  CHECK(s.server->stop().isOk());  // cut after the flush grace
  CHECK(c.waitClosed());
}
