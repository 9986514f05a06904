// abuse: the attacks of issue 13, at full size by default, one after another
// against a running server, while the honest probe (bench/abuse_probe.h)
// measures round trips and the server's RSS is sampled:
//   partial     23 connections each send most of a legal 100 MiB MULTI_SET
//               (12 values of 8 MiB) and stop;
//   nonreaders  29 clients pipeline 100 GETs of a 1 MiB value, never read;
//   waits       89 connections each WAIT on 131,072 absent keys; then
//   waits-drop  all 89 dropped at once (the stall, and RSS coming back);
//   collide     50,000 SETs of keys crafted to collide under libstdc++'s
//               std::hash against 50,000 random keys (and 10,000-key WAITs);
//   owed        ADD k 1 pipelined before a protocol error: its reply comes;
//   hog         8 MiB values under new keys until the server refuses.
// Every loop is bounded in count and by --timeout.
#include "bench/abuse.h"

#include <fmt/format.h>
#include <poll.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/abuse_run.h"
#include "protocol/requests.h"

namespace tcpstore::bench {
namespace abuse {

using protocol::ReplyShape;
namespace req = protocol::requests;

Phase& Abuse::begin(std::string name, std::string what) {
  if (!c_.quiet) fmt::print(stderr, "abuse: {}: {}\n", name, what);
  // A quiet server first: what the previous phase queued is processed.
  if (!ctl_.fence(within(30 * kSec))) {
    ++run_.control_failures;
    if (!c_.quiet) fmt::print(stderr, "abuse: the control connection failed\n");
    ctl_ = RawSock::connect(c_.addr(), within(10 * kSec), true);
  }
  run_.phases.emplace_back();
  Phase& p = run_.phases.back();
  p.name = std::move(name);
  p.what = std::move(what);
  const int idx = static_cast<int>(run_.phases.size()) - 1;
  probe_.setPhase(idx);
  p.rss_before = sampler_.now();
  sampler_.setPhase(idx);
  phase_t0_ = nowNs();
  p.t0_ns = phase_t0_;
  phase_cpu0_ = c_.server_pid > 0 ? processCpuSeconds(c_.server_pid) : -1;
  return p;
}

void Abuse::end(Phase& p) {
  const int idx = static_cast<int>(&p - run_.phases.data());
  p.rss_peak = sampler_.peak(idx);
  p.sched_lag_ms = sampler_.lagMs(idx);
  if (p.rss_after < 0) p.rss_after = sampler_.now();
  p.rss_peak = std::max(p.rss_peak, std::max(p.rss_before, p.rss_after));
  p.seconds = static_cast<double>(nowNs() - phase_t0_) / 1e9;
  if (phase_cpu0_ >= 0) {
    p.server_cpu_s = processCpuSeconds(c_.server_pid) - phase_cpu0_;
  }
}

// Waits until the server's RSS is down to `target`, or (with a plateau) has
// not fallen for that long, or `limit` passed (at most --settle); records
// it as the phase's "after".
void Abuse::settle(Phase& p, std::int64_t target, std::int64_t limit,
                   std::int64_t plateau) {
  const std::int64_t t0 = nowNs();
  const std::int64_t end = within(limit);
  std::int64_t best = sampler_.now(), best_at = nowNs();
  while (best >= 0 && best > target && nowNs() < end &&
         (plateau <= 0 || nowNs() - best_at < plateau)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const std::int64_t r = sampler_.now();
    if (r < best - kMiB / 2) best_at = nowNs();
    best = std::min(best, r);
  }
  p.rss_after = sampler_.now();
  p.figures.emplace_back("settle_s", static_cast<double>(nowNs() - t0) / 1e9);
}

// Keeps the attack up for the hold time, counting the connections the
// server closes meanwhile.
void Abuse::hold(std::vector<RawSock>& socks, Phase& p) {
  const std::int64_t end = within(hold_ns_);
  std::vector<bool> closed(socks.size(), false);
  for (;;) {
    for (std::size_t i = 0; i < socks.size(); ++i) {
      if (!closed[i] && socks[i].peerClosed()) closed[i] = true;
    }
    if (nowNs() >= end) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  p.closed = static_cast<int>(std::count(closed.begin(), closed.end(), true));
}

bool Abuse::deleteKeys(const std::vector<std::string>& keys) {
  std::string m;
  protocol::Reply r;
  constexpr std::size_t kBatch = 4096;
  for (std::size_t i = 0; i < keys.size(); i += kBatch) {
    const std::size_t n = std::min(kBatch, keys.size() - i);
    m.clear();
    for (std::size_t k = i; k < i + n; ++k) {
      encode2(req::deleteKey(keys[k]), m);
    }
    if (!ctl_.sendAll(m, within(30 * kSec))) return false;
    for (std::size_t k = 0; k < n; ++k) {
      if (!ctl_.recvReply(ReplyShape::kInt64, r, within(30 * kSec))) {
        return false;
      }
    }
  }
  return true;
}

void Abuse::baseline() {
  Phase& p = begin("baseline", "the probe alone, no attack");
  std::this_thread::sleep_for(std::chrono::nanoseconds(std::min<std::int64_t>(
      hold_ns_, std::max<std::int64_t>(0, deadline_ - nowNs()))));
  end(p);
}

int Abuse::run() {
  deadline_ = nowNs() + static_cast<std::int64_t>(c_.timeout_s * 1e9);
  ctl_ = RawSock::connect(c_.addr(), within(10 * kSec), true);
  if (!ctl_.ok()) {
    fmt::print(stderr, "abuse: cannot connect to {}\n", c_.addr().text);
    return 1;
  }
  std::string err;
  if (!probe_.start(err)) {
    fmt::print(stderr, "abuse: {}\n", err);
    return 1;
  }
  run_.phases.reserve(kMaxPhases);  // Phase& stay valid
  run_.rss_start = sampler_.now();
  baseline();
  struct Step {
    const char* name;
    void (Abuse::*fn)();
  };
  // clang-format off
  const Step steps[] = {
      {"partial", &Abuse::partial}, {"nonreaders", &Abuse::nonreaders},
      {"waits", &Abuse::waits},     {"collide", &Abuse::collide},
      {"owed", &Abuse::owed},       {"hog", &Abuse::hog},
  };
  // clang-format on
  for (const Step& s : steps) {
    if (timedOut()) break;
    if (wanted(s.name)) (this->*s.fn)();
  }
  // Not an attack: the keys the attacks stored are deleted (within 120 s
  // more, even after a timeout).
  const bool finished = run_.finished;
  deadline_ = std::max(deadline_, nowNs() + 120 * kSec);
  Phase& cleanup = begin(
      "cleanup", fmt::format("DELETE_KEY of the {} keys the attacks stored",
                             garbage_.size()));
  cleanup.ok = deleteKeys(garbage_);
  end(cleanup);
  run_.finished = finished;
  probe_.stop();
  for (std::size_t i = 0; i < run_.phases.size(); ++i) {
    run_.phases[i].probe = probe_.stats(static_cast<int>(i));
  }
  run_.probe_data_errors = probe_.dataErrors();
  run_.probe_lost = probe_.lost();
  run_.verdicts = judge(run_);
  printReport(run_);
  if (!c_.json_path.empty() && !writeFile(c_.json_path, reportJson(run_))) {
    return 1;
  }
  bool ok = run_.probe_data_errors == 0 && run_.probe_lost == 0 &&
            run_.control_failures == 0;
  for (const Phase& p : run_.phases) ok = ok && p.ok;
  if (!ok) return 1;
  return run_.finished ? 0 : 2;
}

}  // namespace abuse

int runAbuse(const CommonOptions& common, const AbuseOptions& opt) {
  auto a = std::make_unique<abuse::Abuse>(common, opt);
  return a->run();
}

}  // namespace tcpstore::bench
