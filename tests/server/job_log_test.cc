// The server's tcpstore:// job progress lines (store/server/job_progress.h),
// end to end: a real server, the job keys written over TCP exactly as torch
// 2.x writes them through PrefixStore(JOB) (python/README.md), and the
// server's stderr read back through a pipe, each line awaited with a
// deadline.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <string>

#include "tcpstore/server.h"
#include "tests/server/raw_client.h"
#include "tests/support/deadline.h"
#include "tests/support/scoped_server.h"

using namespace tcpstore::test;

namespace {

// Points this process's stderr (the server's log) at a pipe while alive.
class StderrCapture {
 public:
  StderrCapture() {
    REQUIRE(::pipe2(fds_, O_CLOEXEC) == 0);
    saved_ = ::dup(2);
    REQUIRE(saved_ >= 0);
    REQUIRE(::dup2(fds_[1], 2) == 2);
  }
  ~StderrCapture() {
    ::dup2(saved_, 2);
    ::close(saved_);
    ::close(fds_[0]);
    ::close(fds_[1]);
  }
  StderrCapture(const StderrCapture&) = delete;
  StderrCapture& operator=(const StderrCapture&) = delete;

  // Reads until the captured text holds `needle` or the deadline passes.
  bool waitFor(std::string_view needle, std::chrono::milliseconds limit) {
    const auto end = Clock::now() + scaled(limit);
    for (;;) {
      if (text_.find(needle) != std::string::npos) return true;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          end - Clock::now());
      if (left.count() <= 0) return false;
      pollfd p{fds_[0], POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char buf[4096];
      const ssize_t n = ::read(fds_[0], buf, sizeof buf);
      if (n > 0) text_.append(buf, static_cast<std::size_t>(n));
    }
  }
  const std::string& text() const { return text_; }

 private:
  int fds_[2] = {-1, -1};
  int saved_ = -1;
  std::string text_;
};

// COMPARE_SET "" -> desired (2.x), waiting for its reply.
void compareSet(RawConn& c, const std::string& key,
                const std::string& desired) {
  REQUIRE(c.send(byte(v2::kCompareSet) + str(key) + str("") + str(desired)));
  const std::string len = c.recv(8);
  REQUIRE(len.size() == 8);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i)
    n = (n << 8) | static_cast<unsigned char>(len[i]);
  REQUIRE(c.recv(n) == desired);
}

}  // namespace

TEST_CASE("job log: joined 2/3, then the missing rank, then the failure") {
  StderrCapture err;
  tcpstore::ServerOptions o;
  o.log_level = "debug";  // local() turns the default "info" to "error"
  o.job_stall_ms = 300;
  auto server = ScopedServer::local(o);
  RawConn c = RawConn::connect(server->port());
  REQUIRE(c.handshake());
  // torch's PrefixStore("run12/attempt_0"), on the wire with its "/".
  const std::string job = "/run12/attempt_0/tcpstore/";
  compareSet(c, job + "world_size", "3");
  compareSet(c, job + "rank/0", "hostA 101");
  compareSet(c, job + "world_size", "3");
  compareSet(c, job + "rank/1", "hostB 102");
  // The second count may fall in the first one's second: it comes when that
  // second ends (never stale), or with the stall line, whichever is first.
  CHECK_MESSAGE(
      err.waitFor("job run12/attempt_0: joined 2/3", std::chrono::seconds(10)),
      err.text());
  CHECK_MESSAGE(
      err.waitFor("job run12/attempt_0: joined 2/3; missing ranks: 2\n",
                  std::chrono::seconds(10)),
      err.text());
  compareSet(c, job + "failed", "2/3 ranks joined within 3 s; missing: 2");
  CHECK_MESSAGE(err.waitFor("E tcpstore-server: job run12/attempt_0: join "
                            "failed: 2/3 ranks joined within 3 s; missing: 2\n",
                            std::chrono::seconds(10)),
                err.text());
  CHECK(err.text().find("joined 3/3") == std::string::npos);
}

TEST_CASE("job log: all ranks joined") {
  StderrCapture err;
  tcpstore::ServerOptions o;
  o.log_level = "debug";  // local() turns the default "info" to "error"
  auto server = ScopedServer::local(o);
  RawConn c = RawConn::connect(server->port());
  REQUIRE(c.handshake());
  const std::string job = "/j1/tcpstore/";
  compareSet(c, job + "world_size", "2");
  compareSet(c, job + "rank/1", "hostB 7");
  compareSet(c, job + "rank/0", "hostA 8");
  REQUIRE(c.send(byte(v2::kSet) + str(job + "ready") + str("1")));
  CHECK_MESSAGE(err.waitFor("job j1: joined 2/2\n", std::chrono::seconds(10)),
                err.text());
  CHECK_MESSAGE(
      err.waitFor("job j1: all 2 ranks joined\n", std::chrono::seconds(10)),
      err.text());
}
