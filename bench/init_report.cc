#include "bench/init_report.h"

#include <fmt/format.h>

#include <cmath>

namespace tcpstore::bench {

bool writeInitReport(const InitReport& r, const CommonOptions& common) {
  const std::uint64_t conn_errors =
      r.stats.connect_errors + r.stats.closed_by_peer;
  const double hb_pct = r.hb_window_s > 0 && r.hb_server_cpu_s >= 0
                            ? 100.0 * r.hb_server_cpu_s / r.hb_window_s
                            : std::nan("");
  const double hb_pct_1k = hb_pct * 1000.0 / static_cast<double>(r.ranks);
  std::string extra;
  if (r.heartbeat) {
    extra = fmt::format(
        ", connected {:.3f} s, {} CHECKs in {:.2f} s, CHECK p50 {:.0f} us p99 "
        "{:.0f} us, server cpu {:.2f}% ({:.3f}% per 1,000 ranks)",
        r.connected_s, r.checks, r.hb_window_s, r.check_p50_us, r.check_p99_us,
        hb_pct, hb_pct_1k);
  }
  fmt::print(
      "{} dialect={} ranks={}{}: {} wall {:.4f} s, rank p50 {:.4f} s p99 "
      "{:.4f} s max {:.4f} s, {} requests, {} reply bytes, {} conn errors, {} "
      "bad replies, {} retries, {} failed ranks, server cpu {}, generator cpu "
      "{:.3f} s{}\n",
      r.name, r.dialect, r.ranks, r.echo_floor ? " (echo floor)" : "",
      r.finished ? "finished" : "DID NOT FINISH", r.wall_s, r.p50_s, r.p99_s,
      r.max_s, r.stats.requests_sent, r.reply_bytes, conn_errors, r.bad_replies,
      r.retries, r.failed,
      r.server_cpu_s >= 0 ? fmt::format("{:.3f} s", r.server_cpu_s)
                          : std::string("n/a"),
      r.generator_cpu_s, extra);
  if (!r.first_error.empty() && !common.quiet)
    fmt::print(stderr, "first error: {}\n", r.first_error);
  if (common.json_path.empty()) return true;
  auto i64 = [](std::uint64_t v) { return static_cast<std::int64_t>(v); };
  JsonObject j;
  j.str("mode", r.name)
      .str("addr", r.addr)
      .str("dialect", r.dialect)
      .boolean("echo_floor", r.echo_floor)
      .integer("ranks", i64(r.ranks))
      .boolean("finished", r.finished)
      .num("timeout_s", common.timeout_s)
      .num("wall_s", r.wall_s)
      .num("rank_p50_s", r.p50_s)
      .num("rank_p99_s", r.p99_s)
      .num("rank_max_s", r.max_s)
      .integer("requests_sent", i64(r.stats.requests_sent))
      .integer("replies", i64(r.stats.replies))
      .integer("reply_bytes", i64(r.reply_bytes))
      .integer("conn_errors", i64(conn_errors))
      .integer("protocol_errors", i64(r.stats.protocol_errors))
      .integer("bad_replies", i64(r.bad_replies))
      .integer("retries", i64(r.retries))
      .integer("ranks_failed", i64(r.failed))
      .integer("server_pid", common.server_pid)
      .num("server_cpu_s", r.server_cpu_s >= 0 ? r.server_cpu_s : std::nan(""))
      .num("generator_cpu_s", r.generator_cpu_s)
      .str("first_error", r.first_error);
  if (r.heartbeat) {
    j.num("seconds", r.seconds)
        .integer("checks", i64(r.checks))
        .num("connected_s", r.connected_s)
        .num("hb_window_s", r.hb_window_s)
        .num("hb_server_cpu_s",
             r.hb_server_cpu_s >= 0 ? r.hb_server_cpu_s : std::nan(""))
        .num("server_cpu_pct", hb_pct)
        .num("cpu_pct_per_1k_ranks", hb_pct_1k)
        .num("check_p50_us", r.check_p50_us)
        .num("check_p99_us", r.check_p99_us);
  }
  if (!writeFile(common.json_path, j.text())) {
    fmt::print(stderr, "cannot write {}\n", common.json_path);
    return false;
  }
  return true;
}

}  // namespace tcpstore::bench
