#include "store/client/connection.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <random>
#include <thread>

#include "protocol/requests.h"

namespace tcpstore::client_detail {
namespace {

using std::chrono::duration_cast;
using std::chrono::milliseconds;

std::string errnoText(int err) {
  return fmt::format("{} (errno {})", std::strerror(err), err);
}

// Milliseconds for poll(): rounded up, clamped to int, 0 if past.
int pollMillis(Deadline deadline) {
  auto now = Clock::now();
  if (deadline <= now) return 0;
  auto left = std::chrono::ceil<milliseconds>(deadline - now).count();
  return static_cast<int>(std::min<std::int64_t>(left, 1 << 30));
}

// poll() one fd until an event or the deadline; EINTR restarts with the
// remaining time. Returns revents, 0 on timeout, -1 on error (errno set).
int pollFd(int fd, short events, Deadline deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    int r = ::poll(&p, 1, pollMillis(deadline));
    if (r > 0) return p.revents;
    if (r == 0) {
      if (Clock::now() >= deadline) return 0;
      continue;  // woke early (rounding): poll again for the rest
    }
    if (errno == EINTR) continue;
    return -1;
  }
}

bool retryableErrno(int err) {
  switch (err) {
    case ECONNREFUSED:
    case ECONNRESET:
    case ECONNABORTED:
    case ENETUNREACH:
    case ENETDOWN:
    case EHOSTUNREACH:
    case EHOSTDOWN:
    case ETIMEDOUT:
    case EADDRNOTAVAIL:
    case EAGAIN:
    case EPIPE:
      return true;
    default:
      return false;
  }
}

double jitterFactor(double jitter) {
  if (jitter <= 0) return 1.0;
  jitter = std::min(jitter, 1.0);
  thread_local std::mt19937_64 rng{
      std::random_device{}() ^ (static_cast<std::uint64_t>(::getpid()) << 32) ^
      static_cast<std::uint64_t>(Clock::now().time_since_epoch().count())};
  std::uniform_real_distribution<double> dist(1.0 - jitter, 1.0 + jitter);
  return dist(rng);
}

std::string endpointName(const Endpoint& e) {
  if (e.host.find(':') != std::string::npos) {
    return fmt::format("[{}]:{}", e.host, e.port);
  }
  return fmt::format("{}:{}", e.host, e.port);
}

std::string endpointList(const ConnectConfig& c) {
  std::string s;
  for (const auto& e : c.endpoints) {
    if (!s.empty()) s += ", ";
    s += endpointName(e);
  }
  return s;
}

Status closedStatus(const std::string& peer, std::string_view what) {
  return Status::closed(
      fmt::format("{}: server {} closed the connection", what, peer));
}

}  // namespace

Deadline deadlineAfter(std::chrono::milliseconds d) noexcept {
  auto now = Clock::now();
  if (d.count() <= 0) return now;
  // ~100 years is "never" and cannot overflow steady_clock's int64 ns.
  constexpr auto kMax = std::chrono::hours(24 * 365 * 100);
  if (d > kMax) return now + kMax;
  return now + d;
}

Connection::~Connection() {
  if (fd_ >= 0) ::close(fd_);
}

std::string Connection::peer() const {
  return endpointName(config_.endpoints[endpoint_]);
}

Result<std::unique_ptr<Connection>> Connection::open(
    const ConnectConfig& config, Deadline deadline, std::size_t first) {
  const std::size_t n = config.endpoints.size();
  if (n == 0) return Status::invalidArgument("no endpoint to connect to");
  auto delay =
      std::chrono::duration<double, std::milli>(config.retry.initial_backoff);
  const auto max_delay =
      std::chrono::duration<double, std::milli>(config.retry.max_backoff);
  int attempt = 0;
  Status last_non_timeout;  // OK until an attempt fails other than by timeout
  for (;;) {
    // One round: an attempt on each endpoint.
    bool retryable = false;
    Status e;
    for (std::size_t k = 0; k < n; ++k) {
      ++attempt;
      bool again = false;
      const Deadline until =
          n == 1 ? deadline
                 : std::min(deadline, deadlineAfter(kEndpointAttempt));
      auto r = openOnce(config, (first + k) % n, until, again);
      if (r.has_value()) return r;
      e = r.error();
      if (!e.isTimeout()) last_non_timeout = e;
      retryable = retryable || again;
      if (Clock::now() >= deadline) break;
    }
    auto now = Clock::now();
    if (!retryable || now >= deadline) {
      if (!retryable) return e;
      // kTimeout only if every attempt ran into the deadline (nothing
      // answered at all); otherwise report the last real failure.
      Status shown = last_non_timeout.isOk() ? e : last_non_timeout;
      StatusCode code =
          last_non_timeout.isOk() ? StatusCode::kTimeout : StatusCode::kRefused;
      return Status(code,
                    fmt::format("could not connect to {} within the connect "
                                "deadline ({} attempt{}); last error: {}",
                                endpointList(config), attempt,
                                attempt == 1 ? "" : "s", shown.toString()));
    }
    auto sleep = delay * jitterFactor(config.retry.jitter);
    auto left = deadline - now;
    auto sleep_ns =
        std::min<Clock::duration>(duration_cast<Clock::duration>(sleep),
                                  left);  // never past the deadline
    std::this_thread::sleep_for(sleep_ns);
    delay = std::min(delay * std::max(config.retry.multiplier, 1.0), max_delay);
  }
}

Result<std::unique_ptr<Connection>> Connection::openOnce(
    const ConnectConfig& config, std::size_t endpoint, Deadline deadline,
    bool& retryable) {
  retryable = false;
  const Endpoint& ep = config.endpoints[endpoint];
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  std::string port = std::to_string(ep.port);
  int gai = ::getaddrinfo(ep.host.c_str(), port.c_str(), &hints, &res);
  if (gai != 0) {
    // Name resolution may fail transiently (DNS not up yet, a peer's name not
    // published yet): retry until the deadline.
    retryable = gai == EAI_AGAIN || gai == EAI_NONAME || gai == EAI_FAIL
#ifdef EAI_NODATA
                || gai == EAI_NODATA
#endif
                || (gai == EAI_SYSTEM && retryableErrno(errno));
    return Status::refused(fmt::format("cannot resolve host '{}': {}", ep.host,
                                       ::gai_strerror(gai)));
  }
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> guard(res,
                                                             &::freeaddrinfo);

  Status last = Status::refused("no address");
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    int fd =
        ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                 ai->ai_protocol);
    if (fd < 0) {
      int err = errno;
      last = Status::ioError(fmt::format("socket(): {}", errnoText(err)));
      retryable = retryable || err == EAFNOSUPPORT || retryableErrno(err);
      continue;
    }
    std::unique_ptr<Connection> conn(new Connection(fd, config, endpoint));
    int rc = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
    int err = rc == 0 ? 0 : errno;
    if (rc != 0 && (err == EINPROGRESS || err == EINTR)) {
      int ev = pollFd(fd, POLLOUT, deadline);
      if (ev == 0) {
        retryable = true;
        last = Status::timeout(
            fmt::format("connect to {} timed out", conn->peer()));
        continue;
      }
      if (ev < 0) {
        err = errno;
      } else {
        socklen_t len = sizeof(err);
        if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
          err = errno;
      }
    }
    if (err != 0) {
      retryable = retryable || retryableErrno(err);
      last = err == ECONNREFUSED
                 ? Status::refused(fmt::format("connect to {}: {}",
                                               conn->peer(), errnoText(err)))
                 : Status::ioError(fmt::format("connect to {}: {}",
                                               conn->peer(), errnoText(err)));
      continue;
    }
    int one = 1;
    (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    Status hs = conn->handshake(deadline);
    if (!hs) {
      // A server that closes on our handshake (e.g. a torch 1.13 server
      // reading the 2.x VALIDATE) or one still starting: retry like torch.
      retryable = true;
      if (hs.isTimeout()) {
        last = hs;
      } else {
        last = Status::refused(fmt::format(
            "{} handshake with {} failed: {}{}",
            protocol::dialectName(config.dialect), conn->peer(), hs.toString(),
            hs.isClosed() ? " (a torch 1.13 server? then use dialect 1.13)"
                          : ""));
      }
      continue;
    }
    return conn;
  }
  return last;
}

Status Connection::handshake(Deadline deadline) {
  if (config_.dialect != protocol::Dialect::kV2) return Status::ok();
  const auto nonce = static_cast<std::uint32_t>(::getpid());
  std::string out;
  protocol::encodeRequest(config_.dialect, protocol::requests::validate(), out);
  protocol::encodeRequest(config_.dialect, protocol::requests::ping(nonce),
                          out);
  Status s = sendBytes(out, deadline);
  if (!s) return s;
  OwnedReply reply;
  s = receive(protocol::ReplyShape::kU32, 0, deadline, reply);
  if (!s) return s;
  if (reply.u32 != nonce) {
    return fail(Status::protocolError(
        fmt::format("PING echo {} does not match nonce {}", reply.u32, nonce)));
  }
  return Status::ok();
}

Status Connection::send(const protocol::Request& req, Deadline deadline) {
  std::string out;
  if (!protocol::encodeRequest(config_.dialect, req, out)) {
    return Status::notSupported(fmt::format(
        "{} is not part of the {} dialect", protocol::commandName(req.command),
        protocol::dialectName(config_.dialect)));
  }
  return sendBytes(out, deadline);
}

Status Connection::sendBytes(std::string_view bytes, Deadline deadline) {
  if (broken_) return Status::closed("connection already failed");
  std::size_t off = 0;
  while (off < bytes.size()) {
    ssize_t n = ::send(fd_, bytes.data() + off, bytes.size() - off,
                       MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      off += static_cast<std::size_t>(n);
      continue;
    }
    int err = errno;
    if (n < 0 && err == EINTR) continue;
    if (n < 0 && (err == EAGAIN || err == EWOULDBLOCK)) {
      int ev = pollFd(fd_, POLLOUT, deadline);
      if (ev == 0) {
        return fail(
            Status::timeout(fmt::format("send to {} timed out", peer())));
      }
      if (ev < 0)
        return fail(Status::ioError(fmt::format("poll: {}", errnoText(errno))));
      continue;  // writable, or an error that the next send() reports
    }
    if (err == EPIPE || err == ECONNRESET)
      return fail(closedStatus(peer(), "send"));
    return fail(
        Status::ioError(fmt::format("send to {}: {}", peer(), errnoText(err))));
  }
  return Status::ok();
}

Status Connection::fill(Deadline deadline) {
  if (rx_off_ > 0 && rx_off_ == rx_.size()) {
    rx_.clear();
    rx_off_ = 0;
  } else if (rx_off_ > (1u << 20) && rx_off_ > rx_.size() / 2) {
    rx_.erase(0, rx_off_);
    rx_off_ = 0;
  }
  for (;;) {
    char buf[64 * 1024];
    ssize_t n = ::recv(fd_, buf, sizeof(buf), MSG_DONTWAIT);
    if (n > 0) {
      rx_.append(buf, static_cast<std::size_t>(n));
      return Status::ok();
    }
    if (n == 0) return fail(closedStatus(peer(), "recv"));
    int err = errno;
    if (err == EINTR) continue;
    if (err == EAGAIN || err == EWOULDBLOCK) {
      int ev = pollFd(fd_, POLLIN, deadline);
      if (ev == 0)
        return Status::timeout(fmt::format("no reply from {} in time", peer()));
      if (ev < 0)
        return fail(Status::ioError(fmt::format("poll: {}", errnoText(errno))));
      continue;
    }
    if (err == ECONNRESET || err == EPIPE)
      return fail(closedStatus(peer(), "recv"));
    return fail(Status::ioError(
        fmt::format("recv from {}: {}", peer(), errnoText(err))));
  }
}

Status Connection::receive(protocol::ReplyShape shape, std::uint64_t count,
                           Deadline deadline, OwnedReply& out) {
  if (broken_) return Status::closed("connection already failed");
  protocol::Reply reply;
  std::size_t need = 0;
  for (;;) {
    std::string_view in(rx_.data() + rx_off_, rx_.size() - rx_off_);
    if (in.size() >= need) {
      auto r = protocol::decodeReply(in, shape, config_.limits, reply, count);
      if (r.frame()) {
        out = OwnedReply{};
        out.byte = reply.byte;
        out.u32 = reply.u32;
        out.number = reply.number;
        out.value.assign(reply.value);
        out.values.reserve(reply.values.size());
        for (auto v : reply.values) out.values.emplace_back(v);
        rx_off_ += r.consumed;
        return Status::ok();
      }
      if (r.failed()) {
        return fail(Status::protocolError(
            fmt::format("bad reply from {}: {}", peer(), r.error.message())));
      }
      need = r.need_at_least;
    }
    Status s = fill(deadline);
    if (!s) return s;
  }
}

Result<OwnedReply> Connection::roundTrip(const protocol::Request& req,
                                         Deadline deadline,
                                         std::uint64_t count) {
  Status s = send(req, deadline);
  if (!s) return s;
  OwnedReply reply;
  auto shape = protocol::replyShapeOf(req.command);
  if (shape == protocol::ReplyShape::kNone) return reply;
  s = receive(shape, count, deadline, reply);
  if (!s) {
    broken_ = true;  // a late reply would desynchronize the stream
    return s;
  }
  return reply;
}

bool Connection::idleHealthy() {
  if (broken_ || rx_off_ != rx_.size()) return false;
  pollfd p{fd_, POLLIN, 0};
  int r = ::poll(&p, 1, 0);
  if (r == 0) return true;
  // Readable while idle: EOF, a reset, or unsolicited bytes. Unusable.
  broken_ = true;
  lost_ = true;
  return false;
}

}  // namespace tcpstore::client_detail
