// Child processes for the tests: argv spawned with stdout and stderr on
// pipes, lines read with a deadline, exit collected with a deadline (killed
// if it does not come). A Child that goes out of scope is killed and reaped.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "tests/support/deadline.h"

extern char** environ;

namespace tcpstore::test {

// Waits for `pid` to exit until the deadline (SIGKILL and reap after it).
// Returns the waitpid status, or -1 if it had to be killed.
inline int waitPid(pid_t pid, Clock::time_point deadline) {
  for (;;) {
    int st = 0;
    const pid_t w = ::waitpid(pid, &st, WNOHANG);
    if (w == pid || (w < 0 && errno != EINTR)) return w == pid ? st : -1;
    if (Clock::now() >= deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &st, 0);
      return -1;
    }
    // Poll granularity only: the result does not depend on it.
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
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
    const int st = waitPid(pid_, deadline);
    pid_ = -1;
    if (st == -1) {
      r.timed_out = true;
    } else {
      r.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    r.out = consumed_out_ + out_;
    r.err = err_;
    return r;
  }

  // Reads stderr (and stdout) until stderr holds `needle` (at or after
  // offset `from`) or the deadline passes; true if found. `poke` runs before
  // each poll round (e.g. sends SIGUSR1 so that the server prints its
  // counters).
  template <typename Poke>
  bool waitStderr(std::string_view needle, Clock::time_point deadline,
                  Poke poke, std::size_t from = 0) {
    for (;;) {
      if (err_.find(needle, from) != std::string::npos) return true;
      if ((out_fd_ < 0 && err_fd_ < 0) || Clock::now() >= deadline)
        return false;
      poke();
      (void)pump(std::min<Clock::time_point>(
          deadline, Clock::now() + std::chrono::milliseconds(20)));
    }
  }
  const std::string& err() const { return err_; }

  void terminate() {
    if (pid_ > 0) ::kill(pid_, SIGTERM);
  }
  void signal(int sig) {
    if (pid_ > 0) ::kill(pid_, sig);
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

}  // namespace tcpstore::test
