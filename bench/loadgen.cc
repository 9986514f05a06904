#include "bench/loadgen.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

namespace tcpstore::bench {

namespace {
constexpr std::size_t kScratchBytes = 256 * 1024;
constexpr int kMaxEvents = 1024;
}  // namespace

std::int64_t nowNs() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool parseEndpoint(std::string_view s, Endpoint& out, std::string& error) {
  std::string host;
  std::string port;
  if (!s.empty() && s.front() == '[') {
    auto close = s.find(']');
    if (close == std::string_view::npos || close + 1 >= s.size() ||
        s[close + 1] != ':') {
      error = fmt::format("bad address '{}': want [IPV6]:PORT", s);
      return false;
    }
    host = std::string(s.substr(1, close - 1));
    port = std::string(s.substr(close + 2));
  } else {
    auto colon = s.rfind(':');
    if (colon == std::string_view::npos) {
      error = fmt::format("bad address '{}': want HOST:PORT", s);
      return false;
    }
    host = std::string(s.substr(0, colon));
    port = std::string(s.substr(colon + 1));
  }
  if (host == "localhost") host = "127.0.0.1";
  char* end = nullptr;
  long p = std::strtol(port.c_str(), &end, 10);
  if (port.empty() || *end != '\0' || p <= 0 || p > 65535) {
    error = fmt::format("bad port in '{}'", s);
    return false;
  }
  out = Endpoint{};
  out.text = std::string(s);
  auto* v4 = reinterpret_cast<sockaddr_in*>(&out.addr);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&out.addr);
  if (inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<std::uint16_t>(p));
    out.len = sizeof(sockaddr_in);
    out.ipv4 = true;
    return true;
  }
  if (inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<std::uint16_t>(p));
    out.len = sizeof(sockaddr_in6);
    return true;
  }
  error = fmt::format("bad host '{}': want a numeric IPv4/IPv6 address", host);
  return false;
}

std::uint64_t raiseFdLimit() {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 0;
  if (rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    (void)setrlimit(RLIMIT_NOFILE, &rl);
    (void)getrlimit(RLIMIT_NOFILE, &rl);
  }
  return rl.rlim_cur;
}

struct CpuPin::Saved {
  pid_t tid;
  cpu_set_t mask;
};

CpuPin::CpuPin(int cpu, int pid) {
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  auto pin = [&](pid_t tid) {
    auto s = std::make_unique<Saved>();
    s->tid = tid;
    if (sched_getaffinity(tid, sizeof(s->mask), &s->mask) != 0) return;
    if (sched_setaffinity(tid, sizeof(one), &one) != 0) return;
    saved_.push_back(std::move(s));
  };
  pin(0);  // this thread (the generator is single-threaded)
  if (pid <= 0) return;
  std::string dir = fmt::format("/proc/{}/task", pid);
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] >= '0' && e->d_name[0] <= '9') {
        pin(static_cast<pid_t>(std::strtol(e->d_name, nullptr, 10)));
      }
    }
    closedir(d);
  }
}

CpuPin::~CpuPin() {
  for (auto& s : saved_)
    (void)sched_setaffinity(s->tid, sizeof(s->mask), &s->mask);
}

double processCpuSeconds(int pid) {
  std::ifstream f(fmt::format("/proc/{}/stat", pid));
  std::string line;
  if (!f || !std::getline(f, line)) return -1;
  // Fields after the ")" that closes comm: state is field 3; utime 14,
  // stime 15.
  auto rp = line.rfind(')');
  if (rp == std::string::npos) return -1;
  std::istringstream rest(line.substr(rp + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; i <= 15; ++i) {
    if (!(rest >> field)) return -1;
    if (i == 14) utime = std::strtoull(field.c_str(), nullptr, 10);
    if (i == 15) stime = std::strtoull(field.c_str(), nullptr, 10);
  }
  long hz = sysconf(_SC_CLK_TCK);
  if (hz <= 0) hz = 100;
  return static_cast<double>(utime + stime) / static_cast<double>(hz);
}

std::int64_t processRssBytes(int pid) {
  std::ifstream f(fmt::format("/proc/{}/status", pid));
  std::string line;
  while (f && std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) {
      return std::strtoll(line.c_str() + 6, nullptr, 10) * 1024;
    }
  }
  return -1;
}

double selfCpuSeconds() {
  rusage ru{};
  if (getrusage(RUSAGE_SELF, &ru) != 0) return -1;
  auto tv = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6;
  };
  return tv(ru.ru_utime) + tv(ru.ru_stime);
}

std::int64_t tcpExtCounter(std::string_view name) {
  std::ifstream f("/proc/net/netstat");
  std::string names, values;
  while (std::getline(f, names) && std::getline(f, values)) {
    if (names.rfind("TcpExt:", 0) != 0) continue;
    std::istringstream n(names), v(values);
    std::string a, b;
    while (n >> a && v >> b) {
      if (a == name) return std::strtoll(b.c_str(), nullptr, 10);
    }
  }
  return -1;
}

// ---- Loop -------------------------------------------------------------------

Loop::Loop() : epfd_(epoll_create1(EPOLL_CLOEXEC)), scratch_(kScratchBytes) {
  std::random_device rd;
  spread_octet_ = static_cast<std::uint8_t>(2 + rd() % 250);
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  std::uint32_t lo = 0, hi = 0;
  if (range >> lo >> hi && lo >= 1024 && hi <= 65535 && lo < hi) {
    port_lo_ = lo;
    port_hi_ = hi;
  }
  source_next_ = rd() % (port_hi_ - port_lo_ + 1);
}

Loop::~Loop() {
  // The run is over: reset instead of FIN, so that tens of thousands of
  // TIME_WAITs do not crowd the ephemeral ports of this machine (other
  // processes binding port 0 would fail) and the next run's connects.
  const linger abort_now{1, 0};
  for (auto& c : conns_) {
    if (c->fd_ < 0) continue;
    (void)setsockopt(c->fd_, SOL_SOCKET, SO_LINGER, &abort_now,
                     sizeof(abort_now));
    ::close(c->fd_);
  }
  if (epfd_ >= 0) ::close(epfd_);
}

int Loop::openSocket(const Endpoint& ep, int& err) {
  int family = ep.addr.ss_family;
  int fd = ::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    err = errno;
    return -1;
  }
  int one = 1;
  (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (rcvbuf_ > 0) {
    (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf_, sizeof(rcvbuf_));
  }
  if (!ep.ipv4 || source_mode_ == SourceMode::kKernel) return fd;
  sockaddr_in src{};
  src.sin_family = AF_INET;
  if (source_mode_ == SourceMode::kAddrs) {
    // 127.S.x.y, y in 1..250: each source address has its own ephemeral ports.
    (void)setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one,
                     sizeof(one));
    std::uint32_t n = source_next_++ % (250u * 250u);
    std::uint32_t a = (127u << 24) |
                      (static_cast<std::uint32_t>(spread_octet_) << 16) |
                      ((n / 250u + 1u) << 8) | (n % 250u + 1u);
    src.sin_addr.s_addr = htonl(a);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof(src)) != 0) {
      err = errno;
      ::close(fd);
      return -1;
    }
    return fd;
  }
  // kPorts: the destination's address, an explicit port taken round-robin
  // from the ephemeral range. The kernel's own choice scans ports linearly
  // once thousands of connections go to one destination (quadratic overall).
  (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  src.sin_addr = reinterpret_cast<const sockaddr_in*>(&ep.addr)->sin_addr;
  const std::uint32_t span = port_hi_ - port_lo_ + 1;
  for (int attempt = 0; attempt < 256; ++attempt) {
    src.sin_port =
        htons(static_cast<std::uint16_t>(port_lo_ + source_next_++ % span));
    if (::bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof(src)) == 0)
      return fd;
    if (errno != EADDRINUSE) break;
  }
  err = errno;
  ::close(fd);
  return -1;
}

Conn* Loop::connect(const Endpoint& ep, ConnHandler* h, std::uint64_t user) {
  ++stats_.connects_started;
  conns_.push_back(std::make_unique<Conn>());
  Conn* c = conns_.back().get();
  c->handler_ = h;
  c->user = user;
  for (int attempt = 0; attempt < 64; ++attempt) {
    int err = 0;
    int fd = openSocket(ep, err);
    if (fd < 0) {
      ++stats_.connect_errors;
      return nullptr;
    }
    int rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&ep.addr), ep.len);
    if (rc != 0 && errno != EINPROGRESS) {
      err = errno;
      ::close(fd);
      if (err == EADDRNOTAVAIL && ep.ipv4) {
        // That 4-tuple is taken (kPorts: e.g. by a TIME_WAIT of an earlier
        // run), or the kernel ran out of ports: try the next port / explicit
        // ports.
        if (source_mode_ == SourceMode::kKernel)
          source_mode_ = SourceMode::kPorts;
        ++stats_.src_retries;
        continue;
      }
      ++stats_.connect_errors;
      return nullptr;
    }
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
    ev.data.ptr = c;
    if (epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      ::close(fd);
      ++stats_.connect_errors;
      return nullptr;
    }
    c->fd_ = fd;
    c->connecting_ = true;
    ++open_;
    return c;
  }
  ++stats_.connect_errors;
  return nullptr;
}

void Loop::markDirty(Conn& c) {
  if (!c.dirty_) {
    c.dirty_ = true;
    dirty_.push_back(&c);
  }
}

void Loop::send(Conn& c, protocol::Dialect d, const protocol::Request& req,
                std::uint32_t tag, std::uint64_t count) {
  if (!c.open()) return;
  if (!protocol::encodeRequest(d, req, c.out_)) return;
  ++stats_.requests_sent;
  auto shape = protocol::replyShapeOf(req.command);
  if (shape != protocol::ReplyShape::kNone) {
    c.pending_.push_back(Pending{shape, 0, tag, count, nowNs()});
  }
  markDirty(c);
}

void Loop::sendRaw(Conn& c, std::string_view bytes, std::uint32_t expect_len,
                   std::uint32_t tag) {
  if (!c.open()) return;
  c.out_.append(bytes.data(), bytes.size());
  ++stats_.requests_sent;
  if (expect_len > 0) {
    c.pending_.push_back(
        Pending{protocol::ReplyShape::kNone, expect_len, tag, 0, nowNs()});
  }
  markDirty(c);
}

void Loop::close(Conn& c) {
  if (c.fd_ < 0) return;
  ::close(c.fd_);  // also removes it from the epoll set
  c.fd_ = -1;
  c.connecting_ = false;
  --open_;
  std::string().swap(c.out_);
  std::string().swap(c.in_);
  c.out_off_ = 0;
  c.front_done_ = 0;
  c.pending_.clear();
}

void Loop::fail(Conn& c, int err) {
  bool established = !c.connecting_;
  if (established) {
    ++stats_.closed_by_peer;
  } else {
    ++stats_.connect_errors;
  }
  close(c);
  c.handler_->onClosed(c, err, established);
}

void Loop::addTimer(std::int64_t when_ns, TimerHandler* h, std::uint64_t arg) {
  timers_.push(Timer{when_ns, timer_seq_++, h, arg});
}

void Loop::flush(Conn& c) {
  while (c.fd_ >= 0 && !c.connecting_ && c.out_off_ < c.out_.size()) {
    ssize_t n = ::send(c.fd_, c.out_.data() + c.out_off_,
                       c.out_.size() - c.out_off_, MSG_NOSIGNAL);
    if (n > 0) {
      c.out_off_ += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return;  // EPOLLOUT edge follows
    fail(c, n < 0 ? errno : EPIPE);
    return;
  }
  if (c.fd_ >= 0 && c.out_off_ == c.out_.size()) {
    // Sent: a large request's buffer goes back to the heap at once, so the
    // next connection's reuses it (16K ranks each sending a 15 KiB
    // MULTI_GET would otherwise keep 250 MB).
    if (c.out_.capacity() > kKeepBufferBytes) {
      std::string().swap(c.out_);
    } else {
      c.out_.clear();
    }
    c.out_off_ = 0;
  }
}

std::size_t Loop::decode(Conn& c, std::string_view in) {
  std::size_t off = 0;
  while (c.fd_ >= 0 && off < in.size()) {
    if (c.pending_.empty()) {
      ++stats_.protocol_errors;
      fail(c, EPROTO);
      return off;
    }
    std::string_view avail = in.substr(off);
    const Pending p = c.pending_.front();
    if (p.raw_len > 0) {
      // Opaque bytes (echo): consumed as they arrive, never buffered whole.
      const std::uint64_t take =
          std::min<std::uint64_t>(avail.size(), p.raw_len - c.front_done_);
      off += take;
      c.front_done_ += take;
      if (c.front_done_ < p.raw_len) break;
      reply_.clear();
    } else if (p.shape == protocol::ReplyShape::kStrings && p.count > 0 &&
               c.handler_->streamsValues()) {
      // Value by value, each handed over as soon as it is complete.
      bool partial = false;
      while (c.front_done_ < p.count && c.fd_ >= 0) {
        auto r = protocol::decodeReply(avail, protocol::ReplyShape::kString,
                                       limits_, reply_);
        if (r.needMore()) {
          partial = true;
          break;
        }
        if (r.failed()) {
          ++stats_.protocol_errors;
          fail(c, EPROTO);
          return off;
        }
        c.handler_->onValue(c, p, reply_.value);
        off += r.consumed;
        avail.remove_prefix(r.consumed);
        ++c.front_done_;
      }
      if (partial || c.fd_ < 0) break;
      reply_.clear();
      reply_.shape = p.shape;
      reply_.number = static_cast<std::int64_t>(p.count);
    } else {
      reply_.clear();
      reply_.shape = p.shape;
      auto r = protocol::decodeReply(avail, p.shape, limits_, reply_, p.count);
      if (r.needMore()) break;
      if (r.failed()) {
        ++stats_.protocol_errors;
        fail(c, EPROTO);
        return off;
      }
      off += r.consumed;  // reply_'s views stay valid until `in` changes
    }
    c.front_done_ = 0;
    c.pending_.pop_front();
    ++stats_.replies;
    c.handler_->onReply(c, p, reply_);
  }
  return off;
}

void Loop::readAll(Conn& c) {
  while (c.fd_ >= 0) {
    ssize_t n = ::recv(c.fd_, scratch_.data(), scratch_.size(), 0);
    if (n > 0) {
      const std::string_view got(scratch_.data(), static_cast<std::size_t>(n));
      if (c.in_.empty()) {
        // Nothing buffered: decode in place; only a partial reply's bytes
        // are kept (with streamed values, at most one value's).
        const std::size_t used = decode(c, got);
        if (c.fd_ >= 0 && used < got.size()) c.in_.assign(got.substr(used));
      } else {
        c.in_.append(got);
        const std::size_t used = decode(c, c.in_);
        if (c.fd_ >= 0) {
          c.in_.erase(0, used);
          if (c.in_.empty() && c.in_.capacity() > kKeepBufferBytes)
            std::string().swap(c.in_);  // a large reply is done
        }
      }
      if (static_cast<std::size_t>(n) < scratch_.size())
        return;  // drained (ET: EAGAIN next)
      continue;
    }
    if (n == 0) {
      fail(c, ECONNRESET);
      return;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return;
    fail(c, errno);
    return;
  }
}

void Loop::handleEvent(Conn& c, std::uint32_t events) {
  if (c.fd_ < 0) return;
  if (c.connecting_) {
    if (!(events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) return;
    int err = 0;
    socklen_t len = sizeof(err);
    if (getsockopt(c.fd_, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    if (err != 0) {
      fail(c, err);
      return;
    }
    c.connecting_ = false;
    c.handler_->onConnected(c);
    if (c.fd_ < 0) return;
    if (!c.out_.empty()) markDirty(c);
  }
  if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) readAll(c);
  if (c.fd_ >= 0 && (events & EPOLLOUT) && c.out_off_ < c.out_.size()) flush(c);
}

void Loop::runOnce(std::int64_t max_wait_ns) {
  std::int64_t now = nowNs();
  std::int64_t wait_ns = max_wait_ns;
  if (!timers_.empty())
    wait_ns =
        std::min(wait_ns, std::max<std::int64_t>(0, timers_.top().when - now));
  if (!dirty_.empty()) wait_ns = 0;
  int timeout_ms = static_cast<int>((wait_ns + 999999) / 1000000);
  epoll_event events[kMaxEvents];
  int n = epoll_wait(epfd_, events, kMaxEvents, timeout_ms);
  for (int i = 0; i < n; ++i) {
    handleEvent(*static_cast<Conn*>(events[i].data.ptr), events[i].events);
  }
  now = nowNs();
  // Fire due timers; a bounded number per iteration so I/O keeps flowing.
  for (int fired = 0;
       fired < 4096 && !timers_.empty() && timers_.top().when <= now; ++fired) {
    Timer t = timers_.top();
    timers_.pop();
    t.h->onTimer(t.arg);
  }
  // Flush (the list may grow while flushing only through fail() callbacks).
  for (std::size_t i = 0; i < dirty_.size(); ++i) {
    Conn* c = dirty_[i];
    c->dirty_ = false;
    if (c->fd_ >= 0 && !c->connecting_) flush(*c);
  }
  dirty_.clear();
}

// ---- stats and output
// ---------------------------------------------------------

double percentile(std::vector<std::int64_t>& v, double pct) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  double rank = pct / 100.0 * static_cast<double>(v.size() - 1);
  auto lo = static_cast<std::size_t>(std::floor(rank));
  auto hi = std::min(v.size() - 1, lo + 1);
  double frac = rank - static_cast<double>(lo);
  return static_cast<double>(v[lo]) * (1 - frac) +
         static_cast<double>(v[hi]) * frac;
}

namespace {
std::string jsonEscape(std::string_view s) {
  std::string out;
  for (char ch : s) {
    auto u = static_cast<unsigned char>(ch);
    if (ch == '"' || ch == '\\') {
      out.push_back('\\');
      out.push_back(ch);
    } else if (u < 0x20) {
      out += fmt::format("\\u{:04x}", u);
    } else {
      out.push_back(ch);
    }
  }
  return out;
}
}  // namespace

JsonObject& JsonObject::raw(std::string_view k, std::string_view json) {
  if (!body_.empty()) body_ += ", ";
  body_ += fmt::format("\"{}\": {}", jsonEscape(k), json);
  return *this;
}
JsonObject& JsonObject::num(std::string_view k, double v) {
  if (!std::isfinite(v)) return raw(k, "null");
  return raw(k, fmt::format("{:.9g}", v));
}
JsonObject& JsonObject::integer(std::string_view k, std::int64_t v) {
  return raw(k, fmt::format("{}", v));
}
JsonObject& JsonObject::str(std::string_view k, std::string_view v) {
  return raw(k, fmt::format("\"{}\"", jsonEscape(v)));
}
JsonObject& JsonObject::boolean(std::string_view k, bool v) {
  return raw(k, v ? "true" : "false");
}
std::string JsonObject::text() const { return "{" + body_ + "}"; }

bool writeFile(const std::string& path, const std::string& text) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return false;
  bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  ok = std::fputc('\n', f) != EOF && ok;
  return std::fclose(f) == 0 && ok;
}

int forkLoopbackServer(Endpoint& ep, bool below_ephemeral,
                       void (*serve)(int listen_fd)) {
  int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (lfd < 0) return -1;
  int one = 1;
  setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  bool bound = !below_ephemeral &&
               bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  std::mt19937 rng(static_cast<std::uint32_t>(getpid()));
  for (int i = 0; !bound && i < 200; ++i) {
    a.sin_port = htons(static_cast<std::uint16_t>(20000 + rng() % 12000));
    bound = bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  }
  if (!bound || listen(lfd, 4096) != 0 ||
      getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    close(lfd);
    return -1;
  }
  pid_t pid = fork();
  if (pid < 0) {
    close(lfd);
    return -1;
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    serve(lfd);
    _exit(0);
  }
  close(lfd);
  std::string err;
  parseEndpoint(fmt::format("127.0.0.1:{}", ntohs(a.sin_port)), ep, err);
  return pid;
}

}  // namespace tcpstore::bench
