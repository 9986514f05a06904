// tcpstore server: one libuv loop thread owns every connection, the keyspace
// and the counters' write side. See include/tcpstore/server.h for the API and
// house-style.md §4.5-§4.6 for the buffer and flush model.
#include "tcpstore/server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "protocol/codec.h"
#include "store/keyspace.h"
#include "store/server/log.h"

namespace tcpstore {

namespace {

using protocol::Command;
using protocol::DecodeErrorCode;
using protocol::DecodeResult;
using protocol::Dialect;
using server::LogLevel;
using store::ConnId;

// Bytes of the loop-wide read buffer. Reads land there unless a connection is
// in the middle of a message too large for it.
constexpr std::size_t kScratchBytes = 64 * 1024;
// A connection reading in place gets at least this much free tail.
constexpr std::size_t kMinFreeTail = 64 * 1024;
// Input buffers above this are released when they become empty, so a large
// request does not pin memory on an idle connection.
constexpr std::size_t kKeepInputBytes = 64 * 1024;
// Output buffers above this are released once written.
constexpr std::size_t kKeepOutputBytes = 64 * 1024;
constexpr std::size_t kMinInputCapacity = 256;
constexpr std::size_t kMaxBufBytes = std::size_t{1} << 30;
// Stop: how long pending replies may take to drain before connections are cut.
constexpr std::uint64_t kStopFlushMs = 1000;
// Protocol-error log lines per second before suppression.
constexpr int kMaxErrorLinesPerSecond = 10;

static_assert(ServerCounters::kCommands ==
              static_cast<int>(protocol::kCommandCount));

// Single writer (the loop thread), any number of readers: a relaxed load and
// store is race-free and costs a plain move on x86-64 and arm64.
inline void bump(std::atomic<std::uint64_t>& a, std::uint64_t n = 1) noexcept {
  a.store(a.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
}
inline std::uint64_t get(const std::atomic<std::uint64_t>& a) noexcept {
  return a.load(std::memory_order_relaxed);
}

struct AtomicCounters {
  std::atomic<std::uint64_t> requests[ServerCounters::kCommands] = {};
  std::atomic<std::uint64_t> requests_total{0};
  std::atomic<std::uint64_t> connections_accepted{0};
  std::atomic<std::uint64_t> connections_closed{0};
  std::atomic<std::uint64_t> connections_v113{0};
  std::atomic<std::uint64_t> connections_v2{0};
  std::atomic<std::uint64_t> rejected_protocol{0};
  std::atomic<std::uint64_t> rejected_limit{0};
  std::atomic<std::uint64_t> rejected_semantic{0};
  std::atomic<std::uint64_t> rejected_slow_reader{0};
  std::atomic<std::uint64_t> accept_errors{0};
  std::atomic<std::uint64_t> connections_shed{0};
  std::atomic<std::uint64_t> bytes_in{0};
  std::atomic<std::uint64_t> bytes_out{0};
};

// One contiguous byte buffer with a consumed front [0, begin) and a free tail
// [end, cap). Grows geometrically; never shrinks while it holds bytes.
class InputBuffer {
 public:
  std::size_t size() const noexcept { return end_ - begin_; }
  bool empty() const noexcept { return end_ == begin_; }
  char* data() noexcept { return buf_.get() + begin_; }
  std::size_t capacity() const noexcept { return cap_; }

  // Makes sure at least `n` bytes are free after the data; returns the tail.
  char* reserveTail(std::size_t n) {
    if (cap_ - end_ >= n) return buf_.get() + end_;
    std::size_t live = size();
    if (begin_ > 0 && cap_ - live >= n) {  // enough room once compacted
      std::memmove(buf_.get(), buf_.get() + begin_, live);
      begin_ = 0;
      end_ = live;
      return buf_.get() + end_;
    }
    std::size_t want = live + n;
    std::size_t cap = cap_ < kMinInputCapacity ? kMinInputCapacity : cap_ * 2;
    while (cap < want) cap *= 2;
    std::unique_ptr<char[]> next(new char[cap]);
    if (live > 0) std::memcpy(next.get(), buf_.get() + begin_, live);
    buf_ = std::move(next);
    cap_ = cap;
    begin_ = 0;
    end_ = live;
    return buf_.get() + end_;
  }
  std::size_t freeTail() const noexcept { return cap_ - end_; }
  char* tail() noexcept { return buf_.get() + end_; }
  void commit(std::size_t n) noexcept { end_ += n; }
  void append(const char* p, std::size_t n) {
    std::memcpy(reserveTail(n), p, n);
    end_ += n;
  }
  void consume(std::size_t n) noexcept { begin_ += n; }
  // Once per read batch: free when empty (large buffers are released), move the
  // tail to the front when the consumed part is past half.
  void trim() noexcept {
    if (begin_ == end_) {
      begin_ = end_ = 0;
      if (cap_ > kKeepInputBytes) {
        buf_.reset();
        cap_ = 0;
      }
    } else if (begin_ > cap_ / 2) {
      std::size_t live = size();
      std::memmove(buf_.get(), buf_.get() + begin_, live);
      begin_ = 0;
      end_ = live;
    }
  }

 private:
  std::unique_ptr<char[]> buf_;
  std::size_t cap_ = 0;
  std::size_t begin_ = 0;
  std::size_t end_ = 0;
};

std::string formatSockaddr(const sockaddr* sa) {
  char host[INET6_ADDRSTRLEN] = "?";
  if (sa->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    uv_ip4_name(in, host, sizeof host);
    return fmt::format("{}:{}", host, ntohs(in->sin_port));
  }
  if (sa->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    uv_ip6_name(in6, host, sizeof host);
    return fmt::format("[{}]:{}", host, ntohs(in6->sin6_port));
  }
  return "?";
}

std::uint16_t sockaddrPort(const sockaddr* sa) {
  if (sa->sa_family == AF_INET)
    return ntohs(reinterpret_cast<const sockaddr_in*>(sa)->sin_port);
  if (sa->sa_family == AF_INET6) {
    return ntohs(reinterpret_cast<const sockaddr_in6*>(sa)->sin6_port);
  }
  return 0;
}

int listenBacklog() {
  int backlog = 4096;
  if (std::FILE* f = std::fopen("/proc/sys/net/core/somaxconn", "r")) {
    int v = 0;
    if (std::fscanf(f, "%d", &v) == 1 && v > 0) backlog = v;
    std::fclose(f);
  }
  return backlog;
}

std::string errnoText(int err) {
  return fmt::format("{} ({})", std::strerror(err), err);
}

// Which counter a decode error is charged to.
bool isLimitError(DecodeErrorCode c) {
  switch (c) {
    case DecodeErrorCode::kKeyTooLong:
    case DecodeErrorCode::kValueTooLong:
    case DecodeErrorCode::kTooManyKeys:
    case DecodeErrorCode::kRequestTooLarge:
      return true;
    default:
      return false;
  }
}

// Process-wide multi-tenant registry: port -> running server.
std::mutex& registryMutex() {
  static std::mutex mu;
  return mu;
}
std::map<std::uint16_t, std::weak_ptr<Server>>& registry() {
  static std::map<std::uint16_t, std::weak_ptr<Server>> reg;
  return reg;
}

}  // namespace

struct ServerConn;

namespace {
store::KeyspaceOptions keyspaceOptions(const ServerOptions& o) {
  store::KeyspaceOptions ko;
  ko.compare_set_wakes = o.compare_set_wakes;
  ko.get_missing_returns_empty =
      false;  // GET of a missing key closes, like every real server
  ko.max_value_bytes = o.limits.max_value_bytes;
  // A reply over twice the output cap could never be delivered (the
  // connection is dropped as a slow reader); refuse to build it.
  const std::uint64_t cap = o.limits.max_buffered_output_bytes;
  const std::uint64_t two_caps = cap > UINT64_MAX / 2 ? UINT64_MAX : 2 * cap;
  const std::uint64_t one_value = o.limits.max_value_bytes > UINT64_MAX - 8
                                      ? UINT64_MAX
                                      : o.limits.max_value_bytes + 8;
  ko.max_reply_bytes = std::max(two_caps, one_value);
  return ko;
}
}  // namespace

struct Server::Impl {
  explicit Impl(const ServerOptions& o)
      : options(o), keyspace(keyspaceOptions(o)) {
    limits.max_key_bytes = o.limits.max_key_bytes;
    limits.max_value_bytes = o.limits.max_value_bytes;
    limits.max_keys_per_request = o.limits.max_keys_per_request;
    limits.max_request_bytes = o.limits.max_request_bytes;
    limits.max_buffered_output_bytes = o.limits.max_buffered_output_bytes;
    stall_ms = o.limits.stalled_reader_ms;
  }

  // ---- setup (caller thread, before the loop thread exists) --------------
  Status init();
  Status bindAndListen();
  Status openListener(int fd, int backlog);
  void teardownAfterFailedInit();
  void runLoop() noexcept;

  // ---- loop thread ------------------------------------------------------
  static void onListenReadable(uv_poll_t* poll, int status,
                               int events) noexcept;
  static void onAcceptRetry(uv_timer_t* timer) noexcept;
  static void onListenerClosed(uv_handle_t* handle) noexcept;
  static void onAlloc(uv_handle_t* handle, std::size_t suggested,
                      uv_buf_t* buf) noexcept;
  static void onRead(uv_stream_t* stream, ssize_t nread,
                     const uv_buf_t* buf) noexcept;
  static void onWrite(uv_write_t* req, int status) noexcept;
  static void onConnClosed(uv_handle_t* handle) noexcept;
  static void onCheck(uv_check_t* check) noexcept;
  static void onStopAsync(uv_async_t* async) noexcept;
  static void onStopTimer(uv_timer_t* timer) noexcept;
  static void onHandleClosed(uv_handle_t* handle) noexcept;
  static void onLogTimer(uv_timer_t* timer) noexcept;
  static void onStallTimer(uv_timer_t* timer) noexcept;

  void acceptAll();
  void adopt(int fd, const sockaddr_storage& peer);
  void shed();
  void pauseAccepting();
  void noteAcceptError(int err, std::uint64_t shed_now);
  void closeListener();
  void handleRead(ServerConn* c, ssize_t nread, const uv_buf_t* buf);
  // Decodes and applies requests from [data, data+len); returns bytes consumed.
  std::size_t drain(ServerConn* c, const char* data, std::size_t len);
  void drainBuffered(ServerConn* c);
  void dispatch(ServerConn* self);
  void appendOutput(ServerConn* t, std::string_view bytes, bool requested);
  void flush(ServerConn* c);
  void checkOutputCap(ServerConn* t);
  void maybeResume(ServerConn* c);
  void closeConn(ServerConn* c);
  void rejectConn(ServerConn* c, std::atomic<std::uint64_t>& counter,
                  std::string_view reason);
  void noteDialect(ServerConn* c);
  void noteInitWrite();
  void beginStop();
  void closeLoopHandles();
  bool logEnabled(LogLevel l) const noexcept {
    return static_cast<int>(l) <= log_level;
  }
  void log(LogLevel l, std::string_view msg) const noexcept {
    if (logEnabled(l)) server::logLine(l, msg);
  }
  void logRejection(std::string_view line);

  ServerOptions options;
  protocol::Limits limits;
  std::uint64_t stall_ms = 0;  // options.limits.stalled_reader_ms
  int log_level = static_cast<int>(LogLevel::kInfo);

  uv_loop_t loop{};
  // The listening socket: polled by us, accepted with accept4() (so EMFILE is
  // seen and counted; libuv's uv_listen would shed silently).
  uv_poll_t listen_poll{};
  uv_timer_t accept_retry{};
  int listen_fd = -1;
  bool owns_listen_fd = false;
  int reserve_fd = -1;  // spare fd given up to shed connections on EMFILE
  bool retry_inited = false;
  uv_timer_t log_timer{};  // prints the "suppressed N" summary of a window
  bool log_timer_inited = false;
  uv_async_t stop_async{};
  uv_check_t flush_check{};
  uv_timer_t stop_timer{};
  bool loop_inited = false;
  bool listener_inited = false;
  bool listener_closing = false;
  bool async_inited = false;
  bool check_inited = false;
  bool timer_inited = false;
  // Drops paused connections whose output made no progress for
  // limits.stalled_reader_ms; runs only while some connection is paused.
  uv_timer_t stall_timer{};
  bool stall_timer_inited = false;
  std::vector<ConnId> paused_ids;  // may hold stale or repeated ids
  bool loop_handles_closing = false;
  int open_handles = 0;  // loop-owned handles (not connections) still open

  store::Keyspace keyspace;
  store::Effects fx;
  protocol::Request req;
  std::unordered_map<ConnId, ServerConn*> conns;
  std::vector<ServerConn*> dirty;
  // Sum of outputBytes() over open connections.
  std::uint64_t total_output = 0;
  ConnId next_id = 1;
  std::unique_ptr<char[]> scratch{new char[kScratchBytes]};
  bool stopping = false;

  // Error-log rate limiting (loop thread).
  std::uint64_t log_window_ms = 0;
  int log_lines_in_window = 0;
  std::uint64_t log_suppressed = 0;
  std::uint64_t last_accept_log_ms = 0;
  bool accept_log_once = false;
  std::uint64_t accept_errors_unlogged = 0;
  std::uint64_t shed_unlogged = 0;

  // world_size progress log (loop thread).
  std::int64_t last_joined = -1;
  std::uint64_t last_joined_log_ms = 0;
  bool joined_complete_logged = false;

  AtomicCounters ctr;

  // Set by init(), read-only afterwards.
  std::uint16_t port = 0;
  std::string address;

  std::thread thread;
  std::thread::id loop_thread_id;
  std::mutex stop_mu;
  std::condition_variable stopped_cv;
  bool stop_requested = false;  // guarded by stop_mu
  bool stopped = false;         // guarded by stop_mu
  Status stop_status;           // written before `stopped`, guarded by stop_mu
  std::mutex join_mu;
};

struct ServerConn {
  explicit ServerConn(Server::Impl* s, ConnId i)
      : srv(s), id(i), stream(s->limits) {}
  uv_tcp_t tcp{};
  Server::Impl* srv;
  ConnId id;
  protocol::RequestStream stream;
  InputBuffer in;
  std::size_t need = 1;  // bytes that must be buffered before decoding again
  std::string pending;   // output not yet handed to the kernel
  std::string inflight;  // owned by the current uv_write
  uv_write_t wreq{};
  sockaddr_storage peer{};
  bool writing = false;
  bool dirty = false;
  bool paused = false;  // reads stopped: output over the cap
  bool closing = false;
  bool close_after_flush =
      false;  // peer half-closed: close once replies are out
  bool dialect_noted = false;
  // While paused: when its output last made progress, and the libuv write
  // queue size seen then.
  std::uint64_t progress_ms = 0;
  std::size_t progress_queue = 0;

  std::size_t outputBytes() const noexcept {
    return pending.size() + inflight.size();
  }
  std::string peerName() const {
    return formatSockaddr(reinterpret_cast<const sockaddr*>(&peer));
  }
  std::string_view dialectName() const noexcept {
    auto d = stream.dialect();
    return d ? protocol::dialectName(*d) : std::string_view("undecided");
  }
};

// ---- setup ---------------------------------------------------------------

Status Server::Impl::init() {
  auto lvl = server::parseLogLevel(options.log_level);
  if (!lvl) {
    return Status::invalidArgument(
        fmt::format("unknown log level '{}' (use error, warn, info or debug)",
                    options.log_level));
  }
  log_level = static_cast<int>(*lvl);
  if (options.limits.max_buffered_output_bytes == 0) {
    return Status::invalidArgument("max_buffered_output_bytes must be > 0");
  }
  int rc = uv_loop_init(&loop);
  if (rc != 0)
    return Status::ioError(fmt::format("uv_loop_init: {}", uv_strerror(rc)));
  loop_inited = true;
  loop.data = this;
  uv_timer_init(&loop, &accept_retry);
  accept_retry.data = this;
  retry_inited = true;
  ++open_handles;
  uv_timer_init(&loop, &log_timer);
  log_timer.data = this;
  log_timer_inited = true;
  ++open_handles;
  reserve_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  rc = uv_async_init(&loop, &stop_async, &Impl::onStopAsync);
  if (rc != 0)
    return Status::ioError(fmt::format("uv_async_init: {}", uv_strerror(rc)));
  stop_async.data = this;
  async_inited = true;
  ++open_handles;
  uv_check_init(&loop, &flush_check);
  flush_check.data = this;
  check_inited = true;
  ++open_handles;
  uv_check_start(&flush_check, &Impl::onCheck);
  uv_unref(reinterpret_cast<uv_handle_t*>(&flush_check));
  uv_timer_init(&loop, &stop_timer);
  stop_timer.data = this;
  timer_inited = true;
  ++open_handles;
  uv_timer_init(&loop, &stall_timer);
  stall_timer.data = this;
  stall_timer_inited = true;
  ++open_handles;
  return bindAndListen();
}

// `fd` is bound and listening; from here on the server owns it.
Status Server::Impl::openListener(int fd, int /*backlog*/) {
  listen_fd = fd;
  owns_listen_fd = true;
  int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) {
    return Status::ioError(fmt::format("cannot make fd {} non-blocking: {}", fd,
                                       errnoText(errno)));
  }
  (void)::fcntl(fd, F_SETFD, FD_CLOEXEC);
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
    return Status::ioError(fmt::format("getsockname: {}", errnoText(errno)));
  }
  port = sockaddrPort(reinterpret_cast<sockaddr*>(&ss));
  address = formatSockaddr(reinterpret_cast<sockaddr*>(&ss));
  int rc = uv_poll_init_socket(&loop, &listen_poll, fd);
  if (rc != 0) {
    return Status::ioError(
        fmt::format("uv_poll_init_socket: {}", uv_strerror(rc)));
  }
  listen_poll.data = this;
  listener_inited = true;
  ++open_handles;
  rc = uv_poll_start(&listen_poll, UV_READABLE, &Impl::onListenReadable);
  if (rc != 0) {
    return Status::ioError(fmt::format("uv_poll_start: {}", uv_strerror(rc)));
  }
  return Status::ok();
}

namespace {

// socket + SO_REUSEADDR (+ IPV6_V6ONLY off) + bind + listen. Returns the fd or
// -errno.
int makeListenSocket(const sockaddr* sa, socklen_t len, int backlog) {
  int fd =
      ::socket(sa->sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -errno;
  int one = 1;
  (void)::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (sa->sa_family == AF_INET6) {
    int zero = 0;
    (void)::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
  }
  if (::bind(fd, sa, len) != 0 || ::listen(fd, backlog) != 0) {
    int err = errno;
    ::close(fd);
    return -err;
  }
  return fd;
}

}  // namespace

Status Server::Impl::bindAndListen() {
  int backlog = listenBacklog();
  if (options.listen_fd >= 0) {
    int fd = options.listen_fd;
    int type = 0;
    socklen_t tlen = sizeof type;
    if (::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tlen) != 0) {
      return Status::invalidArgument(fmt::format(
          "listen fd {} is not a socket: {}", fd, errnoText(errno)));
    }
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    if (type != SOCK_STREAM ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0 ||
        (ss.ss_family != AF_INET && ss.ss_family != AF_INET6)) {
      return Status::invalidArgument(
          fmt::format("listen fd {} is not a TCP socket", fd));
    }
    std::uint16_t bound = sockaddrPort(reinterpret_cast<sockaddr*>(&ss));
    if (bound == 0) {
      return Status::invalidArgument(
          fmt::format("listen fd {} is not bound to a port", fd));
    }
    if (options.port != 0 && options.port != bound) {
      return Status::invalidArgument(fmt::format(
          "listen fd {} is bound to port {}, expected to be bound to port {}",
          fd, bound, options.port));
    }
    if (::listen(fd, backlog) != 0) {
      return Status::ioError(
          fmt::format("listen on fd {}: {}", fd, errnoText(errno)));
    }
    return openListener(fd, backlog);
  }

  struct Candidate {
    sockaddr_storage ss{};
    socklen_t len = 0;
  };
  std::vector<Candidate> candidates;
  if (options.host.empty()) {
    Candidate c6;
    uv_ip6_addr("::", options.port, reinterpret_cast<sockaddr_in6*>(&c6.ss));
    c6.len = sizeof(sockaddr_in6);
    candidates.push_back(c6);
    Candidate c4;
    uv_ip4_addr("0.0.0.0", options.port,
                reinterpret_cast<sockaddr_in*>(&c4.ss));
    c4.len = sizeof(sockaddr_in);
    candidates.push_back(c4);
  } else {
    std::string host = options.host;
    if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
      host = host.substr(1, host.size() - 2);
    }
    Candidate c;
    if (uv_ip4_addr(host.c_str(), options.port,
                    reinterpret_cast<sockaddr_in*>(&c.ss)) == 0) {
      c.len = sizeof(sockaddr_in);
      candidates.push_back(c);
    } else if (uv_ip6_addr(host.c_str(), options.port,
                           reinterpret_cast<sockaddr_in6*>(&c.ss)) == 0) {
      c.len = sizeof(sockaddr_in6);
      candidates.push_back(c);
    } else {
      addrinfo hints{};
      hints.ai_family = AF_UNSPEC;
      hints.ai_socktype = SOCK_STREAM;
      addrinfo* res = nullptr;
      int gai = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
      if (gai != 0) {
        return Status::ioError(fmt::format("cannot resolve host '{}': {}",
                                           options.host, gai_strerror(gai)));
      }
      for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
        if (ai->ai_family != AF_INET && ai->ai_family != AF_INET6) continue;
        Candidate r;
        std::memcpy(&r.ss, ai->ai_addr, ai->ai_addrlen);
        r.len = ai->ai_addrlen;
        if (ai->ai_family == AF_INET) {
          reinterpret_cast<sockaddr_in*>(&r.ss)->sin_port = htons(options.port);
        } else {
          reinterpret_cast<sockaddr_in6*>(&r.ss)->sin6_port =
              htons(options.port);
        }
        candidates.push_back(r);
      }
      ::freeaddrinfo(res);
      if (candidates.empty()) {
        return Status::ioError(
            fmt::format("host '{}' has no IPv4/IPv6 address", options.host));
      }
    }
  }

  std::string failures;
  bool in_use = false;
  for (const Candidate& c : candidates) {
    const auto* sa = reinterpret_cast<const sockaddr*>(&c.ss);
    int fd = makeListenSocket(sa, c.len, backlog);
    if (fd >= 0) return openListener(fd, backlog);
    if (-fd == EADDRINUSE) in_use = true;
    if (!failures.empty()) failures += "; ";
    failures += fmt::format("{}: {}", formatSockaddr(sa), errnoText(-fd));
    log(LogLevel::kDebug,
        fmt::format("bind {} failed: {}", formatSockaddr(sa), errnoText(-fd)));
  }
  if (in_use) {
    return Status::ioError(
        fmt::format("port {} is already in use ({})", options.port, failures));
  }
  return Status::ioError(fmt::format("cannot bind/listen: {}", failures));
}

void Server::Impl::teardownAfterFailedInit() {
  if (!loop_inited) return;
  auto closeIf = [](bool inited, void* h) {
    if (inited && !uv_is_closing(static_cast<uv_handle_t*>(h))) {
      uv_close(static_cast<uv_handle_t*>(h), nullptr);
    }
  };
  closeIf(listener_inited, &listen_poll);
  closeIf(retry_inited, &accept_retry);
  closeIf(log_timer_inited, &log_timer);
  closeIf(async_inited, &stop_async);
  closeIf(check_inited, &flush_check);
  closeIf(timer_inited, &stop_timer);
  closeIf(stall_timer_inited, &stall_timer);
  uv_run(&loop, UV_RUN_DEFAULT);
  (void)uv_loop_close(&loop);
  loop_inited = false;
  if (owns_listen_fd && listen_fd >= 0) ::close(listen_fd);
  listen_fd = -1;
  if (reserve_fd >= 0) ::close(reserve_fd);
  reserve_fd = -1;
}

void Server::Impl::runLoop() noexcept {
  uv_run(&loop, UV_RUN_DEFAULT);
  Status st;
  int rc = uv_loop_close(&loop);
  if (rc != 0) {
    std::string names;
    uv_walk(
        &loop,
        [](uv_handle_t* h, void* arg) noexcept {
          auto* out = static_cast<std::string*>(arg);
          if (!out->empty()) *out += ", ";
          *out += uv_handle_type_name(uv_handle_get_type(h));
          if (!uv_is_closing(h)) uv_close(h, nullptr);
        },
        &names);
    st = Status::ioError(fmt::format("uv_loop_close: {} (leaked handles: {})",
                                     uv_strerror(rc),
                                     names.empty() ? "none" : names));
    uv_run(&loop, UV_RUN_DEFAULT);
    (void)uv_loop_close(&loop);
  }
  if (reserve_fd >= 0) ::close(reserve_fd);
  reserve_fd = -1;
  {
    std::lock_guard lk(stop_mu);
    stop_status = st;
    stopped = true;
  }
  stopped_cv.notify_all();
}

// ---- accept ----------------------------------------------------------------

void Server::Impl::onListenReadable(uv_poll_t* poll, int status,
                                    int /*events*/) noexcept {
  auto* s = static_cast<Impl*>(poll->data);
  if (s->stopping) return;
  if (status < 0) {
    bump(s->ctr.accept_errors);
    s->noteAcceptError(-status, 0);
    s->pauseAccepting();
    return;
  }
  s->acceptAll();
}

// Accepts every pending connection (one wake-up may carry thousands).
void Server::Impl::acceptAll() {
  for (;;) {
    sockaddr_storage peer{};
    socklen_t len = sizeof peer;
    int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&peer), &len,
                       SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      try {
        adopt(fd, peer);
      } catch (...) {
        log(LogLevel::kError, "out of memory while accepting a connection");
        bump(ctr.accept_errors);
      }
      continue;
    }
    int err = errno;
    switch (err) {
      case EAGAIN:
#if EWOULDBLOCK != EAGAIN
      case EWOULDBLOCK:
#endif
        return;
      // The pending connection failed, not the listener (accept(2) NOTES).
      case EINTR:
      case ECONNABORTED:
      case EPROTO:
      case ENETDOWN:
      case ENOPROTOOPT:
      case EHOSTDOWN:
      case ENONET:
      case EHOSTUNREACH:
      case EOPNOTSUPP:
      case ENETUNREACH:
        continue;
      case EMFILE:
      case ENFILE:
        bump(ctr.accept_errors);
        shed();
        return;
      default:  // ENOBUFS, ENOMEM, ...: back off briefly
        bump(ctr.accept_errors);
        noteAcceptError(err, 0);
        pauseAccepting();
        return;
    }
  }
}

// Out of fds: give up the reserve fd, accept and close every pending
// connection (their clients see a close at once instead of hanging in the
// backlog), take the reserve back. Existing connections are unaffected.
void Server::Impl::shed() {
  std::uint64_t n = 0;
  int last_err = EMFILE;
  if (reserve_fd >= 0) {
    ::close(reserve_fd);
    reserve_fd = -1;
    for (;;) {
      int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) {
        ::close(fd);
        ++n;
        continue;
      }
      last_err = errno;
      if (last_err == EINTR || last_err == ECONNABORTED) continue;
      break;
    }
    reserve_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  }
  bump(ctr.connections_shed, n);
  noteAcceptError(EMFILE, n);
  // Still out of fds (no reserve, or another thread took it): a readable
  // listener would spin the loop, so stop polling it for a moment.
  if (reserve_fd < 0 || (last_err != EAGAIN && last_err != EWOULDBLOCK)) {
    pauseAccepting();
  }
}

void Server::Impl::pauseAccepting() {
  if (stopping || listener_closing) return;
  uv_poll_stop(&listen_poll);
  uv_timer_start(&accept_retry, &Impl::onAcceptRetry, 100, 0);
}

void Server::Impl::onAcceptRetry(uv_timer_t* timer) noexcept {
  auto* s = static_cast<Impl*>(timer->data);
  if (s->stopping || s->listener_closing) return;
  if (s->reserve_fd < 0)
    s->reserve_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  uv_poll_start(&s->listen_poll, UV_READABLE, &Impl::onListenReadable);
}

// At most one log line per second about accept failures.
void Server::Impl::noteAcceptError(int err, std::uint64_t shed_now) {
  ++accept_errors_unlogged;
  shed_unlogged += shed_now;
  std::uint64_t now = uv_now(&loop);
  if (accept_log_once && now - last_accept_log_ms < 1000) return;
  log(LogLevel::kWarn,
      fmt::format("accept failed: {}; {} error(s), {} connection(s) shed since "
                  "the last report; {} connection(s) still served",
                  errnoText(err), accept_errors_unlogged, shed_unlogged,
                  conns.size()));
  accept_errors_unlogged = 0;
  shed_unlogged = 0;
  last_accept_log_ms = now;
  accept_log_once = true;
}

void Server::Impl::adopt(int fd, const sockaddr_storage& peer) {
  std::unique_ptr<ServerConn> c;
  try {
    c = std::make_unique<ServerConn>(this, next_id++);
  } catch (...) {
    ::close(fd);
    throw;
  }
  uv_tcp_init(&loop, &c->tcp);
  c->tcp.data = c.get();
  ServerConn* raw = c.release();  // owned by the handle from here on
  int rc = uv_tcp_open(&raw->tcp, fd);
  if (rc != 0) {
    ::close(fd);
    bump(ctr.accept_errors);
    uv_close(reinterpret_cast<uv_handle_t*>(&raw->tcp), &Impl::onConnClosed);
    return;
  }
  int one = 1;
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  raw->peer = peer;
  conns.emplace(raw->id, raw);
  bump(ctr.connections_accepted);
  rc = uv_read_start(reinterpret_cast<uv_stream_t*>(&raw->tcp), &Impl::onAlloc,
                     &Impl::onRead);
  if (rc != 0) closeConn(raw);
}

void Server::Impl::closeListener() {
  if (listener_closing || !listener_inited) return;
  listener_closing = true;
  uv_timer_stop(&accept_retry);
  uv_close(reinterpret_cast<uv_handle_t*>(&listen_poll),
           &Impl::onListenerClosed);
}

void Server::Impl::onListenerClosed(uv_handle_t* handle) noexcept {
  auto* s = static_cast<Impl*>(handle->data);
  if (s->owns_listen_fd && s->listen_fd >= 0) ::close(s->listen_fd);
  s->listen_fd = -1;
  --s->open_handles;
}

// ---- read ------------------------------------------------------------------

void Server::Impl::onAlloc(uv_handle_t* handle, std::size_t,
                           uv_buf_t* buf) noexcept {
  auto* c = static_cast<ServerConn*>(handle->data);
  Impl* s = c->srv;
  // The rest of the current message fits the scratch buffer: read there (no
  // per-connection memory for the common small request). Otherwise read in
  // place into the connection's own buffer.
  std::size_t buffered = c->in.size();
  if (c->need <= buffered + kScratchBytes) {
    *buf = uv_buf_init(s->scratch.get(), static_cast<unsigned>(kScratchBytes));
    return;
  }
  try {
    char* tail = c->in.reserveTail(kMinFreeTail);
    std::size_t n = c->in.freeTail();
    if (n > (1u << 30)) n = 1u << 30;
    *buf = uv_buf_init(tail, static_cast<unsigned>(n));
  } catch (...) {
    *buf = uv_buf_init(nullptr, 0);  // read_cb gets UV_ENOBUFS
  }
}

void Server::Impl::onRead(uv_stream_t* stream, ssize_t nread,
                          const uv_buf_t* buf) noexcept {
  auto* c = static_cast<ServerConn*>(stream->data);
  Impl* s = c->srv;
  try {
    s->handleRead(c, nread, buf);
  } catch (...) {
    if (!c->closing) {
      s->rejectConn(c, s->ctr.rejected_limit,
                    "out of memory while serving the connection");
    }
  }
}

void Server::Impl::handleRead(ServerConn* c, ssize_t nread,
                              const uv_buf_t* buf) {
  if (c->closing) return;
  if (nread < 0) {
    if (nread == UV_EOF) {
      DecodeResult r =
          c->stream.finish(std::string_view(c->in.data(), c->in.size()));
      if (r.failed()) {
        rejectConn(c, ctr.rejected_protocol, r.error.message());
        return;
      }
      log(LogLevel::kDebug, fmt::format("connection {} from {} closed by peer",
                                        c->id, c->peerName()));
      if (c->outputBytes() > 0) {
        // A peer that half-closed after a pipelined batch still gets its
        // replies; the connection closes once they are written.
        c->close_after_flush = true;
        uv_read_stop(reinterpret_cast<uv_stream_t*>(&c->tcp));
        return;
      }
    } else if (nread == UV_ENOBUFS) {
      rejectConn(c, ctr.rejected_limit, "out of memory for the input buffer");
      return;
    } else {
      log(LogLevel::kDebug,
          fmt::format("connection {} from {}: read error {}", c->id,
                      c->peerName(), uv_strerror(static_cast<int>(nread))));
    }
    closeConn(c);
    return;
  }
  if (nread == 0) return;
  auto n = static_cast<std::size_t>(nread);
  bump(ctr.bytes_in, n);
  if (buf->base == scratch.get()) {
    if (c->in.empty()) {
      // Decode straight from the scratch buffer; keep only an unfinished tail.
      std::size_t used = drain(c, buf->base, n);
      if (c->closing) return;
      if (used < n) c->in.append(buf->base + used, n - used);
    } else {
      c->in.append(buf->base, n);
      drainBuffered(c);
      if (c->closing) return;
    }
  } else {
    c->in.commit(n);
    drainBuffered(c);
    if (c->closing) return;
  }
  c->in.trim();
}

void Server::Impl::drainBuffered(ServerConn* c) {
  std::size_t used = drain(c, c->in.data(), c->in.size());
  if (!c->closing) c->in.consume(used);
}

std::size_t Server::Impl::drain(ServerConn* c, const char* data,
                                std::size_t len) {
  std::size_t off = 0;
  while (!c->paused && !c->closing && len - off >= c->need) {
    DecodeResult r =
        c->stream.next(std::string_view(data + off, len - off), req);
    if (!c->dialect_noted) noteDialect(c);
    if (r.kind == DecodeResult::kNeedMore) {
      c->need = r.need_at_least > 0 ? r.need_at_least : 1;
      break;
    }
    if (r.kind == DecodeResult::kError) {
      rejectConn(c,
                 isLimitError(r.error.code) ? ctr.rejected_limit
                                            : ctr.rejected_protocol,
                 r.error.message());
      return off;
    }
    c->need = 1;
    auto cmd = static_cast<std::size_t>(req.command);
    if (cmd < protocol::kCommandCount) bump(ctr.requests[cmd]);
    bump(ctr.requests_total);
    fx.clear();
    Status st = keyspace.apply(c->id, req, fx);
    if (!st.isOk()) {
      rejectConn(c,
                 st.code() == StatusCode::kLimitExceeded
                     ? ctr.rejected_limit
                     : ctr.rejected_semantic,
                 fmt::format("{} rejected: {}",
                             protocol::commandName(req.command), st.message()));
      return off;
    }
    if (options.world_size > 0 && req.key == "init/" &&
        (req.command == Command::kAdd || req.command == Command::kSet)) {
      noteInitWrite();
    }
    dispatch(c);
    // One huge MULTI_GET/LIST_KEYS reply must not pin its buffer for good.
    if (fx.bytes().capacity() > kKeepOutputBytes) fx = store::Effects();
    off += r.consumed;
  }
  return off;
}

void Server::Impl::noteDialect(ServerConn* c) {
  auto d = c->stream.dialect();
  if (!d) return;
  c->dialect_noted = true;
  bump(*d == Dialect::kV2 ? ctr.connections_v2 : ctr.connections_v113);
}

void Server::Impl::noteInitWrite() {
  const std::string* v = keyspace.find("init/");
  if (v == nullptr) return;
  std::int64_t n = 0;
  auto [p, ec] = std::from_chars(v->data(), v->data() + v->size(), n);
  (void)p;
  if (ec != std::errc()) return;
  std::int64_t w = options.world_size;
  std::uint64_t now = uv_now(&loop);
  if (n >= w) {
    if (!joined_complete_logged) {
      joined_complete_logged = true;
      last_joined = n;
      last_joined_log_ms = now;
      log(LogLevel::kInfo, fmt::format("joined {}/{}", n, w));
    }
    return;
  }
  if (n != last_joined &&
      (last_joined < 0 || now - last_joined_log_ms >= 1000)) {
    last_joined = n;
    last_joined_log_ms = now;
    log(LogLevel::kInfo, fmt::format("joined {}/{}", n, w));
  }
}

// ---- output ----------------------------------------------------------------

void Server::Impl::dispatch(ServerConn* self) {
  for (const store::Effects::Send& send : fx.sends()) {
    ServerConn* t = nullptr;
    if (send.conn == self->id) {
      t = self;
    } else {
      auto it = conns.find(send.conn);
      if (it == conns.end()) continue;
      t = it->second;
    }
    appendOutput(t, fx.bytesOf(send), t == self);
  }
}

// Under the server-wide output budget, a push the receiver did not ask for
// (STOP_WAITING, watch notification) drops the receiver only if it is behind:
// it would then hold more than this many unsent bytes. An idle waiter always
// gets its byte.
constexpr std::size_t kBehindBytes = 4096;

void Server::Impl::appendOutput(ServerConn* t, std::string_view bytes,
                                bool requested) {
  if (t->closing) return;
  if (!requested &&
      total_output + bytes.size() > options.limits.max_total_output_bytes &&
      t->outputBytes() + bytes.size() > kBehindBytes) {
    rejectConn(t, ctr.rejected_slow_reader,
               fmt::format("{} unsent bytes while the server's unsent output "
                           "is past its budget of {} bytes",
                           t->outputBytes() + bytes.size(),
                           options.limits.max_total_output_bytes));
    return;
  }
  t->pending.append(bytes.data(), bytes.size());
  total_output += bytes.size();
  if (!t->dirty) {
    t->dirty = true;
    dirty.push_back(t);
  }
  checkOutputCap(t);
}

// Over the cap: stop reading (and parsing) this connection until its output
// drains below half. Over twice the cap while the kernel takes nothing more
// (a write is pending, or uv_try_write left bytes over): drop it. Replies are
// only judged after a write attempt, so one large reply to a reading client
// is never mistaken for a slow reader.
void Server::Impl::checkOutputCap(ServerConn* t) {
  std::uint64_t cap = limits.max_buffered_output_bytes;
  std::size_t out = t->outputBytes();
  if (out > 2 * cap && t->writing) {
    rejectConn(
        t, ctr.rejected_slow_reader,
        fmt::format("slow reader: {} bytes of replies not taken (limit {})",
                    out, 2 * cap));
  } else if (out > cap && !t->paused) {
    t->paused = true;
    uv_read_stop(reinterpret_cast<uv_stream_t*>(&t->tcp));
    if (stall_ms > 0 && !stopping) {
      t->progress_ms = uv_now(&loop);
      t->progress_queue = SIZE_MAX;  // first check records the queue size
      paused_ids.push_back(t->id);
      if (!uv_is_active(reinterpret_cast<uv_handle_t*>(&stall_timer))) {
        const std::uint64_t every =
            std::clamp<std::uint64_t>(stall_ms / 4, 1, 1000);
        uv_timer_start(&stall_timer, &Impl::onStallTimer, every, every);
      }
    }
  }
}

// A paused connection is dropped once its output took no byte for
// stalled_reader_ms: a client that never reads is paused, then dropped.
void Server::Impl::onStallTimer(uv_timer_t* timer) noexcept {
  auto* s = static_cast<Impl*>(timer->data);
  const std::uint64_t now = uv_now(&s->loop);
  std::size_t kept = 0;
  for (std::size_t i = 0; i < s->paused_ids.size(); ++i) {
    auto it = s->conns.find(s->paused_ids[i]);
    if (it == s->conns.end()) continue;
    ServerConn* c = it->second;
    if (c->closing || !c->paused) continue;
    const std::size_t queued =
        uv_stream_get_write_queue_size(reinterpret_cast<uv_stream_t*>(&c->tcp));
    if (queued < c->progress_queue) {
      if (c->progress_queue != SIZE_MAX) c->progress_ms = now;
      c->progress_queue = queued;
    }
    if (now - c->progress_ms >= s->stall_ms) {
      try {
        s->rejectConn(c, s->ctr.rejected_slow_reader,
                      fmt::format("slow reader: {} bytes of replies not "
                                  "taken for {} ms",
                                  c->outputBytes(), now - c->progress_ms));
      } catch (...) {
        s->closeConn(c);
      }
      continue;
    }
    s->paused_ids[kept++] = c->id;
  }
  s->paused_ids.resize(kept);
  if (kept == 0) uv_timer_stop(&s->stall_timer);
}

void Server::Impl::onCheck(uv_check_t* check) noexcept {
  auto* s = static_cast<Impl*>(check->data);
  // Index loop: flushing may resume a paused connection, whose buffered
  // requests can add more dirty connections.
  for (std::size_t i = 0; i < s->dirty.size(); ++i) {
    ServerConn* c = s->dirty[i];
    c->dirty = false;
    if (c->closing) continue;
    try {
      s->flush(c);
    } catch (...) {
      if (!c->closing)
        s->rejectConn(c, s->ctr.rejected_limit, "out of memory while writing");
    }
  }
  s->dirty.clear();
}

void Server::Impl::flush(ServerConn* c) {
  if (c->closing || c->writing || c->pending.empty()) return;
  uv_buf_t b = uv_buf_init(
      c->pending.data(),
      static_cast<unsigned>(std::min(c->pending.size(), kMaxBufBytes)));
  int r = uv_try_write(reinterpret_cast<uv_stream_t*>(&c->tcp), &b, 1);
  if (r == UV_EAGAIN || r == UV_ENOSYS) r = 0;
  if (r < 0) {
    log(LogLevel::kDebug, fmt::format("connection {} from {}: write error {}",
                                      c->id, c->peerName(), uv_strerror(r)));
    closeConn(c);
    return;
  }
  auto written = static_cast<std::size_t>(r);
  bump(ctr.bytes_out, written);
  if (written > 0) c->progress_ms = uv_now(&loop);
  total_output -= written;
  if (written == c->pending.size()) {
    c->pending.clear();
    if (c->pending.capacity() > kKeepOutputBytes)
      std::string().swap(c->pending);
  } else {
    c->inflight.assign(c->pending, written, std::string::npos);
    c->pending.clear();
    if (c->pending.capacity() > kKeepOutputBytes)
      std::string().swap(c->pending);
    // uv_buf_t lengths are 32-bit: hand over huge outputs in 1 GiB pieces.
    std::vector<uv_buf_t> bufs;
    for (std::size_t at = 0; at < c->inflight.size(); at += kMaxBufBytes) {
      std::size_t len = std::min(kMaxBufBytes, c->inflight.size() - at);
      bufs.push_back(
          uv_buf_init(c->inflight.data() + at, static_cast<unsigned>(len)));
    }
    c->wreq.data = c;
    int rc =
        uv_write(&c->wreq, reinterpret_cast<uv_stream_t*>(&c->tcp), bufs.data(),
                 static_cast<unsigned>(bufs.size()), &Impl::onWrite);
    if (rc != 0) {
      closeConn(c);
      return;
    }
    c->writing = true;
    checkOutputCap(c);
    if (c->closing) return;
  }
  if ((stopping || c->close_after_flush) && c->outputBytes() == 0) {
    closeConn(c);
    return;
  }
  maybeResume(c);
}

void Server::Impl::onWrite(uv_write_t* wreq, int status) noexcept {
  auto* c = static_cast<ServerConn*>(wreq->data);
  Impl* s = c->srv;
  c->writing = false;
  if (c->closing) return;
  if (status < 0) {
    s->log(LogLevel::kDebug, fmt::format("connection {}: write error {}", c->id,
                                         uv_strerror(status)));
    s->closeConn(c);
    return;
  }
  bump(s->ctr.bytes_out, c->inflight.size());
  c->progress_ms = uv_now(&s->loop);
  s->total_output -= c->inflight.size();
  c->inflight.clear();
  if (c->inflight.capacity() > kKeepOutputBytes)
    std::string().swap(c->inflight);
  try {
    if (!c->pending.empty()) {
      s->flush(c);
    } else if (s->stopping || c->close_after_flush) {
      s->closeConn(c);
    } else {
      s->maybeResume(c);
    }
  } catch (...) {
    if (!c->closing)
      s->rejectConn(c, s->ctr.rejected_limit, "out of memory while writing");
  }
}

void Server::Impl::maybeResume(ServerConn* c) {
  if (!c->paused || c->closing || stopping || c->close_after_flush) return;
  if (c->outputBytes() > limits.max_buffered_output_bytes / 2) return;
  c->paused = false;
  int rc = uv_read_start(reinterpret_cast<uv_stream_t*>(&c->tcp),
                         &Impl::onAlloc, &Impl::onRead);
  if (rc != 0) {
    closeConn(c);
    return;
  }
  // Requests that arrived before the pause are still buffered.
  if (!c->in.empty()) {
    drainBuffered(c);
    if (!c->closing) c->in.trim();
  }
}

// ---- close -----------------------------------------------------------------

void Server::Impl::rejectConn(ServerConn* c,
                              std::atomic<std::uint64_t>& counter,
                              std::string_view reason) {
  if (c->closing) return;
  bump(counter);
  if (logEnabled(LogLevel::kWarn)) {
    logRejection(fmt::format("closing connection from {} ({}): {}",
                             c->peerName(), c->dialectName(), reason));
  }
  closeConn(c);
}

void Server::Impl::logRejection(std::string_view line) {
  std::uint64_t now = uv_now(&loop);
  if (now - log_window_ms >= 1000) {
    if (log_suppressed > 0) {
      server::logLine(
          LogLevel::kWarn,
          fmt::format("suppressed {} similar message(s)", log_suppressed));
    }
    log_window_ms = now;
    log_lines_in_window = 0;
    log_suppressed = 0;
  }
  if (log_lines_in_window < kMaxErrorLinesPerSecond) {
    ++log_lines_in_window;
    server::logLine(LogLevel::kWarn, line);
  } else if (log_suppressed++ == 0 && !stopping) {
    // Print the summary when this window ends, even if the flood stops.
    uv_timer_start(&log_timer, &Impl::onLogTimer, log_window_ms + 1000 - now,
                   0);
  }
}

void Server::Impl::onLogTimer(uv_timer_t* timer) noexcept {
  auto* s = static_cast<Impl*>(timer->data);
  if (s->log_suppressed > 0) {
    server::logLine(
        LogLevel::kWarn,
        fmt::format("suppressed {} similar message(s)", s->log_suppressed));
  }
  s->log_window_ms = uv_now(&s->loop);
  s->log_lines_in_window = 0;
  s->log_suppressed = 0;
}

void Server::Impl::closeConn(ServerConn* c) {
  if (c->closing) return;
  c->closing = true;
  total_output -= c->outputBytes();  // nothing more is sent or counted for c
  keyspace.disconnect(c->id);
  conns.erase(c->id);
  bump(ctr.connections_closed);
  uv_close(reinterpret_cast<uv_handle_t*>(&c->tcp), &Impl::onConnClosed);
  if (stopping && conns.empty()) closeLoopHandles();
}

void Server::Impl::onConnClosed(uv_handle_t* handle) noexcept {
  delete static_cast<ServerConn*>(handle->data);
}

// ---- stop ------------------------------------------------------------------

void Server::Impl::onStopAsync(uv_async_t* async) noexcept {
  auto* s = static_cast<Impl*>(async->data);
  try {
    s->beginStop();
  } catch (...) {
    // Allocation failure while collecting connections: cut them all.
    while (!s->conns.empty()) s->closeConn(s->conns.begin()->second);
    s->closeLoopHandles();
  }
}

void Server::Impl::beginStop() {
  if (stopping) return;
  stopping = true;
  closeListener();
  if (log_suppressed > 0) {
    server::logLine(
        LogLevel::kWarn,
        fmt::format("suppressed {} similar message(s)", log_suppressed));
    log_suppressed = 0;
  }
  std::vector<ServerConn*> all;
  all.reserve(conns.size());
  for (auto& kv : conns) all.push_back(kv.second);
  for (ServerConn* c : all) {
    if (c->closing) continue;
    uv_read_stop(reinterpret_cast<uv_stream_t*>(&c->tcp));
    if (c->outputBytes() == 0) {
      closeConn(c);
    } else {
      flush(c);  // closes the connection once everything is written
    }
  }
  if (conns.empty()) {
    closeLoopHandles();
  } else {
    uv_timer_start(&stop_timer, &Impl::onStopTimer, kStopFlushMs, 0);
  }
}

void Server::Impl::onStopTimer(uv_timer_t* timer) noexcept {
  auto* s = static_cast<Impl*>(timer->data);
  if (!s->conns.empty()) {
    s->log(
        LogLevel::kWarn,
        fmt::format("stop: {} connection(s) still had unsent replies after {} "
                    "ms; closing them",
                    s->conns.size(), kStopFlushMs));
  }
  while (!s->conns.empty()) s->closeConn(s->conns.begin()->second);
  s->closeLoopHandles();
}

void Server::Impl::closeLoopHandles() {
  if (loop_handles_closing) return;
  loop_handles_closing = true;
  auto closeOne = [](uv_handle_t* h) {
    if (!uv_is_closing(h)) uv_close(h, &Impl::onHandleClosed);
  };
  closeOne(reinterpret_cast<uv_handle_t*>(&stop_async));
  closeOne(reinterpret_cast<uv_handle_t*>(&flush_check));
  closeOne(reinterpret_cast<uv_handle_t*>(&stop_timer));
  closeOne(reinterpret_cast<uv_handle_t*>(&accept_retry));
  closeOne(reinterpret_cast<uv_handle_t*>(&log_timer));
  closeOne(reinterpret_cast<uv_handle_t*>(&stall_timer));
  closeListener();
}

void Server::Impl::onHandleClosed(uv_handle_t* handle) noexcept {
  auto* s = static_cast<Impl*>(handle->loop->data);
  --s->open_handles;
}

// ---- public API ------------------------------------------------------------

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::shared_ptr<Server>> Server::start(const ServerOptions& options) {
  std::unique_lock<std::mutex> reg_lock(registryMutex(), std::defer_lock);
  if (options.multi_tenant) {
    reg_lock.lock();
    if (options.port != 0) {
      auto it = registry().find(options.port);
      if (it != registry().end()) {
        if (auto live = it->second.lock()) {
          std::lock_guard lk(live->impl_->stop_mu);
          if (!live->impl_->stop_requested) return live;
        }
      }
    }
  }
  auto impl = std::make_unique<Impl>(options);
  Status st = impl->init();
  if (!st.isOk()) {
    impl->teardownAfterFailedInit();
    return st;
  }
  Impl* raw = impl.get();
  std::shared_ptr<Server> server(new Server(std::move(impl)));
  // The loop thread runs with every signal blocked: process signals go to the
  // embedding program's threads, and a write to a reset peer yields EPIPE
  // instead of killing the process with SIGPIPE (no global handler needed).
  sigset_t all_signals;
  sigset_t previous;
  sigfillset(&all_signals);
  pthread_sigmask(SIG_SETMASK, &all_signals, &previous);
  try {
    raw->thread = std::thread([raw] { raw->runLoop(); });
    pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  } catch (const std::exception& e) {
    pthread_sigmask(SIG_SETMASK, &previous, nullptr);
    raw->teardownAfterFailedInit();
    {
      std::lock_guard lk(raw->stop_mu);
      raw->stop_requested = true;
      raw->stopped = true;
    }
    return Status::ioError(
        fmt::format("cannot start the loop thread: {}", e.what()));
  }
  raw->loop_thread_id = raw->thread.get_id();
  if (options.multi_tenant) registry()[raw->port] = server;
  raw->log(LogLevel::kDebug, fmt::format("listening on {}", raw->address));
  return server;
}

Server::~Server() {
  if (impl_ && impl_->thread.joinable() &&
      std::this_thread::get_id() != impl_->loop_thread_id) {
    (void)stop();
  } else if (impl_ && impl_->thread.joinable()) {
    impl_->thread.detach();  // destroyed from its own loop: cannot join
  }
}

std::uint16_t Server::port() const noexcept { return impl_->port; }

std::string Server::address() const { return impl_->address; }

Status Server::stop() {
  Impl* s = impl_.get();
  if (std::this_thread::get_id() == s->loop_thread_id) {
    return Status::invalidArgument(
        "Server::stop() called from the server's loop thread");
  }
  {
    std::lock_guard lk(s->stop_mu);
    if (!s->stop_requested) {
      s->stop_requested = true;
      uv_async_send(&s->stop_async);
    }
  }
  {
    std::lock_guard lk(s->join_mu);
    if (s->thread.joinable()) s->thread.join();
  }
  std::lock_guard lk(s->stop_mu);
  return s->stop_status;
}

void Server::wait() {
  Impl* s = impl_.get();
  std::unique_lock lk(s->stop_mu);
  s->stopped_cv.wait(lk, [s] { return s->stopped; });
}

ServerCounters Server::counters() const {
  const AtomicCounters& a = impl_->ctr;
  ServerCounters c;
  for (int i = 0; i < ServerCounters::kCommands; ++i)
    c.requests[i] = get(a.requests[i]);
  c.requests_total = get(a.requests_total);
  c.connections_accepted = get(a.connections_accepted);
  c.connections_closed = get(a.connections_closed);
  c.connections_open = c.connections_accepted >= c.connections_closed
                           ? c.connections_accepted - c.connections_closed
                           : 0;
  c.connections_v113 = get(a.connections_v113);
  c.connections_v2 = get(a.connections_v2);
  c.rejected_protocol = get(a.rejected_protocol);
  c.rejected_limit = get(a.rejected_limit);
  c.rejected_semantic = get(a.rejected_semantic);
  c.rejected_slow_reader = get(a.rejected_slow_reader);
  c.accept_errors = get(a.accept_errors);
  c.connections_shed = get(a.connections_shed);
  c.bytes_in = get(a.bytes_in);
  c.bytes_out = get(a.bytes_out);
  return c;
}

std::string Server::countersLine() const {
  ServerCounters c = counters();
  std::string out = fmt::format("requests total={}", c.requests_total);
  for (int i = 0; i < ServerCounters::kCommands; ++i) {
    if (c.requests[i] == 0) continue;
    std::string name(protocol::commandName(static_cast<Command>(i)));
    for (char& ch : name)
      ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    out += fmt::format(" {}={}", name, c.requests[i]);
  }
  out += fmt::format(
      " | conns accepted={} closed={} open={} v1.13={} v2={} | rejected "
      "protocol={} limit={} "
      "semantic={} slow_reader={} | accept_errors={} shed={} | bytes in={} "
      "out={}",
      c.connections_accepted, c.connections_closed, c.connections_open,
      c.connections_v113, c.connections_v2, c.rejected_protocol,
      c.rejected_limit, c.rejected_semantic, c.rejected_slow_reader,
      c.accept_errors, c.connections_shed, c.bytes_in, c.bytes_out);
  return out;
}

}  // namespace tcpstore
