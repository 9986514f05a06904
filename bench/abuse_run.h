// The attack runner of `tcpstore-bench abuse` (bench/abuse.cc runs the
// phases and the report, bench/abuse_attacks.cc holds the attacks).
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "bench/abuse.h"

namespace tcpstore::bench::abuse {

inline constexpr std::int64_t kMs = 1000000;
inline constexpr std::int64_t kSec = 1000 * kMs;

class Abuse {
 public:
  Abuse(const CommonOptions& common, const AbuseOptions& opt)
      : c_(common),
        o_(opt),
        sampler_(common.server_pid),
        probe_(common.addr(), common.key_prefix, opt.probe_ms, 10) {
    hold_ns_ = static_cast<std::int64_t>(
        (o_.hold_s >= 0 ? o_.hold_s : std::max(0.3, 3 * o_.scale)) * 1e9);
    settle_ns_ = static_cast<std::int64_t>(o_.settle_s * 1e9);
    run_.addr = c_.addr().text;
    run_.scale = o_.scale;
  }
  int run();

 private:
  int scaled(int full, int least) const {
    return std::max(least, static_cast<int>(std::lround(full * o_.scale)));
  }
  std::int64_t scaledBytes(std::int64_t full, std::int64_t least) const {
    return std::max(least, static_cast<std::int64_t>(std::llround(
                               static_cast<double>(full) * o_.scale)));
  }
  bool wanted(const std::string& name) const {
    if (o_.only.empty()) return true;
    return ("," + o_.only + ",").find("," + name + ",") != std::string::npos;
  }
  bool timedOut() {
    if (nowNs() < deadline_) return false;
    run_.finished = false;
    return true;
  }
  std::int64_t within(std::int64_t ns) const {
    return std::min(deadline_, nowNs() + ns);
  }
  std::string key(std::string_view what) const {
    return fmt::format("/{}/{}", c_.key_prefix, what);
  }

  Phase& begin(std::string name, std::string what);
  void end(Phase& p);
  void settle(Phase& p, std::int64_t target, std::int64_t limit,
              std::int64_t plateau);
  void hold(std::vector<RawSock>& socks, Phase& p);
  bool deleteKeys(const std::vector<std::string>& keys);

  void baseline();
  void partial();
  void nonreaders();
  void waits();
  void collide();
  void owed();
  void hog();

  CommonOptions c_;
  AbuseOptions o_;
  RssSampler sampler_;
  Probe probe_;
  RawSock ctl_;  // setup and cleanup, an honest client too
  std::int64_t deadline_ = 0;
  std::int64_t hold_ns_ = 0;
  std::int64_t settle_ns_ = 0;
  std::int64_t phase_t0_ = 0;
  double phase_cpu0_ = 0;
  std::vector<std::string>
      garbage_;  // keys the attacks left, deleted at the end
  RunSummary run_;
};

}  // namespace tcpstore::bench::abuse
