// GatewayProcess: a real `tcpstore-server --backend etcd://...` process for
// tests (test code). Started on 127.0.0.1 port 0; the port is read from its
// "listening on HOST:PORT" line. Killed by PID (SIGKILL) by kill() or the
// destructor.
#pragma once

#include <signal.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/support/child.h"
#include "tests/support/deadline.h"

namespace tcpstore::test {

class GatewayProcess {
 public:
  GatewayProcess(const std::string& server_bin, const std::string& url) {
    if (!child_.start({server_bin, "--backend", url, "--host", "127.0.0.1",
                       "--port", "0"})) {
      throw std::runtime_error("cannot spawn " + server_bin);
    }
    const auto deadline = Clock::now() + scaled(std::chrono::seconds(30));
    for (;;) {
      auto line = child_.readLine(deadline);
      if (!line) {
        throw std::runtime_error("gateway did not start: " + child_.err());
      }
      const std::string tag = "listening on 127.0.0.1:";
      if (line->rfind(tag, 0) == 0) {
        port_ = static_cast<std::uint16_t>(std::stoi(line->substr(tag.size())));
        return;
      }
    }
  }

  std::uint16_t port() const { return port_; }
  pid_t pid() const { return child_.pid(); }
  bool running() const { return child_.pid() > 0; }

  // SIGKILL and reap.
  void kill() {
    child_.signal(SIGKILL);
    (void)child_.wait(Clock::now() + scaled(std::chrono::seconds(10)));
  }

  // Waits until the server's request counter of `command` (its name in the
  // counters line, lower case, e.g. "wait") has reached `at_least` (each
  // round is one SIGUSR1 and the counters line it prints). False at the
  // deadline.
  bool waitCount(const std::string& command, int at_least,
                 std::chrono::milliseconds limit = std::chrono::seconds(20)) {
    const auto deadline = Clock::now() + scaled(limit);
    const std::string tag = "requests total=";
    while (Clock::now() < deadline) {
      const std::size_t seen = child_.err().size();
      child_.signal(SIGUSR1);
      if (!child_.waitStderr(
              tag, deadline, [] {}, seen))
        return false;
      const std::size_t start = child_.err().find(tag, seen);
      if (!child_.waitStderr(
              "\n", deadline, [] {}, start))
        return false;
      const std::string& err = child_.err();
      const std::string line = err.substr(start, err.find('\n', start) - start);
      const std::string needle = " " + command + "=";
      const auto p = line.find(needle);
      const int n = p == std::string::npos
                        ? 0
                        : std::stoi(line.substr(p + needle.size()));
      if (n >= at_least) return true;
    }
    return false;
  }

 private:
  Child child_;
  std::uint16_t port_ = 0;
};

}  // namespace tcpstore::test
