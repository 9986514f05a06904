#include "bench/abuse_probe.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <utility>

#include "protocol/requests.h"

namespace tcpstore::bench::abuse {

namespace req = protocol::requests;
using protocol::DecodeResult;
using protocol::ReplyShape;

void encode2(const protocol::Request& r, std::string& out) {
  protocol::encodeRequest(protocol::Dialect::kV2, r, out);
}
std::string encode2(const protocol::Request& r) {
  std::string out;
  encode2(r, out);
  return out;
}

namespace {

// Milliseconds left until `deadline` for poll(), at least 0.
int msLeft(std::int64_t deadline) {
  const std::int64_t left = deadline - nowNs();
  if (left <= 0) return 0;
  return static_cast<int>(std::min<std::int64_t>(left / 1000000 + 1, 1000));
}

// Waits for `events` on fd; false once the deadline passed.
bool waitFor(int fd, short events, std::int64_t deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, msLeft(deadline));
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) return false;
    if (nowNs() >= deadline) return false;
  }
}

}  // namespace

RawSock::RawSock(RawSock&& o) noexcept
    : fd_(std::exchange(o.fd_, -1)),
      in_(std::move(o.in_)),
      in_off_(std::exchange(o.in_off_, 0)),
      nonce_(o.nonce_) {}

RawSock& RawSock::operator=(RawSock&& o) noexcept {
  if (this != &o) {
    close();
    fd_ = std::exchange(o.fd_, -1);
    in_ = std::move(o.in_);
    in_off_ = std::exchange(o.in_off_, 0);
    nonce_ = o.nonce_;
  }
  return *this;
}

void RawSock::close() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  in_.clear();
  in_off_ = 0;
}

RawSock RawSock::connect(const Endpoint& ep, std::int64_t deadline,
                         bool handshake, int rcvbuf) {
  RawSock s;
  const int fd = ::socket(ep.addr.ss_family,
                          SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return s;
  s.fd_ = fd;
  if (rcvbuf > 0) {
    ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
  }
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&ep.addr), ep.len) != 0) {
    if (errno != EINPROGRESS || !waitFor(fd, POLLOUT, deadline)) {
      s.close();
      return s;
    }
    int err = 0;
    socklen_t len = sizeof err;
    if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
      s.close();
      return s;
    }
  }
  if (handshake) {
    std::string m = encode2(req::validate());
    if (!s.sendAll(m, deadline) || !s.fence(deadline)) s.close();
  }
  return s;
}

bool RawSock::sendAll(std::string_view bytes, std::int64_t deadline) {
  std::size_t off = 0;
  while (off < bytes.size()) {
    const long n = sendSome(bytes.substr(off));
    if (n < 0) return false;
    off += static_cast<std::size_t>(n);
    if (off < bytes.size() && !waitFor(fd_, POLLOUT, deadline)) return false;
  }
  return true;
}

long RawSock::sendSome(std::string_view bytes) {
  if (fd_ < 0) return -1;
  if (bytes.empty()) return 0;
  for (;;) {
    const ssize_t n =
        ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) return static_cast<long>(n);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    return -1;
  }
}

bool RawSock::fill(std::int64_t deadline) {
  if (fd_ < 0) return false;
  if (in_off_ > 0 && in_off_ * 2 >= in_.size()) {
    in_.erase(0, in_off_);
    in_off_ = 0;
  }
  char buf[64 * 1024];
  for (;;) {
    const ssize_t n = ::recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) {
      in_.append(buf, static_cast<std::size_t>(n));
      return true;
    }
    if (n == 0) return false;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return false;
    if (!waitFor(fd_, POLLIN, deadline)) return false;
  }
}

bool RawSock::recvReply(ReplyShape shape, protocol::Reply& out,
                        std::int64_t deadline) {
  static const protocol::Limits limits;
  for (;;) {
    const std::string_view have =
        std::string_view(in_).substr(std::min(in_off_, in_.size()));
    const DecodeResult r = protocol::decodeReply(have, shape, limits, out);
    if (r.kind == DecodeResult::kFrame) {
      in_off_ += r.consumed;
      return true;
    }
    if (r.kind == DecodeResult::kError) return false;
    if (!fill(deadline)) return false;
  }
}

bool RawSock::fence(std::int64_t deadline) {
  const std::uint32_t nonce = 0xAB000000u | (nonce_++ & 0xFFFFFFu);
  if (!sendAll(encode2(req::ping(nonce)), deadline)) return false;
  protocol::Reply r;
  return recvReply(ReplyShape::kU32, r, deadline) && r.u32 == nonce;
}

bool RawSock::peerClosed() const {
  if (fd_ < 0) return true;
  pollfd p{fd_, POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

bool RawSock::waitClosed(std::int64_t deadline, std::string* got) {
  if (got != nullptr) got->assign(in_, std::min(in_off_, in_.size()));
  in_.clear();
  in_off_ = 0;
  if (fd_ < 0) return true;
  char buf[64 * 1024];
  for (;;) {
    const ssize_t n = ::recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) {
      if (got != nullptr) got->append(buf, static_cast<std::size_t>(n));
      continue;
    }
    if (n == 0) return true;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return true;  // reset
    if (!waitFor(fd_, POLLIN, deadline)) return false;
  }
}

// ---- RssSampler
// --------------------------------------------------------------

RssSampler::RssSampler(int pid) {
  for (auto& p : peak_) p.store(-1);
  for (auto& l : lag_) l.store(0);
  if (pid > 0) {
    fd_ = ::open(fmt::format("/proc/{}/statm", pid).c_str(),
                 O_RDONLY | O_CLOEXEC);
  }
  thread_ = std::thread([this] {
    constexpr std::int64_t kPeriod = 5000000;
    while (!stop_.load()) {
      if (fd_ >= 0) note(now());
      const std::int64_t t = nowNs();
      std::this_thread::sleep_for(std::chrono::nanoseconds(kPeriod));
      const std::int64_t late = nowNs() - t - kPeriod;
      auto& l = lag_[phase_.load()];
      std::int64_t cur = l.load();
      while (late > cur && !l.compare_exchange_weak(cur, late)) {
      }
    }
  });
}

RssSampler::~RssSampler() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
  if (fd_ >= 0) ::close(fd_);
}

std::int64_t RssSampler::now() const {
  if (fd_ < 0) return -1;
  char buf[128];
  const ssize_t n = ::pread(fd_, buf, sizeof buf - 1, 0);
  if (n <= 0) return -1;
  buf[n] = '\0';
  char* end = nullptr;
  std::strtoull(buf, &end, 10);  // size
  const unsigned long long resident = std::strtoull(end, nullptr, 10);
  return static_cast<std::int64_t>(resident) * ::sysconf(_SC_PAGESIZE);
}

void RssSampler::note(std::int64_t rss) {
  auto& p = peak_[phase_.load()];
  std::int64_t cur = p.load();
  while (rss > cur && !p.compare_exchange_weak(cur, rss)) {
  }
}

void RssSampler::setPhase(int phase) {
  phase_.store(phase);
  note(now());
}

// ---- Probe
// -------------------------------------------------------------------

Probe::Probe(const Endpoint& ep, std::string key_prefix, double interval_ms,
             double timeout_s)
    : ep_(ep),
      prefix_(std::move(key_prefix)),
      interval_ns_(static_cast<std::int64_t>(interval_ms * 1e6)),
      timeout_ns_(static_cast<std::int64_t>(timeout_s * 1e9)) {
  for (int i = 0; i < kKeys; ++i) {
    keys_[i] = fmt::format("/{}/probe/{}", prefix_, i);
  }
  samples_.reserve(1 << 20);
}

Probe::~Probe() { stop(); }

bool Probe::start(std::string& error) {
  sock_ = RawSock::connect(ep_, nowNs() + timeout_ns_, true);
  if (!sock_.ok()) {
    error = "the probe cannot connect";
    return false;
  }
  thread_ = std::thread([this] { run(); });
  return true;
}

void Probe::stop() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

bool Probe::reconnect() {
  sock_ = RawSock::connect(ep_, nowNs() + timeout_ns_, true);
  return sock_.ok();
}

bool Probe::roundTrip(std::uint64_t n) {
  const int j = static_cast<int>(n % kKeys);
  const int other = (j + 1) % kKeys;
  // A fresh value each time, its length varying (16..143 bytes).
  value_ = fmt::format("{}:{}:", prefix_, n);
  value_.resize(16 + n % 128 + value_.size() % 16,
                static_cast<char>('a' + n % 26));
  msg_.clear();
  encode2(req::set(keys_[j], value_), msg_);
  encode2(req::get(keys_[j]), msg_);
  const bool check_other = !expected_[other].empty();
  if (check_other) encode2(req::get(keys_[other]), msg_);
  const std::int64_t deadline = nowNs() + timeout_ns_;
  expected_[j].clear();  // unknown until the reply confirms it
  if (!sock_.sendAll(msg_, deadline)) return false;
  const int ph = phase_.load();
  if (!sock_.recvReply(protocol::ReplyShape::kString, reply_, deadline)) {
    return false;
  }
  if (reply_.value != value_) ++data_errors_[ph];
  expected_[j] = value_;
  if (check_other) {
    if (!sock_.recvReply(protocol::ReplyShape::kString, reply_, deadline)) {
      return false;
    }
    if (reply_.value != expected_[other]) ++data_errors_[ph];
  }
  return true;
}

void Probe::run() {
  std::int64_t next = nowNs();
  for (std::uint64_t n = 0; !stop_.load(); ++n) {
    const std::int64_t now = nowNs();
    if (next > now) {
      std::this_thread::sleep_for(std::chrono::nanoseconds(next - now));
    }
    next = std::max(next + interval_ns_, nowNs());
    const int phase = phase_.load();
    const std::int64_t t0 = nowNs();
    const bool ok = roundTrip(n);
    samples_.push_back({phase, t0, nowNs() - t0});
    if (!ok) {
      ++lost_[phase];
      // A value whose SET may or may not have been applied is unknown.
      for (auto& e : expected_) e.clear();
      const std::int64_t until = nowNs() + timeout_ns_;
      while (!stop_.load() && nowNs() < until && !reconnect()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
  }
}

ProbeStats Probe::stats(int phase) const {
  ProbeStats s;
  std::vector<std::int64_t> ns;
  std::int64_t worst = -1;
  for (const Sample& x : samples_) {
    if (x.phase != phase) continue;
    ns.push_back(x.ns);
    if (x.ns > worst) {
      worst = x.ns;
      s.max_at_ns = x.at;
    }
  }
  s.round_trips = ns.size();
  s.data_errors = data_errors_[phase];
  s.lost = lost_[phase];
  if (!ns.empty()) {
    s.max_ms =
        static_cast<double>(*std::max_element(ns.begin(), ns.end())) / 1e6;
    s.p99_ms = percentile(ns, 99) / 1e6;
    s.p50_ms = percentile(ns, 50) / 1e6;
  }
  return s;
}

std::uint64_t Probe::dataErrors() const {
  std::uint64_t n = 0;
  for (auto e : data_errors_) n += e;
  return n;
}
std::uint64_t Probe::lost() const {
  std::uint64_t n = 0;
  for (auto e : lost_) n += e;
  return n;
}

}  // namespace tcpstore::bench::abuse
