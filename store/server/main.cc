// tcpstore-server: a standalone c10d TCPStore server for PyTorch 1.13 and 2.x
// clients on one port.
//
// Exit codes: 0 clean stop (SIGINT/SIGTERM), 1 stop failed, 2 bad usage,
// 3 cannot bind/listen.
#include <fmt/format.h>
#include <pthread.h>
#include <signal.h>

#include <charconv>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

#include "store/server/log.h"
#include "tcpstore/server.h"

#ifndef TCPSTORE_VERSION
#define TCPSTORE_VERSION "unknown"
#endif

namespace {

using tcpstore::server::LogLevel;

constexpr int kExitOk = 0;
constexpr int kExitStopFailed = 1;
constexpr int kExitUsage = 2;
constexpr int kExitBind = 3;

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
  --log-level L            error, warn, info or debug (default {level})
  --help                   show this help
  --version                show the version

Prints "listening on HOST:PORT" on stdout once it accepts connections.
SIGUSR1 prints the counters to stderr; SIGINT/SIGTERM stop cleanly.
Exit codes: 0 clean stop, 2 bad usage, 3 cannot bind/listen.
)",
                     fmt::arg("port", d.port), fmt::arg("key", l.max_key_bytes),
                     fmt::arg("value", l.max_value_bytes),
                     fmt::arg("keys", l.max_keys_per_request),
                     fmt::arg("request", l.max_request_bytes),
                     fmt::arg("output", l.max_buffered_output_bytes),
                     fmt::arg("total", l.max_total_output_bytes),
                     fmt::arg("stall", l.stalled_reader_ms),
                     fmt::arg("partial", l.partial_request_ms),
                     fmt::arg("memory", l.max_memory_bytes),
                     fmt::arg("level", d.log_level));
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

}  // namespace

int main(int argc, char** argv) {
  tcpstore::ServerOptions opts;
  bool port_given = false;
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
    } else {
      return usageError(fmt::format("unknown option '{}'", argv[i]));
    }
  }
  if (opts.listen_fd >= 0 && !port_given) opts.port = 0;  // take the fd's port
  const LogLevel level = *tcpstore::server::parseLogLevel(opts.log_level);

  // Signals are taken synchronously by this thread (sigwait); block them
  // before the loop thread exists so it inherits the mask.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  auto started = tcpstore::Server::start(opts);
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
