// tcpstore-cli's job views (status, watch, release) over the key schema of
// the Python package's tcpstore:// jobs (python/README.md, "Key schema"):
//   <job>/tcpstore/world_size = N, <job>/tcpstore/rank/<r> = "host pid",
//   <job>/tcpstore/joined (counter), <job>/tcpstore/ready,
//   <job>/tcpstore/failed.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "tcpstore/client.h"

namespace tcpstore::cli {

// Prints the job's state without joining it (reads only). Returns the exit
// status: 0 all joined, 1 incomplete/failed/unknown job, else a Status error
// through fail (never returns then).
int printJobStatus(const Client& c, const std::string& job);
// Without a job: torch's raw "init/" counter and every job found by
// LIST_KEYS (servers without it: only the counter). Returns 0.
int printServerStatus(const Client& c, const ClientOptions& o);
// Waits, without counting itself, until `n` have joined: the job's joined
// counter (job non-empty: blocking WAIT on <job>/tcpstore/ready in slices of
// at most 1 s, progress printed after each) or torch's "init/" counter (read
// every 200 ms on a short connection). Prints "joined K/N" on each change.
// A job whose join failed returns kNotFound with the failed key's reason.
Status watchWorkers(const Client& c, const ClientOptions& o,
                    const std::string& job, std::int64_t n,
                    std::chrono::milliseconds timeout);
// Deletes every key under <job>/ (LIST_KEYS), world_size last. Returns the
// number deleted.
Result<std::int64_t> releaseJob(const Client& c, const std::string& job);

}  // namespace tcpstore::cli
