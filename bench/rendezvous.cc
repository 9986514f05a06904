// rendezvous: N ranks join and pass a store-based barrier, as torch's
// init_process_group does (docs/protocol.md §5.5, §6.3).
//
// Per rank: connect (2.x: VALIDATE + PING), ADD init/ +1; rank 0 (the store
// owner) then polls WAIT+GET init/ every 10 ms until N joined; 1.13 ranks open
// their second (callback) connection, which stays idle; then the barrier:
//   1.13:   ADD key 1, then ADD key 0 every 10 ms until it equals N;
//   2.x:    ADD key 1, ADD key 0, the last one SETs key:last_worker, all WAIT
//   on it; server: 2.x BARRIER(key, N); 1.13 (no BARRIER command): ADD key 1,
//   the last
//           one SETs key:done, all WAIT on it (one wait per rank).
#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench/round_trip.h"
#include "bench/scenarios.h"

namespace tcpstore::bench {
namespace {

using protocol::Command;
using protocol::Dialect;
using protocol::Reply;
using protocol::Request;

constexpr std::int64_t kMs = 1000000;
constexpr std::int64_t kPollNs = 10 * kMs;

enum Tag : std::uint32_t {
  kTagPing = 1,
  kTagPing2,
  kTagInitAdd,
  kTagMasterWait,
  kTagMasterGet,
  kTagBarrierAdd1,
  kTagBarrierAdd0,
  kTagWait,
  kTagBarrier,
  kTagFloor,
};

enum TimerKind : std::uint64_t {
  kStart = 1,
  kPoll,
  kRetryMain,
  kRetrySecond,
  kMasterPoll
};

enum class State : std::uint8_t {
  kWaitStart,
  kConnectMain,
  kHandshake,
  kInitAdd,
  kMasterPoll,
  kConnectSecond,
  kBarrier,
  kDone,
  kFailed,
};

struct Rank {
  Conn* main = nullptr;
  Conn* second = nullptr;
  State state = State::kWaitStart;
  std::int64_t start_ns = 0;
  std::int64_t done_ns = 0;
  double backoff_s = 0.5;
  int retries = 0;
  int floor_rts = 0;  // echo floor: round trips done
};

class Rendezvous final : public ConnHandler, public TimerHandler {
 public:
  Rendezvous(const CommonOptions& common, const RendezvousOptions& opt)
      : common_(common),
        opt_(opt),
        ranks_(static_cast<std::size_t>(opt.ranks)) {
    const std::string& p = common.key_prefix;
    init_key_ = "init/" + p;
    bkey_ = "/" + p + "/default_pg/store_based_barrier_key:" +
            (common.dialect == Dialect::kV113 ? "1" : "0");
    last_key_ = bkey_ + ":last_worker";
    done_key_ = bkey_ + ":done";
    conns_per_rank_ = opt.conns_per_rank > 0
                          ? opt.conns_per_rank
                          : (common.dialect == Dialect::kV113 ? 2 : 1);
    loop_.setSourceMode(common.source_mode);
  }

  int run();

  void onConnected(Conn& c) override;
  void onReply(Conn& c, const Pending& p, const Reply& r) override;
  void onClosed(Conn& c, int err, bool established) override;
  void onTimer(std::uint64_t arg) override;

 private:
  std::size_t idx(const Conn& c) const {
    return static_cast<std::size_t>(c.user >> 1);
  }
  // Rank i's server: the addresses given, round-robin.
  const Endpoint& addrOf(std::size_t i) const noexcept {
    return common_.addrOf(i);
  }
  void connectMain(std::size_t i);
  void connectSecond(std::size_t i);
  void sendHandshake(Conn& c, std::size_t i, std::uint32_t tag);
  void sendInitAdd(std::size_t i);
  void masterPoll(std::size_t i);
  void afterInit(std::size_t i);
  void startBarrier(std::size_t i);
  void floorStep(std::size_t i);
  void sendAdd(Conn& c, const std::string& key, std::int64_t delta,
               std::uint32_t tag);
  void sendSet(Conn& c, const std::string& key);
  void sendWait(Conn& c, const std::string& key);
  void done(std::size_t i);
  void failRank(std::size_t i, const char* why, int err);
  void scheduleRetry(std::size_t i, bool second);
  Conn& mainOf(std::size_t i) { return *ranks_[i].main; }
  std::int64_t rankCount() const { return opt_.ranks; }

  const CommonOptions& common_;
  RendezvousOptions opt_;
  Loop loop_;
  std::vector<Rank> ranks_;
  std::string init_key_, bkey_, last_key_, done_key_;
  int conns_per_rank_ = 1;
  std::int64_t t0_ = 0;
  std::int64_t all_joined_ns_ = 0;
  std::size_t joined_ = 0;
  std::size_t finished_ = 0;
  std::size_t done_ = 0;
  std::size_t failed_ = 0;
  std::uint64_t retries_ = 0;
  // Requests sent again because the condition they read was not met yet: the
  // 1.13 barrier's repeated ADD key 0, rank 0's repeated WAIT+GET init/.
  std::uint64_t polls_ = 0;
  std::string first_error_;
  Request req_;
  std::mt19937_64 rng_{std::random_device{}()};
};

void Rendezvous::connectMain(std::size_t i) {
  Rank& r = ranks_[i];
  r.state = State::kConnectMain;
  r.main = loop_.connect(addrOf(i), this, i << 1);
  if (!r.main) scheduleRetry(i, false);
}

void Rendezvous::connectSecond(std::size_t i) {
  Rank& r = ranks_[i];
  r.state = State::kConnectSecond;
  r.second = loop_.connect(addrOf(i), this, (i << 1) | 1);
  if (!r.second) scheduleRetry(i, true);
}

void Rendezvous::scheduleRetry(std::size_t i, bool second) {
  Rank& r = ranks_[i];
  ++retries_;
  ++r.retries;
  std::int64_t delay_ns = 1'000'000'000;  // 1.13: a fixed 1 s between tries
  if (common_.dialect == Dialect::kV2) {
    delay_ns = nextRetryDelayNs(r.backoff_s, 60.0, rng_);
  }
  loop_.addTimer(nowNs() + delay_ns, this,
                 ((second ? kRetrySecond : kRetryMain) << 32) | i);
}

void Rendezvous::sendHandshake(Conn& c, std::size_t i, std::uint32_t tag) {
  req_.clear();
  req_.command = Command::kValidate;
  req_.u32 = protocol::kValidateMagic;
  loop_.send(c, Dialect::kV2, req_, 0);
  req_.clear();
  req_.command = Command::kPing;
  req_.u32 = static_cast<std::uint32_t>(i + 1);
  loop_.send(c, Dialect::kV2, req_, tag);
}

void Rendezvous::sendAdd(Conn& c, const std::string& key, std::int64_t delta,
                         std::uint32_t tag) {
  req_.clear();
  req_.command = Command::kAdd;
  req_.key = key;
  req_.number = delta;
  loop_.send(c, common_.dialect, req_, tag);
}

void Rendezvous::sendSet(Conn& c, const std::string& key) {
  req_.clear();
  req_.command = Command::kSet;
  req_.key = key;
  req_.value = "1";
  loop_.send(c, common_.dialect, req_, 0);
}

void Rendezvous::sendWait(Conn& c, const std::string& key) {
  req_.clear();
  req_.command = Command::kWait;
  req_.keys.push_back(key);
  loop_.send(c, common_.dialect, req_, kTagWait);
}

void Rendezvous::sendInitAdd(std::size_t i) {
  ranks_[i].state = State::kInitAdd;
  sendAdd(mainOf(i), init_key_, 1, kTagInitAdd);
}

void Rendezvous::masterPoll(std::size_t i) {
  ranks_[i].state = State::kMasterPoll;
  // get() is WAIT, then GET once the WAIT was answered (two round trips).
  sendWait(mainOf(i), init_key_);
}

void Rendezvous::afterInit(std::size_t i) {
  if (++joined_ == ranks_.size()) all_joined_ns_ = nowNs();
  if (conns_per_rank_ >= 2) {
    connectSecond(i);
  } else {
    startBarrier(i);
  }
}

void Rendezvous::startBarrier(std::size_t i) {
  ranks_[i].state = State::kBarrier;
  Conn& c = mainOf(i);
  if (opt_.barrier == BarrierKind::kServer && common_.dialect == Dialect::kV2) {
    req_.clear();
    req_.command = Command::kBarrier;
    req_.key = bkey_;
    req_.number = rankCount();
    loop_.send(c, common_.dialect, req_, kTagBarrier);
    return;
  }
  sendAdd(c, bkey_, 1, kTagBarrierAdd1);
}

void Rendezvous::done(std::size_t i) {
  Rank& r = ranks_[i];
  if (r.state == State::kDone || r.state == State::kFailed) return;
  r.state = State::kDone;
  r.done_ns = nowNs();
  ++done_;
  ++finished_;
}

void Rendezvous::failRank(std::size_t i, const char* why, int err) {
  Rank& r = ranks_[i];
  if (r.state == State::kDone || r.state == State::kFailed) return;
  if (first_error_.empty()) {
    first_error_ =
        fmt::format("rank {}: {} ({})", i, why, err ? std::strerror(err) : "-");
  }
  r.state = State::kFailed;
  ++failed_;
  ++finished_;
  if (r.main) loop_.close(*r.main);
  if (r.second) loop_.close(*r.second);
}

void Rendezvous::floorStep(std::size_t i) {
  Rank& r = ranks_[i];
  if (r.floor_rts == 2 && conns_per_rank_ >= 2 && r.second == nullptr) {
    if (++joined_ == ranks_.size()) all_joined_ns_ = nowNs();
    connectSecond(i);
    return;
  }
  if (r.floor_rts == 2 && conns_per_rank_ < 2) {
    if (++joined_ == ranks_.size()) all_joined_ns_ = nowNs();
  }
  if (r.floor_rts >= kFloorRoundTrips) {
    done(i);
    return;
  }
  r.state = State::kBarrier;
  static const std::string kMsg(22, 'x');
  loop_.sendRaw(mainOf(i), kMsg, static_cast<std::uint32_t>(kMsg.size()),
                kTagFloor);
}

void Rendezvous::onConnected(Conn& c) {
  std::size_t i = idx(c);
  bool second = (c.user & 1) != 0;
  if (opt_.echo_floor) {
    floorStep(i);
    return;
  }
  if (!second) {
    if (common_.dialect == Dialect::kV2) {
      ranks_[i].state = State::kHandshake;
      sendHandshake(c, i, kTagPing);
    } else {
      sendInitAdd(i);
    }
    return;
  }
  if (common_.dialect == Dialect::kV2) {
    sendHandshake(c, i, kTagPing2);
  } else {
    startBarrier(i);
  }
}

void Rendezvous::onReply(Conn& c, const Pending& p, const Reply& r) {
  std::size_t i = idx(c);
  Rank& rk = ranks_[i];
  switch (p.tag) {
    case kTagFloor:
      ++rk.floor_rts;
      floorStep(i);
      return;
    case kTagPing:
    case kTagPing2:
      if (r.u32 != static_cast<std::uint32_t>(i + 1)) {
        failRank(i, "PING echo mismatch", 0);
        return;
      }
      if (p.tag == kTagPing) {
        sendInitAdd(i);
      } else {
        startBarrier(i);
      }
      return;
    case kTagInitAdd:
      if (i == 0 && opt_.master_poll && ranks_.size() > 1) {
        masterPoll(i);
      } else {
        afterInit(i);
      }
      return;
    case kTagMasterGet: {
      std::string v(r.value);
      long long n = std::strtoll(v.c_str(), nullptr, 10);
      if (n >= rankCount()) {
        afterInit(i);
      } else {
        loop_.addTimer(nowNs() + kPollNs, this, (kMasterPoll << 32) | i);
      }
      return;
    }
    case kTagBarrierAdd1:
      if (opt_.barrier ==
          BarrierKind::kServer) {  // 1.13 dialect: one WAIT per rank
        if (r.number == rankCount()) sendSet(c, done_key_);
        sendWait(c, done_key_);
        return;
      }
      sendAdd(c, bkey_, 0, kTagBarrierAdd0);
      return;
    case kTagBarrierAdd0:
      if (opt_.barrier == BarrierKind::kV113) {
        if (r.number == rankCount()) {
          done(i);
        } else {
          loop_.addTimer(nowNs() + kPollNs, this, (kPoll << 32) | i);
        }
        return;
      }
      if (r.number == rankCount()) sendSet(c, last_key_);
      sendWait(c, last_key_);
      return;
    case kTagWait:
      // The master's WAIT on init/ (its GET follows) or the barrier's WAIT.
      if (rk.state == State::kBarrier) {
        done(i);
      } else if (rk.state == State::kMasterPoll) {
        req_.clear();
        req_.command = Command::kGet;
        req_.key = init_key_;
        loop_.send(c, common_.dialect, req_, kTagMasterGet);
      }
      return;
    case kTagBarrier:
      done(i);
      return;
    default:
      return;
  }
}

void Rendezvous::onClosed(Conn& c, int err, bool established) {
  std::size_t i = idx(c);
  bool second = (c.user & 1) != 0;
  Rank& r = ranks_[i];
  if (r.state == State::kDone || r.state == State::kFailed) return;
  if (!established || (r.state == State::kHandshake && !second)) {
    // connect refused/reset, or the 2.x handshake was dropped: the client
    // retries.
    if (second) {
      r.second = nullptr;
      scheduleRetry(i, true);
    } else {
      r.main = nullptr;
      scheduleRetry(i, false);
    }
    return;
  }
  failRank(i,
           second ? "second connection closed by the server"
                  : "connection closed by the server",
           err);
}

void Rendezvous::onTimer(std::uint64_t arg) {
  std::size_t i = static_cast<std::size_t>(arg & 0xffffffffu);
  auto kind = arg >> 32;
  Rank& r = ranks_[i];
  if (r.state == State::kDone || r.state == State::kFailed) return;
  switch (kind) {
    case kStart:
      r.start_ns = nowNs();
      connectMain(i);
      return;
    case kRetryMain:
      connectMain(i);
      return;
    case kRetrySecond:
      connectSecond(i);
      return;
    case kPoll:
      if (r.main && r.main->open()) {
        polls_ += 1;
        sendAdd(*r.main, bkey_, 0, kTagBarrierAdd0);
      }
      return;
    case kMasterPoll:
      if (r.main && r.main->open()) {
        polls_ += 2;  // get() = WAIT + GET
        masterPoll(i);
      }
      return;
    default:
      return;
  }
}

int Rendezvous::run() {
  if (opt_.barrier == BarrierKind::kServer &&
      common_.dialect == Dialect::kV113 && !common_.quiet) {
    fmt::print(
        stderr,
        "note: 1.13 has no BARRIER command; server barrier = ADD + one WAIT\n");
  }
  double cpu0 =
      common_.server_pid > 0 ? processCpuSeconds(common_.server_pid) : -1;
  const double self0 = selfCpuSeconds();
  const std::int64_t overflows0 = tcpExtCounter("ListenOverflows");
  const std::int64_t syn_retrans0 = tcpExtCounter("TCPSynRetrans");
  t0_ = nowNs();
  std::uniform_real_distribution<double> spread(
      0, std::max(0.0, opt_.arrival_spread_s));
  for (std::size_t i = 0; i < ranks_.size(); ++i) {
    std::int64_t at = t0_;
    if (opt_.arrival_spread_s > 0)
      at += static_cast<std::int64_t>(spread(rng_) * 1e9);
    if (at <= t0_) {
      ranks_[i].start_ns = t0_;
      connectMain(i);
    } else {
      loop_.addTimer(at, this, (kStart << 32) | i);
    }
  }
  const std::int64_t deadline =
      t0_ + static_cast<std::int64_t>(common_.timeout_s * 1e9);
  std::int64_t next_progress = t0_ + 2000 * kMs;
  while (finished_ < ranks_.size()) {
    std::int64_t now = nowNs();
    if (now >= deadline) break;
    if (!common_.quiet && now >= next_progress) {
      fmt::print(
          stderr,
          "[rendezvous] {:.1f}s: joined {}/{} done {} failed {} conns {}\n",
          static_cast<double>(now - t0_) / 1e9, joined_, ranks_.size(), done_,
          failed_, loop_.openConns());
      next_progress = now + 2000 * kMs;
    }
    loop_.runOnce(std::min<std::int64_t>(50 * kMs, deadline - now));
  }
  const std::int64_t t_end = nowNs();
  double cpu1 =
      common_.server_pid > 0 ? processCpuSeconds(common_.server_pid) : -1;
  const double client_cpu = selfCpuSeconds() - self0;
  const std::int64_t overflows = tcpExtCounter("ListenOverflows") - overflows0;
  const std::int64_t syn_retrans =
      tcpExtCounter("TCPSynRetrans") - syn_retrans0;
  const bool finished = done_ == ranks_.size();

  std::vector<std::int64_t> per_rank;  // from the rank's own arrival
  std::int64_t last_done = t0_;
  for (const Rank& r : ranks_) {
    if (r.state == State::kDone) {
      per_rank.push_back(r.done_ns - r.start_ns);
      last_done = std::max(last_done, r.done_ns);
    }
  }
  const double wall =
      static_cast<double>((finished ? last_done : t_end) - t0_) / 1e9;
  const double p50 = percentile(per_rank, 50) / 1e9;
  const double p99 = percentile(per_rank, 99) / 1e9;
  const double pmax =
      per_rank.empty() ? 0 : static_cast<double>(per_rank.back()) / 1e9;
  const LoopStats& st = loop_.stats();
  const std::uint64_t conn_errors = st.connect_errors + st.closed_by_peer;
  const double cpu = (cpu0 >= 0 && cpu1 >= 0) ? cpu1 - cpu0 : -1;
  const char* barrier_name = opt_.echo_floor                      ? "echo-floor"
                             : opt_.barrier == BarrierKind::kV113 ? "1.13"
                             : opt_.barrier == BarrierKind::kV2   ? "2.x"
                                                                  : "server";
  const std::size_t open_at_end = loop_.openConns();
  const double n_ranks = static_cast<double>(ranks_.size());
  const double per_rank_requests =
      static_cast<double>(st.requests_sent) / n_ranks;
  const double per_rank_polls = static_cast<double>(polls_) / n_ranks;
  std::string dialect(protocol::dialectName(common_.dialect));
  fmt::print(
      "rendezvous dialect={} ranks={} conns/rank={} barrier={} spread={}s: {} "
      "wall {:.4f} s "
      "(all joined {:.4f} s), rank p50 {:.4f} s p99 {:.4f} s max {:.4f} s, {} "
      "requests, "
      "{:.2f} requests/rank, {:.2f} polls/rank ({} polls), "
      "{} conn errors ({} connect, {} closed), {} retries, {} failed ranks, "
      "server cpu {}, "
      "generator cpu {:.3f} s\n",
      dialect, ranks_.size(), conns_per_rank_, barrier_name,
      opt_.arrival_spread_s, finished ? "finished" : "DID NOT FINISH", wall,
      all_joined_ns_ ? static_cast<double>(all_joined_ns_ - t0_) / 1e9 : -1.0,
      p50, p99, pmax, st.requests_sent, per_rank_requests, per_rank_polls,
      polls_, conn_errors, st.connect_errors, st.closed_by_peer, retries_,
      failed_, cpu >= 0 ? fmt::format("{:.3f} s", cpu) : std::string("n/a"),
      client_cpu);
  if (!first_error_.empty() && !common_.quiet)
    fmt::print(stderr, "first error: {}\n", first_error_);
  if (!common_.json_path.empty()) {
    JsonObject j;
    j.str("mode", "rendezvous")
        .str("addr", common_.addr().text)
        .str("dialect", dialect)
        .integer("ranks", static_cast<std::int64_t>(ranks_.size()))
        .integer("conns_per_rank", conns_per_rank_)
        .str("barrier", barrier_name)
        .num("arrival_spread_s", opt_.arrival_spread_s)
        .boolean("finished", finished)
        .num("timeout_s", common_.timeout_s)
        .num("wall_s", wall)
        .num("all_joined_s",
             all_joined_ns_ ? static_cast<double>(all_joined_ns_ - t0_) / 1e9
                            : -1.0)
        .integer("ranks_done", static_cast<std::int64_t>(done_))
        .integer("ranks_failed", static_cast<std::int64_t>(failed_))
        .num("rank_p50_s", p50)
        .num("rank_p99_s", p99)
        .num("rank_max_s", pmax)
        .integer("requests_sent", static_cast<std::int64_t>(st.requests_sent))
        .integer("replies", static_cast<std::int64_t>(st.replies))
        .num("requests_per_rank", per_rank_requests)
        .integer("polls", static_cast<std::int64_t>(polls_))
        .num("polls_per_rank", per_rank_polls)
        .integer("conn_errors", static_cast<std::int64_t>(conn_errors))
        .integer("connect_errors", static_cast<std::int64_t>(st.connect_errors))
        .integer("closed_by_peer", static_cast<std::int64_t>(st.closed_by_peer))
        .integer("protocol_errors",
                 static_cast<std::int64_t>(st.protocol_errors))
        .integer("retries", static_cast<std::int64_t>(retries_))
        .integer("src_retries", static_cast<std::int64_t>(st.src_retries))
        .integer("open_conns_at_end", static_cast<std::int64_t>(open_at_end))
        .integer("server_pid", common_.server_pid)
        .num("server_cpu_s", cpu >= 0 ? cpu : std::nan(""))
        .num("generator_cpu_s", client_cpu)
        .integer("listen_overflows", overflows)  // machine-wide TcpExt deltas
        .integer("syn_retransmits", syn_retrans)
        .str("first_error", first_error_);
    if (!writeFile(common_.json_path, j.text())) {
      fmt::print(stderr, "cannot write {}\n", common_.json_path);
      return 1;
    }
  }
  return finished ? 0 : 2;
}

}  // namespace

int runRendezvous(const CommonOptions& common, const RendezvousOptions& opt) {
  if (!opt.echo_floor) {
    auto r = std::make_unique<Rendezvous>(common, opt);
    return r->run();
  }
  CommonOptions c = common;
  int pid = startEchoServer(c.onlyAddr());
  if (pid <= 0) {
    fmt::print(stderr, "echo floor: cannot start the echo server\n");
    return 1;
  }
  c.server_pid = pid;
  int rc = 0;
  {
    auto r = std::make_unique<Rendezvous>(c, opt);
    rc = r->run();
  }
  stopChild(pid);
  return rc;
}

}  // namespace tcpstore::bench
