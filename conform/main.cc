// tcpstore-conform: judges a c10d TCPStore server through its socket only.
//
//   tcpstore-conform --addr HOST:PORT [--dialect 1.13|2.x|both]
//       [--profile torch-1.13|torch-2.6|torch-2.14|tcpstore|tcpstore-gateway]
//       [--only GROUP]
//       [--json FILE] [--name NAME] [--timeout-ms N] [--list]
//   tcpstore-conform --server-cmd "CMD {port}" [same options]
//
// Exit: 0 nothing required failed; 1 a check failed or deviated; 2 usage;
// 3 the server could not be reached or started.
#include <fmt/format.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>
#include <thread>

#include "conform/runner.h"

extern char** environ;

namespace tcpstore::conform {
namespace {

constexpr const char* kUsage =
    "usage: tcpstore-conform (--addr HOST:PORT | --server-cmd \"CMD {port}\")\n"
    "         [--dialect 1.13|2.x|both] "
    "[--profile torch-1.13|torch-2.6|torch-2.14|tcpstore|\n"
    "         tcpstore-gateway]\n"
    "         [--only wire|semantics|blocking|isolation|extensions] [--json "
    "FILE]\n"
    "         [--name NAME] [--timeout-ms N] [--start-timeout-s N] [--list]\n";

int usage(const std::string& why) {
  std::fprintf(stderr, "tcpstore-conform: %s\n%s", why.c_str(), kUsage);
  return 2;
}

std::optional<Profile> parseProfile(const std::string& s) {
  for (std::size_t i = 0; i < kProfileCount; ++i) {
    if (profileName(static_cast<Profile>(i)) == s)
      return static_cast<Profile>(i);
  }
  return std::nullopt;
}

std::optional<Group> parseGroup(const std::string& s) {
  for (Group g : {Group::kWire, Group::kSemantics, Group::kBlocking,
                  Group::kIsolation, Group::kExtensions}) {
    if (groupName(g) == s) return g;
  }
  return std::nullopt;
}

// The server started by --server-cmd: /bin/sh -c "exec CMD", its stdout sent
// to our stderr; stopped by PID (SIGTERM, then SIGKILL after 10 s).
class ServerProcess {
 public:
  ~ServerProcess() { stop(); }
  bool start(const std::string& cmd) {
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, 2, 1);
    std::string script = "exec " + cmd;
    const char* argv[] = {"/bin/sh", "-c", script.c_str(), nullptr};
    int rc = posix_spawn(&pid_, "/bin/sh", &fa, nullptr,
                         const_cast<char* const*>(argv), environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) pid_ = -1;
    return pid_ > 0;
  }
  bool exited() {
    if (pid_ <= 0) return true;
    int st = 0;
    if (::waitpid(pid_, &st, WNOHANG) == pid_) {
      pid_ = -1;
      return true;
    }
    return false;
  }
  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    for (int i = 0; i < 1000 && !exited(); ++i) {
      std::this_thread::sleep_for(Ms(10));
    }
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      int st = 0;
      ::waitpid(pid_, &st, 0);
      pid_ = -1;
    }
  }

 private:
  pid_t pid_ = -1;
};

int run(int argc, char** argv) {
  RunOptions opts;
  std::string addr, server_cmd, json_path, name;
  int start_timeout_s = 120;
  bool list = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::optional<std::string> {
      if (i + 1 >= argc) return std::nullopt;
      return std::string(argv[++i]);
    };
    std::optional<std::string> v;
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (a == "--list") {
      list = true;
    } else if (!(v = value())) {
      return usage("missing value for " + a);
    } else if (a == "--addr") {
      addr = *v;
    } else if (a == "--server-cmd") {
      server_cmd = *v;
    } else if (a == "--json") {
      json_path = *v;
    } else if (a == "--name") {
      name = *v;
    } else if (a == "--dialect") {
      if (*v == "1.13") {
        opts.v2 = false;
      } else if (*v == "2.x") {
        opts.v113 = false;
      } else if (*v != "both") {
        return usage("bad --dialect " + *v);
      }
    } else if (a == "--profile") {
      if (!(opts.profile = parseProfile(*v)))
        return usage("bad --profile " + *v);
    } else if (a == "--only") {
      if (!(opts.only = parseGroup(*v))) return usage("bad --only " + *v);
    } else if (a == "--timeout-ms") {
      opts.timing.op = Ms(std::atoi(v->c_str()));
      if (opts.timing.op.count() <= 0) return usage("bad --timeout-ms");
    } else if (a == "--start-timeout-s") {
      start_timeout_s = std::atoi(v->c_str());
    } else {
      return usage("unknown argument " + a);
    }
  }
  std::vector<Check> checks = allChecks();
  if (list) {
    for (const auto& c : checks) {
      std::printf("%s\t%s\t%s\t%s:%d\n", c.id, c.title, c.ref, c.file, c.line);
    }
    return 0;
  }
  if (addr.empty() == server_cmd.empty()) {
    return usage("give exactly one of --addr and --server-cmd");
  }
  ServerProcess server;
  if (!server_cmd.empty()) {
    auto at = server_cmd.find("{port}");
    if (at == std::string::npos) return usage("--server-cmd needs {port}");
    opts.port = pickFreePort();
    server_cmd.replace(at, 6, std::to_string(opts.port));
    if (!server.start(server_cmd)) {
      std::fprintf(stderr, "tcpstore-conform: cannot start: %s\n",
                   server_cmd.c_str());
      return 3;
    }
    auto deadline = Clock::now() + std::chrono::seconds(start_timeout_s);
    for (;;) {
      Conn probe;
      if (probe.connect(opts.host, opts.port, Ms(500))) break;
      if (server.exited() || Clock::now() > deadline) {
        std::fprintf(stderr,
                     "tcpstore-conform: server did not accept on %s:%u\n",
                     opts.host.c_str(), opts.port);
        return 3;
      }
      std::this_thread::sleep_for(Ms(50));
    }
  } else {
    auto colon = addr.rfind(':');
    if (colon == std::string::npos) return usage("--addr needs HOST:PORT");
    opts.host = addr.substr(0, colon);
    if (opts.host.size() > 2 && opts.host.front() == '[') {
      opts.host = opts.host.substr(1, opts.host.size() - 2);
    }
    int port = std::atoi(addr.c_str() + colon + 1);
    if (port <= 0 || port > 65535) return usage("bad port in --addr");
    opts.port = static_cast<std::uint16_t>(port);
    Conn probe;
    if (!probe.connect(opts.host, opts.port, opts.timing.op)) {
      std::fprintf(stderr, "tcpstore-conform: %s: %s\n", addr.c_str(),
                   probe.error().c_str());
      return 3;
    }
  }
  RunReport rep = runChecks(checks, opts);
  rep.target = name;
  server.stop();
  std::fputs(textReport(rep).c_str(), stdout);
  if (!json_path.empty()) {
    std::ofstream f(json_path);
    f << jsonReport(rep);
    if (!f) {
      std::fprintf(stderr, "tcpstore-conform: cannot write %s\n",
                   json_path.c_str());
      return 3;
    }
  }
  return rep.failed + rep.deviates == 0 ? 0 : 1;
}

}  // namespace
}  // namespace tcpstore::conform

int main(int argc, char** argv) {
  ::signal(SIGPIPE, SIG_IGN);
  return tcpstore::conform::run(argc, argv);
}
