// The real torch 2.x init load (issue 12): what a job's ranks do to the store
// after the connect storm.
//
//   nccl-scalable-init  every 128th rank SETs its NCCL unique id (128 bytes);
//                       every rank WAITs for all N/128 root ids, then fetches
//                       them with one MULTI_GET (1.13: pipelined GETs, it has
//                       no MULTI_GET), as torch's store multiGet does.
//   gloo-mesh           every rank SETs its address (128 bytes), then for each
//                       peer in rank order WAITs for its key and GETs it
//                       (store.get: two round trips), N^2 GETs in all.
//   heartbeat           after connecting, every rank CHECKs one (missing) key
//                       once a second, the ranks spread evenly over the
//                       second, for --seconds: server CPU % per 1,000 ranks.
//
// With --echo-floor each round trip becomes one message of the same request
// bytes answered with the same reply bytes by a built-in server that does no
// protocol work (bench/sized_echo.h): the machine's floor for that traffic.
#pragma once

#include <string_view>

#include "bench/scenarios.h"

namespace tcpstore::bench {

enum class InitScenario { kNcclScalableInit, kGlooMesh, kHeartbeat };

struct InitOptions {
  InitScenario scenario = InitScenario::kNcclScalableInit;
  int ranks = 1024;
  double seconds = 20;  // heartbeat: how long the 1 Hz CHECKs are held
  bool echo_floor = false;
  int value_bytes = 128;  // NCCL unique id / gloo address size
};

// The mode names above; false for anything else.
bool parseInitScenario(std::string_view mode, InitScenario& out);

// Returns the process exit code (0 ok, 1 error, 2 did not finish).
int runInit(const CommonOptions& common, const InitOptions& opt);

}  // namespace tcpstore::bench
