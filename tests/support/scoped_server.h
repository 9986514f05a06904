// ScopedServer: an in-process tcpstore::Server for one test. Its destructor
// CHECKs that stop() returns OK, so every test that starts a server asserts a
// clean stop (every connection and loop handle closed) without a line of its
// own. stop() is idempotent: a test may stop early and check the Status too.
#pragma once

#include <doctest/doctest.h>

#include <memory>
#include <utility>

#include "tcpstore/server.h"

namespace tcpstore::test {

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
  // test asked for another than the default.
  static ScopedServer local(tcpstore::ServerOptions o = {}) {
    if (o.host.empty()) o.host = "127.0.0.1";
    if (o.port == tcpstore::ServerOptions{}.port) o.port = 0;
    if (o.log_level == tcpstore::ServerOptions{}.log_level)
      o.log_level = "error";
    return start(o);
  }

  tcpstore::Server* operator->() const { return server_.get(); }
  tcpstore::Server& operator*() const { return *server_; }
  const std::shared_ptr<tcpstore::Server>& shared() const { return server_; }

 private:
  void checkStop() {
    if (!server_) return;
    const tcpstore::Status st = server_->stop();
    CHECK_MESSAGE(st.isOk(), "server did not stop cleanly: " << st.toString());
    server_.reset();
  }

  std::shared_ptr<tcpstore::Server> server_;
};

}  // namespace tcpstore::test
