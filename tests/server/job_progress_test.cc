// JobProgress (store/server/job_progress.h) driven with explicit times: the
// lines it writes for tcpstore:// jobs, and when it asks to be called back.
#include "store/server/job_progress.h"

#include <doctest/doctest.h>

#include <string>
#include <vector>

using namespace tcpstore::server;
using tcpstore::protocol::Command;
using tcpstore::protocol::Request;

namespace {

struct Lines {
  std::vector<std::string> all;
  JobProgress::Sink sink() {
    return [this](LogLevel, std::string_view l) { all.emplace_back(l); };
  }
  // The lines since the last call.
  std::vector<std::string> take() {
    std::vector<std::string> out;
    out.swap(all);
    return out;
  }
};

// As torch's client puts it on the wire: "/" + PrefixStore(job) + key.
Request cas(const std::string& key, const std::string& desired) {
  Request r;
  r.command = Command::kCompareSet;
  r.key = key;
  r.desired = desired;
  return r;
}
Request set(const std::string& key, const std::string& value) {
  Request r;
  r.command = Command::kSet;
  r.key = key;
  r.value = value;
  return r;
}

using V = std::vector<std::string>;

}  // namespace

TEST_CASE(
    "job progress: only SET and COMPARE_SET of tcpstore keys concern it") {
  const std::string k = "/j/tcpstore/rank/0";
  CHECK(JobProgress::concerns(cas(k, "h 1")));
  CHECK(JobProgress::concerns(set(k, "h 1")));
  Request add = set(k, "");
  add.command = Command::kAdd;
  CHECK_FALSE(JobProgress::concerns(add));
  CHECK_FALSE(JobProgress::concerns(set("/j/default_pg/0", "x")));
}

TEST_CASE("job progress: joined K/N, rate limited but never stale, ready") {
  Lines out;
  JobProgress p(out.sink(), {});
  const std::string job = "/run12/attempt_0/tcpstore/";  // '/' in the job id
  CHECK(p.note(5000, cas(job + "world_size", "3")) == 10000);  // stall timer
  CHECK(p.note(5001, cas(job + "rank/0", "hostA 11")) == 0);
  CHECK(out.take() == V{"job run12/attempt_0: joined 1/3"});
  CHECK(p.note(5002, cas(job + "world_size", "3")) == 0);  // rank 1's
  CHECK(p.note(5200, cas(job + "rank/1", "hostB 12")) == 801);
  CHECK(out.take().empty());  // same second: deferred
  CHECK(p.note(5300, cas(job + "rank/1", "hostB 12")) == 0);  // again
  CHECK(p.onTimer(6001) == 9199);  // next: the stall line at 15200
  CHECK(out.take() == V{"job run12/attempt_0: joined 2/3"});
  CHECK(p.onTimer(6500) == 8700);  // nothing new: no line
  CHECK(out.take().empty());
  // The last rank: logged at once, then ready forgets the job.
  p.note(6600, cas(job + "rank/2", "hostC 13"));
  CHECK(out.take() == V{"job run12/attempt_0: joined 3/3"});
  p.note(6601, set(job + "ready", "1"));
  CHECK(out.take() == V{"job run12/attempt_0: all 3 ranks joined"});
  CHECK(p.jobs() == 0);
  CHECK(p.onTimer(15200) == 0);
  CHECK(out.take().empty());
}

TEST_CASE("job progress: missing ranks after the stall, then every repeat") {
  Lines out;
  JobProgress::Limits lim;
  lim.stall_ms = 100;
  lim.repeat_ms = 300;
  lim.max_listed = 3;
  JobProgress p(out.sink(), lim);
  CHECK(p.note(1000, cas("/j/tcpstore/world_size", "8")) == 100);
  p.note(1010, cas("/j/tcpstore/rank/0", "h 1"));
  p.note(1020, cas("/j/tcpstore/rank/5", "h 2"));  // deferred count
  out.take();
  CHECK(p.onTimer(1100) == 20);   // nothing due yet: rank 5 moved the stall
  CHECK(p.onTimer(1120) == 300);  // the next stall line before the count
  CHECK(out.take() ==
        V{"job j: joined 2/8; missing ranks: 1, 2, 3 and 3 more"});
  CHECK(p.onTimer(1420) > 0);
  CHECK(out.take() ==
        V{"job j: joined 2/8; missing ranks: 1, 2, 3 and 3 more"});
}

TEST_CASE("job progress: a failure is logged once and ends the job") {
  Lines out;
  JobProgress p(out.sink(), {});
  p.note(1000, cas("/j/tcpstore/world_size", "2"));
  p.note(1000, cas("/j/tcpstore/failed", "1/2 ranks joined\nin 3 s"));
  p.note(1001, cas("/j/tcpstore/failed", "another rank's message"));
  CHECK(out.take() == V{"job j: join failed: 1/2 ranks joined?in 3 s"});
  CHECK(p.jobs() == 0);
}

TEST_CASE("job progress: bounded jobs and world sizes") {
  Lines out;
  JobProgress::Limits lim;
  lim.max_jobs = 2;
  lim.max_world = 4;
  lim.stall_ms = 10;
  JobProgress p(out.sink(), lim);
  p.note(1000, cas("/a/tcpstore/world_size", "2"));
  p.note(1000, cas("/b/tcpstore/world_size", "1000000000"));
  p.note(1000, cas("/b/tcpstore/rank/999999999", "h 1"));
  CHECK(out.take() == V{"job b: joined 1/1000000000"});
  p.note(1000, cas("/c/tcpstore/world_size", "2"));  // drops a
  CHECK(out.take() == V{"job a: no longer tracked (more than 2 jobs joining)"});
  CHECK(p.jobs() == 2);
  p.onTimer(1010);
  const V lines = out.take();
  REQUIRE(lines.size() == 2);
  CHECK(lines[0] ==
        "job b: joined 1/1000000000; no new rank for 0 s (missing ranks are "
        "not tracked beyond 4)");
  CHECK(lines[1] == "job c: joined 0/2; missing ranks: 0, 1");
  // Junk is ignored.
  p.note(1020, cas("/c/tcpstore/rank/2", "h 1"));  // out of range
  p.note(1020, cas("/c/tcpstore/rank/-1", "h 1"));
  p.note(1020, cas("/c/tcpstore/rank/x", "h 1"));
  p.note(1020, cas("/d/tcpstore/world_size", "-3"));
  CHECK(out.take().empty());
  CHECK(p.jobs() == 2);
}
