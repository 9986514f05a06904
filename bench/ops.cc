// ops: closed-loop throughput and latency of set/get/add/mix with K idle
// connections held open; echo: the same client code against a raw loopback
// echo server (the floor); memory: server RSS with idle connections and keys.
#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench/scenarios.h"

namespace tcpstore::bench {
namespace {

using protocol::Command;
using protocol::Dialect;
using protocol::Reply;
using protocol::Request;

constexpr std::int64_t kMs = 1000000;

enum Tag : std::uint32_t {
  kTagPing = 1,
  kTagSync,   // GETNUMKEYS used as a fence
  kTagOp,     // the last request of one measured operation
  kTagOther,  // a reply that is not the end of an operation
};

// ---- a raw echo server in a child process (the round-trip floor) -----------

[[noreturn]] void echoServerMain(int lfd) {
  int ep = epoll_create1(EPOLL_CLOEXEC);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = lfd;
  epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev);
  std::vector<char> buf(256 * 1024);
  epoll_event events[256];
  for (;;) {
    int n = epoll_wait(ep, events, 256, 1000);
    if (n < 0 && errno != EINTR) _exit(1);
    if (getppid() == 1) _exit(0);
    for (int i = 0; i < n; ++i) {
      int fd = events[i].data.fd;
      if (fd == lfd) {
        for (;;) {
          int c = accept4(lfd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
          if (c < 0) break;
          epoll_event cev{};
          cev.events = EPOLLIN;
          cev.data.fd = c;
          epoll_ctl(ep, EPOLL_CTL_ADD, c, &cev);
        }
        continue;
      }
      ssize_t r = recv(fd, buf.data(), buf.size(), 0);
      if (r <= 0) {
        if (r < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        close(fd);
        continue;
      }
      // Echo everything back (blocking on a full send buffer is acceptable for
      // a floor).
      std::size_t off = 0;
      while (off < static_cast<std::size_t>(r)) {
        ssize_t w = send(fd, buf.data() + off,
                         static_cast<std::size_t>(r) - off, MSG_NOSIGNAL);
        if (w > 0) {
          off += static_cast<std::size_t>(w);
        } else if (w < 0 && (errno == EAGAIN || errno == EINTR)) {
          std::this_thread::yield();
        } else {
          close(fd);
          break;
        }
      }
    }
  }
}

// ---- connection set-up shared by ops and memory
// ------------------------------

// Opens connections (with the 2.x handshake where needed) and tells when each
// is ready.
class Base : public ConnHandler {
 public:
  Base(const CommonOptions& common) : common_(common) {
    loop_.setSourceMode(common.source_mode);
  }

  void onConnected(Conn& c) override {
    if (common_.dialect == Dialect::kV2) {
      req_.clear();
      req_.command = Command::kValidate;
      req_.u32 = protocol::kValidateMagic;
      loop_.send(c, Dialect::kV2, req_, 0);
      req_.clear();
      req_.command = Command::kPing;
      req_.u32 = 4242;
      loop_.send(c, Dialect::kV2, req_, kTagPing);
    } else {
      ++ready_;
      onReady(c);
    }
  }
  void onReply(Conn& c, const Pending& p, const Reply& r) override {
    if (p.tag == kTagPing) {
      ++ready_;
      onReady(c);
      return;
    }
    onOther(c, p, r);
  }
  void onClosed(Conn&, int err, bool established) override {
    ++lost_;
    if (first_error_.empty()) {
      first_error_ =
          fmt::format("{}: {}", established ? "closed" : "connect failed",
                      std::strerror(err));
    }
  }

 protected:
  virtual void onReady(Conn&) {}
  virtual void onOther(Conn&, const Pending&, const Reply&) {}

  // Runs the loop until pred() or the deadline; false on deadline.
  template <typename Pred>
  bool runUntil(Pred pred, std::int64_t deadline) {
    while (!pred()) {
      std::int64_t now = nowNs();
      if (now >= deadline) return false;
      loop_.runOnce(std::min<std::int64_t>(20 * kMs, deadline - now));
    }
    return true;
  }
  // Opens n connections; true when all are ready.
  bool openConns(std::vector<Conn*>& out, int n, std::uint64_t user_base,
                 std::int64_t deadline) {
    std::size_t target = ready_ + static_cast<std::size_t>(n);
    for (int i = 0; i < n; ++i) {
      Conn* c = loop_.connect(common_.addr(), this,
                              user_base + static_cast<std::uint64_t>(i));
      if (!c) {
        ++lost_;
        continue;
      }
      out.push_back(c);
      // Keep the SYN backlog of a slow server from overflowing: at most 512 in
      // flight.
      if ((i + 1) % 512 == 0) {
        std::size_t want = target - static_cast<std::size_t>(n) +
                           static_cast<std::size_t>(i + 1);
        runUntil([&] { return ready_ + lost_ >= want; }, deadline);
      }
    }
    return runUntil(
               [&] { return ready_ >= target || ready_ + lost_ >= target; },
               deadline) &&
           ready_ >= target;
  }
  // Sends GETNUMKEYS on c and waits for it (everything before it was applied).
  bool fence(Conn& c, std::int64_t deadline) {
    fenced_ = false;
    req_.clear();
    req_.command = Command::kGetNumKeys;
    loop_.send(c, common_.dialect, req_, kTagSync);
    return runUntil([&] { return fenced_ || !c.open(); }, deadline) && fenced_;
  }

  const CommonOptions& common_;
  Loop loop_;
  Request req_;
  std::size_t ready_ = 0;
  std::size_t lost_ = 0;
  bool fenced_ = false;
  std::int64_t fence_value_ = 0;
  std::string first_error_;
};

// ---- ops
// ---------------------------------------------------------------------

class Ops final : public Base {
 public:
  Ops(const CommonOptions& common, const OpsOptions& opt)
      : Base(common), opt_(opt) {
    value_.assign(static_cast<std::size_t>(std::max(0, opt.value_bytes)), 'v');
    for (int i = 0; i < std::max(1, opt.keys); ++i) {
      keys_.push_back(fmt::format("/{}/bench/k{}", common.key_prefix, i));
      counters_.push_back(fmt::format("/{}/bench/c{}", common.key_prefix, i));
    }
    echo_ = opt.op == "echo";
  }
  int run(int echo_pid);

 protected:
  void onOther(Conn& c, const Pending& p, const Reply& r) override {
    if (p.tag == kTagSync) {
      fenced_ = true;
      fence_value_ = r.number;
      return;
    }
    if (p.tag != kTagOp) return;
    --inflight_;
    std::int64_t now = nowNs();
    if (now >= measure_start_ && now < measure_end_) {
      lat_.push_back(now - p.sent_ns);
      ++ops_measured_;
      requests_measured_ +=
          std::max<std::uint64_t>(1, p.count);  // requests in this op
    }
    if (now < measure_end_) issue(c);
  }

 private:
  void issue(Conn& c);

  OpsOptions opt_;
  std::vector<Conn*> clients_, idle_;
  std::vector<std::string> keys_, counters_;
  std::string value_;
  std::string echo_bytes_;
  bool echo_ = false;
  std::int64_t measure_start_ = 0, measure_end_ = 0;
  std::int64_t inflight_ = 0;
  std::uint64_t ops_measured_ = 0, requests_measured_ = 0;
  std::vector<std::int64_t> lat_;
  std::mt19937 rng_{12345};
};

void Ops::issue(Conn& c) {
  ++inflight_;
  if (echo_) {
    loop_.sendRaw(c, echo_bytes_,
                  static_cast<std::uint32_t>(echo_bytes_.size()), kTagOp);
    return;
  }
  std::uint32_t k = rng_() % static_cast<std::uint32_t>(keys_.size());
  std::string_view op = opt_.op;
  if (op == "mix") {
    std::uint32_t dice = rng_() % 10;  // 60% get, 20% add, 20% set
    op = dice < 6 ? "get" : dice < 8 ? "add" : "set";
  }
  req_.clear();
  if (op == "get") {
    req_.command = Command::kGet;
    req_.key = keys_[k];
    loop_.send(c, common_.dialect, req_, kTagOp, 1);
  } else if (op == "add") {
    req_.command = Command::kAdd;
    req_.key = counters_[k];
    req_.number = 1;
    loop_.send(c, common_.dialect, req_, kTagOp, 1);
  } else {
    // SET has no reply: the operation is SET + CHECK of the same key (2
    // requests).
    req_.command = Command::kSet;
    req_.key = keys_[k];
    req_.value = value_;
    loop_.send(c, common_.dialect, req_, kTagOther);
    req_.clear();
    req_.command = Command::kCheck;
    req_.keys.push_back(keys_[k]);
    loop_.send(c, common_.dialect, req_, kTagOp, 2);
  }
}

int Ops::run(int echo_pid) {
  const std::int64_t t0 = nowNs();
  const std::int64_t deadline =
      t0 + static_cast<std::int64_t>(common_.timeout_s * 1e9);
  bool ok = true;
  if (opt_.idle > 0) ok = openConns(idle_, opt_.idle, 1u << 20, deadline);
  const std::size_t idle_ready = ready_;
  if (ok) ok = openConns(clients_, std::max(1, opt_.clients), 0, deadline);
  if (!ok) {
    fmt::print(stderr,
               "ops: could not open {} idle + {} client connections ({} ready, "
               "{} lost: {})\n",
               opt_.idle, opt_.clients, ready_, lost_, first_error_);
    return 1;
  }
  if (echo_) {
    req_.clear();
    req_.command = Command::kGet;
    req_.key = keys_[0];
    protocol::encodeRequest(common_.dialect, req_, echo_bytes_);
  } else if (opt_.op == "get" || opt_.op == "mix") {
    // Populate the keys that GET reads, in batches fenced by GETNUMKEYS.
    Conn& c0 = *clients_[0];
    for (std::size_t i = 0; i < keys_.size(); ++i) {
      req_.clear();
      req_.command = Command::kSet;
      req_.key = keys_[i];
      req_.value = value_;
      loop_.send(c0, common_.dialect, req_, 0);
      if ((i + 1) % 1000 == 0 && !fence(c0, deadline)) return 1;
    }
    if (!fence(c0, deadline)) return 1;
  }
  const int pid = echo_ ? echo_pid : common_.server_pid;
  // Pinned only now, so that opening thousands of idle connections used both
  // CPUs.
  std::unique_ptr<CpuPin> pin;
  if (common_.pin_cpu >= 0)
    pin = std::make_unique<CpuPin>(common_.pin_cpu, pid);
  const std::int64_t start = nowNs();
  measure_start_ = start + static_cast<std::int64_t>(opt_.warmup_s * 1e9);
  measure_end_ = measure_start_ + static_cast<std::int64_t>(opt_.seconds * 1e9);
  if (measure_end_ > deadline) measure_end_ = deadline;
  lat_.reserve(1 << 20);
  for (Conn* c : clients_) {
    for (int d = 0; d < std::max(1, opt_.pipeline); ++d) issue(*c);
  }
  double cpu0 = -1, cpu1 = -1;
  std::uint64_t lost_before = lost_;
  while (nowNs() < measure_start_) loop_.runOnce(measure_start_ - nowNs());
  if (pid > 0) cpu0 = processCpuSeconds(pid);
  while (nowNs() < measure_end_ && lost_ == lost_before)
    loop_.runOnce(measure_end_ - nowNs());
  if (pid > 0) cpu1 = processCpuSeconds(pid);
  // Drain what is still in flight (not measured).
  runUntil([&] { return inflight_ <= 0 || lost_ != lost_before; },
           std::min(deadline, nowNs() + 5000 * kMs));
  const double secs = static_cast<double>(measure_end_ - measure_start_) / 1e9;
  const double p50 = percentile(lat_, 50) / 1e3;
  const double p99 = percentile(lat_, 99) / 1e3;
  const double p999 = percentile(lat_, 99.9) / 1e3;
  const double pmin =
      lat_.empty() ? 0 : static_cast<double>(lat_.front()) / 1e3;
  const double cpu = (cpu0 >= 0 && cpu1 >= 0) ? cpu1 - cpu0 : -1;
  const double ops_s = static_cast<double>(ops_measured_) / secs;
  const double req_s = static_cast<double>(requests_measured_) / secs;
  const double cpu_per_req_us =
      (cpu >= 0 && requests_measured_ > 0)
          ? cpu * 1e6 / static_cast<double>(requests_measured_)
          : -1;
  std::string dialect(protocol::dialectName(common_.dialect));
  const bool failed = lost_ != 0;
  fmt::print(
      "ops dialect={} op={} clients={} pipeline={} idle={}: {:.0f} ops/s "
      "({:.0f} req/s), latency "
      "us p50 {:.1f} p99 {:.1f} p99.9 {:.1f} min {:.1f}, server cpu {} ({} "
      "us/request){}\n",
      dialect, opt_.op, clients_.size(), opt_.pipeline, idle_ready, ops_s,
      req_s, p50, p99, p999, pmin,
      cpu >= 0 ? fmt::format("{:.3f} s", cpu) : std::string("n/a"),
      cpu_per_req_us >= 0 ? fmt::format("{:.2f}", cpu_per_req_us)
                          : std::string("n/a"),
      failed ? fmt::format(" [{} connections lost: {}]", lost_, first_error_)
             : std::string());
  if (!common_.json_path.empty()) {
    JsonObject j;
    j.str("mode", echo_ ? "echo" : "ops")
        .str("addr", common_.addr().text)
        .str("dialect", dialect)
        .str("op", opt_.op)
        .integer("clients", static_cast<std::int64_t>(clients_.size()))
        .integer("pipeline", opt_.pipeline)
        .integer("pinned_cpu", common_.pin_cpu)
        .integer("idle", static_cast<std::int64_t>(idle_ready))
        .integer("value_bytes", opt_.value_bytes)
        .integer("keys", static_cast<std::int64_t>(keys_.size()))
        .num("seconds", secs)
        .integer("ops", static_cast<std::int64_t>(ops_measured_))
        .integer("requests", static_cast<std::int64_t>(requests_measured_))
        .num("ops_per_s", ops_s)
        .num("requests_per_s", req_s)
        .num("p50_us", p50)
        .num("p99_us", p99)
        .num("p999_us", p999)
        .num("min_us", pmin)
        .integer("server_pid", pid)
        .num("server_cpu_s", cpu >= 0 ? cpu : std::nan(""))
        .num("server_cpu_per_request_us",
             cpu_per_req_us >= 0 ? cpu_per_req_us : std::nan(""))
        .integer("conn_lost", static_cast<std::int64_t>(lost_))
        .str("first_error", first_error_);
    if (!writeFile(common_.json_path, j.text())) return 1;
  }
  return failed ? 1 : 0;
}

// ---- memory
// ------------------------------------------------------------------

class Memory final : public Base {
 public:
  Memory(const CommonOptions& common, const MemoryOptions& opt)
      : Base(common), opt_(opt) {}
  int run();

 protected:
  void onOther(Conn&, const Pending& p, const Reply& r) override {
    if (p.tag == kTagSync) {
      fenced_ = true;
      fence_value_ = r.number;
    }
  }

 private:
  MemoryOptions opt_;
  std::vector<Conn*> ctl_, idle_;
};

void settle(int ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

int Memory::run() {
  const int pid = common_.server_pid;
  if (pid <= 0 || processRssBytes(pid) < 0) {
    fmt::print(stderr, "memory: needs --server-pid of a live server\n");
    return 1;
  }
  const std::int64_t deadline =
      nowNs() + static_cast<std::int64_t>(common_.timeout_s * 1e9);
  if (!openConns(ctl_, 1, 0, deadline) || !fence(*ctl_[0], deadline)) {
    fmt::print(stderr, "memory: cannot reach the server: {}\n", first_error_);
    return 1;
  }
  const std::int64_t keys_before = fence_value_;
  settle(300);
  const std::int64_t rss0 = processRssBytes(pid);
  if (opt_.idle > 0 && !openConns(idle_, opt_.idle, 1u << 20, deadline)) {
    fmt::print(stderr, "memory: could not open {} idle connections: {}\n",
               opt_.idle, first_error_);
    return 1;
  }
  if (!fence(*ctl_[0], deadline)) return 1;
  settle(300);
  const std::int64_t rss1 = processRssBytes(pid);
  // M keys of exactly key_bytes bytes each, value_bytes values.
  std::string value(static_cast<std::size_t>(std::max(0, opt_.value_bytes)),
                    'v');
  std::string key;
  Conn& c = *ctl_[0];
  for (int i = 0; i < opt_.keys; ++i) {
    key = fmt::format("/{}/m/{}/", common_.key_prefix, i);
    if (static_cast<int>(key.size()) < opt_.key_bytes) {
      key.append(static_cast<std::size_t>(opt_.key_bytes) - key.size(), 'k');
    }
    req_.clear();
    req_.command = Command::kSet;
    req_.key = key;
    req_.value = value;
    loop_.send(c, common_.dialect, req_, 0);
    if ((i + 1) % 2000 == 0 && !fence(c, deadline)) return 1;
  }
  if (!fence(c, deadline)) return 1;
  const std::int64_t added = fence_value_ - keys_before;
  settle(500);
  const std::int64_t rss2 = processRssBytes(pid);
  const double per_conn =
      opt_.idle > 0 ? static_cast<double>(rss1 - rss0) / opt_.idle : 0;
  const double per_key =
      added > 0 ? static_cast<double>(rss2 - rss1) / static_cast<double>(added)
                : 0;
  fmt::print(
      "memory dialect={} keys={} (key {} B, value {} B) idle={}: rss {:.1f} "
      "MiB -> {:.1f} MiB "
      "with idle conns -> {:.1f} MiB with keys; {:.0f} bytes/idle conn, {:.0f} "
      "bytes/key\n",
      protocol::dialectName(common_.dialect), added, opt_.key_bytes,
      opt_.value_bytes, idle_.size(), static_cast<double>(rss0) / 1048576.0,
      static_cast<double>(rss1) / 1048576.0,
      static_cast<double>(rss2) / 1048576.0, per_conn, per_key);
  if (!common_.json_path.empty()) {
    JsonObject j;
    j.str("mode", "memory")
        .str("addr", common_.addr().text)
        .str("dialect", protocol::dialectName(common_.dialect))
        .integer("keys", added)
        .integer("key_bytes", opt_.key_bytes)
        .integer("value_bytes", opt_.value_bytes)
        .integer("idle", static_cast<std::int64_t>(idle_.size()))
        .integer("rss_base", rss0)
        .integer("rss_idle", rss1)
        .integer("rss_keys", rss2)
        .num("bytes_per_idle_conn", per_conn)
        .num("bytes_per_key", per_key)
        .integer("server_pid", pid);
    if (!writeFile(common_.json_path, j.text())) return 1;
  }
  return added == opt_.keys ? 0 : 1;
}

}  // namespace

int startEchoServer(Endpoint& ep) {
  // Port 0 first; when the ephemeral range is crowded (TIME_WAITs of big
  // runs), random ports below it.
  return forkLoopbackServer(ep, false, echoServerMain);
}

void stopChild(int pid) {
  if (pid <= 0) return;
  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
}

int runOps(const CommonOptions& common, const OpsOptions& opt) {
  CommonOptions c = common;
  int echo_pid = 0;
  if (opt.op == "echo") {
    echo_pid = startEchoServer(c.onlyAddr());
    if (echo_pid <= 0) {
      fmt::print(stderr, "echo: cannot start the echo server: {}\n",
                 std::strerror(errno));
      return 1;
    }
    c.dialect =
        Dialect::kV113;  // no handshake: the echo server only reflects bytes
  }
  int rc = 0;
  {
    auto ops = std::make_unique<Ops>(c, opt);
    rc = ops->run(echo_pid);
  }
  stopChild(echo_pid);
  return rc;
}

int runMemory(const CommonOptions& common, const MemoryOptions& opt) {
  auto m = std::make_unique<Memory>(common, opt);
  return m->run();
}

}  // namespace tcpstore::bench
