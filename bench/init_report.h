// The result line and JSON object of the init scenarios (init_scenarios.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "bench/loadgen.h"
#include "bench/scenarios.h"

namespace tcpstore::bench {

struct InitReport {
  std::string name;  // the mode: nccl-scalable-init, gloo-mesh, heartbeat
  std::string dialect;
  std::string addr;
  bool echo_floor = false;
  std::size_t ranks = 0;
  bool finished = false;
  double wall_s = 0, p50_s = 0, p99_s = 0, max_s = 0;  // per rank
  LoopStats stats;
  std::uint64_t reply_bytes = 0, bad_replies = 0, retries = 0, failed = 0;
  double server_cpu_s = -1;  // < 0: unknown
  double generator_cpu_s = 0;
  std::string first_error;
  // heartbeat only
  bool heartbeat = false;
  double seconds = 0;
  std::uint64_t checks = 0;
  double connected_s = -1;      // the connect storm
  double hb_window_s = 0;       // first CHECK sent to last reply
  double hb_server_cpu_s = -1;  // server CPU over that window
  double check_p50_us = 0, check_p99_us = 0;
};

// Prints the one-line summary on stdout (and the first error on stderr
// unless quiet) and writes the JSON object to common.json_path if set.
// Returns false if that file could not be written.
bool writeInitReport(const InitReport& r, const CommonOptions& common);

}  // namespace tcpstore::bench
