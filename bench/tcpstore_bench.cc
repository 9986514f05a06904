// tcpstore-bench: an event-driven load generator for any c10d TCPStore server.
//
//   tcpstore-bench rendezvous --addr 127.0.0.1:29500 --dialect 1.13 --ranks
//   4096 tcpstore-bench ops --addr 127.0.0.1:29500 --op get --clients 1 --idle
//   10000 tcpstore-bench ops --op echo            (the loopback round-trip
//   floor) tcpstore-bench memory --addr ... --server-pid PID --keys 100000
//   --idle 1000
//   tcpstore-bench abuse --addr ... --server-pid PID   (issue 13's attacks)
#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "bench/init_scenarios.h"
#include "bench/job_slice.h"
#include "bench/scenarios.h"

namespace {

using tcpstore::bench::AbuseOptions;
using tcpstore::bench::BarrierKind;
using tcpstore::bench::CommonOptions;
using tcpstore::bench::MemoryOptions;
using tcpstore::bench::OpsOptions;
using tcpstore::bench::RendezvousOptions;

constexpr const char* kUsage = R"(usage: tcpstore-bench MODE [options]

modes:
  rendezvous  --ranks N [--conns-per-rank 1|2] [--barrier 1.13|2.x|server]
              [--arrival-spread S] [--no-master-poll]
              [--echo-floor]  (same connections, 4 raw round trips per rank
                               against a built-in echo server: the machine's floor)
  ops         --op set|get|add|mix|echo [--clients C] [--pipeline D] [--idle K]
              [--seconds T] [--warmup S] [--keys N] [--value-bytes B]
  memory      --server-pid PID [--keys M] [--idle K] [--key-bytes B] [--value-bytes B]
  nccl-scalable-init | gloo-mesh | heartbeat   --ranks N [--seconds T] [--echo-floor]
              torch 2.x init load (bench/init_scenarios.h); heartbeat holds --seconds
  init-job    --world N [--first-rank K] --ranks M [--start-at REALTIME_NS] [--echo-floor]
              ranks K..K+M-1 of an N-rank 2.x job: handshake, ADD init/, NCCL scalable
              init, BARRIER N (bench/job_slice.h); --json has every rank's finish time
  sized-echo-server --host H [--sndbuf BYTES]   the init-job floor server: prints
              "listening on H:P"; --sndbuf: SO_SNDBUF of its sockets
  abuse       --server-pid PID [--scale F] [--hold S] [--settle S] [--hog-values N]
              [--partial-linger S]
              [--probe-ms MS] [--only partial,nonreaders,waits,collide,owed,hog]
              every attack of issue 13 at full size (F=1), one after another,
              while a probe client does a verified SET+GET every MS (1.5) ms;
              prints RSS, probe latency and closes per attack and the targets.
              Sends ~2 GiB and holds up to ~1 GiB of server memory per attack
              with the default budget; default --timeout 600 here

common options:
  --addr HOST:PORT[,HOST:PORT...]  server address (default 127.0.0.1:29500; ignored by
                      ops --op echo); rendezvous spreads its ranks over several, round-robin
  --dialect 1.13|2.x  wire dialect the clients speak (default 2.x)
  --server-pid PID    read the server's CPU time / RSS from /proc/PID
  --timeout S         bound on the whole run, seconds (default 60)
  --json FILE         also write the result as one JSON object
  --key-prefix P      key namespace of this run (default: random, so runs never collide)
  --source ports|addrs|kernel   how client sockets pick their source (IPv4): ports
                      (default) = explicit round-robin ports on the server's address
                      (the kernel's own choice gets quadratic with 10k+ connections to
                      one destination); addrs = 127.S.x.y addresses (beware: servers
                      that reverse-resolve peers then query DNS); kernel = plain connect
  --rcvbuf BYTES      SO_RCVBUF of every client socket (init-job; default: autotuning)
  --pin-cpu N         run the generator and every thread of --server-pid on CPU N
                      (restored at exit); for stable round-trip latency on a VM
  --quiet             no progress lines on stderr
)";

bool parseDouble(const char* s, double& out) {
  char* end = nullptr;
  out = std::strtod(s, &end);
  return end != s && *end == '\0';
}
bool parseInt(const char* s, int& out) {
  char* end = nullptr;
  long v = std::strtol(s, &end, 10);
  if (end == s || *end != '\0' || v < 0 || v > 100000000) return false;
  out = static_cast<int>(v);
  return true;
}

int usageError(const std::string& msg) {
  fmt::print(stderr, "tcpstore-bench: {}\n\n{}", msg, kUsage);
  return 64;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string_view(argv[1]) == "--help" ||
      std::string_view(argv[1]) == "-h") {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 64 : 0;
  }
  const std::string mode = argv[1];
  tcpstore::bench::InitScenario init_scenario{};
  const bool init_mode =
      tcpstore::bench::parseInitScenario(mode, init_scenario);
  if (mode != "rendezvous" && mode != "ops" && mode != "memory" &&
      mode != "abuse" && mode != "init-job" && mode != "sized-echo-server" &&
      !init_mode) {
    return usageError("unknown mode '" + mode + "'");
  }
  CommonOptions common;
  RendezvousOptions rdv;
  OpsOptions ops;
  MemoryOptions mem;
  AbuseOptions abuse;
  tcpstore::bench::JobSliceOptions job;
  std::string echo_host = "127.0.0.1";
  int echo_sndbuf = 0;
  bool timeout_set = false;
  std::string addr = "127.0.0.1:29500";
  int pin_cpu = -1;
  for (int i = 2; i < argc; ++i) {
    std::string_view a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) return nullptr;
      return argv[++i];
    };
    const char* v = nullptr;
    bool ok = true;
    if (a == "--quiet") {
      common.quiet = true;
      continue;
    }
    if (a == "--echo-floor") {
      rdv.echo_floor = true;
      continue;
    }
    if (a == "--no-master-poll") {
      rdv.master_poll = false;
      continue;
    }
    if (!(v = value())) return usageError(std::string(a) + " needs a value");
    if (a == "--addr") {
      addr = v;
    } else if (a == "--dialect") {
      std::string_view d = v;
      if (d == "1.13") {
        common.dialect = tcpstore::protocol::Dialect::kV113;
      } else if (d == "2.x" || d == "2") {
        common.dialect = tcpstore::protocol::Dialect::kV2;
      } else {
        ok = false;
      }
    } else if (a == "--server-pid") {
      ok = parseInt(v, common.server_pid);
    } else if (a == "--timeout") {
      ok = parseDouble(v, common.timeout_s) && common.timeout_s > 0 &&
           common.timeout_s <= 3600;
      timeout_set = true;
    } else if (a == "--json") {
      common.json_path = v;
    } else if (a == "--pin-cpu") {
      ok = parseInt(v, pin_cpu) && pin_cpu < 1024;
    } else if (a == "--source") {
      std::string_view m = v;
      using SM = tcpstore::bench::Loop::SourceMode;
      if (m == "ports") {
        common.source_mode = SM::kPorts;
      } else if (m == "addrs") {
        common.source_mode = SM::kAddrs;
      } else if (m == "kernel") {
        common.source_mode = SM::kKernel;
      } else {
        ok = false;
      }
    } else if (a == "--key-prefix") {
      common.key_prefix = v;
    } else if (a == "--ranks") {
      ok = parseInt(v, rdv.ranks) && rdv.ranks >= 1 && rdv.ranks <= 1000000;
    } else if (a == "--conns-per-rank") {
      ok = parseInt(v, rdv.conns_per_rank) &&
           (rdv.conns_per_rank == 1 || rdv.conns_per_rank == 2);
    } else if (a == "--barrier") {
      std::string_view b = v;
      rdv.barrier_set = true;
      if (b == "1.13") {
        rdv.barrier = BarrierKind::kV113;
      } else if (b == "2.x" || b == "2") {
        rdv.barrier = BarrierKind::kV2;
      } else if (b == "server") {
        rdv.barrier = BarrierKind::kServer;
      } else {
        ok = false;
      }
    } else if (a == "--world") {
      ok = parseInt(v, job.world) && job.world >= 1 && job.world <= 1000000;
    } else if (a == "--first-rank") {
      ok = parseInt(v, job.first_rank);
    } else if (a == "--start-at") {
      char* end = nullptr;
      job.start_at_ns = std::strtoll(v, &end, 10);
      ok = end != v && *end == '\0' && job.start_at_ns >= 0;
    } else if (a == "--rcvbuf") {
      ok = parseInt(v, common.rcvbuf) && common.rcvbuf <= (64 << 20);
    } else if (a == "--sndbuf") {
      ok = parseInt(v, echo_sndbuf) && echo_sndbuf <= (64 << 20);
    } else if (a == "--host") {
      echo_host = v;
    } else if (a == "--arrival-spread") {
      ok = parseDouble(v, rdv.arrival_spread_s) && rdv.arrival_spread_s >= 0;
    } else if (a == "--op") {
      ops.op = v;
      ok = ops.op == "set" || ops.op == "get" || ops.op == "add" ||
           ops.op == "mix" || ops.op == "echo";
    } else if (a == "--clients") {
      ok = parseInt(v, ops.clients) && ops.clients >= 1;
    } else if (a == "--pipeline") {
      ok = parseInt(v, ops.pipeline) && ops.pipeline >= 1 &&
           ops.pipeline <= 4096;
    } else if (a == "--idle") {
      ok = parseInt(v, ops.idle);
      mem.idle = ops.idle;
    } else if (a == "--seconds") {
      ok = parseDouble(v, ops.seconds) && ops.seconds > 0;
    } else if (a == "--warmup") {
      ok = parseDouble(v, ops.warmup_s) && ops.warmup_s >= 0;
    } else if (a == "--keys") {
      ok = parseInt(v, ops.keys) && ops.keys >= 1;
      mem.keys = ops.keys;
    } else if (a == "--value-bytes") {
      ok = parseInt(v, ops.value_bytes) && ops.value_bytes <= (8 << 20);
      mem.value_bytes = ops.value_bytes;
    } else if (a == "--key-bytes") {
      ok = parseInt(v, mem.key_bytes) && mem.key_bytes <= 8192;
    } else if (a == "--scale") {
      ok = parseDouble(v, abuse.scale) && abuse.scale > 0 && abuse.scale <= 1;
    } else if (a == "--hold") {
      ok = parseDouble(v, abuse.hold_s) && abuse.hold_s >= 0 &&
           abuse.hold_s <= 600;
    } else if (a == "--settle") {
      ok = parseDouble(v, abuse.settle_s) && abuse.settle_s >= 0 &&
           abuse.settle_s <= 600;
    } else if (a == "--partial-linger") {
      ok = parseDouble(v, abuse.partial_linger_s) &&
           abuse.partial_linger_s >= 0 && abuse.partial_linger_s <= 600;
    } else if (a == "--hog-values") {
      ok = parseInt(v, abuse.hog_values) && abuse.hog_values >= 1 &&
           abuse.hog_values <= 2048;
    } else if (a == "--probe-ms") {
      ok = parseDouble(v, abuse.probe_ms) && abuse.probe_ms >= 0.1 &&
           abuse.probe_ms <= 1000;
    } else if (a == "--only") {
      abuse.only = v;
    } else {
      return usageError("unknown option " + std::string(a));
    }
    if (!ok) return usageError(fmt::format("bad value '{}' for {}", v, a));
  }
  std::string err;
  for (std::size_t from = 0; from <= addr.size();) {
    std::size_t comma = addr.find(',', from);
    if (comma == std::string::npos) comma = addr.size();
    tcpstore::bench::Endpoint ep;
    if (!tcpstore::bench::parseEndpoint(addr.substr(from, comma - from), ep,
                                        err))
      return usageError(err);
    common.addrs.push_back(ep);
    from = comma + 1;
  }
  if (!rdv.barrier_set) {
    rdv.barrier = common.dialect == tcpstore::protocol::Dialect::kV113
                      ? BarrierKind::kV113
                      : BarrierKind::kV2;
  }
  if (mode == "abuse" && !timeout_set) common.timeout_s = 600;
  if (common.key_prefix.empty()) {
    std::random_device rd;
    common.key_prefix = fmt::format("b{:08x}", rd());
  }
  if (mode == "sized-echo-server") {
    return tcpstore::bench::runSizedEchoServerMode(echo_host, echo_sndbuf);
  }
  const std::uint64_t fds = tcpstore::bench::raiseFdLimit();
  const std::uint64_t need =
      mode == "rendezvous" || init_mode || mode == "init-job"
          ? static_cast<std::uint64_t>(rdv.ranks) *
                static_cast<std::uint64_t>(
                    rdv.conns_per_rank
                        ? rdv.conns_per_rank
                        : (init_mode || mode == "init-job" ? 1 : 2))
          : static_cast<std::uint64_t>(ops.idle) +
                static_cast<std::uint64_t>(ops.clients);
  if (need + 16 > fds && !common.quiet) {
    fmt::print(stderr,
               "warning: {} connections need more than the fd limit {}\n", need,
               fds);
  }
  common.pin_cpu = pin_cpu;
  std::unique_ptr<tcpstore::bench::CpuPin> pin;
  if (pin_cpu >= 0 && mode != "ops") {
    pin = std::make_unique<tcpstore::bench::CpuPin>(pin_cpu, common.server_pid);
    if (!common.quiet) {
      fmt::print(stderr, "pinned {} thread(s) to CPU {}\n",
                 pin->pinnedThreads(), pin_cpu);
    }
  }
  if (mode == "rendezvous") return tcpstore::bench::runRendezvous(common, rdv);
  if (init_mode) {
    return tcpstore::bench::runInit(
        common, {init_scenario, rdv.ranks, ops.seconds, rdv.echo_floor, 128});
  }
  if (mode == "init-job") {
    job.ranks = rdv.ranks;
    job.echo_floor = rdv.echo_floor;
    return tcpstore::bench::runJobSlice(common, job);
  }
  if (mode == "ops") return tcpstore::bench::runOps(common, ops);
  if (mode == "abuse") return tcpstore::bench::runAbuse(common, abuse);
  return tcpstore::bench::runMemory(common, mem);
}
