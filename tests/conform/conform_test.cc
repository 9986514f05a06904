// tcpstore-conform against a fault-injecting server (each group must FAIL on
// the fault that breaks it, and pass when nothing is broken) and against our
// real tcpstore-server started as a separate process.
#include <doctest/doctest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/support/bound_port.h"
#include "tests/support/child.h"
#include "tests/support/deadline.h"
#include "tests/conform/fault_server.h"

namespace tcpstore::conform::test {
namespace {

using tcpstore::test::ProcResult;
using tcpstore::test::runProcess;

const std::string kTool = std::string(TCPSTORE_BIN_DIR) + "/tcpstore-conform";
const std::string kServer = std::string(TCPSTORE_BIN_DIR) + "/tcpstore-server";

ProcResult conform(std::vector<std::string> args) {
  args.insert(args.begin(), kTool);
  ProcResult r = runProcess(args, std::chrono::milliseconds(90000));
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  REQUIRE_FALSE(r.timed_out);
  return r;
}

ProcResult againstFault(Fault fault, const std::string& group) {
  FaultServer server(fault);
  REQUIRE(server.port() != 0);
  return conform({"--addr", "127.0.0.1:" + std::to_string(server.port()),
                  "--profile", "tcpstore", "--only", group,
                  // Shorter than the default 3 s: the faults make many replies
                  // never come, and each such wait costs one timeout.
                  "--timeout-ms",
                  std::to_string(1500 * tcpstore::test::timeoutMultiplier())});
}

bool hasLine(const std::string& out, const std::string& prefix) {
  return out.find("\n" + prefix) != std::string::npos ||
         out.rfind(prefix, 0) == 0;
}

std::string lastLine(const std::string& out) {
  auto end = out.find_last_not_of('\n');
  auto start = out.rfind('\n', end);
  return out.substr(start == std::string::npos ? 0 : start + 1,
                    end - (start == std::string::npos ? 0 : start + 1) + 1);
}

void expectGroupFails(Fault fault, const std::string& group,
                      const std::vector<std::string>& failing) {
  ProcResult r = againstFault(fault, group);
  INFO("output:\n" << r.out << r.err);
  CHECK(r.exit_code == 1);
  for (const auto& id : failing) CHECK(hasLine(r.out, "FAIL " + id + " "));
  CHECK(lastLine(r.out).find(" passed, ") != std::string::npos);
  CHECK(lastLine(r.out).find(" 0 failed") == std::string::npos);
}

TEST_CASE("every group passes on the fault server without a fault") {
  for (std::string group :
       {"wire", "semantics", "blocking", "isolation", "extensions"}) {
    ProcResult r = againstFault(Fault::kNone, group);
    INFO("group " << group << ":\n" << r.out << r.err);
    CHECK(r.exit_code == 0);
    CHECK(lastLine(r.out).find(", 0 failed") != std::string::npos);
    CHECK(r.out.find("FAIL ") == std::string::npos);
  }
}

TEST_CASE("wire fails when a reply is dropped") {
  expectGroupFails(Fault::kDropGetReply, "wire",
                   {"wire.v1.set_get", "wire.v2.set_get", "wire.v2.add"});
}

TEST_CASE("semantics fails when compare_set answers wrongly") {
  expectGroupFails(Fault::kWrongCompareSet, "semantics",
                   {"sem.compare_set.mismatch"});
}

TEST_CASE("blocking fails when waiters are not woken") {
  expectGroupFails(Fault::kNoWake, "blocking",
                   {"block.set", "block.add", "block.append", "block.multi_set",
                    "block.two_waiters"});
}

TEST_CASE("isolation fails when a partial message stalls everyone") {
  expectGroupFails(Fault::kStallOnPartial, "isolation",
                   {"iso.partial.request", "iso.partial.command_byte"});
}

TEST_CASE("isolation fails when limits are not enforced") {
  expectGroupFails(Fault::kIgnoreLimits, "isolation",
                   {"iso.limit.key", "iso.limit.value", "iso.limit.key_count"});
}

TEST_CASE("extensions fails when LIST_KEYS is broken") {
  expectGroupFails(Fault::kBrokenListKeys, "extensions", {"ext.list_keys"});
}

TEST_CASE("a server that hangs fails its checks and the run goes on") {
  // kDropGetReply makes GET hang forever; the run must still reach its end.
  ProcResult r = againstFault(Fault::kDropGetReply, "wire");
  CHECK(hasLine(r.out, "PASS wire.v2.compare_set "));
  CHECK(hasLine(r.out, "FAIL wire.v2.empty_value "));
}

TEST_CASE("our tcpstore-server conforms to the tcpstore profile") {
  ProcResult r =
      conform({"--server-cmd", kServer + " --host 127.0.0.1 --port {port}",
               "--profile", "tcpstore"});
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("\nbehaves like tcpstore\n") != std::string::npos);
  CHECK(r.out.find("FAIL ") == std::string::npos);
  CHECK(r.out.find("DEVIATES ") == std::string::npos);
}

TEST_CASE(
    "our server judged as torch 2.6 deviates where the README says it "
    "differs") {
  ProcResult r =
      conform({"--server-cmd", kServer + " --host 127.0.0.1 --port {port}",
               "--profile", "torch-2.6", "--only", "blocking"});
  CHECK(r.exit_code == 1);
  CHECK(hasLine(r.out, "DEVIATES block.compare_set "));
  CHECK(hasLine(r.out, "DEVIATES block.after_client_timeout "));
  CHECK(hasLine(r.out, "PASS block.set "));
}

TEST_CASE("the best-matching profile is picked when none is given") {
  ProcResult r =
      conform({"--server-cmd", kServer + " --host 127.0.0.1 --port {port}"});
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("profile tcpstore (best match)") != std::string::npos);
}

TEST_CASE("dialect and group selection and the JSON report") {
  FaultServer server(Fault::kNone);
  std::string json =
      "/tmp/tcpstore-conform-test-" + std::to_string(::getpid()) + ".json";
  ProcResult r =
      conform({"--addr", "127.0.0.1:" + std::to_string(server.port()),
               "--dialect", "1.13", "--only", "wire", "--json", json});
  CHECK(r.exit_code == 0);
  CHECK(hasLine(r.out, "PASS wire.v1.watch "));
  CHECK(r.out.find("wire.v2.") == std::string::npos);
  CHECK(r.out.find("sem.") == std::string::npos);
  std::ifstream f(json);
  auto j = nlohmann::json::parse(f, nullptr, false);
  std::remove(json.c_str());
  REQUIRE(j.is_object());
  CHECK(j["checks"].size() ==
        static_cast<std::size_t>(j["passed"].get<int>() +
                                 j["unsupported"].get<int>()));
  CHECK(j["checks"][0]["source"].get<std::string>().rfind(
            "conform/checks/wire.cc#L", 0) == 0);
}

TEST_CASE("usage errors exit 2 and an unreachable server 3") {
  CHECK(conform({"--profile", "nope", "--addr", "127.0.0.1:1"}).exit_code == 2);
  CHECK(conform({}).exit_code == 2);
  tcpstore::test::BoundPort closed;  // bound, not listening: refused
  CHECK(conform({"--addr", "127.0.0.1:" + std::to_string(closed.port())})
            .exit_code == 3);
}

}  // namespace
}  // namespace tcpstore::conform::test
