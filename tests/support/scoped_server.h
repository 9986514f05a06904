// ScopedServer: an in-process tcpstore::Server for one test. Its destructor
// CHECKs that stop() returns OK, so every test that starts a server asserts a
// clean stop (every connection and loop handle closed) without a line of its
// own. stop() is idempotent: a test may stop early and check the Status too.
//
// Topology switch (label `relay`): with TCPSTORE_TEST_RELAYS=1 or 2 in the
// environment, local() starts an upstream server plus that many relays
// stacked in front of it (ServerOptions::upstream, each relay's upstream the
// one behind it), all in this process, and the ScopedServer stands for the
// front relay: port(), counters() and stop() are the front relay's, so the
// loopback suites run unchanged through relays. Tests that assert what only
// the server holding the state can show (its exact counters, its logs, its
// internals) call skipInRelayMode() with the reason (a visible skip).
#pragma once

#include <doctest/doctest.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tcpstore/server.h"
#include "tests/support/skip.h"

namespace tcpstore::test {

// TCPSTORE_TEST_RELAYS: relays in front of local() servers (0, 1 or 2).
inline int testRelays() {
  const char* s = std::getenv("TCPSTORE_TEST_RELAYS");
  if (s == nullptr || *s == '\0') return 0;
  const int n = std::atoi(s);
  return n < 0 ? 0 : (n > 4 ? 4 : n);
}

// Skips the calling test case (exit 77, shown as skipped) when local()
// servers are relays.
inline void skipInRelayMode(const std::string& why) {
  if (testRelays() > 0) skipTest("through relays: " + why);
}

class ScopedServer {
 public:
  ScopedServer() = default;
  explicit ScopedServer(std::shared_ptr<tcpstore::Server> s)
      : server_(std::move(s)) {}
  ScopedServer(ScopedServer&& o) noexcept = default;
  ScopedServer& operator=(ScopedServer&& o) noexcept {
    if (this != &o) {
      checkStop();
      server_ = std::move(o.server_);
      behind_ = std::move(o.behind_);
    }
    return *this;
  }
  ScopedServer(const ScopedServer&) = delete;
  ScopedServer& operator=(const ScopedServer&) = delete;
  ~ScopedServer() { checkStop(); }

  // Starts a server with `o` as given (REQUIREs success). Tests that want
  // 127.0.0.1:0 and quiet logs say so in `o`; see local().
  static ScopedServer start(const tcpstore::ServerOptions& o) {
    auto r = tcpstore::Server::start(o);
    REQUIRE_MESSAGE(r.ok(), r.error().toString());
    return ScopedServer(r.value());
  }
  // 127.0.0.1, port 0 (unless o.port is set), log level "error" unless the
  // test asked for another than the default. Through TCPSTORE_TEST_RELAYS
  // relays if that is set (and o.upstream is not).
  static ScopedServer local(tcpstore::ServerOptions o = {}) {
    if (o.host.empty()) o.host = "127.0.0.1";
    if (o.port == tcpstore::ServerOptions{}.port) o.port = 0;
    if (o.log_level == tcpstore::ServerOptions{}.log_level)
      o.log_level = "error";
    const int relays = o.upstream.empty() ? testRelays() : 0;
    if (relays == 0) return start(o);
    // The server holding the state: the test's options on a free port.
    tcpstore::ServerOptions up = o;
    up.host = "127.0.0.1";
    up.port = 0;
    up.listen_fd = -1;
    up.multi_tenant = false;
    std::vector<std::shared_ptr<tcpstore::Server>> chain;
    chain.push_back(start(up).release());
    for (int i = 1; i <= relays; ++i) {
      tcpstore::ServerOptions r = i == relays ? o : up;
      r.upstream = "127.0.0.1:" + std::to_string(chain.back()->port());
      chain.push_back(start(r).release());
    }
    ScopedServer s(chain.back());
    chain.pop_back();
    s.behind_ = std::move(chain);
    return s;
  }

  tcpstore::Server* operator->() const { return server_.get(); }
  tcpstore::Server& operator*() const { return *server_; }
  const std::shared_ptr<tcpstore::Server>& shared() const { return server_; }
  // The front server's counters, with the rejections made by the server
  // holding the state added (through relays a request that breaks a rule
  // upstream is rejected, and counted, there; the relay closes its client).
  tcpstore::ServerCounters rejectionCounters() const {
    tcpstore::ServerCounters c = server_->counters();
    if (behind_.empty()) return c;
    const tcpstore::ServerCounters o = behind_.front()->counters();
    c.rejected_protocol += o.rejected_protocol;
    c.rejected_limit += o.rejected_limit;
    c.rejected_semantic += o.rejected_semantic;
    return c;
  }
  // Relay topology: the server holding the state (the front one otherwise).
  tcpstore::Server& origin() const {
    return behind_.empty() ? *server_ : *behind_.front();
  }

 private:
  std::shared_ptr<tcpstore::Server> release() { return std::move(server_); }
  void checkStop() {
    if (server_) {
      const tcpstore::Status st = server_->stop();
      CHECK_MESSAGE(st.isOk(),
                    "server did not stop cleanly: " << st.toString());
      server_.reset();
    }
    // Front to back: a relay stops before the server it relays to.
    while (!behind_.empty()) {
      const tcpstore::Status st = behind_.back()->stop();
      CHECK_MESSAGE(st.isOk(),
                    "server did not stop cleanly: " << st.toString());
      behind_.pop_back();
    }
  }

  std::shared_ptr<tcpstore::Server> server_;
  // Relay topology: the servers behind the front one, upstream-most first.
  std::vector<std::shared_ptr<tcpstore::Server>> behind_;
};

}  // namespace tcpstore::test
