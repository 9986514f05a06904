// init-job: one generator process's slice of a large torch 2.x job's init
// (issue 12 item 4: 96K ranks played by several processes, each under the
// per-process fd cap).
//
// The process plays ranks K..K+M-1 of an N-rank job (--world N --first-rank K
// --ranks M). Every rank, on its own connection, round trip by round trip:
//   1. connect, VALIDATE + PING (the 2.x client's handshake);
//   2. ADD <prefix>/init/ 1;
//   3. NCCL scalable init: a root rank (rank % 128 == 0) SETs its 128-byte id
//      <prefix>/nccl/commId/<rank/128>; every rank WAITs for all N/128 ids;
//   4. MULTI_GET of all N/128 ids;
//   5. BARRIER <prefix>/barrier N (2.14's server-side barrier).
// The counts (ADD, BARRIER) and the root set are those of N, so several
// processes given the same --key-prefix and complementary slices make one job.
// Ranks are spread round-robin over --addr (e.g. one relay per address).
//
// --start-at NS (CLOCK_REALTIME) makes every process start its ranks at one
// instant; latencies are measured from it, and --json writes each rank's
// completion time (ms after the start) so an orchestrator can merge slices.
//
// With --echo-floor every round trip is one sized-echo message of the same
// request bytes answered with the same reply bytes (bench/sized_echo.h) by the
// servers at --addr (tcpstore-bench sized-echo-server): the floor of exactly
// these connections and this traffic.
#pragma once

#include <cstdint>
#include <string>

#include "bench/scenarios.h"

namespace tcpstore::bench {

struct JobSliceOptions {
  int world = 1024;              // N: ranks in the whole job
  int first_rank = 0;            // K
  int ranks = 1024;              // M (0 < K + M <= N)
  std::int64_t start_at_ns = 0;  // CLOCK_REALTIME; 0: start at once
  bool echo_floor = false;
  int value_bytes = 128;  // the NCCL unique id
};

// Returns the process exit code (0 ok, 1 error or bad replies, 2 did not
// finish within common.timeout_s, counted from the start instant).
int runJobSlice(const CommonOptions& common, const JobSliceOptions& opt);

// tcpstore-bench sized-echo-server --host H: binds H:0, prints
// "listening on H:PORT" on stdout and serves sized-echo messages until
// killed (or its parent exits). Returns an exit code only on failure.
// sndbuf > 0: SO_SNDBUF of accepted sockets (--sndbuf).
int runSizedEchoServerMode(const std::string& host, int sndbuf);

}  // namespace tcpstore::bench
