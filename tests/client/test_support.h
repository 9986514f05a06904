// Helpers for the client tests: child processes with captured output and a
// deadline, raw 2.x requests, a free-port reservation.
#pragma once

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace tcpstore::test {

using Clock = std::chrono::steady_clock;

// Multiplier from TCPSTORE_TEST_TIMEOUT_MULTIPLIER (sanitizer builds).
inline int timeoutMultiplier() {
  const char* m = std::getenv("TCPSTORE_TEST_TIMEOUT_MULTIPLIER");
  int v = m ? std::atoi(m) : 1;
  return v > 0 ? v : 1;
}
inline std::chrono::milliseconds scaled(std::chrono::milliseconds d) {
  return d * timeoutMultiplier();
}

struct ProcResult {
  int exit_code = -1;  // -1: killed / did not exit in time
  bool timed_out = false;
  std::string out;
  std::string err;
};

// A child process with stdout/stderr on pipes.
class Child {
 public:
  Child() = default;
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  Child(Child&& o) noexcept { *this = std::move(o); }
  Child& operator=(Child&& o) noexcept {
    std::swap(pid_, o.pid_);
    std::swap(out_fd_, o.out_fd_);
    std::swap(err_fd_, o.err_fd_);
    std::swap(out_, o.out_);
    std::swap(err_, o.err_);
    return *this;
  }
  ~Child() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      int st = 0;
      ::waitpid(pid_, &st, 0);
    }
    if (out_fd_ >= 0) ::close(out_fd_);
    if (err_fd_ >= 0) ::close(err_fd_);
  }

  // argv[0] is the program path (no PATH search unless it has no '/').
  // extra_env entries ("K=V") are added to the environment.
  bool start(const std::vector<std::string>& argv,
             const std::vector<std::string>& extra_env = {}) {
    int out_pipe[2];
    int err_pipe[2];
    if (::pipe2(out_pipe, O_CLOEXEC) != 0) return false;
    if (::pipe2(err_pipe, O_CLOEXEC) != 0) return false;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, out_pipe[1], 1);
    posix_spawn_file_actions_adddup2(&fa, err_pipe[1], 2);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    std::vector<std::string> env_store;
    for (char** e = environ; *e != nullptr; ++e) env_store.emplace_back(*e);
    for (const auto& e : extra_env) env_store.push_back(e);
    std::vector<char*> env;
    for (auto& e : env_store) env.push_back(e.data());
    env.push_back(nullptr);
    int rc = argv[0].find('/') == std::string::npos
                 ? ::posix_spawnp(&pid_, argv[0].c_str(), &fa, nullptr,
                                  args.data(), env.data())
                 : ::posix_spawn(&pid_, argv[0].c_str(), &fa, nullptr,
                                 args.data(), env.data());
    posix_spawn_file_actions_destroy(&fa);
    ::close(out_pipe[1]);
    ::close(err_pipe[1]);
    out_fd_ = out_pipe[0];
    err_fd_ = err_pipe[0];
    if (rc != 0) {
      pid_ = -1;
      return false;
    }
    return true;
  }

  pid_t pid() const { return pid_; }

  // Reads stdout until a full line is available or the deadline passes.
  std::optional<std::string> readLine(Clock::time_point deadline) {
    for (;;) {
      auto nl = out_.find('\n');
      if (nl != std::string::npos) {
        std::string line = out_.substr(0, nl);
        out_.erase(0, nl + 1);
        consumed_out_ += line + "\n";
        return line;
      }
      if (!pump(deadline)) return std::nullopt;
    }
  }

  // Waits for exit (collecting output) until the deadline; kills on timeout.
  ProcResult wait(Clock::time_point deadline) {
    ProcResult r;
    while (out_fd_ >= 0 || err_fd_ >= 0) {
      if (!pump(deadline)) break;
    }
    for (;;) {
      int st = 0;
      pid_t w = ::waitpid(pid_, &st, WNOHANG);
      if (w == pid_) {
        pid_ = -1;
        r.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        break;
      }
      if (Clock::now() >= deadline) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &st, 0);
        pid_ = -1;
        r.timed_out = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    r.out = consumed_out_ + out_;
    r.err = err_;
    return r;
  }

  void terminate() {
    if (pid_ > 0) ::kill(pid_, SIGTERM);
  }

 private:
  // One poll round over the open pipes; false on deadline or all closed.
  bool pump(Clock::time_point deadline) {
    pollfd fds[2];
    int n = 0;
    if (out_fd_ >= 0) fds[n++] = {out_fd_, POLLIN, 0};
    if (err_fd_ >= 0) fds[n++] = {err_fd_, POLLIN, 0};
    if (n == 0) return false;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - Clock::now());
    if (left.count() <= 0) return false;
    int r = ::poll(fds, n, static_cast<int>(left.count()));
    if (r <= 0) return r < 0 && errno == EINTR;
    for (int i = 0; i < n; ++i) {
      if (fds[i].revents == 0) continue;
      char buf[4096];
      ssize_t got = ::read(fds[i].fd, buf, sizeof(buf));
      bool is_out = fds[i].fd == out_fd_;
      if (got > 0) {
        (is_out ? out_ : err_).append(buf, static_cast<std::size_t>(got));
      } else {
        ::close(fds[i].fd);
        (is_out ? out_fd_ : err_fd_) = -1;
      }
    }
    return true;
  }

  pid_t pid_ = -1;
  int out_fd_ = -1;
  int err_fd_ = -1;
  std::string out_;
  std::string consumed_out_;
  std::string err_;
};

inline ProcResult runProcess(const std::vector<std::string>& argv,
                             std::chrono::milliseconds timeout,
                             const std::vector<std::string>& extra_env = {}) {
  Child c;
  if (!c.start(argv, extra_env)) return {};
  return c.wait(Clock::now() + scaled(timeout));
}

// A socket bound to 127.0.0.1:0 but not listening: connects to its port are
// refused, and no other socket (a parallel test's server) can take the port.
// release() hands the fd over (e.g. to ServerOptions::listen_fd).
class BoundPort {
 public:
  BoundPort() {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0)
      return;
    socklen_t len = sizeof(a);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
  }
  ~BoundPort() {
    if (fd_ >= 0) ::close(fd_);
  }
  BoundPort(const BoundPort&) = delete;
  BoundPort& operator=(const BoundPort&) = delete;
  std::uint16_t port() const { return port_; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_ = -1;
  std::uint16_t port_ = 0;
};

inline bool interopSkipped() {
  const char* s = std::getenv("TCPSTORE_SKIP_INTEROP");
  return s != nullptr && std::string(s) == "1";
}

}  // namespace tcpstore::test
