// tcpstore-cli: command-line client of a c10d TCPStore server.
#include <fmt/format.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "store/client/cli_jobs.h"
#include "tcpstore/client.h"

namespace {

constexpr const char* kUsage =
    R"(usage: tcpstore-cli [OPTIONS] COMMAND [ARGS...]

A client of a c10d TCPStore server (tcpstore-server, or PyTorch 1.13/2.x).
Keys are named as torch users name them: `set foo bar` is read back by
torch.distributed.TCPStore(...).get("foo").

options (only before COMMAND; everything after COMMAND is an argument):
  --addr HOST:PORT     server address (default 127.0.0.1:29500; IPv6: [::1]:29500)
  --addr H1:P1,H2:P2   several gateways of one store (tcpstore-server --backend
                       etcd://...): connects to the first that answers, re-issues
                       reads and waits on the next one if it is lost
  --dialect 2.x|1.13   wire dialect of the server (default 2.x)
  --timeout SECONDS    connect, wait and reply timeout (default 300)
  --prefix PREFIX      key prefix, like torch's PrefixStore(PREFIX, store)
  -h, --help           this text

commands:
  set KEY VALUE                    store VALUE at KEY
  get KEY                          wait until KEY exists, print its value
  add KEY N                        add N (may be negative), print the new value
  compare-set KEY EXPECTED DESIRED
                                   print the resulting value
  wait KEY...                      wait until all KEYs exist
  check KEY...                     exit 0 if all KEYs exist, 1 if not
  delete KEY                       print 1 if KEY existed, else 0
  num-keys                         print the number of keys on the server
  barrier NAME N                   return when N callers arrived at barrier NAME
                                   (keys: BARRIER /NAME where the server has it,
                                   else counter /NAME and done key /NAME:done)
  wait-for-workers N               count on torch's init/ key, wait for N
  wait-for-workers N --watch [--job JOB]
                                   wait until N have joined WITHOUT counting
                                   this process: torch's init/ counter (read
                                   every 200 ms), or with --job the job's
                                   joined counter (a server-side wait on
                                   JOB/tcpstore/ready); prints "joined K/N"
  status [JOB]                     a tcpstore:// job's joined/expected, the
                                   ranks registered and missing (exit 1 if not
                                   complete); without JOB: torch's init/
                                   counter and every job found (LIST_KEYS)
  release JOB                      delete every key of a job that no longer
                                   runs (frees its job id; 2.x LIST_KEYS)
  ping                             round trip, prints "ok" (1.13 dialect: a
                                   CHECK of an absent key; 1.13 has no PING)
  list-keys                        print the keys, one per line (2.x servers
                                   with LIST_KEYS)

exit status: 0 ok; 1 check found a missing key; 2 usage error; 3 connection
failure (refused/closed/io); 4 timeout; 5 other error (protocol, not supported,
...). Errors are one line on stderr.
)";

struct Failure {
  int code;
  std::string message;
};

[[noreturn]] void die(int code, const std::string& msg) {
  std::fprintf(stderr, "tcpstore-cli: %s\n", msg.c_str());
  std::exit(code);
}

[[noreturn]] void usage(const std::string& msg) {
  die(2, msg + " (see tcpstore-cli --help)");
}

int exitCodeOf(const tcpstore::Status& s) {
  switch (s.code()) {
    case tcpstore::StatusCode::kRefused:
    case tcpstore::StatusCode::kClosed:
    case tcpstore::StatusCode::kIoError:
      return 3;
    case tcpstore::StatusCode::kTimeout:
      return 4;
    case tcpstore::StatusCode::kInvalidArgument:
      return 2;
    default:
      return 5;
  }
}

[[noreturn]] void fail(const tcpstore::Status& s) {
  std::string m = s.toString();
  for (char& ch : m) {
    if (ch == '\n' || ch == '\r') ch = ' ';  // exactly one line
  }
  die(exitCodeOf(s), m);
}

bool parseInt(std::string_view s, long long& out) {
  if (s.empty()) return false;
  std::string tmp(s);
  errno = 0;
  char* end = nullptr;
  out = std::strtoll(tmp.c_str(), &end, 10);
  return errno == 0 && end == tmp.c_str() + tmp.size();
}

void parseAddr(std::string_view a, std::string& host, std::uint16_t& port) {
  std::string_view h;
  std::string_view p;
  if (!a.empty() && a.front() == '[') {
    auto close = a.find(']');
    if (close == std::string_view::npos) usage("bad --addr: missing ']'");
    h = a.substr(1, close - 1);
    auto rest = a.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') usage("bad --addr: expected ':' after ']'");
      p = rest.substr(1);
    }
  } else {
    auto colon = a.rfind(':');
    if (colon != std::string_view::npos && a.find(':') != colon) {
      usage("bad --addr: write IPv6 addresses in brackets, e.g. [::1]:29500");
    }
    if (colon == std::string_view::npos) {
      h = a;
    } else {
      h = a.substr(0, colon);
      p = a.substr(colon + 1);
    }
  }
  if (h.empty()) usage("bad --addr: empty host");
  host = std::string(h);
  if (!p.empty()) {
    long long n = 0;
    if (!parseInt(p, n) || n < 1 || n > 65535)
      usage(fmt::format("bad port '{}'", p));
    port = static_cast<std::uint16_t>(n);
  }
}

void needArgs(const std::string& cmd, const std::vector<std::string>& args,
              std::size_t min, std::size_t max) {
  if (args.size() < min || args.size() > max) {
    if (min == max) {
      usage(
          fmt::format("{} takes {} argument{}", cmd, min, min == 1 ? "" : "s"));
    }
    usage(fmt::format("{} takes at least {} argument{}", cmd, min,
                      min == 1 ? "" : "s"));
  }
}

void printLine(std::string_view v) {
  std::fwrite(v.data(), 1, v.size(), stdout);
  std::fputc('\n', stdout);
}

}  // namespace

int main(int argc, char** argv) {
  tcpstore::ClientOptions opts;
  std::string prefix;
  int i = 1;
  auto optValue = [&](std::string_view arg, std::string_view name,
                      std::string& out) -> bool {
    if (arg == name) {
      if (i + 1 >= argc) usage(fmt::format("{} needs a value", name));
      out = argv[++i];
      return true;
    }
    if (arg.size() > name.size() && arg.substr(0, name.size()) == name &&
        arg[name.size()] == '=') {
      out = std::string(arg.substr(name.size() + 1));
      return true;
    }
    return false;
  };
  for (; i < argc; ++i) {
    std::string_view arg = argv[i];
    std::string v;
    if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (optValue(arg, "--addr", v)) {
      if (v.find(',') == std::string::npos) {
        parseAddr(v, opts.host, opts.port);
        opts.endpoints.clear();
      } else {
        // Several gateways of one store: failover (client.h).
        auto eps = tcpstore::parseEndpoints(v);
        if (!eps) usage(fmt::format("bad --addr: {}", eps.error().message()));
        opts.endpoints = std::move(*eps);
        opts.host = opts.endpoints.front().host;
        opts.port = opts.endpoints.front().port;
      }
    } else if (optValue(arg, "--dialect", v)) {
      if (v == "2.x" || v == "2") {
        opts.dialect = tcpstore::Dialect::kV2;
      } else if (v == "1.13") {
        opts.dialect = tcpstore::Dialect::kV113;
      } else {
        usage(fmt::format("unknown dialect '{}' (2.x or 1.13)", v));
      }
    } else if (optValue(arg, "--timeout", v)) {
      char* end = nullptr;
      double secs = std::strtod(v.c_str(), &end);
      if (v.empty() || end != v.c_str() + v.size() || !(secs >= 0) ||
          secs > 1e9) {
        usage(fmt::format("bad --timeout '{}'", v));
      }
      auto ms = std::chrono::milliseconds(
          static_cast<long long>(secs * 1000.0 + 0.5));
      opts.timeout = ms;
      opts.connect_timeout = ms;
    } else if (optValue(arg, "--prefix", v)) {
      prefix = v;
      opts.prefix = v;
    } else if (!arg.empty() && arg[0] == '-') {
      usage(fmt::format("unknown option '{}'", arg));
    } else {
      break;
    }
  }
  if (i >= argc) usage("missing COMMAND");
  const std::string cmd = argv[i++];
  std::vector<std::string> args(argv + i, argv + argc);

  static const char* const kCommands[] = {
      "set",   "get",       "add",      "compare-set", "wait",
      "check", "delete",    "num-keys", "barrier",     "wait-for-workers",
      "ping",  "list-keys", "status",   "release"};
  bool known = false;
  for (const char* c : kCommands) known = known || cmd == c;
  if (!known) usage(fmt::format("unknown command '{}'", cmd));
  // Check arity before connecting, so usage errors are immediate.
  if (cmd == "set") needArgs(cmd, args, 2, 2);
  if (cmd == "get" || cmd == "delete") needArgs(cmd, args, 1, 1);
  if (cmd == "add" || cmd == "barrier") needArgs(cmd, args, 2, 2);
  if (cmd == "compare-set") needArgs(cmd, args, 3, 3);
  if (cmd == "wait" || cmd == "check") needArgs(cmd, args, 1, SIZE_MAX);
  if (cmd == "num-keys" || cmd == "ping" || cmd == "list-keys")
    needArgs(cmd, args, 0, 0);
  bool watch = false;
  std::string job;
  if (cmd == "wait-for-workers") {
    std::vector<std::string> rest;
    for (std::size_t k = 0; k < args.size(); ++k) {
      if (args[k] == "--watch") {
        watch = true;
      } else if (args[k] == "--job" && k + 1 < args.size()) {
        job = args[++k];
      } else {
        rest.push_back(args[k]);
      }
    }
    if (!job.empty() && !watch) usage("wait-for-workers: --job needs --watch");
    args = rest;
    needArgs(cmd, args, 1, 1);
  }
  if (cmd == "status") needArgs(cmd, args, 0, 1);
  if (cmd == "release") needArgs(cmd, args, 1, 1);
  long long number = 0;
  if ((cmd == "add" || cmd == "barrier") && !parseInt(args[1], number)) {
    usage(fmt::format("{}: '{}' is not an integer", cmd, args[1]));
  }
  if (cmd == "wait-for-workers" && !parseInt(args[0], number)) {
    usage(fmt::format("{}: '{}' is not an integer", cmd, args[0]));
  }
  if ((cmd == "barrier" || cmd == "wait-for-workers") && number < 1) {
    usage(fmt::format("{}: N must be >= 1", cmd));
  }

  auto client = tcpstore::Client::connect(opts);
  if (!client) fail(client.error());
  const tcpstore::Client& c = *client;

  if (cmd == "set") {
    if (auto s = c.set(args[0], args[1]); !s) fail(s);
  } else if (cmd == "get") {
    auto r = c.get(args[0]);
    if (!r) fail(r.error());
    printLine(*r);
  } else if (cmd == "add") {
    auto r = c.add(args[0], number);
    if (!r) fail(r.error());
    printLine(std::to_string(*r));
  } else if (cmd == "compare-set") {
    auto r = c.compareSet(args[0], args[1], args[2]);
    if (!r) fail(r.error());
    printLine(*r);
  } else if (cmd == "wait") {
    if (auto s = c.wait(args); !s) fail(s);
  } else if (cmd == "check") {
    auto r = c.check(args);
    if (!r) fail(r.error());
    std::fflush(stdout);
    return *r ? 0 : 1;
  } else if (cmd == "delete") {
    auto r = c.deleteKey(args[0]);
    if (!r) fail(r.error());
    printLine(*r ? "1" : "0");
  } else if (cmd == "num-keys") {
    auto r = c.numKeys();
    if (!r) fail(r.error());
    printLine(std::to_string(*r));
  } else if (cmd == "barrier") {
    if (auto s = c.barrier(args[0], number); !s) fail(s);
  } else if (cmd == "wait-for-workers" && watch) {
    if (auto s = tcpstore::cli::watchWorkers(c, opts, job, number, c.timeout());
        !s) {
      fail(s);
    }
  } else if (cmd == "wait-for-workers") {
    if (auto s = c.waitForWorkers(number); !s) fail(s);
  } else if (cmd == "status") {
    std::fflush(stdout);
    int rc = args.empty() ? tcpstore::cli::printServerStatus(c, opts)
                          : tcpstore::cli::printJobStatus(c, args[0]);
    std::fflush(stdout);
    return rc;
  } else if (cmd == "release") {
    auto r = tcpstore::cli::releaseJob(c, args[0]);
    if (!r) fail(r.error());
    printLine(std::to_string(*r));
  } else if (cmd == "ping") {
    auto s = c.ping();
    if (s.code() == tcpstore::StatusCode::kNotSupported &&
        c.dialect() == tcpstore::Dialect::kV113) {
      // 1.13 has no PING: a harmless round trip (CHECK of a key nobody sets).
      auto r = c.check({"tcpstore-cli/ping"});
      s = r ? tcpstore::Status::ok() : r.error();
    }
    if (!s) fail(s);
    printLine("ok");
  } else if (cmd == "list-keys") {
    auto r = c.listKeys();
    if (!r) fail(r.error());
    for (const auto& k : *r) printLine(k);
  }
  if (std::fflush(stdout) != 0)
    die(5, fmt::format("write to stdout: {}", std::strerror(errno)));
  return 0;
}
