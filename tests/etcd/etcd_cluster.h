// EtcdCluster: a real 3-member etcd cluster on loopback for tests.
//
// Each member is Debian's etcd binary started as its own process (posix_spawn)
// with random free ports (below the ephemeral range, see freePort()) and a data
// dir under the build tree; start() waits (with a deadline) until every member
// answers /health. Members can be killed (SIGKILL, by PID) and restarted on the
// same ports and data. The destructor kills every member it started and removes
// the data dirs.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace tcpstore::test {

class EtcdCluster {
 public:
  static constexpr int kMembers = 3;

  // `etcd_bin`: the etcd server binary; `root`: a directory for data dirs and
  // logs (created; removed by the destructor).
  EtcdCluster(std::string etcd_bin, std::filesystem::path root)
      : bin_(std::move(etcd_bin)), root_(std::move(root)) {
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_);
    for (int i = 0; i < kMembers; ++i) {
      members_.push_back(
          Member{"m" + std::to_string(i), freePort(), freePort(), -1});
    }
  }
  ~EtcdCluster() {
    for (int i = 0; i < kMembers; ++i) kill(i);
    std::error_code ec;
    std::filesystem::remove_all(root_, ec);
  }
  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;

  // Starts every member and waits until all are healthy (throws past
  // `deadline`).
  // A member that exits at start (e.g. a port taken by another process
  // between our check and etcd's bind) makes the whole cluster start over on
  // fresh ports and empty data dirs, up to three times.
  void start(std::chrono::seconds deadline = std::chrono::seconds(60)) {
    for (int attempt = 1;; ++attempt) {
      try {
        for (int i = 0; i < kMembers; ++i) spawn(i, "new");
        for (int i = 0; i < kMembers; ++i) waitHealthy(i, deadline);
        return;
      } catch (const std::runtime_error&) {
        if (attempt == 3) throw;
        for (int i = 0; i < kMembers; ++i) {
          kill(i);
          std::filesystem::remove_all(root_ / members_[i].name);
          members_[i].client_port = freePort();
          members_[i].peer_port = freePort();
        }
      }
    }
  }

  // "127.0.0.1:PORT" client endpoints, member order.
  std::vector<std::string> endpoints() const {
    std::vector<std::string> v;
    for (const auto& m : members_)
      v.push_back("127.0.0.1:" + std::to_string(m.client_port));
    return v;
  }
  // "etcd://127.0.0.1:A,127.0.0.1:B,127.0.0.1:C/prefix"
  std::string url(const std::string& prefix) const {
    std::string u = "etcd://";
    for (const auto& e : endpoints()) u += e + ",";
    u.pop_back();
    return u + "/" + prefix;
  }

  bool running(int i) const { return members_[i].pid > 0; }

  // SIGKILL member `i` (if running) and reap it.
  void kill(int i) {
    Member& m = members_[i];
    if (m.pid <= 0) return;
    ::kill(m.pid, SIGKILL);
    int status = 0;
    ::waitpid(m.pid, &status, 0);
    m.pid = -1;
  }
  // Freezes member `i` (SIGSTOP): it keeps its sockets open but answers
  // nothing, like a hung host. resume() undoes it (SIGCONT).
  void pause(int i) {
    if (members_[i].pid > 0) ::kill(members_[i].pid, SIGSTOP);
  }
  void resume(int i) {
    if (members_[i].pid > 0) ::kill(members_[i].pid, SIGCONT);
  }
  // Restarts member `i` on its ports and data dir; waits until healthy.
  void restart(int i,
               std::chrono::seconds deadline = std::chrono::seconds(60)) {
    spawn(i, "existing");
    waitHealthy(i, deadline);
  }

  // Index of the current leader (asks each running member), or nullopt.
  std::optional<int> leader() const {
    for (int i = 0; i < kMembers; ++i) {
      if (!running(i)) continue;
      auto body =
          http(members_[i].client_port, "POST", "/v3/maintenance/status", "{}");
      if (!body) continue;
      auto member = jsonField(*body, "member_id");
      auto lead = jsonField(*body, "leader");
      if (member && lead && *member == *lead) return i;
    }
    return std::nullopt;
  }
  // Waits until some member is leader (throws past `deadline`).
  int waitLeader(std::chrono::seconds deadline = std::chrono::seconds(30)) {
    const auto until = std::chrono::steady_clock::now() + deadline;
    while (std::chrono::steady_clock::now() < until) {
      if (auto l = leader()) return *l;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));  // poll
    }
    throw std::runtime_error("etcd cluster: no leader before the deadline");
  }

 private:
  struct Member {
    std::string name;
    int client_port;
    int peer_port;
    pid_t pid;
  };

  // A random free port BELOW the kernel's ephemeral range (32768+), so no
  // outgoing connection (of etcd or of a parallel test) can take it between
  // this check and etcd's bind, nor while a killed member is down.
  static int freePort() {
    static std::mt19937 rng(std::random_device{}());
    std::uniform_int_distribution<int> pick(20000, 32000);
    for (int attempt = 0; attempt < 200; ++attempt) {
      const int port = pick(rng);
      int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      if (fd < 0) break;
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      a.sin_port = htons(static_cast<std::uint16_t>(port));
      const bool ok =
          ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
      ::close(fd);
      if (ok) return port;
    }
    throw std::runtime_error("etcd cluster: no free port");
  }

  void spawn(int i, const std::string& state) {
    Member& m = members_[i];
    if (m.pid > 0) return;
    std::string cluster;
    for (const auto& o : members_) {
      cluster +=
          o.name + "=http://127.0.0.1:" + std::to_string(o.peer_port) + ",";
    }
    cluster.pop_back();
    const std::string client =
        "http://127.0.0.1:" + std::to_string(m.client_port);
    const std::string peer = "http://127.0.0.1:" + std::to_string(m.peer_port);
    std::vector<std::string> args = {
        bin_,
        "--name=" + m.name,
        "--data-dir=" + (root_ / m.name).string(),
        "--listen-client-urls=" + client,
        "--advertise-client-urls=" + client,
        "--listen-peer-urls=" + peer,
        "--initial-advertise-peer-urls=" + peer,
        "--initial-cluster=" + cluster,
        "--initial-cluster-state=" + state,
        "--initial-cluster-token=tcpstore-test-" + std::to_string(::getpid()),
        "--heartbeat-interval=50",
        "--election-timeout=500",
        "--logger=zap",
        "--log-outputs=stderr"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    const std::string log = (root_ / (m.name + ".log")).string();
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(),
                                     O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    pid_t pid = -1;
    int rc =
        posix_spawn(&pid, bin_.c_str(), &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) throw std::runtime_error("etcd cluster: cannot spawn " + bin_);
    m.pid = pid;
  }

  void waitHealthy(int i, std::chrono::seconds deadline) {
    const auto until = std::chrono::steady_clock::now() + deadline;
    while (std::chrono::steady_clock::now() < until) {
      int status = 0;
      if (::waitpid(members_[i].pid, &status, WNOHANG) == members_[i].pid) {
        members_[i].pid = -1;
        throw std::runtime_error("etcd member " + members_[i].name +
                                 " exited; its log ends with: " + logTail(i));
      }
      auto body = http(members_[i].client_port, "GET", "/health", "");
      if (body && body->find("\"health\":\"true\"") != std::string::npos)
        return;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));  // poll
    }
    throw std::runtime_error("etcd member " + members_[i].name +
                             " not healthy before the deadline");
  }

  std::string logTail(int i) const {
    std::ifstream in(root_ / (members_[i].name + ".log"));
    std::string all((std::istreambuf_iterator<char>(in)),
                    std::istreambuf_iterator<char>());
    return all.size() > 1500 ? all.substr(all.size() - 1500) : all;
  }

  // One HTTP/1.1 request to 127.0.0.1:port; the body, or nullopt.
  static std::optional<std::string> http(int port, const std::string& method,
                                         const std::string& path,
                                         const std::string& body) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return std::nullopt;
    timeval tv{1, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      ::close(fd);
      return std::nullopt;
    }
    std::string req = method + " " + path +
                      " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                      "Content-Type: application/json\r\nContent-Length: " +
                      std::to_string(body.size()) + "\r\n\r\n" + body;
    if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) !=
        static_cast<ssize_t>(req.size())) {
      ::close(fd);
      return std::nullopt;
    }
    std::string resp;
    char buf[4096];
    for (;;) {
      ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) break;
      resp.append(buf, static_cast<std::size_t>(n));
    }
    ::close(fd);
    auto p = resp.find("\r\n\r\n");
    if (resp.rfind("HTTP/1.1 200", 0) != 0 || p == std::string::npos)
      return std::nullopt;
    return resp.substr(p + 4);
  }

  // The string value of "name":"..." in a flat JSON text.
  static std::optional<std::string> jsonField(const std::string& json,
                                              const std::string& name) {
    const std::string pat = "\"" + name + "\":\"";
    auto p = json.find(pat);
    if (p == std::string::npos) return std::nullopt;
    p += pat.size();
    auto e = json.find('"', p);
    if (e == std::string::npos) return std::nullopt;
    return json.substr(p, e - p);
  }

  std::string bin_;
  std::filesystem::path root_;
  std::vector<Member> members_;
};

}  // namespace tcpstore::test
