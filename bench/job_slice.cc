// init-job: a slice of a large torch 2.x job's init (bench/job_slice.h).
//
// Every rank runs a fixed script of round trips on its one connection; a
// round trip is a few requests sent back to back whose last reply ends it
// (with --echo-floor: one sized-echo message of the same bytes).
#include "bench/job_slice.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

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

std::int64_t realtimeNs() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// The round trips of a rank's script, in order.
enum class Trip : std::uint8_t {
  kHandshake,  // VALIDATE + PING
  kJoin,       // ADD init/ 1
  kRoots,      // (root: SET id) + WAIT all ids
  kFetch,      // MULTI_GET all ids
  kBarrier,    // BARRIER N
  kDone
};

struct Rank {
  Conn* conn = nullptr;
  Trip trip = Trip::kHandshake;
  bool failed = false;
  bool bad_value = false;    // a fetched id that was not the one SET
  std::int64_t done_ns = 0;  // monotonic
  double backoff_s = 0.5;
};

class JobSlice final : public ConnHandler, public TimerHandler {
 public:
  JobSlice(const CommonOptions& common, const JobSliceOptions& opt)
      : common_(common),
        opt_(opt),
        n_(static_cast<std::size_t>(opt.ranks)),
        ranks_(n_),
        value_(static_cast<std::size_t>(opt.value_bytes), 'v') {
    loop_.setSourceMode(common.source_mode);
    loop_.setRecvBuffer(common.rcvbuf);
    const std::string& p = common.key_prefix;
    init_key_ = p + "/init/";
    barrier_key_ = p + "/barrier";
    const int roots = (opt.world + kRootEvery - 1) / kRootEvery;
    for (int r = 0; r < roots; ++r) {
      root_keys_.push_back(fmt::format("{}/nccl/commId/{}", p, r));
    }
    for (const auto& k : root_keys_) all_keys_.push_back(k);
  }

  int run();

  void onConnected(Conn& c) override;
  void onReply(Conn& c, const Pending& p, const Reply& r) override;
  bool streamsValues() const override { return true; }
  void onValue(Conn& c, const Pending& p, std::string_view value) override;
  void onClosed(Conn& c, int err, bool established) override;
  void onTimer(std::uint64_t arg) override;

 private:
  int globalRank(std::size_t i) const {
    return opt_.first_rank + static_cast<int>(i);
  }
  Request& add() { return trip_.add(); }
  void send(std::size_t i, std::uint32_t reply_bytes);
  void connect(std::size_t i);
  void retry(std::size_t i);
  void next(std::size_t i);
  void fail(std::size_t i, const std::string& why);

  const CommonOptions& common_;
  JobSliceOptions opt_;
  std::size_t n_;
  Loop loop_;
  std::vector<Rank> ranks_;
  std::string value_, init_key_, barrier_key_;
  std::vector<std::string> root_keys_;
  std::vector<std::string_view> all_keys_;
  RoundTrip trip_;
  std::size_t finished_ = 0, failed_ = 0;
  std::uint64_t retries_ = 0, bad_replies_ = 0;
  std::string first_error_;
  std::mt19937_64 rng_{std::random_device{}()};
};

// Sends the requests add()ed since the last send as one round trip.
void JobSlice::send(std::size_t i, std::uint32_t reply_bytes) {
  trip_.send(loop_, *ranks_[i].conn, Dialect::kV2, opt_.echo_floor, reply_bytes,
             0, 0);
}

void JobSlice::connect(std::size_t i) {
  Rank& r = ranks_[i];
  r.trip = Trip::kHandshake;
  r.conn = loop_.connect(common_.addrOf(i), this, i);
  if (r.conn == nullptr) retry(i);
}

// A refused connect or a dropped handshake: the 2.x client retries the
// whole connect + handshake, backoff 0.5 s x 1.5 with jitter.
void JobSlice::retry(std::size_t i) {
  Rank& r = ranks_[i];
  ++retries_;
  loop_.addTimer(nowNs() + nextRetryDelayNs(r.backoff_s, 8.0, rng_), this, i);
}

// Sends rank i's round trip `ranks_[i].trip` (or ends its script).
void JobSlice::next(std::size_t i) {
  Rank& r = ranks_[i];
  const auto vb = static_cast<std::uint32_t>(value_.size());
  switch (r.trip) {
    case Trip::kHandshake: {
      Request& v = add();
      v.command = Command::kValidate;
      v.u32 = protocol::kValidateMagic;
      Request& p = add();
      p.command = Command::kPing;
      p.u32 = static_cast<std::uint32_t>(globalRank(i) + 1);
      send(i, 4);
      return;
    }
    case Trip::kJoin: {
      Request& a = add();
      a.command = Command::kAdd;
      a.key = init_key_;
      a.number = 1;
      send(i, 8);
      return;
    }
    case Trip::kRoots: {
      const int g = globalRank(i);
      if (g % kRootEvery == 0) {
        Request& set = add();
        set.command = Command::kSet;
        set.key = root_keys_[static_cast<std::size_t>(g / kRootEvery)];
        set.value = value_;
      }
      Request& w = add();
      w.command = Command::kWait;
      w.keys = all_keys_;
      send(i, 1);
      return;
    }
    case Trip::kFetch: {
      Request& m = add();
      m.command = Command::kMultiGet;
      m.keys = all_keys_;
      send(i, static_cast<std::uint32_t>(root_keys_.size() * (8 + vb)));
      return;
    }
    case Trip::kBarrier: {
      Request& b = add();
      b.command = Command::kBarrier;
      b.key = barrier_key_;
      b.number = opt_.world;
      send(i, 1);
      return;
    }
    case Trip::kDone:
      r.done_ns = nowNs();
      ++finished_;
      return;
  }
}

void JobSlice::fail(std::size_t i, const std::string& why) {
  Rank& r = ranks_[i];
  if (r.failed || r.trip == Trip::kDone) return;
  if (first_error_.empty()) {
    first_error_ = fmt::format("rank {}: {}", globalRank(i), why);
  }
  r.failed = true;
  ++failed_;
  ++finished_;
  if (r.conn != nullptr && r.conn->open()) loop_.close(*r.conn);
}

void JobSlice::onConnected(Conn& c) { next(static_cast<std::size_t>(c.user)); }

void JobSlice::onReply(Conn& c, const Pending&, const Reply& rep) {
  const std::size_t i = static_cast<std::size_t>(c.user);
  Rank& r = ranks_[i];
  if (r.failed || r.trip == Trip::kDone) return;
  if (!opt_.echo_floor) {
    bool ok = true;
    switch (r.trip) {
      case Trip::kHandshake:
        ok = rep.shape == ReplyShape::kU32 &&
             rep.u32 == static_cast<std::uint32_t>(globalRank(i) + 1);
        break;
      case Trip::kJoin:
        ok = rep.shape == ReplyShape::kInt64 && rep.number >= 1 &&
             rep.number <= opt_.world;
        break;
      case Trip::kFetch:  // the ids went through onValue
        ok = rep.shape == ReplyShape::kStrings &&
             rep.number == static_cast<std::int64_t>(root_keys_.size()) &&
             !r.bad_value;
        break;
      default:
        ok = rep.shape == ReplyShape::kByte;
        break;
    }
    if (!ok) ++bad_replies_;
  }
  r.trip = static_cast<Trip>(static_cast<int>(r.trip) + 1);
  next(i);
}

void JobSlice::onValue(Conn& c, const Pending&, std::string_view value) {
  if (value != value_)
    ranks_[static_cast<std::size_t>(c.user)].bad_value = true;
}

void JobSlice::onClosed(Conn& c, int err, bool established) {
  const std::size_t i = static_cast<std::size_t>(c.user);
  Rank& r = ranks_[i];
  if (r.failed || r.trip == Trip::kDone) return;
  if (!established || r.trip == Trip::kHandshake) {
    r.conn = nullptr;
    retry(i);
    return;
  }
  fail(i, fmt::format("connection closed by the server ({})",
                      err ? std::strerror(err) : "-"));
}

void JobSlice::onTimer(std::uint64_t arg) {
  const std::size_t i = static_cast<std::size_t>(arg);
  if (!ranks_[i].failed && ranks_[i].conn == nullptr) connect(i);
}

int JobSlice::run() {
  // Wait for the common start (sleeping, then the last bit spinning on the
  // clock so processes start within microseconds of each other).
  if (opt_.start_at_ns > 0) {
    for (;;) {
      const std::int64_t left = opt_.start_at_ns - realtimeNs();
      if (left <= 0) break;
      if (left > 2 * kMs) {
        usleep(static_cast<useconds_t>((left - kMs) / 1000));
      }
    }
  }
  const std::int64_t real0 = realtimeNs();
  const std::int64_t t0 = nowNs();
  const std::int64_t start_real =
      opt_.start_at_ns > 0 ? opt_.start_at_ns : real0;
  const double cpu0 =
      common_.server_pid > 0 ? processCpuSeconds(common_.server_pid) : -1;
  const double self0 = selfCpuSeconds();
  for (std::size_t i = 0; i < n_; ++i) connect(i);
  const std::int64_t deadline =
      t0 + static_cast<std::int64_t>(common_.timeout_s * 1e9);
  std::int64_t next_progress = t0 + 2000 * kMs;
  while (finished_ < n_) {
    const std::int64_t now = nowNs();
    if (now >= deadline) break;
    if (!common_.quiet && now >= next_progress) {
      fmt::print(stderr, "[init-job {}+{}] {:.1f}s: done {}/{} failed {}\n",
                 opt_.first_rank, n_, static_cast<double>(now - t0) / 1e9,
                 finished_ - failed_, n_, failed_);
      next_progress = now + 2000 * kMs;
    }
    loop_.runOnce(std::min<std::int64_t>(50 * kMs, deadline - now));
  }
  const bool finished = finished_ == n_ && failed_ == 0;
  const double gen_cpu = selfCpuSeconds() - self0;
  const double server_cpu =
      cpu0 >= 0 ? processCpuSeconds(common_.server_pid) - cpu0 : -1;
  // Completion times, ms after the common start (realtime clock).
  const double skew_ms = static_cast<double>(real0 - start_real) / 1e6;
  std::vector<std::int64_t> lat;
  std::string done_ms = "[";
  for (const Rank& r : ranks_) {
    if (r.failed || r.trip != Trip::kDone) continue;
    const double ms = static_cast<double>(r.done_ns - t0) / 1e6 + skew_ms;
    lat.push_back(static_cast<std::int64_t>(ms * 1e6));
    if (done_ms.size() > 1) done_ms += ',';
    done_ms += fmt::format("{:.3f}", ms);
  }
  done_ms += ']';
  const double p50 = percentile(lat, 50) / 1e9;
  const double p99 = percentile(lat, 99) / 1e9;
  const double last = lat.empty() ? 0 : static_cast<double>(lat.back()) / 1e9;
  const LoopStats& st = loop_.stats();
  const std::uint64_t conn_errors = st.connect_errors + st.closed_by_peer;
  fmt::print(
      "init-job world={} ranks={}+{}{}: {} last {:.4f} s, rank p50 {:.4f} s "
      "p99 {:.4f} s, start skew {:.3f} ms, {} requests, {} conn errors, {} "
      "bad replies, {} retries, {} failed ranks, generator cpu {:.3f} s\n",
      opt_.world, opt_.first_rank, n_, opt_.echo_floor ? " (echo floor)" : "",
      finished ? "finished" : "DID NOT FINISH", last, p50, p99, skew_ms,
      st.requests_sent, conn_errors, bad_replies_, retries_, failed_, gen_cpu);
  if (!first_error_.empty() && !common_.quiet) {
    fmt::print(stderr, "first error: {}\n", first_error_);
  }
  if (!common_.json_path.empty()) {
    auto i64 = [](std::uint64_t v) { return static_cast<std::int64_t>(v); };
    JsonObject j;
    j.str("mode", "init-job")
        .boolean("echo_floor", opt_.echo_floor)
        .integer("world", opt_.world)
        .integer("first_rank", opt_.first_rank)
        .integer("ranks", i64(n_))
        .integer("addrs", i64(common_.addrs.size()))
        .boolean("finished", finished)
        .num("timeout_s", common_.timeout_s)
        .integer("start_at_ns", start_real)
        .num("start_skew_ms", skew_ms)
        .num("last_s", last)
        .num("rank_p50_s", p50)
        .num("rank_p99_s", p99)
        .integer("requests_sent", i64(st.requests_sent))
        .integer("replies", i64(st.replies))
        .integer("conn_errors", i64(conn_errors))
        .integer("connect_errors", i64(st.connect_errors))
        .integer("closed_by_peer", i64(st.closed_by_peer))
        .integer("protocol_errors", i64(st.protocol_errors))
        .integer("src_retries", i64(st.src_retries))
        .integer("bad_replies", i64(bad_replies_))
        .integer("retries", i64(retries_))
        .integer("ranks_failed", i64(failed_))
        .num("server_cpu_s", server_cpu >= 0 ? server_cpu : std::nan(""))
        .num("generator_cpu_s", gen_cpu)
        .str("first_error", first_error_)
        .raw("done_ms", done_ms);
    if (!writeFile(common_.json_path, j.text())) {
      fmt::print(stderr, "cannot write {}\n", common_.json_path);
      return 1;
    }
  }
  if (!finished) return failed_ > 0 && finished_ == n_ ? 1 : 2;
  return bad_replies_ == 0 && st.protocol_errors == 0 ? 0 : 1;
}

}  // namespace

int runJobSlice(const CommonOptions& common, const JobSliceOptions& opt) {
  if (opt.world < 1 || opt.ranks < 1 || opt.first_rank < 0 ||
      opt.first_rank + opt.ranks > opt.world) {
    fmt::print(stderr,
               "init-job: need 0 <= --first-rank, 1 <= --ranks, first + "
               "ranks <= --world\n");
    return 64;
  }
  return std::make_unique<JobSlice>(common, opt)->run();
}

int runSizedEchoServerMode(const std::string& host, int sndbuf) {
  sockaddr_storage ss{};
  socklen_t len = 0;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&ss);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&ss);
  if (inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    len = sizeof(*v4);
  } else if (inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    len = sizeof(*v6);
  } else {
    fmt::print(stderr, "sized-echo-server: bad --host '{}'\n", host);
    return 64;
  }
  raiseFdLimit();
  const int lfd =
      socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int one = 1;
  if (lfd < 0 ||
      setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
      bind(lfd, reinterpret_cast<sockaddr*>(&ss), len) != 0 ||
      listen(lfd, 4096) != 0 ||
      getsockname(lfd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
    fmt::print(stderr, "sized-echo-server: cannot listen on {}: {}\n", host,
               std::strerror(errno));
    return 1;
  }
  const unsigned port =
      ntohs(ss.ss_family == AF_INET ? v4->sin_port : v6->sin6_port);
  fmt::print("listening on {}:{}\n",
             ss.ss_family == AF_INET ? host : "[" + host + "]", port);
  std::fflush(stdout);
  serveSizedEcho(lfd, sndbuf);
}

}  // namespace tcpstore::bench
