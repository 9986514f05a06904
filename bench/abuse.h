// The pieces of `tcpstore-bench abuse` shared by its attack code
// (bench/abuse.cc) and its report (bench/abuse_report.cc).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "bench/abuse_probe.h"
#include "bench/scenarios.h"

namespace tcpstore::bench::abuse {

inline constexpr std::int64_t kMiB = 1 << 20;

// One row of the report: an attack (or the baseline, or a sub-step such as
// the drop of the WAIT connections) and what the server did meanwhile.
struct Phase {
  std::string name;  // short id (--only takes these)
  std::string what;  // one line: the attack at the size run
  int conns = 0;     // attacking connections opened
  int closed = 0;    // of those, closed by the server
  std::int64_t rss_before = -1, rss_peak = -1, rss_after = -1;
  double seconds = 0;
  std::int64_t t0_ns = 0;  // the phase began (nowNs clock)
  double server_cpu_s = -1;
  ProbeStats probe;
  double sched_lag_ms = 0;  // the bench's own worst scheduling delay
  // Attack-specific figures (name, value), in the JSON and the notes.
  std::vector<std::pair<std::string, double>> figures;
  std::string notes;  // for the table
  // The attack's own correctness check (e.g. every owed reply arrived);
  // false makes the run fail.
  bool ok = true;
};

struct Verdict {
  std::string target;
  std::string measured;
  bool met = false;
};

struct RunSummary {
  std::string addr;
  double scale = 1;
  bool finished = true;
  std::int64_t rss_start = -1;
  std::uint64_t probe_data_errors = 0;
  std::uint64_t probe_lost = 0;
  std::uint64_t control_failures = 0;  // the setup connection failed a fence
  std::vector<Phase> phases;
  std::vector<Verdict> verdicts;  // the "Done when" targets
};

// The "Done when" targets of issue 13 judged on the phases.
std::vector<Verdict> judge(const RunSummary& run);
// The table on stdout.
void printReport(const RunSummary& run);
// The same as one JSON object.
std::string reportJson(const RunSummary& run);

}  // namespace tcpstore::bench::abuse
