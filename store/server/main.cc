// tcpstore-server: a standalone c10d TCPStore server for PyTorch 1.13 and 2.x
// clients on one port.
//
// Exit codes: 0 clean stop (SIGINT/SIGTERM), 1 stop failed, 2 bad usage,
// 3 cannot start serving: bind/listen failed, or the backend's remote (etcd,
// the relay's --upstream) cannot be reached.
#include <fmt/format.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>

#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

#include "store/backend.h"
#include "store/server/log.h"
#include "store/server/start.h"
#include "tcpstore/server.h"

// ---- --backend (etcd gateway) -------------------------------------------
#ifdef TCPSTORE_WITH_ETCD
#include "store/etcd/etcd_admin.h"
#include "store/etcd/etcd_backend.h"
#include "store/etcd/etcd_options.h"
#include "store/server/options.h"
#endif
// ---- end --backend --------------------------------------------------------

#ifndef TCPSTORE_VERSION
#define TCPSTORE_VERSION "unknown"
#endif

namespace {

using tcpstore::server::LogLevel;

constexpr int kExitOk = 0;
constexpr int kExitStopFailed = 1;
constexpr int kExitUsage = 2;
constexpr int kExitBind = 3;

int usageError(const std::string& msg);

// ---- --backend (etcd gateway) -------------------------------------------
constexpr std::string_view kEtcdScheme = "etcd://";

std::string backendUsage() {
  return R"(
Backend (where the keys live):
  --backend memory         in this process (default): fastest; the state dies
                           with the process
  --backend etcd://HOST:PORT[,HOST:PORT...][/PREFIX]
                           in etcd v3 under /PREFIX/ (default /tcpstore/): this
                           server is a stateless gateway; several gateways may
                           serve one job; any of them, or etcd members short of
                           a majority, may fail.
                           At start one linearizable read must succeed on some
                           member within 5 s, else exit 3 (fail fast: a wrong
                           address or a cluster without quorum is reported at
                           once). Once running, a request that etcd cannot
                           serve within 20 s closes its connection (an error,
                           never a guessed answer). URL parameters
                           (?NAME=VALUE&...): op-timeout-ms (20000),
                           rpc-timeout-ms (one call, 2000), combine-adds=0|1
                           (1; 0 only to measure what combining buys); TLS:
                           cacert=PEM (turns TLS on), cert=PEM&key=PEM (a
                           client certificate).
  --delete-prefix          with --backend etcd://.../PREFIX: delete every key of
                           the job (and the gateway's bookkeeping keys) in one
                           etcd transaction, print "deleted N keys", exit 0
                           (3 if etcd is unreachable). Run it when the job is
                           over; it does not start a server.
)";
}

// The backend chosen by --backend; null means the in-memory one
// (Server::start). Exits through `exit_code` when it cannot be built.
struct BackendChoice {
  std::string spec = "memory";
  bool delete_prefix = false;
};

// Builds the backend of `choice` for `opts`. On failure returns null and
// sets `exit_code`; for --delete-prefix does the deletion and sets
// `exit_code` too (nothing to serve).
std::unique_ptr<tcpstore::store::Backend> makeBackend(
    const BackendChoice& choice, const tcpstore::ServerOptions& opts,
    std::optional<int>& exit_code) {
  const bool is_etcd =
      std::string_view(choice.spec).substr(0, kEtcdScheme.size()) ==
      kEtcdScheme;
  if (choice.spec == "memory") {
    if (choice.delete_prefix) {
      exit_code = usageError("--delete-prefix needs --backend etcd://...");
    }
    return nullptr;
  }
  if (!is_etcd) {
    exit_code =
        usageError(fmt::format("bad value for --backend: '{}' (memory or "
                               "etcd://HOST:PORT[,...][/PREFIX])",
                               choice.spec));
    return nullptr;
  }
#ifdef TCPSTORE_WITH_ETCD
  auto parsed = tcpstore::store::parseEtcdUrl(choice.spec);
  if (!parsed) {
    exit_code = usageError(
        fmt::format("bad value for --backend: {}", parsed.error().message()));
    return nullptr;
  }
  tcpstore::store::EtcdOptions eo = std::move(parsed).value();
  const tcpstore::store::KeyspaceOptions ko =
      tcpstore::server::keyspaceOptions(opts);
  eo.max_value_bytes = ko.max_value_bytes;
  eo.max_reply_bytes = ko.max_reply_bytes;
  eo.log = [](std::string_view line) {
    tcpstore::server::logLine(LogLevel::kWarn, line);
  };
  if (choice.delete_prefix) {
    auto n = tcpstore::store::deleteJobKeys(eo);
    if (!n) {
      tcpstore::server::logLine(LogLevel::kError,
                                fmt::format("cannot delete prefix '{}': {}",
                                            eo.prefix, n.error().message()));
      exit_code = kExitBind;
    } else {
      std::printf("deleted %lld keys under prefix '%s'\n",
                  static_cast<long long>(n.value()), eo.prefix.c_str());
      exit_code = kExitOk;
    }
    return nullptr;
  }
  tcpstore::store::EtcdOptions probe = eo;
  probe.op_timeout = std::chrono::milliseconds(5000);
  if (tcpstore::Status st = tcpstore::store::checkEtcd(probe); !st.isOk()) {
    tcpstore::server::logLine(
        LogLevel::kError,
        fmt::format("cannot start: {} ({})", st.message(), choice.spec));
    exit_code = kExitBind;
    return nullptr;
  }
  return std::make_unique<tcpstore::store::EtcdBackend>(std::move(eo));
#else
  (void)opts;
  exit_code = usageError(
      "--backend etcd:// is not built in (configure with -DTCPSTORE_ETCD=ON "
      "and libgrpc++-dev, protobuf-compiler-grpc, golang-etcd-server-dev)");
  return nullptr;
#endif
}
// ---- end --backend --------------------------------------------------------

// The help text; defaults come from ServerOptions, the one copy of them.
std::string usage() {
  const tcpstore::ServerOptions d;
  const tcpstore::ServerLimits& l = d.limits;
  return fmt::format(R"(usage: tcpstore-server [options]

Serves the c10d TCPStore protocol of PyTorch 1.13 and 2.x on one port (the
dialect is detected per connection).

  --host H                 address or name to bind (default: "::" dual-stack,
                           falling back to 0.0.0.0)
  --port P                 port (default {port}; 0 picks a free one)
  --listen-fd N            adopt this already-bound TCP socket instead of binding
  --world-size N           log "joined N/W" progress of the "init/" counter
  --max-key-bytes N        longest key accepted (default {key})
  --max-value-bytes N      longest value accepted (default {value})
  --max-keys-per-request N most keys in one CHECK/WAIT/MULTI_GET/MULTI_SET (default {keys})
  --max-request-bytes N    largest single request (default {request})
  --max-output-bytes N     unsent reply bytes per connection before it is paused
                           (dropped at twice this; default {output})
  --max-total-output-bytes N  unsent bytes over all connections past which a
                           large watch notification drops its receiver
                           (default {total})
  --stalled-reader-ms N    drop a connection paused for output once its replies
                           made no progress this long (default {stall}; 0: never)
  --partial-request-ms N   close a connection holding part of a request that
                           sends no byte for this long (default {partial};
                           0: never); idle connections are never closed
  --max-memory-bytes N     server-wide memory budget: partial requests, unsent
                           output, registrations and stored data (default
                           {memory}; 0: none)
  --classic-compare-set    COMPARE_SET does not wake waiters (classic servers)
  --upstream HOST:PORT     relay mode: serve this node's clients through one
                           connection to that tcpstore-server (or relay),
                           combining concurrent ADDs and identical reads; the
                           state lives upstream. Exit 3 if it cannot be
                           reached, or does not speak the relay extension,
                           within 5 s; once running, losing it closes the
                           clients with requests upstream and reconnects
                           (50 ms doubling to 2 s, jittered). docs/relay.md
  --log-level L            error, warn, info or debug (default {level})
  --help                   show this help
  --version                show the version

Prints "listening on HOST:PORT" on stdout once it accepts connections.
SIGUSR1 prints the counters to stderr; SIGINT/SIGTERM stop cleanly.
Exit codes: 0 clean stop, 2 bad usage, 3 cannot bind/listen or reach etcd or
the upstream.
{backend})",
                     fmt::arg("port", d.port), fmt::arg("key", l.max_key_bytes),
                     fmt::arg("value", l.max_value_bytes),
                     fmt::arg("keys", l.max_keys_per_request),
                     fmt::arg("request", l.max_request_bytes),
                     fmt::arg("output", l.max_buffered_output_bytes),
                     fmt::arg("total", l.max_total_output_bytes),
                     fmt::arg("stall", l.stalled_reader_ms),
                     fmt::arg("partial", l.partial_request_ms),
                     fmt::arg("memory", l.max_memory_bytes),
                     fmt::arg("level", d.log_level),
                     fmt::arg("backend", backendUsage()));
}

int usageError(const std::string& msg) {
  std::fprintf(stderr,
               "tcpstore-server: %s\nTry 'tcpstore-server --help' for more "
               "information.\n",
               msg.c_str());
  return kExitUsage;
}

template <typename T>
std::optional<T> parseNumber(std::string_view s) {
  T v{};
  if (s.empty()) return std::nullopt;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

// The server binary's one allocator policy (glibc; a process embedding the
// server library keeps its own):
//  - Large blocks (stored values, large requests' input buffers, large
//    replies) get mappings of their own, returned to the OS when freed. By
//    default glibc raises its mmap threshold (up to 32 MiB) each time a
//    mapped block is freed, after which such blocks come from the heap, which
//    keeps them once freed: RSS stayed ~0.9 GiB after 912 MiB of 8 MiB values
//    were deleted. A fixed threshold also makes a large InputBuffer grow by
//    mremap (input_buffer.h).
//  - The trim threshold is fixed too: glibc would otherwise raise it with
//    each large free, and then never give back the loop thread's arena top
//    (malloc_trim() does not trim a thread arena's top either): RSS stayed
//    16-35 MiB above its start after a 1.1 GiB WAIT drop. The keyspace's
//    reclaim calls malloc_trim() for the rest (memory_backend.cc).
void setAllocatorPolicy() noexcept {
  constexpr int kMmapThresholdBytes = 256 * 1024;
  constexpr int kTrimThresholdBytes = 4 << 20;
  (void)mallopt(M_MMAP_THRESHOLD, kMmapThresholdBytes);
  (void)mallopt(M_TRIM_THRESHOLD, kTrimThresholdBytes);
}

}  // namespace

int main(int argc, char** argv) {
  setAllocatorPolicy();
  tcpstore::ServerOptions opts;
  bool port_given = false;
  BackendChoice backend_choice;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    std::string_view value;
    bool has_inline = false;
    if (arg.substr(0, 2) == "--") {
      auto eq = arg.find('=');
      if (eq != std::string_view::npos) {
        value = arg.substr(eq + 1);
        arg = arg.substr(0, eq);
        has_inline = true;
      }
    }
    auto takeValue =
        [&](std::string_view flag) -> std::optional<std::string_view> {
      if (has_inline) return value;
      if (i + 1 >= argc) return std::nullopt;
      (void)flag;
      return std::string_view(argv[++i]);
    };
    auto needValue = [&](std::string_view flag, auto& out) -> bool {
      using T = std::remove_reference_t<decltype(out)>;
      auto v = takeValue(flag);
      if (!v) {
        usageError(fmt::format("option {} needs a value", flag));
        return false;
      }
      auto n = parseNumber<T>(*v);
      if (!n) {
        usageError(fmt::format("bad value for {}: '{}'", flag, *v));
        return false;
      }
      out = *n;
      return true;
    };
    if (arg == "--help" || arg == "-h") {
      std::fputs(usage().c_str(), stdout);
      return kExitOk;
    } else if (arg == "--version") {
      std::printf("tcpstore-server %s\n", TCPSTORE_VERSION);
      return kExitOk;
    } else if (arg == "--host") {
      auto v = takeValue(arg);
      if (!v) return usageError("option --host needs a value");
      if (v->empty()) return usageError("--host must not be empty");
      opts.host = std::string(*v);
    } else if (arg == "--port") {
      if (!needValue(arg, opts.port)) return kExitUsage;
      port_given = true;
    } else if (arg == "--listen-fd") {
      if (!needValue(arg, opts.listen_fd)) return kExitUsage;
      if (opts.listen_fd < 0) return usageError("--listen-fd must be >= 0");
    } else if (arg == "--world-size") {
      if (!needValue(arg, opts.world_size)) return kExitUsage;
      if (opts.world_size < 0) return usageError("--world-size must be >= 0");
    } else if (arg == "--max-key-bytes") {
      if (!needValue(arg, opts.limits.max_key_bytes)) return kExitUsage;
    } else if (arg == "--max-value-bytes") {
      if (!needValue(arg, opts.limits.max_value_bytes)) return kExitUsage;
    } else if (arg == "--max-keys-per-request") {
      if (!needValue(arg, opts.limits.max_keys_per_request)) return kExitUsage;
    } else if (arg == "--max-request-bytes") {
      if (!needValue(arg, opts.limits.max_request_bytes)) return kExitUsage;
    } else if (arg == "--max-output-bytes") {
      if (!needValue(arg, opts.limits.max_buffered_output_bytes))
        return kExitUsage;
      if (opts.limits.max_buffered_output_bytes == 0) {
        return usageError("--max-output-bytes must be > 0");
      }
    } else if (arg == "--max-total-output-bytes") {
      if (!needValue(arg, opts.limits.max_total_output_bytes))
        return kExitUsage;
    } else if (arg == "--partial-request-ms") {  // budget flags (#13)
      if (!needValue(arg, opts.limits.partial_request_ms)) return kExitUsage;
    } else if (arg == "--max-memory-bytes") {
      if (!needValue(arg, opts.limits.max_memory_bytes)) return kExitUsage;
    } else if (arg == "--stalled-reader-ms") {
      if (!needValue(arg, opts.limits.stalled_reader_ms)) return kExitUsage;
    } else if (arg == "--classic-compare-set") {
      if (has_inline) return usageError("--classic-compare-set takes no value");
      opts.compare_set_wakes = false;
    } else if (arg == "--log-level") {
      auto v = takeValue(arg);
      if (!v) return usageError("option --log-level needs a value");
      if (!tcpstore::server::parseLogLevel(*v)) {
        return usageError(fmt::format(
            "bad value for --log-level: '{}' (error|warn|info|debug)", *v));
      }
      opts.log_level = std::string(*v);
    } else if (arg == "--upstream") {  // relay mode (docs/relay.md)
      auto v = takeValue(arg);
      if (!v) return usageError("option --upstream needs a value");
      if (v->empty()) return usageError("--upstream must not be empty");
      opts.upstream = std::string(*v);
    } else if (arg == "--backend") {
      auto v = takeValue(arg);
      if (!v) return usageError("option --backend needs a value");
      backend_choice.spec = std::string(*v);
    } else if (arg == "--delete-prefix") {
      if (has_inline) return usageError("--delete-prefix takes no value");
      backend_choice.delete_prefix = true;
    } else {
      return usageError(fmt::format("unknown option '{}'", argv[i]));
    }
  }
  if (opts.listen_fd >= 0 && !port_given) opts.port = 0;  // take the fd's port
  if (!opts.upstream.empty() && backend_choice.spec != "memory") {
    return usageError("--upstream and --backend exclude each other");
  }
  const LogLevel level = *tcpstore::server::parseLogLevel(opts.log_level);

  // Signals are taken synchronously by this thread (sigwait); block them
  // before the loop thread exists so it inherits the mask.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  std::optional<int> backend_exit;
  std::unique_ptr<tcpstore::store::Backend> backend =
      makeBackend(backend_choice, opts, backend_exit);
  if (backend_exit) return *backend_exit;
  auto started = backend
                     ? tcpstore::server::startServer(opts, std::move(backend))
                     : tcpstore::Server::start(opts);
  if (!started) {
    tcpstore::Status st = started.error();
    tcpstore::server::logLine(LogLevel::kError,
                              fmt::format("cannot start: {}", st.message()));
    return st.code() == tcpstore::StatusCode::kInvalidArgument ? kExitUsage
                                                               : kExitBind;
  }
  std::shared_ptr<tcpstore::Server> server = std::move(started).value();
  std::printf("listening on %s\n", server->address().c_str());
  std::fflush(stdout);
  if (level >= LogLevel::kInfo) {
    tcpstore::server::logLine(
        LogLevel::kInfo,
        fmt::format("serving PyTorch 1.13 and 2.x clients on {}",
                    server->address()));
  }

  for (;;) {
    int sig = 0;
    if (sigwait(&sigs, &sig) != 0) continue;
    if (sig == SIGUSR1) {
      tcpstore::server::logLine(LogLevel::kInfo, server->countersLine());
      continue;
    }
    if (level >= LogLevel::kInfo) {
      tcpstore::server::logLine(
          LogLevel::kInfo, fmt::format("signal {}: stopping",
                                       sig == SIGINT ? "SIGINT" : "SIGTERM"));
    }
    break;
  }
  tcpstore::Status st = server->stop();
  tcpstore::server::logLine(LogLevel::kInfo, server->countersLine());
  if (!st.isOk()) {
    tcpstore::server::logLine(LogLevel::kError,
                              fmt::format("stop: {}", st.toString()));
    return kExitStopFailed;
  }
  return kExitOk;
}
