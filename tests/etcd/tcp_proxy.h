// TcpProxy: a TCP forwarder on loopback for partition tests (test code).
//
// Listens on 127.0.0.1:0 and forwards every accepted connection to
// 127.0.0.1:target_port, both directions, on one thread (poll). partition()
// freezes it: nothing is read, written or accepted any more, so the peers'
// connections stay open and silent (packets of a partitioned network go
// nowhere; new connections complete in the kernel's backlog and then hear
// nothing). heal() resumes forwarding where it stopped: bytes held in the
// kernel's buffers meanwhile are delivered, as after a healed partition.
// The destructor stops the thread and closes every socket.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace tcpstore::test {

class TcpProxy {
 public:
  explicit TcpProxy(int target_port) : target_port_(target_port) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a = loopback(0);
    if (listen_fd_ < 0 ||
        ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
        ::listen(listen_fd_, 64) != 0) {
      throw std::runtime_error("tcp proxy: cannot listen");
    }
    socklen_t len = sizeof(a);
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    if (::pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0)
      throw std::runtime_error("tcp proxy: pipe");
    thread_ = std::thread([this] { run(); });
  }
  ~TcpProxy() {
    stop_ = true;
    poke();
    thread_.join();
    for (auto& p : pairs_) {
      ::close(p->fd[0]);
      ::close(p->fd[1]);
    }
    ::close(listen_fd_);
    ::close(wake_[0]);
    ::close(wake_[1]);
  }
  TcpProxy(const TcpProxy&) = delete;
  TcpProxy& operator=(const TcpProxy&) = delete;

  int port() const { return port_; }
  // Stops all traffic (see above). Returns once the thread has stopped
  // moving bytes.
  void partition() {
    frozen_ = true;
    poke();
    while (ack_ != gen_) std::this_thread::yield();
  }
  void heal() {
    frozen_ = false;
    poke();
  }

 private:
  struct Pair {
    int fd[2];           // [0] accepted, [1] to the target
    std::string out[2];  // bytes waiting to be written to fd[i]
    bool closing = false;
  };

  static sockaddr_in loopback(int port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    return a;
  }

  void poke() {
    ++gen_;
    const char b = 1;
    (void)!::write(wake_[1], &b, 1);
  }

  void acceptOne() {
    const int c = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) return;
    const int t = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a = loopback(target_port_);
    if (t < 0 ||
        ::connect(t, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      ::close(c);
      if (t >= 0) ::close(t);
      return;
    }
    ::fcntl(c, F_SETFL, O_NONBLOCK);
    ::fcntl(t, F_SETFL, O_NONBLOCK);
    auto p = std::make_unique<Pair>();
    p->fd[0] = c;
    p->fd[1] = t;
    pairs_.push_back(std::move(p));
  }

  void run() {
    while (!stop_) {
      const std::uint64_t gen = gen_;
      const bool frozen = frozen_;
      std::vector<pollfd> fds;
      fds.push_back({wake_[0], POLLIN, 0});
      if (!frozen) fds.push_back({listen_fd_, POLLIN, 0});
      const std::size_t first_pair = fds.size();
      if (!frozen) {
        for (auto& p : pairs_) {
          for (int i = 0; i < 2; ++i) {
            short ev = 0;
            // Read from fd[i] while the other side's backlog is small.
            if (!p->closing && p->out[1 - i].size() < (1u << 20)) ev |= POLLIN;
            if (!p->out[i].empty()) ev |= POLLOUT;
            fds.push_back({p->fd[i], ev, 0});
          }
        }
      }
      ack_ = gen;
      if (::poll(fds.data(), fds.size(), -1) < 0 && errno != EINTR) return;
      if (fds[0].revents != 0) {
        char buf[64];
        while (::read(wake_[0], buf, sizeof(buf)) > 0) {
        }
      }
      if (frozen_ || stop_) continue;  // changed while polling: start over
      if (!frozen && (fds[1].revents & POLLIN)) acceptOne();
      if (frozen) continue;
      for (std::size_t k = 0; k < pairs_.size() && !frozen_; ++k) {
        Pair& p = *pairs_[k];
        for (int i = 0; i < 2; ++i) {
          const short re = fds[first_pair + 2 * k + i].revents;
          if (re & (POLLIN | POLLHUP | POLLERR)) {
            char buf[64 * 1024];
            const ssize_t n = ::recv(p.fd[i], buf, sizeof(buf), 0);
            if (n > 0) {
              p.out[1 - i].append(buf, static_cast<std::size_t>(n));
            } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
              p.closing = true;
            }
          }
          if (!p.out[i].empty()) {
            const ssize_t n =
                ::send(p.fd[i], p.out[i].data(), p.out[i].size(), MSG_NOSIGNAL);
            if (n > 0) {
              p.out[i].erase(0, static_cast<std::size_t>(n));
            } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
              p.closing = true;
              p.out[i].clear();
            }
          }
        }
      }
      // A pair one side of which closed goes once its bytes are flushed.
      for (std::size_t k = 0; k < pairs_.size();) {
        Pair& p = *pairs_[k];
        if (p.closing && p.out[0].empty() && p.out[1].empty()) {
          ::close(p.fd[0]);
          ::close(p.fd[1]);
          pairs_.erase(pairs_.begin() + static_cast<std::ptrdiff_t>(k));
        } else {
          ++k;
        }
      }
    }
  }

  int target_port_;
  int listen_fd_ = -1;
  int port_ = 0;
  int wake_[2] = {-1, -1};
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> frozen_{false};
  std::atomic<std::uint64_t> gen_{0};
  std::atomic<std::uint64_t> ack_{0};
  std::vector<std::unique_ptr<Pair>> pairs_;  // proxy thread only
};

}  // namespace tcpstore::test
