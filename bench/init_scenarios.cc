// nccl-scalable-init, gloo-mesh and heartbeat (bench/init_scenarios.h).
//
// Every rank runs a script of round trips on its one connection. A round trip
// is a few requests sent back to back (e.g. SET + WAIT) whose last reply ends
// it; with --echo-floor it is one sized-echo message of the same request
// bytes (encoded by the same codec) answered with the same reply bytes.
#include "bench/init_scenarios.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench/init_report.h"
#include "bench/round_trip.h"
#include "bench/sized_echo.h"

namespace tcpstore::bench {
namespace {

using protocol::Command;
using protocol::Dialect;
using protocol::Reply;
using protocol::ReplyShape;
using protocol::Request;

constexpr std::int64_t kMs = 1000000;
constexpr int kRootEvery = 128;  // NCCL's scalable init: one root per 128

enum Tag : std::uint32_t { kTagPart = 1, kTagEnd };
enum TimerKind : std::uint64_t { kRetry = 1, kTick };

enum class Phase : std::uint8_t {
  kConnect,
  kRun,
  kReady,  // heartbeat: connected, waiting for the others
  kDone,
  kFailed
};

struct Rank {
  Conn* conn = nullptr;
  Phase phase = Phase::kConnect;
  bool handshake = false;  // the 2.x VALIDATE + PING trip is in flight
  std::int64_t start_ns = 0;
  std::int64_t done_ns = 0;
  std::uint32_t step = 0;
  double backoff_s = 0.5;
};

const char* scenarioName(InitScenario s) {
  switch (s) {
    case InitScenario::kNcclScalableInit:
      return "nccl-scalable-init";
    case InitScenario::kGlooMesh:
      return "gloo-mesh";
    case InitScenario::kHeartbeat:
      return "heartbeat";
  }
  return "?";
}

// Wire bytes of a reply (what the server sent for it).
std::uint64_t replyBytes(const Reply& r) {
  switch (r.shape) {
    case ReplyShape::kByte:
    case ReplyShape::kU32:
    case ReplyShape::kInt64:
      return protocol::fixedReplyBytes(r.shape);
    case ReplyShape::kString:
      return 8 + r.value.size();
    case ReplyShape::kStrings: {
      std::uint64_t n = 0;
      for (auto v : r.values) n += 8 + v.size();
      return n;
    }
    default:
      return 0;
  }
}

class Init final : public ConnHandler, public TimerHandler {
 public:
  Init(const CommonOptions& common, const InitOptions& opt)
      : common_(common),
        opt_(opt),
        n_(static_cast<std::size_t>(opt.ranks)),
        ranks_(n_),
        value_(static_cast<std::size_t>(opt.value_bytes), 'v') {
    loop_.setSourceMode(common.source_mode);
    const std::string& p = common.key_prefix;
    if (opt.scenario == InitScenario::kNcclScalableInit) {
      const std::size_t roots = (n_ + kRootEvery - 1) / kRootEvery;
      for (std::size_t r = 0; r < roots; ++r) {
        keys_.push_back(fmt::format("{}/nccl/commId/{}", p, r));
      }
      for (const auto& k : keys_) all_keys_.push_back(k);
    } else if (opt.scenario == InitScenario::kGlooMesh) {
      for (std::size_t r = 0; r < n_; ++r) {
        keys_.push_back(fmt::format("{}/gloo/rank_{}", p, r));
      }
    } else {
      keys_.push_back(p + "/NCCL_DUMP_ON_TIMEOUT");
    }
  }

  int run();

  void onConnected(Conn& c) override;
  void onReply(Conn& c, const Pending& p, const Reply& r) override;
  void onClosed(Conn& c, int err, bool established) override;
  void onTimer(std::uint64_t arg) override;

 private:
  Dialect dialect() const { return common_.dialect; }
  Request& add() { return trip_.add(); }
  void sendTrip(std::size_t i, std::uint32_t reply_bytes);
  void connect(std::size_t i);
  void retry(std::size_t i);
  void step(std::size_t i);
  void maybeStartHeartbeat();
  void heartbeatTick();
  void finish(std::size_t i);
  void fail(std::size_t i, const std::string& why);
  bool allFinished() const;

  const CommonOptions& common_;
  InitOptions opt_;
  std::size_t n_;
  Loop loop_;
  std::vector<Rank> ranks_;
  std::string value_;
  std::vector<std::string> keys_;
  std::vector<std::string_view> all_keys_;
  RoundTrip trip_;
  std::size_t finished_ = 0, failed_ = 0, ready_ = 0;
  std::uint64_t retries_ = 0, bad_replies_ = 0, reply_bytes_ = 0;
  std::string first_error_;
  std::mt19937_64 rng_{std::random_device{}()};
  // heartbeat
  std::int64_t hb_t0_ = 0, hb_end_ = 0, connected_ns_ = 0;
  std::uint64_t hb_total_ = 0, hb_sent_ = 0, hb_replies_ = 0;
  double hb_cpu0_ = -1, hb_cpu1_ = -1;
  std::vector<std::int64_t> check_ns_;
};

void Init::sendTrip(std::size_t i, std::uint32_t reply_bytes) {
  trip_.send(loop_, *ranks_[i].conn, dialect(), opt_.echo_floor, reply_bytes,
             kTagPart, kTagEnd);
}

void Init::connect(std::size_t i) {
  Rank& r = ranks_[i];
  r.phase = Phase::kConnect;
  r.conn = loop_.connect(common_.addrOf(i), this, i);
  if (r.conn == nullptr) retry(i);
}

void Init::retry(std::size_t i) {
  Rank& r = ranks_[i];
  ++retries_;
  loop_.addTimer(nowNs() + nextRetryDelayNs(r.backoff_s, 8.0, rng_), this,
                 (kRetry << 32) | i);
}

// The rank's next round trip after its step-th one (or the end of its
// script). Each scenario's trips are listed in init_scenarios.h.
void Init::step(std::size_t i) {
  Rank& r = ranks_[i];
  const std::uint32_t s = r.step++;
  const std::uint32_t vb = static_cast<std::uint32_t>(value_.size());
  switch (opt_.scenario) {
    case InitScenario::kNcclScalableInit: {
      if (s == 0) {
        if (i % kRootEvery == 0) {
          Request& set = add();
          set.command = Command::kSet;
          set.key = keys_[i / kRootEvery];
          set.value = value_;
        }
        Request& w = add();
        w.command = Command::kWait;
        w.keys = all_keys_;
        sendTrip(i, 1);
      } else if (s == 1) {
        if (dialect() == Dialect::kV2) {
          Request& m = add();
          m.command = Command::kMultiGet;
          m.keys = all_keys_;
        } else {
          for (const auto& k : keys_) {
            Request& g = add();
            g.command = Command::kGet;
            g.key = k;
          }
        }
        sendTrip(i, static_cast<std::uint32_t>(keys_.size() * (8 + vb)));
      } else {
        finish(i);
      }
      return;
    }
    case InitScenario::kGlooMesh: {
      // Trip 2k waits for the k-th peer's key, trip 2k+1 gets it.
      const std::size_t k = s / 2;
      if (k + 1 >= n_) {
        finish(i);
        return;
      }
      if (s == 0) {
        Request& set = add();
        set.command = Command::kSet;
        set.key = keys_[i];
        set.value = value_;
      }
      const std::size_t peer = k < i ? k : k + 1;
      Request& q = add();
      if (s % 2 == 0) {
        q.command = Command::kWait;
        q.keys.push_back(keys_[peer]);
        sendTrip(i, 1);
      } else {
        q.command = Command::kGet;
        q.key = keys_[peer];
        sendTrip(i, 8 + vb);
      }
      return;
    }
    case InitScenario::kHeartbeat:
      r.phase = Phase::kReady;
      ++ready_;
      maybeStartHeartbeat();
      return;
  }
}

// Sends every CHECK due by now: rank k's t-th CHECK is due at
// hb_t0 + t s + k/N s.
void Init::heartbeatTick() {
  const std::int64_t now = nowNs();
  if (hb_sent_ == 0) {
    hb_cpu0_ =
        common_.server_pid > 0 ? processCpuSeconds(common_.server_pid) : -1;
  }
  const double elapsed = static_cast<double>(now - hb_t0_) / 1e9;
  const auto due = std::min<std::uint64_t>(
      hb_total_,
      static_cast<std::uint64_t>(elapsed * static_cast<double>(n_)) + 1);
  for (; hb_sent_ < due; ++hb_sent_) {
    const std::size_t i = hb_sent_ % n_;
    if (ranks_[i].phase != Phase::kReady || !ranks_[i].conn->open()) {
      ++hb_replies_;  // a failed rank sends nothing: nothing to wait for
      continue;
    }
    Request& q = add();
    q.command = Command::kCheck;
    q.keys.push_back(keys_[0]);
    sendTrip(i, 1);
  }
  if (hb_sent_ < hb_total_) loop_.addTimer(now + kMs, this, kTick << 32);
}

void Init::finish(std::size_t i) {
  Rank& r = ranks_[i];
  if (r.phase == Phase::kDone || r.phase == Phase::kFailed) return;
  r.phase = Phase::kDone;
  r.done_ns = nowNs();
  ++finished_;
}

void Init::fail(std::size_t i, const std::string& why) {
  Rank& r = ranks_[i];
  if (r.phase == Phase::kDone || r.phase == Phase::kFailed) return;
  if (first_error_.empty()) first_error_ = fmt::format("rank {}: {}", i, why);
  const bool was_ready = r.phase == Phase::kReady;
  r.phase = Phase::kFailed;
  ++failed_;
  ++finished_;
  if (r.conn != nullptr) loop_.close(*r.conn);
  if (opt_.scenario == InitScenario::kHeartbeat && !was_ready) {
    maybeStartHeartbeat();
  }
}

// Once every rank is connected (or failed), the CHECKs start 10 ms later.
void Init::maybeStartHeartbeat() {
  if (ready_ + failed_ != n_ || hb_t0_ != 0) return;
  connected_ns_ = nowNs();
  hb_t0_ = connected_ns_ + 10 * kMs;
  hb_total_ = static_cast<std::uint64_t>(
      std::llround(static_cast<double>(n_) * opt_.seconds));
  loop_.addTimer(hb_t0_, this, kTick << 32);
}

void Init::onConnected(Conn& c) {
  const std::size_t i = static_cast<std::size_t>(c.user);
  Rank& r = ranks_[i];
  r.phase = Phase::kRun;
  if (dialect() == Dialect::kV2) {
    r.handshake = true;
    Request& v = add();
    v.command = Command::kValidate;
    v.u32 = protocol::kValidateMagic;
    Request& p = add();
    p.command = Command::kPing;
    p.u32 = static_cast<std::uint32_t>(i + 1);
    sendTrip(i, 4);
    return;
  }
  step(i);
}

void Init::onReply(Conn& c, const Pending& p, const Reply& r) {
  const std::size_t i = static_cast<std::size_t>(c.user);
  Rank& rk = ranks_[i];
  reply_bytes_ += p.raw_len > 0 ? p.raw_len : replyBytes(r);
  const std::uint32_t vb = static_cast<std::uint32_t>(value_.size());
  if (!opt_.echo_floor) {
    bool ok = true;
    if (r.shape == ReplyShape::kU32) {
      ok = r.u32 == static_cast<std::uint32_t>(i + 1);
    } else if (r.shape == ReplyShape::kString) {
      ok = r.value.size() == vb;
    } else if (r.shape == ReplyShape::kStrings) {
      ok = r.values.size() == keys_.size();
      for (auto v : r.values) ok = ok && v.size() == vb;
    }
    if (!ok) ++bad_replies_;
  }
  if (rk.handshake) {
    rk.handshake = false;
    step(i);
    return;
  }
  if (opt_.scenario == InitScenario::kHeartbeat) {
    check_ns_.push_back(nowNs() - p.sent_ns);
    if (++hb_replies_ == hb_total_) {
      hb_end_ = nowNs();
      hb_cpu1_ =
          common_.server_pid > 0 ? processCpuSeconds(common_.server_pid) : -1;
    }
    return;
  }
  // A multi-request trip (1.13's pipelined GETs) ends with its last reply.
  if (c.pendingCount() == 0) step(i);
}

void Init::onClosed(Conn& c, int err, bool established) {
  const std::size_t i = static_cast<std::size_t>(c.user);
  Rank& r = ranks_[i];
  if (r.phase == Phase::kDone || r.phase == Phase::kFailed) return;
  if (!established || r.handshake) {
    // A refused connect or a dropped handshake: the client retries.
    r.handshake = false;
    r.conn = nullptr;
    r.step = 0;
    retry(i);
    return;
  }
  fail(i, fmt::format("connection closed by the server ({})",
                      err ? std::strerror(err) : "-"));
}

void Init::onTimer(std::uint64_t arg) {
  const auto kind = arg >> 32;
  if (kind == kTick) {
    heartbeatTick();
    return;
  }
  const std::size_t i = static_cast<std::size_t>(arg & 0xffffffffu);
  if (ranks_[i].phase == Phase::kConnect) connect(i);
}

bool Init::allFinished() const {
  if (opt_.scenario == InitScenario::kHeartbeat) {
    return failed_ == n_ || (hb_total_ > 0 && hb_replies_ >= hb_total_);
  }
  return finished_ == n_;
}

int Init::run() {
  const double cpu0 =
      common_.server_pid > 0 ? processCpuSeconds(common_.server_pid) : -1;
  const double self0 = selfCpuSeconds();
  const std::int64_t t0 = nowNs();
  for (std::size_t i = 0; i < n_; ++i) {
    ranks_[i].start_ns = t0;
    connect(i);
  }
  const std::int64_t deadline =
      t0 + static_cast<std::int64_t>(common_.timeout_s * 1e9);
  std::int64_t next_progress = t0 + 2000 * kMs;
  while (!allFinished()) {
    const std::int64_t now = nowNs();
    if (now >= deadline) break;
    if (!common_.quiet && now >= next_progress) {
      fmt::print(stderr, "[{}] {:.1f}s: done {}/{} failed {} conns {}\n",
                 scenarioName(opt_.scenario),
                 static_cast<double>(now - t0) / 1e9, finished_ - failed_, n_,
                 failed_, loop_.openConns());
      next_progress = now + 2000 * kMs;
    }
    loop_.runOnce(std::min<std::int64_t>(50 * kMs, deadline - now));
  }
  const bool finished = allFinished() && failed_ == 0;
  const std::int64_t t_end = nowNs();
  const double cpu1 =
      common_.server_pid > 0 ? processCpuSeconds(common_.server_pid) : -1;
  const double gen_cpu = selfCpuSeconds() - self0;
  std::vector<std::int64_t> per_rank;
  std::int64_t last = t0;
  for (const Rank& r : ranks_) {
    if (r.phase != Phase::kDone) continue;
    per_rank.push_back(r.done_ns - r.start_ns);
    last = std::max(last, r.done_ns);
  }
  const bool hb = opt_.scenario == InitScenario::kHeartbeat;
  if (hb) last = hb_end_ ? hb_end_ : t_end;
  const double wall = static_cast<double>((finished ? last : t_end) - t0) / 1e9;
  const double p50 = percentile(per_rank, 50) / 1e9;
  const double p99 = percentile(per_rank, 99) / 1e9;
  const double pmax =
      per_rank.empty() ? 0 : static_cast<double>(per_rank.back()) / 1e9;
  InitReport rep;
  rep.name = scenarioName(opt_.scenario);
  rep.dialect = protocol::dialectName(dialect());
  rep.addr = common_.addr().text;
  rep.echo_floor = opt_.echo_floor;
  rep.ranks = n_;
  rep.finished = finished;
  rep.wall_s = wall;
  rep.p50_s = p50;
  rep.p99_s = p99;
  rep.max_s = pmax;
  rep.stats = loop_.stats();
  rep.reply_bytes = reply_bytes_;
  rep.bad_replies = bad_replies_;
  rep.retries = retries_;
  rep.failed = failed_;
  rep.server_cpu_s = cpu0 >= 0 && cpu1 >= 0 ? cpu1 - cpu0 : -1;
  rep.generator_cpu_s = gen_cpu;
  rep.first_error = first_error_;
  rep.heartbeat = hb;
  rep.seconds = opt_.seconds;
  rep.checks = hb_replies_;
  rep.connected_s =
      connected_ns_ ? static_cast<double>(connected_ns_ - t0) / 1e9 : -1.0;
  rep.hb_window_s =
      hb_end_ > hb_t0_ ? static_cast<double>(hb_end_ - hb_t0_) / 1e9 : 0;
  rep.hb_server_cpu_s =
      hb_cpu0_ >= 0 && hb_cpu1_ >= 0 ? hb_cpu1_ - hb_cpu0_ : -1;
  rep.check_p50_us = percentile(check_ns_, 50) / 1e3;
  rep.check_p99_us = percentile(check_ns_, 99) / 1e3;
  if (!writeInitReport(rep, common_)) return 1;
  return finished ? (bad_replies_ == 0 ? 0 : 1) : 2;
}

}  // namespace

bool parseInitScenario(std::string_view mode, InitScenario& out) {
  for (auto s : {InitScenario::kNcclScalableInit, InitScenario::kGlooMesh,
                 InitScenario::kHeartbeat}) {
    if (mode == scenarioName(s)) {
      out = s;
      return true;
    }
  }
  return false;
}

int runInit(const CommonOptions& common, const InitOptions& opt) {
  if (!opt.echo_floor) return std::make_unique<Init>(common, opt)->run();
  CommonOptions c = common;
  const int pid = startSizedEchoServer(c.onlyAddr());
  if (pid <= 0) {
    fmt::print(stderr, "echo floor: cannot start the floor server\n");
    return 1;
  }
  c.server_pid = pid;
  int rc = std::make_unique<Init>(c, opt)->run();
  stopChild(pid);
  return rc;
}

}  // namespace tcpstore::bench
