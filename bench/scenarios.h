// The scenarios of tcpstore-bench: rendezvous, ops (and its echo floor),
// memory, abuse.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench/loadgen.h"
#include "protocol/wire.h"

namespace tcpstore::bench {

enum class BarrierKind { kV113, kV2, kServer };

struct CommonOptions {
  // Every server address given (--addr H:P[,H:P...]; never empty: the
  // default is one): rendezvous, init and init-job spread their ranks over
  // them round-robin (several gateways or relays serving one job); the other
  // modes use the first.
  std::vector<Endpoint> addrs;
  const Endpoint& addr() const noexcept { return addrs.front(); }
  // The address of rank (or connection) i.
  const Endpoint& addrOf(std::size_t i) const noexcept {
    return addrs[i % addrs.size()];
  }
  // A floor server replaces every address: returns the one it will fill.
  Endpoint& onlyAddr() {
    addrs.resize(1);
    return addrs.front();
  }
  protocol::Dialect dialect = protocol::Dialect::kV2;
  double timeout_s = 60;
  int server_pid = 0;
  int pin_cpu = -1;  // ops: pin generator + server to this CPU while measuring
  std::string json_path;
  std::string key_prefix;  // unique per run so repeated runs on one server do
                           // not collide
  bool quiet = false;
  Loop::SourceMode source_mode = Loop::SourceMode::kPorts;
  int rcvbuf = 0;  // --rcvbuf: SO_RCVBUF of client sockets (0: autotuning)
};

struct RendezvousOptions {
  int ranks = 64;
  int conns_per_rank = 0;  // 0: 2 for 1.13, 1 for 2.x
  BarrierKind barrier = BarrierKind::kV2;
  bool barrier_set = false;
  double arrival_spread_s = 0;
  bool master_poll =
      true;  // rank 0 polls init/ like the server-owning store object
  // The machine's floor: the same connections against a raw echo server, with
  // kFloorRoundTrips round trips of a 22-byte message per rank instead of the
  // protocol.
  bool echo_floor = false;
};

struct OpsOptions {
  int clients = 1;
  std::string op = "get";  // set|get|add|mix|echo
  int pipeline = 1;
  int idle = 0;
  double seconds = 3;
  double warmup_s = 0.5;
  int keys = 1000;
  int value_bytes = 32;
};

struct MemoryOptions {
  int keys = 100000;
  int idle = 0;
  int key_bytes = 96;
  int value_bytes = 8;
};

// abuse: the attacks of issue 13 one after another (bench/abuse.cc), sizes
// multiplied by `scale` (1: the full sizes).
struct AbuseOptions {
  double scale = 1;
  double hold_s = -1;    // each attack's load held this long; <0: 3 s x scale
  double settle_s = 30;  // bound on waiting for the server's RSS to come back
  // After the partial attack hangs up: the server frees those buffers at its
  // --partial-request-ms (default 60 s; its sweep runs every 5 s).
  double partial_linger_s = 70;
  int hog_values = 512;   // most 8 MiB values the storing client offers
  double probe_ms = 1.5;  // the probe's round-trip period
  std::string only;       // comma-separated attack names; empty: all
};

// Each returns the process exit code (0 ok, 1 error, 2 did not finish).
int runRendezvous(const CommonOptions& common, const RendezvousOptions& opt);

inline constexpr int kFloorRoundTrips = 4;
// A raw loopback echo server in a forked child: returns its pid (or -1) and
// sets `ep` to its address. stopChild() terminates and reaps it.
int startEchoServer(Endpoint& ep);
void stopChild(int pid);
int runOps(const CommonOptions& common, const OpsOptions& opt);
int runMemory(const CommonOptions& common, const MemoryOptions& opt);
// 0: every attack ran and the honest clients' data stayed exact; 1: a
// correctness failure (data, a lost probe, a reply owed before a protocol
// error missing); 2: --timeout passed first. Speed targets are reported,
// never turned into the exit code.
int runAbuse(const CommonOptions& common, const AbuseOptions& opt);

}  // namespace tcpstore::bench
