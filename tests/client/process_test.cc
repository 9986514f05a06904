// Client tests that run executables as child processes against an
// in-process server: the C API test program, tcpstore-cli, and a custom
// launcher of 8 processes.
#include <doctest/doctest.h>

#include <future>
#include <string>
#include <thread>
#include <vector>

#include "protocol/wire.h"
#include "tcpstore/client.h"
#include "tcpstore/server.h"
#include "tests/support/bound_port.h"
#include "tests/support/child.h"
#include "tests/support/deadline.h"
#include "tests/support/scoped_server.h"

using namespace std::chrono_literals;
using tcpstore::Server;
using tcpstore::ServerOptions;
using tcpstore::protocol::Command;
using tcpstore::test::Child;
using tcpstore::test::Clock;
using tcpstore::test::ProcResult;
using tcpstore::test::runProcess;
using tcpstore::test::scaled;
using tcpstore::test::ScopedServer;

namespace {

const std::string kBin = TCPSTORE_BIN_DIR;

ScopedServer startServer(const std::string& host = "127.0.0.1") {
  ServerOptions o;
  o.host = host;
  return ScopedServer::local(o);
}

std::uint64_t count(const Server& s, Command c) {
  return s.counters().requests[static_cast<int>(c)];
}

struct Cli {
  std::string addr;
  std::vector<std::string> opts;
  ProcResult run(std::vector<std::string> args,
                 std::chrono::milliseconds limit = 20s) const {
    std::vector<std::string> argv{kBin + "/tcpstore-cli", "--addr", addr};
    argv.insert(argv.end(), opts.begin(), opts.end());
    argv.insert(argv.end(), args.begin(), args.end());
    return runProcess(argv, limit);
  }
};

int lines(const std::string& s) {
  int n = 0;
  for (char ch : s) n += ch == '\n';
  return n;
}

}  // namespace

TEST_CASE("C API test program (written in C)") {
  auto server = startServer();
  auto r = runProcess(
      {kBin + "/tcpstore-c-api-test", std::to_string(server->port())}, 60s);
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  CHECK(r.exit_code == 0);
  CHECK(r.out == "c api ok\n");
  r = runProcess(
      {kBin + "/tcpstore-c-api-test", std::to_string(server->port()), "1.13"},
      60s);
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  CHECK(r.exit_code == 0);
  CHECK(r.out == "c api ok\n");
}

TEST_CASE("tcpstore-cli: commands, output and exit codes") {
  auto server = startServer();
  Cli cli{"127.0.0.1:" + std::to_string(server->port()), {"--timeout", "10"}};

  auto r = cli.run({"set", "foo", "bar"});
  CHECK(r.exit_code == 0);
  CHECK(r.out.empty());
  CHECK(r.err.empty());
  r = cli.run({"get", "foo"});
  CHECK(r.exit_code == 0);
  CHECK(r.out == "bar\n");

  r = cli.run({"add", "n", "-2"});  // after the command word, -2 is an argument
  CHECK(r.exit_code == 0);
  CHECK(r.out == "-2\n");
  r = cli.run({"add", "n", "5"});
  CHECK(r.out == "3\n");

  r = cli.run({"compare-set", "foo", "bar", "baz"});
  CHECK(r.exit_code == 0);
  CHECK(r.out == "baz\n");
  r = cli.run({"compare-set", "foo", "nope", "x"});
  CHECK(r.out == "baz\n");

  r = cli.run({"check", "foo", "n"});
  CHECK(r.exit_code == 0);
  r = cli.run({"check", "foo", "missing"});
  CHECK(r.exit_code == 1);
  CHECK(r.err.empty());

  r = cli.run({"wait", "foo", "n"});
  CHECK(r.exit_code == 0);

  r = cli.run({"num-keys"});
  CHECK(r.exit_code == 0);
  CHECK(r.out == "2\n");

  r = cli.run({"list-keys"});
  CHECK(r.exit_code == 0);
  CHECK(r.out == "foo\nn\n");

  r = cli.run({"ping"});
  CHECK(r.exit_code == 0);
  CHECK(r.out == "ok\n");

  r = cli.run({"barrier", "b", "1"});
  CHECK(r.exit_code == 0);
  r = cli.run({"wait-for-workers", "1"});
  CHECK(r.exit_code == 0);

  r = cli.run({"delete", "foo"});
  CHECK(r.exit_code == 0);
  CHECK(r.out == "1\n");
  r = cli.run({"delete", "foo"});
  CHECK(r.out == "0\n");

  // --prefix maps like PrefixStore.
  Cli pcli = cli;
  pcli.opts.push_back("--prefix");
  pcli.opts.push_back("pg1");
  r = pcli.run({"set", "k", "pv"});
  CHECK(r.exit_code == 0);
  r = cli.run({"get", "pg1/k"});
  CHECK(r.out == "pv\n");

  // Two concurrent CLIs meet at a barrier of 2.
  Child first;
  REQUIRE(first.start(
      {kBin + "/tcpstore-cli", "--addr", cli.addr, "barrier", "meet", "2"}));
  r = cli.run({"barrier", "meet", "2"});
  CHECK(r.exit_code == 0);
  auto fr = first.wait(Clock::now() + scaled(20s));
  CHECK(fr.exit_code == 0);

  // A get that waits for a later set.
  Child getter;
  REQUIRE(getter.start(
      {kBin + "/tcpstore-cli", "--addr", cli.addr, "get", "later"}));
  r = cli.run({"set", "later", "v"});
  auto gr = getter.wait(Clock::now() + scaled(20s));
  CHECK(gr.exit_code == 0);
  CHECK(gr.out == "v\n");
}

TEST_CASE("tcpstore-cli: errors are one line on stderr with exit >= 2") {
  auto server = startServer();
  const std::string addr = "127.0.0.1:" + std::to_string(server->port());
  const std::string cli = kBin + "/tcpstore-cli";

  auto r = runProcess(
      {cli, "--addr", addr, "--timeout", "0.3", "wait", "never"}, 20s);
  CHECK(r.exit_code == 4);
  CHECK(lines(r.err) == 1);
  CHECK(r.err.find("timeout") != std::string::npos);
  r = runProcess({cli, "--addr", addr, "--timeout", "0.3", "get", "never"},
                 20s);
  CHECK(r.exit_code == 4);
  CHECK(r.out.empty());

  tcpstore::test::BoundPort reserved;  // nothing listens there
  const auto dead = reserved.port();
  r = runProcess({cli, "--addr", "127.0.0.1:" + std::to_string(dead),
                  "--timeout", "0.3", "ping"},
                 20s);
  CHECK(r.exit_code == 3);
  CHECK(lines(r.err) == 1);
  CHECK(r.err.find("refused") != std::string::npos);

  for (const auto& bad : std::vector<std::vector<std::string>>{
           {cli},
           {cli, "frobnicate"},
           {cli, "set", "onlykey"},
           {cli, "add", "k", "notanumber"},
           {cli, "--dialect", "3.0", "ping"},
           {cli, "--addr", "::1:29500", "ping"},
           {cli, "--addr", "127.0.0.1:70000", "ping"},
           {cli, "--bogus", "ping"},
           {cli, "barrier", "b", "0"},
       }) {
    r = runProcess(bad, 10s);
    INFO(bad.back());
    CHECK(r.exit_code == 2);
    CHECK(lines(r.err) == 1);
    CHECK(r.out.empty());
  }

  // 1.13-only: a 2.x-only command is refused locally.
  r = runProcess({cli, "--addr", addr, "--dialect", "1.13", "list-keys"}, 10s);
  CHECK(r.exit_code == 5);
  CHECK(lines(r.err) == 1);

  r = runProcess({cli, "--help"}, 10s);
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("usage: tcpstore-cli") != std::string::npos);
}

TEST_CASE("tcpstore-cli: IPv6 address in brackets") {
  auto server = startServer("::1");
  const std::string addr = "[::1]:" + std::to_string(server->port());
  auto r = runProcess(
      {kBin + "/tcpstore-cli", "--addr", addr, "set", "six", "6"}, 20s);
  CHECK(r.exit_code == 0);
  r = runProcess({kBin + "/tcpstore-cli", "--addr", addr, "get", "six"}, 20s);
  CHECK(r.exit_code == 0);
  CHECK(r.out == "6\n");
}

namespace {

// Runs `n` launcher processes against `server` and checks they all succeed.
void runLaunchers(const Server& server, int n, const std::string& dialect) {
  std::vector<Child> kids(n);
  for (int i = 0; i < n; ++i) {
    REQUIRE(kids[i].start({kBin + "/tcpstore-test-launcher", "--port",
                           std::to_string(server.port()), "--world",
                           std::to_string(n), "--dialect", dialect, "--timeout",
                           "60"}));
  }
  const auto deadline = Clock::now() + scaled(90s);
  for (int i = 0; i < n; ++i) {
    auto r = kids[i].wait(deadline);
    INFO("launcher " << i << " stderr: " << r.err);
    CHECK(r.exit_code == 0);
    CHECK(r.out == "done\n");
  }
}

}  // namespace

TEST_CASE(
    "custom launcher: 8 processes, waitForWorkers + 3 barriers, exact request "
    "counts (2.x)") {
  auto server = startServer();
  constexpr int kN = 8;
  runLaunchers(*server, kN, "2.x");
  auto c = server->counters();
  // Per process: a primary connection (opened by connect, unused after the
  // handshake) and one pooled connection that carries every blocking call.
  CHECK(c.connections_accepted == 2 * kN);
  CHECK(count(*server, Command::kValidate) == 2 * kN);
  CHECK(count(*server, Command::kPing) == 2 * kN);
  // waitForWorkers = BARRIER init/, GET init/ (verify the count), SET
  // init/done each; 3 barriers = 3 BARRIER each.
  CHECK(count(*server, Command::kBarrier) == 4 * kN);
  CHECK(count(*server, Command::kGet) == kN);
  CHECK(count(*server, Command::kSet) == kN);
  CHECK(count(*server, Command::kAdd) == 0);
  CHECK(count(*server, Command::kWait) == 0);
  CHECK(count(*server, Command::kCheck) == 0);
  CHECK(c.requests_total == 10 * kN);  // nothing else: no polling
}

TEST_CASE(
    "custom launcher: 8 processes in the 1.13 dialect (fallback), exact "
    "request counts") {
  auto server = startServer();
  constexpr int kN = 8;
  runLaunchers(*server, kN, "1.13");
  // Per barrier (and waitForWorkers): one ADD each, one SET by the last
  // arrival, one WAIT by each of the others.
  CHECK(count(*server, Command::kAdd) == 4 * kN);
  CHECK(count(*server, Command::kSet) == 4);
  CHECK(count(*server, Command::kWait) == 4 * (kN - 1));
  CHECK(count(*server, Command::kGet) == 0);
  CHECK(count(*server, Command::kCheck) == 0);
  CHECK(count(*server, Command::kValidate) == 0);
  CHECK(server->counters().requests_total == 4 * kN + 4 + 4 * (kN - 1));
}

TEST_CASE(
    "server process killed (SIGKILL) during a wait: typed error within the "
    "deadline") {
  Child server;
  REQUIRE(server.start(
      {kBin + "/tcpstore-server", "--host", "127.0.0.1", "--port", "0"}));
  auto line = server.readLine(Clock::now() + scaled(20s));
  REQUIRE(line.has_value());
  const std::string want = "listening on 127.0.0.1:";
  REQUIRE(line->rfind(want, 0) == 0);
  tcpstore::ClientOptions o;
  o.port = static_cast<std::uint16_t>(std::stoi(line->substr(want.size())));
  o.timeout = scaled(30s);
  o.connect_timeout = scaled(10s);
  o.share_connections = false;
  auto c = tcpstore::Client::connect(o);
  REQUIRE_MESSAGE(c.has_value(), c.error().toString());
  REQUIRE(c->set("k", "v"));  // the server is up and serving
  auto fut = std::async(std::launch::async, [&] { return c->wait({"never"}); });
  // The WAIT has reached the server once its counters (printed on SIGUSR1)
  // count it.
  REQUIRE(server.waitStderr(" wait=1 ", Clock::now() + scaled(10s),
                            [&] { server.signal(SIGUSR1); }));
  REQUIRE(::kill(server.pid(), SIGKILL) == 0);
  REQUIRE(fut.wait_for(scaled(10s)) == std::future_status::ready);
  auto s = fut.get();
  CHECK(s.code() == tcpstore::StatusCode::kClosed);
  (void)server.wait(Clock::now() + scaled(5s));
}

TEST_CASE(
    "custom launcher: 2.x and 1.13 processes count together in "
    "waitForWorkers") {
  auto server = startServer();
  constexpr int kN = 6;
  std::vector<Child> kids(kN);
  for (int i = 0; i < kN; ++i) {
    REQUIRE(kids[i].start({kBin + "/tcpstore-test-launcher", "--port",
                           std::to_string(server->port()), "--world",
                           std::to_string(kN), "--dialect",
                           i % 2 == 0 ? "2.x" : "1.13", "--barriers", "0",
                           "--timeout", "60"}));
  }
  const auto deadline = Clock::now() + scaled(90s);
  for (int i = 0; i < kN; ++i) {
    auto r = kids[i].wait(deadline);
    INFO("launcher " << i << " stderr: " << r.err);
    CHECK(r.exit_code == 0);
  }
  CHECK(count(*server, Command::kBarrier) == kN / 2);  // 2.x: BARRIER init/
  CHECK(count(*server, Command::kAdd) == kN / 2);      // 1.13: ADD init/
}
