#include "tests/conform/fault_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "protocol/codec.h"
#include "protocol/limits.h"
#include "store/keyspace.h"

namespace tcpstore::conform::test {
namespace {

using protocol::Command;
using store::ConnId;

struct Client {
  int fd = -1;
  std::string in;
  std::string out;
  std::unique_ptr<protocol::RequestStream> stream;
};

std::string str(std::string_view v) {
  std::string out(8, '\0');
  std::uint64_t n = v.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + std::string(v);
}

class Loop {
 public:
  Loop(Fault fault, int listen_fd, int wake_fd, std::atomic<bool>& stop)
      : fault_(fault), listen_fd_(listen_fd), wake_fd_(wake_fd), stop_(stop) {
    if (fault_ == Fault::kIgnoreLimits) {
      limits_.max_key_bytes = limits_.max_value_bytes = 1ull << 40;
      limits_.max_keys_per_request = 1ull << 40;
      limits_.max_request_bytes = 1ull << 40;
    }
  }

  void run() {
    while (!stop_) {
      std::vector<pollfd> fds{{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
      std::vector<ConnId> ids;
      for (auto& [id, c] : clients_) {
        fds.push_back(
            {c.fd, static_cast<short>(POLLIN | (c.out.empty() ? 0 : POLLOUT)),
             0});
        ids.push_back(id);
      }
      if (::poll(fds.data(), fds.size(), 200) <= 0) continue;
      if (fds[0].revents & POLLIN) accept();
      for (std::size_t i = 0; i < ids.size(); ++i) {
        if (fds[i + 2].revents == 0 || !clients_.count(ids[i])) continue;
        if (fds[i + 2].revents & POLLOUT) flush(ids[i]);
        if (fds[i + 2].revents & (POLLIN | POLLHUP | POLLERR)) readFrom(ids[i]);
      }
    }
    for (auto& [id, c] : clients_) ::close(c.fd);
  }

 private:
  void accept() {
    int fd =
        ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    Client c;
    c.fd = fd;
    c.stream = std::make_unique<protocol::RequestStream>(limits_);
    clients_.emplace(next_id_++, std::move(c));
  }

  void drop(ConnId id) {
    auto it = clients_.find(id);
    if (it == clients_.end()) return;
    ::close(it->second.fd);
    clients_.erase(it);
    keyspace_.disconnect(id);
  }

  void flush(ConnId id) {
    Client& c = clients_.at(id);
    while (!c.out.empty()) {
      ssize_t n = ::send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL);
      if (n <= 0) break;
      c.out.erase(0, static_cast<std::size_t>(n));
    }
  }

  // Reads what is there; with kStallOnPartial keeps reading this client
  // alone (everyone else waits) until its partial request is complete.
  void readFrom(ConnId id) {
    for (;;) {
      Client& c = clients_.at(id);
      char buf[65536];
      ssize_t n = ::recv(c.fd, buf, sizeof(buf), 0);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
        return drop(id);
      if (n > 0) c.in.append(buf, static_cast<std::size_t>(n));
      if (!process(id)) return;
      Client& after = clients_.at(id);
      if (fault_ != Fault::kStallOnPartial || after.in.empty() || stop_) return;
      pollfd p{after.fd, POLLIN, 0};
      ::poll(&p, 1, 100);
    }
  }

  // Decodes and applies every complete request; false if the client is gone.
  bool process(ConnId id) {
    Client& c = clients_.at(id);
    for (;;) {
      protocol::Request req;
      auto res = c.stream->next(c.in, req);
      if (res.failed()) {
        drop(id);
        return false;
      }
      if (!res.frame()) return true;
      fx_.clear();
      if (!apply(id, req)) {
        drop(id);
        return false;
      }
      c.in.erase(0, res.consumed);
      for (const auto& s : fx_.sends()) {
        auto it = clients_.find(s.conn);
        if (it == clients_.end()) continue;
        if (fault_ == Fault::kNoWake && s.conn != id) continue;
        it->second.out.append(fx_.bytesOf(s));
        flush(s.conn);
      }
    }
  }

  bool apply(ConnId id, const protocol::Request& req) {
    if (fault_ == Fault::kBrokenListKeys && req.command == Command::kListKeys) {
      fx_.send(id, std::string(8, '\0'));
      return true;
    }
    if (fault_ == Fault::kWrongCompareSet &&
        req.command == Command::kCompareSet) {
      const std::string* cur = keyspace_.find(req.key);
      if (cur != nullptr && *cur != req.value) {
        protocol::Request set;
        set.command = Command::kSet;
        set.key = req.key;
        set.value = req.desired;
        std::string desired(req.desired);
        if (!keyspace_.apply(id, set, fx_).isOk()) return false;
        fx_.send(id, str(desired));
        return true;
      }
    }
    if (!keyspace_.apply(id, req, fx_).isOk()) return false;
    if (fault_ == Fault::kDropGetReply && req.command == Command::kGet) {
      store::Effects kept;
      for (const auto& s : fx_.sends()) {
        if (s.conn != id) kept.send(s.conn, fx_.bytesOf(s));
      }
      fx_ = std::move(kept);
    }
    return true;
  }

  Fault fault_;
  int listen_fd_;
  int wake_fd_;
  std::atomic<bool>& stop_;
  protocol::Limits limits_;
  store::Keyspace keyspace_;
  store::Effects fx_;
  std::map<ConnId, Client> clients_;
  ConnId next_id_ = 1;
};

}  // namespace

FaultServer::FaultServer(Fault fault) : fault_(fault) {
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (listen_fd_ < 0 ||
      ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::listen(listen_fd_, 128) != 0 ||
      ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0 ||
      ::pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
    return;  // port_ stays 0: the test fails on it
  }
  port_ = ntohs(a.sin_port);
  thread_ = std::thread([this] { run(); });
}

FaultServer::~FaultServer() {
  stop_ = true;
  if (wake_[1] >= 0) {
    char b = 1;
    [[maybe_unused]] auto n = ::write(wake_[1], &b, 1);
  }
  if (thread_.joinable()) thread_.join();
  for (int fd : {listen_fd_, wake_[0], wake_[1]}) {
    if (fd >= 0) ::close(fd);
  }
}

void FaultServer::run() { Loop(fault_, listen_fd_, wake_[0], stop_).run(); }

}  // namespace tcpstore::conform::test
