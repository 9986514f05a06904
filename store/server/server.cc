// tcpstore server lifecycle: start, the loop thread, stop, counters, and the
// process-wide multi-tenant registry. The data path lives in the files this
// one wires together (see the README's layout table):
// listener -> connection (input_buffer, decoder) -> dispatcher -> backend
// -> effects -> outbox (flushed once per loop turn), under backpressure.
#include "tcpstore/server.h"

#include <fmt/format.h>
#include <pthread.h>
#include <signal.h>
#include <uv.h>

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "store/memory_backend.h"
#include "store/relay/relay_backend.h"
#include "store/server/connections.h"
#include "store/server/counters.h"
#include "store/server/dispatcher.h"
#include "store/server/listener.h"
#include "store/server/log.h"
#include "store/server/loop_handles.h"
#include "store/server/net.h"
#include "store/server/options.h"
#include "store/server/start.h"

namespace tcpstore {

using server::LogLevel;

namespace {

// Stop: how long pending replies may take to drain before connections are cut.
constexpr std::uint64_t kStopFlushMs = 1000;

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

struct Server::Impl final : server::AcceptHandler {
  Impl(const ServerOptions& o, std::unique_ptr<store::Backend> b)
      : options(o),
        backend(std::move(b)),
        conns(server::protocolLimits(o.limits), server::outputLimits(o.limits),
              ctr, log),
        dispatcher(conns, *backend, ctr, log, o.world_size, o.job_stall_ms),
        listener(handles, ctr, log, *this) {}

  static Result<std::shared_ptr<Server>> start(
      const ServerOptions& options, std::unique_ptr<store::Backend> backend);

  // Caller thread, before the loop thread exists.
  Status init();
  void teardownAfterFailedInit() noexcept;
  // The loop thread.
  void runLoop() noexcept;

  // AcceptHandler
  void onAccepted(int fd) override {
    conns.accept(fd);
  }
  std::size_t numConnections() const noexcept override { return conns.size(); }

  static void onStopAsync(uv_async_t* async) noexcept;
  static void onStopTimer(uv_timer_t* timer) noexcept;
  static void onDrained(void* self) noexcept;
  void beginStop() noexcept;
  void closeLoop() noexcept;

  // Members in dependency order: each is destroyed before what it uses.
  ServerOptions options;
  server::Logger log;
  server::Counters ctr;
  server::LoopHandles handles;
  std::unique_ptr<store::Backend> backend;
  server::Connections conns;
  server::Dispatcher dispatcher;
  server::Listener listener;
  uv_async_t* stop_async = nullptr;
  uv_timer_t* stop_timer = nullptr;
  // Relay mode: the backend, for its counters.
  const store::relay::RelayBackend* relay = nullptr;
  bool backend_open = false;
  bool stopping = false;      // loop thread
  bool loop_closing = false;  // loop thread

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

// ---- setup -----------------------------------------------------------------

Status Server::Impl::init() {
  auto level = server::checkOptions(options);
  if (!level) return level.error();
  log.setLevel(*level);
  Status st = handles.init();
  if (!st.isOk()) return st;
  auto async = handles.addAsync(this, &Impl::onStopAsync);
  if (!async) return async.error();
  stop_async = *async;
  auto timer = handles.addTimer(this);
  if (!timer) return timer.error();
  stop_timer = *timer;
  conns.setHandler(dispatcher);
  conns.setOnDrained(&Impl::onDrained, this);
  conns.setPartialRequestMs(options.limits.partial_request_ms);
  conns.setMaxMuxChannels(options.limits.max_mux_channels);
  conns.setBudget(options.limits.max_memory_bytes, backend.get());
  if (st = conns.open(handles); !st.isOk()) return st;
  if (st = dispatcher.open(handles); !st.isOk()) return st;
  backend_open = true;
  auto sock = server::openListenSocket(options.host, options.port,
                                       options.listen_fd, log);
  if (!sock) return sock.error();
  if (st = listener.open(*sock); !st.isOk()) return st;
  port = sock->port;
  address = sock->address;
  return Status::ok();
}

void Server::Impl::teardownAfterFailedInit() noexcept {
  if (backend_open) backend->close();
  backend_open = false;
  handles.abandon();
  listener.closeReserve();
}

void Server::Impl::runLoop() noexcept {
  Status st = handles.run();
  listener.closeReserve();
  {
    std::lock_guard lk(stop_mu);
    stop_status = st;
    stopped = true;
  }
  stopped_cv.notify_all();
}

// ---- stop ------------------------------------------------------------------

void Server::Impl::onStopAsync(uv_async_t* async) noexcept {
  static_cast<Impl*>(async->data)->beginStop();
}

void Server::Impl::beginStop() noexcept {
  if (stopping) return;
  stopping = true;
  listener.close();
  if (conns.beginStop()) {
    closeLoop();
  } else if (!loop_closing) {
    uv_timer_start(stop_timer, &Impl::onStopTimer, kStopFlushMs, 0);
  }
}

void Server::Impl::onStopTimer(uv_timer_t* timer) noexcept {
  auto* s = static_cast<Impl*>(timer->data);
  if (s->conns.size() > 0) {
    try {
      s->log.log(LogLevel::kWarn,
                 fmt::format("stop: {} connection(s) still had unsent replies "
                             "after {} ms; closing them",
                             s->conns.size(), kStopFlushMs));
    } catch (...) {
    }
  }
  s->conns.closeAll();
  s->closeLoop();
}

void Server::Impl::onDrained(void* self) noexcept {
  static_cast<Impl*>(self)->closeLoop();
}

// Every connection is closed: close the backend's and the loop's handles;
// the loop thread's uv_run() then returns.
void Server::Impl::closeLoop() noexcept {
  if (loop_closing) return;
  loop_closing = true;
  if (backend_open) backend->close();
  backend_open = false;
  listener.close();
  handles.closeAll();
}

// ---- public API ------------------------------------------------------------

Result<std::shared_ptr<Server>> Server::Impl::start(
    const ServerOptions& options, std::unique_ptr<store::Backend> backend) {
  if (backend == nullptr) return Status::invalidArgument("no backend");
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
  const auto* relay =
      dynamic_cast<const store::relay::RelayBackend*>(backend.get());
  auto impl = std::make_unique<Impl>(options, std::move(backend));
  impl->relay = relay;
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
  raw->log.log(LogLevel::kDebug, fmt::format("listening on {}", raw->address));
  return server;
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

namespace {
// Relay mode: a RelayBackend for options.upstream.
Result<std::unique_ptr<store::Backend>> makeRelay(const ServerOptions& o) {
  store::relay::RelayOptions ro;
  if (Status st = store::relay::parseUpstream(o.upstream, ro); !st.isOk())
    return st;
  auto level = server::checkOptions(o);
  if (!level) return level.error();
  ro.connect_timeout_ms = o.upstream_connect_ms;
  ro.limits = server::protocolLimits(o.limits);
  ro.combine = o.upstream_combine;
  ro.log = [lvl = *level](store::relay::RelayLog l, std::string_view line) {
    if (static_cast<int>(l) <= static_cast<int>(lvl))
      server::logLine(static_cast<LogLevel>(static_cast<int>(l)), line);
  };
  return std::unique_ptr<store::Backend>(
      std::make_unique<store::relay::RelayBackend>(std::move(ro)));
}
}  // namespace

Result<std::shared_ptr<Server>> Server::start(const ServerOptions& options) {
  if (!options.upstream.empty()) {
    auto relay = makeRelay(options);
    if (!relay) return relay.error();
    return Impl::start(options, std::move(relay).value());
  }
  return Impl::start(options, std::make_unique<store::MemoryBackend>(
                                  server::keyspaceOptions(options)));
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
      uv_async_send(s->stop_async);
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
  ServerCounters c = impl_->ctr.snapshot();
  if (const auto* r = impl_->relay) {
    const store::relay::RelayCounters& rc = r->counters();
    auto get = [](const std::atomic<std::uint64_t>& a) {
      return a.load(std::memory_order_relaxed);
    };
    c.relay_tunneled = get(rc.tunneled);
    c.relay_combined = get(rc.combined);
    c.relay_upstream_adds = get(rc.upstream_adds);
    c.relay_coalesced = get(rc.coalesced);
    c.relay_upstream_reads = get(rc.upstream_reads);
    c.relay_shared_waits = get(rc.shared_waits);
    c.relay_upstream_waits = get(rc.upstream_waits);
    c.relay_losses = get(rc.losses);
    c.relay_reconnects = get(rc.reconnects);
    c.relay_refused = get(rc.refused);
  }
  return c;
}

std::string Server::countersLine() const {
  const ServerCounters c = counters();
  std::string line = server::countersLine(c);
  if (impl_->relay != nullptr) {
    line += fmt::format(
        " relay tunneled={} combined={} (upstream adds={}) coalesced={} "
        "(upstream reads={}) shared_waits={} (upstream waits={}) upstream "
        "losses={} reconnects={} refused={}",
        c.relay_tunneled, c.relay_combined, c.relay_upstream_adds,
        c.relay_coalesced, c.relay_upstream_reads, c.relay_shared_waits,
        c.relay_upstream_waits, c.relay_losses, c.relay_reconnects,
        c.relay_refused);
  }
  return line;
}

namespace server {
Result<std::shared_ptr<Server>> startServer(
    const ServerOptions& options, std::unique_ptr<store::Backend> backend) {
  return Server::Impl::start(options, std::move(backend));
}
}  // namespace server

}  // namespace tcpstore
