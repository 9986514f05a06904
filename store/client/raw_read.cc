// readRawKey: CHECK + GET of one raw key on a short-lived blocking socket.
#include "store/client/raw_read.h"

#include <fmt/format.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "protocol/codec.h"
#include "protocol/message.h"

namespace tcpstore::cli {
namespace {

namespace p = tcpstore::protocol;
using Clock = std::chrono::steady_clock;

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

int msLeft(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - Clock::now());
  return left.count() > 0 ? static_cast<int>(left.count()) : 0;
}

Status waitFor(int fd, short events, Clock::time_point deadline,
               const char* what) {
  pollfd pfd{fd, events, 0};
  for (;;) {
    int rc = ::poll(&pfd, 1, msLeft(deadline));
    if (rc > 0) return Status::ok();
    if (rc == 0) return Status::timeout(fmt::format("{} timed out", what));
    if (errno != EINTR)
      return Status::ioError(fmt::format("poll: {}", std::strerror(errno)));
  }
}

Result<int> connectTo(const std::string& host, std::uint16_t port,
                      Clock::time_point deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  std::string h = host;
  if (h.size() > 2 && h.front() == '[' && h.back() == ']')
    h = h.substr(1, h.size() - 2);
  int rc = ::getaddrinfo(h.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0) {
    return Status::ioError(
        fmt::format("resolve {}: {}", host, ::gai_strerror(rc)));
  }
  Status last = Status::refused(fmt::format("{}:{}: no address", host, port));
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK,
                      ai->ai_protocol);
    if (fd < 0) continue;
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 ||
        errno == EINPROGRESS) {
      Status s = waitFor(fd, POLLOUT, deadline, "connect");
      int err = 0;
      socklen_t len = sizeof err;
      if (s && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 &&
          err == 0) {
        ::freeaddrinfo(res);
        return fd;
      }
      last = s ? Status::refused(fmt::format("connect {}:{}: {}", host, port,
                                             std::strerror(err)))
               : s;
    }
    ::close(fd);
  }
  ::freeaddrinfo(res);
  return last;
}

Status sendAll(int fd, const std::string& bytes, Clock::time_point deadline) {
  std::size_t off = 0;
  while (off < bytes.size()) {
    ssize_t n =
        ::send(fd, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n > 0) {
      off += static_cast<std::size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      if (Status s = waitFor(fd, POLLOUT, deadline, "send"); !s) return s;
    } else {
      return Status::closed(fmt::format("send: {}", std::strerror(errno)));
    }
  }
  return Status::ok();
}

// Sends req and decodes its reply into out (backed by buf).
Status roundTrip(int fd, p::Dialect d, const p::Request& req, std::string& buf,
                 p::Reply& out, Clock::time_point deadline) {
  std::string wire;
  if (!p::encodeRequest(d, req, wire))
    return Status::notSupported("command not in this dialect");
  if (Status s = sendAll(fd, wire, deadline); !s) return s;
  buf.clear();
  const p::Limits limits;
  for (;;) {
    out.clear();
    auto r = p::decodeReply(buf, p::replyShapeOf(req.command), limits, out);
    if (r.frame()) return Status::ok();
    if (r.failed()) return Status::protocolError(r.error.message());
    if (Status s = waitFor(fd, POLLIN, deadline, "reply"); !s) return s;
    char chunk[4096];
    ssize_t n = ::recv(fd, chunk, sizeof chunk, 0);
    if (n == 0) return Status::closed("server closed the connection");
    if (n < 0 && errno != EAGAIN && errno != EINTR)
      return Status::ioError(fmt::format("recv: {}", std::strerror(errno)));
    if (n > 0) buf.append(chunk, static_cast<std::size_t>(n));
  }
}

}  // namespace

Result<std::optional<std::string>> readRawKey(
    const std::string& host, std::uint16_t port, Dialect dialect,
    std::string_view key, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  auto fd_or = connectTo(host, port, deadline);
  if (!fd_or) return fd_or.error();
  Fd fd(*fd_or);
  const p::Dialect d =
      dialect == Dialect::kV113 ? p::Dialect::kV113 : p::Dialect::kV2;
  p::Request req;
  std::string buf;
  p::Reply reply;
  if (d == p::Dialect::kV2) {
    req.command = p::Command::kValidate;
    req.u32 = p::kValidateMagic;
    std::string wire;
    if (!p::encodeRequest(d, req, wire))
      return Status::protocolError("cannot encode VALIDATE");
    if (Status s = sendAll(fd.get(), wire, deadline); !s) return s;
  }
  req.clear();
  req.command = p::Command::kCheck;
  req.keys.push_back(key);
  if (Status s = roundTrip(fd.get(), d, req, buf, reply, deadline); !s)
    return s;
  if (reply.byte != 0) return std::optional<std::string>();  // 1 = not ready
  req.clear();
  req.command = p::Command::kGet;
  req.key = key;
  if (Status s = roundTrip(fd.get(), d, req, buf, reply, deadline); !s)
    return s;
  return std::optional<std::string>(std::string(reply.value));
}

}  // namespace tcpstore::cli
