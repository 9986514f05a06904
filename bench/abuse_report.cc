// The report of `tcpstore-bench abuse`: the "Done when" targets
// judged on the phases, a table on stdout and a JSON object.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "bench/abuse.h"

namespace tcpstore::bench::abuse {
namespace {

bool isAttack(const Phase& p) {
  return p.name != "baseline" && p.name != "cleanup";
}

const Phase* find(const RunSummary& run, std::string_view name) {
  for (const Phase& p : run.phases) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

double figure(const Phase& p, std::string_view name, double dflt = -1) {
  for (const auto& [k, v] : p.figures) {
    if (k == name) return v;
  }
  return dflt;
}

double mib(std::int64_t b) { return static_cast<double>(b) / kMiB; }

std::string mibText(std::int64_t b) {
  return b < 0 ? "n/a" : fmt::format("{:.0f}", mib(b));
}

}  // namespace

std::vector<Verdict> judge(const RunSummary& run) {
  std::vector<Verdict> out;
  const Phase* worst_rss = nullptr;
  const Phase* worst_p99 = nullptr;
  const Phase* worst_max = nullptr;
  for (const Phase& p : run.phases) {
    if (!isAttack(p)) continue;
    if (worst_rss == nullptr || p.rss_peak > worst_rss->rss_peak)
      worst_rss = &p;
    if (worst_p99 == nullptr || p.probe.p99_ms > worst_p99->probe.p99_ms) {
      worst_p99 = &p;
    }
    if (worst_max == nullptr || p.probe.max_ms > worst_max->probe.max_ms) {
      worst_max = &p;
    }
  }
  if (worst_rss != nullptr) {
    if (worst_rss->rss_peak < 0 || run.rss_start < 0) {
      out.push_back({"RSS growth < 1.5 GiB", "n/a (no --server-pid)", false});
    } else {
      const std::int64_t g = worst_rss->rss_peak - run.rss_start;
      out.push_back(
          {"RSS growth < 1.5 GiB",
           fmt::format("{:.0f} MiB at most ({})", mib(g), worst_rss->name),
           g < 1536 * kMiB});
    }
    out.push_back({"probe p99 < 50 ms",
                   fmt::format("{:.1f} ms at most ({})",
                               worst_p99->probe.p99_ms, worst_p99->name),
                   worst_p99->probe.p99_ms < 50});
    out.push_back({"no single stall > 100 ms",
                   fmt::format("{:.1f} ms longest probe round trip ({}, "
                               "sent {:.1f} s into it)",
                               worst_max->probe.max_ms, worst_max->name,
                               static_cast<double>(worst_max->probe.max_at_ns -
                                                   worst_max->t0_ns) /
                                   1e9),
                   worst_max->probe.max_ms <= 100});
  }
  if (const Phase* c = find(run, "collide")) {
    const double s = figure(*c, "set_ratio"), w = figure(*c, "wait_ratio");
    out.push_back({"crafted keys within 5x of random",
                   fmt::format("SET {:.2f}x, WAIT {:.2f}x", s, w),
                   s > 0 && s < 5 && w > 0 && w < 5});
  }
  if (const Phase* d = find(run, "waits-drop")) {
    const double pre = figure(*d, "rss_preload_mib");
    out.push_back({"RSS back within 2x pre-load after the WAIT drop",
                   fmt::format("{:.0f} MiB after, {:.0f} MiB before the WAITs",
                               mib(d->rss_after), pre),
                   d->rss_after >= 0 && mib(d->rss_after) <= 2 * pre});
  }
  if (const Phase* o = find(run, "owed")) {
    out.push_back(
        {"replies owed before a protocol error are sent", o->notes, o->ok});
  }
  if (const Phase* h = find(run, "hog")) {
    out.push_back({"storing 8 MiB values under new keys is refused", h->notes,
                   figure(*h, "refused") == 1});
  }
  bool exact = run.probe_data_errors == 0 && run.probe_lost == 0 &&
               run.control_failures == 0;
  if (const Phase* n = find(run, "nonreaders")) exact = exact && n->ok;
  out.push_back(
      {"honest clients' data exact",
       fmt::format("probe: {} wrong values, {} lost round trips; control "
                   "connection: {} failures",
                   run.probe_data_errors, run.probe_lost, run.control_failures),
       exact});
  return out;
}

void printReport(const RunSummary& run) {
  fmt::print("abuse against {} (scale {}): server RSS at start {} MiB{}\n",
             run.addr, run.scale, mibText(run.rss_start),
             run.finished ? "" : "; DID NOT FINISH within --timeout");
  for (const Phase& p : run.phases) {
    fmt::print("  {:<11} {}\n", p.name, p.what);
  }
  fmt::print(
      "\n{:<11} {:>5} {:>6} | {:>6} {:>6} {:>6} {:>6} | {:>6} {:>6} {:>6} "
      "{:>7} {:>5} {:>7} | {:>6} {:>6} | {}\n",
      "phase", "conns", "closed", "rss0", "peak", "after", "growth", "probes",
      "p50", "p99", "max", "exact", "lag", "cpu s", "time s", "notes");
  fmt::print(
      "{:<11} {:>5} {:>6} | {:>27} | {:>6} {:>20} {:>5} {:>7} | {:>13} |\n", "",
      "", "", "(MiB)", "", "(ms)", "", "(ms)", "(server)");
  for (const Phase& p : run.phases) {
    const bool exact = p.probe.data_errors == 0 && p.probe.lost == 0;
    fmt::print(
        "{:<11} {:>5} {:>6} | {:>6} {:>6} {:>6} {:>6} | {:>6} {:>6.2f} "
        "{:>6.2f} {:>7.2f} {:>5} {:>7.1f} | {:>6.2f} {:>6.1f} | {}\n",
        p.name, p.conns, p.closed, mibText(p.rss_before), mibText(p.rss_peak),
        mibText(p.rss_after),
        p.rss_peak < 0 ? "n/a" : mibText(p.rss_peak - p.rss_before),
        p.probe.round_trips, p.probe.p50_ms, p.probe.p99_ms, p.probe.max_ms,
        exact ? "yes" : "NO", p.sched_lag_ms, p.server_cpu_s, p.seconds,
        p.notes);
  }
  fmt::print(
      "(lag: the bench's own worst scheduling delay in the phase, a thread "
      "asking to sleep 5 ms; a probe stall no longer than it may be the "
      "machine, not the server)\n");
  fmt::print("\ntargets (issue 13, \"Done when\"):\n");
  for (const Verdict& v : run.verdicts) {
    fmt::print("  {:<6} {}: {}\n", v.met ? "met" : "MISSED", v.target,
               v.measured);
  }
  std::fflush(stdout);
}

std::string reportJson(const RunSummary& run) {
  std::string phases = "[";
  for (const Phase& p : run.phases) {
    JsonObject f;
    for (const auto& [k, v] : p.figures) f.num(k, v);
    JsonObject j;
    j.str("name", p.name)
        .str("what", p.what)
        .integer("conns", p.conns)
        .integer("closed_by_server", p.closed)
        .integer("rss_before", p.rss_before)
        .integer("rss_peak", p.rss_peak)
        .integer("rss_after", p.rss_after)
        .integer("rss_growth", p.rss_peak < 0 ? -1 : p.rss_peak - p.rss_before)
        .integer("probe_round_trips",
                 static_cast<std::int64_t>(p.probe.round_trips))
        .num("probe_p50_ms", p.probe.p50_ms)
        .num("probe_p99_ms", p.probe.p99_ms)
        .num("probe_max_ms", p.probe.max_ms)
        .num("bench_sched_lag_ms", p.sched_lag_ms)
        .num("probe_max_at_s",
             p.probe.round_trips == 0
                 ? 0
                 : static_cast<double>(p.probe.max_at_ns - p.t0_ns) / 1e9)
        .integer("probe_data_errors",
                 static_cast<std::int64_t>(p.probe.data_errors))
        .integer("probe_lost", static_cast<std::int64_t>(p.probe.lost))
        .num("server_cpu_s", p.server_cpu_s)
        .num("seconds", p.seconds)
        .boolean("ok", p.ok)
        .str("notes", p.notes)
        .raw("figures", f.text());
    if (phases.size() > 1) phases += ",";
    phases += j.text();
  }
  phases += "]";
  std::string targets = "[";
  bool all_met = true;
  bool exact = false;
  for (const Verdict& v : run.verdicts) {
    JsonObject j;
    j.str("target", v.target).str("measured", v.measured).boolean("met", v.met);
    if (targets.size() > 1) targets += ",";
    targets += j.text();
    all_met = all_met && v.met;
    if (v.target == "honest clients' data exact") exact = v.met;
  }
  targets += "]";
  JsonObject j;
  j.str("mode", "abuse")
      .str("addr", run.addr)
      .num("scale", run.scale)
      .boolean("finished", run.finished)
      .boolean("honest_exact", exact)
      .integer("probe_data_errors",
               static_cast<std::int64_t>(run.probe_data_errors))
      .integer("probe_lost", static_cast<std::int64_t>(run.probe_lost))
      .integer("control_failures",
               static_cast<std::int64_t>(run.control_failures))
      .integer("rss_start", run.rss_start)
      .boolean("all_targets_met", all_met)
      .raw("phases", phases)
      .raw("targets", targets);
  return j.text() + "\n";
}

}  // namespace tcpstore::bench::abuse
