#include "store/relay/upstream_link.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <new>

#include "store/relay/upstream_connect.h"

namespace tcpstore::store::relay {

namespace mux = protocol::mux;

struct UpstreamLink::Tcp {
  uv_tcp_t handle{};
  uv_connect_t connect{};
  UpstreamLink* link = nullptr;
};

struct UpstreamLink::Write {
  uv_write_t req{};
  std::string bytes;
  UpstreamLink* link = nullptr;
  std::uint64_t generation = 0;
};

UpstreamLink::UpstreamLink(const RelayOptions& options, LinkHandler& handler,
                           RelayCounters& counters)
    : options_(options),
      handler_(handler),
      counters_(counters),
      rng_(static_cast<std::uint32_t>(::getpid()) ^
           static_cast<std::uint32_t>(uv_hrtime())) {}

UpstreamLink::~UpstreamLink() {
  if (addrs_ != nullptr) uv_freeaddrinfo(addrs_);
}

std::string UpstreamLink::name() const {
  return options_.host.find(':') != std::string::npos
             ? "[" + options_.host + "]:" + std::to_string(options_.port)
             : options_.host + ":" + std::to_string(options_.port);
}

void UpstreamLink::log(RelayLog level, const std::string& line) const noexcept {
  if (options_.log) options_.log(level, line);
}

Status UpstreamLink::open(uv_loop_t* loop, int fd) {
  loop_ = loop;
  timer_ = new uv_timer_t;
  if (int rc = uv_timer_init(loop_, timer_); rc != 0) {
    delete timer_;
    timer_ = nullptr;
    ::close(fd);
    return Status::ioError(std::string("uv_timer_init: ") + uv_strerror(rc));
  }
  timer_->data = this;
  Status st = adopt(fd);
  if (!st.isOk()) return st;
  state_ = State::kUp;
  return Status::ok();
}

Status UpstreamLink::adopt(int fd) {
  auto* t = new Tcp;
  t->link = this;
  if (int rc = uv_tcp_init(loop_, &t->handle); rc != 0) {
    delete t;
    ::close(fd);
    return Status::ioError(std::string("uv_tcp_init: ") + uv_strerror(rc));
  }
  t->handle.data = t;
  tcp_ = t;
  if (int rc = uv_tcp_open(&t->handle, fd); rc != 0) {
    ::close(fd);
    closeTcp();
    return Status::ioError(std::string("uv_tcp_open: ") + uv_strerror(rc));
  }
  uv_tcp_nodelay(&t->handle, 1);
  startReading();
  return Status::ok();
}

void UpstreamLink::startReading() noexcept {
  in_.clear();
  need_ = mux::kFrameHeaderBytes;
  uv_read_start(reinterpret_cast<uv_stream_t*>(&tcp_->handle),
                &UpstreamLink::onAlloc, &UpstreamLink::onRead);
}

void UpstreamLink::closeTcp() noexcept {
  if (tcp_ == nullptr) return;
  uv_close(reinterpret_cast<uv_handle_t*>(&tcp_->handle),
           &UpstreamLink::onTcpClosed);
  tcp_ = nullptr;
  out_.clear();
  writing_ = 0;
  write_in_flight_ = false;
}

void UpstreamLink::onTcpClosed(uv_handle_t* h) noexcept {
  delete static_cast<Tcp*>(h->data);
}

void UpstreamLink::close() noexcept {
  state_ = State::kClosed;
  closeTcp();
  if (timer_ != nullptr) {
    uv_close(reinterpret_cast<uv_handle_t*>(timer_),
             &UpstreamLink::onTimerClosed);
    timer_ = nullptr;
  }
  if (resolving_ != nullptr) {
    uv_cancel(reinterpret_cast<uv_req_t*>(resolving_));
    resolving_ = nullptr;  // its callback frees it
  }
}

void UpstreamLink::onTimerClosed(uv_handle_t* h) noexcept {
  delete reinterpret_cast<uv_timer_t*>(h);
}

// ---- output -----------------------------------------------------------------

void UpstreamLink::flush() noexcept {
  if (state_ != State::kUp) {
    out_.clear();
    return;
  }
  if (write_in_flight_ || out_.empty()) return;
  auto* w = new (std::nothrow) Write;
  if (w == nullptr) {
    drop(Status::ioError("out of memory writing to the upstream"));
    return;
  }
  w->bytes.swap(out_);
  w->link = this;
  w->generation = generation_;
  w->req.data = w;
  uv_buf_t buf =
      uv_buf_init(w->bytes.data(), static_cast<unsigned>(w->bytes.size()));
  const int rc =
      uv_write(&w->req, reinterpret_cast<uv_stream_t*>(&tcp_->handle), &buf, 1,
               &UpstreamLink::onWritten);
  if (rc != 0) {
    delete w;
    drop(Status::ioError(std::string("write to upstream: ") + uv_strerror(rc)));
    return;
  }
  writing_ = w->bytes.size();
  write_in_flight_ = true;
}

void UpstreamLink::onWritten(uv_write_t* req, int status) noexcept {
  auto* w = static_cast<Write*>(req->data);
  UpstreamLink* l = w->link;
  const bool current = w->generation == l->generation_ &&
                       l->state_ == State::kUp && l->write_in_flight_;
  delete w;
  if (!current) return;
  l->write_in_flight_ = false;
  l->writing_ = 0;
  if (status != 0) {
    l->drop(Status::closed(std::string("write to upstream: ") +
                           uv_strerror(status)));
    return;
  }
  l->flush();
}

// ---- input ------------------------------------------------------------------

void UpstreamLink::onAlloc(uv_handle_t* h, std::size_t,
                           uv_buf_t* buf) noexcept {
  UpstreamLink* l = static_cast<Tcp*>(h->data)->link;
  *buf = uv_buf_init(l->scratch_, sizeof l->scratch_);
}

void UpstreamLink::onRead(uv_stream_t* s, ssize_t nread,
                          const uv_buf_t* buf) noexcept {
  auto* t = static_cast<Tcp*>(s->data);
  UpstreamLink* l = t->link;
  if (t != l->tcp_ || nread == 0) return;
  if (nread < 0) {
    const std::string why = nread == UV_EOF
                                ? "closed by the upstream"
                                : uv_strerror(static_cast<int>(nread));
    if (l->state_ == State::kHandshake) {
      l->failAttempt(notRelayCapable(l->options_.host, l->options_.port) +
                     " (" + why + " after the preamble)");
    } else {
      l->lose(
          Status::closed("connection to upstream " + l->name() + " " + why));
    }
    return;
  }
  l->handleBytes(buf->base, static_cast<std::size_t>(nread));
}

void UpstreamLink::handleBytes(const char* data, std::size_t n) noexcept {
  if (state_ == State::kHandshake) {
    handshake(data, n);
    return;
  }
  try {
    in_.append(data, n);
  } catch (...) {
    drop(Status::ioError("out of memory reading from the upstream"));
    return;
  }
  decodeFrames();
}

void UpstreamLink::decodeFrames() noexcept {
  std::size_t off = 0;
  const std::uint64_t gen = generation_;
  while (state_ == State::kUp && generation_ == gen &&
         in_.size() - off >= need_) {
    mux::Frame f;
    const auto r = mux::decodeFrame(std::string_view(in_).substr(off),
                                    options_.max_frame_bytes, f);
    if (r.status == mux::FrameDecodeResult::kNeedMore) {
      need_ = r.need_at_least;
      break;
    }
    if (r.status == mux::FrameDecodeResult::kError) {
      drop(Status::protocolError("upstream " + name() +
                                 " sent a bad frame: " + r.error));
      return;
    }
    need_ = mux::kFrameHeaderBytes;
    off += r.consumed;
    if (f.type != mux::FrameType::kData && f.type != mux::FrameType::kClosed) {
      drop(Status::protocolError("upstream " + name() + " sent a " +
                                 std::string(mux::frameTypeName(f.type)) +
                                 " frame (server->relay "
                                 "frames are DATA and CLOSED)"));
      return;
    }
    if (!handler_.onFrame(f)) {
      drop(Status::protocolError("upstream " + name() +
                                 " broke a channel rule"));
      return;
    }
  }
  if (state_ != State::kUp || generation_ != gen) return;
  in_.erase(0, off);
  if (in_.capacity() > 1024 * 1024 && in_.size() < 64 * 1024)
    in_.shrink_to_fit();
  handler_.onReadDone();
}

// ---- loss and reconnect
// -------------------------------------------------------

void UpstreamLink::drop(const Status& why) noexcept {
  if (state_ == State::kUp) lose(why);
}

void UpstreamLink::lose(const Status& why) noexcept {
  closeTcp();
  in_.clear();
  state_ = State::kWaiting;
  failures_ = 0;
  last_failure_.clear();
  bumpRelay(counters_.losses);
  log(RelayLog::kWarn, "lost the upstream: " + why.message() +
                           "; closing its clients, reconnecting");
  handler_.onLinkDown(why);
  if (state_ == State::kWaiting) scheduleAttempt();
}

void UpstreamLink::failAttempt(const std::string& why) noexcept {
  closeTcp();
  if (addrs_ != nullptr) {
    uv_freeaddrinfo(addrs_);
    addrs_ = next_addr_ = nullptr;
  }
  if (state_ == State::kClosed) return;
  state_ = State::kWaiting;
  ++failures_;
  if (why != last_failure_) {
    log(RelayLog::kWarn, "reconnecting to upstream " + name() + ": " + why +
                             " (retrying with backoff)");
    last_failure_ = why;
  }
  scheduleAttempt();
}

void UpstreamLink::scheduleAttempt() noexcept {
  std::uint64_t delay = options_.backoff_min_ms;
  for (std::uint32_t i = 0; i < failures_ && delay < options_.backoff_max_ms;
       ++i) {
    delay *= 2;
  }
  if (delay > options_.backoff_max_ms) delay = options_.backoff_max_ms;
  // Jitter: [delay/2, delay].
  const std::uint64_t half = delay / 2;
  delay = half + (half > 0 ? rng_() % (half + 1) : 0);
  uv_timer_start(timer_, &UpstreamLink::onTimer, delay, 0);
}

void UpstreamLink::onTimer(uv_timer_t* t) noexcept {
  auto* l = static_cast<UpstreamLink*>(t->data);
  switch (l->state_) {
    case State::kWaiting:
      l->attempt();
      return;
    case State::kResolving:
    case State::kConnecting:
    case State::kHandshake:
      if (l->state_ == State::kResolving) l->resolving_ = nullptr;
      l->failAttempt("no answer within " +
                     std::to_string(l->options_.connect_timeout_ms) + " ms");
      return;
    default:
      return;
  }
}

void UpstreamLink::attempt() noexcept {
  auto* req = new (std::nothrow) uv_getaddrinfo_t;
  if (req == nullptr) {
    failAttempt("out of memory");
    return;
  }
  req->data = this;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  const std::string service = std::to_string(options_.port);
  state_ = State::kResolving;
  resolving_ = req;
  uv_timer_start(timer_, &UpstreamLink::onTimer, options_.connect_timeout_ms,
                 0);
  const int rc = uv_getaddrinfo(loop_, req, &UpstreamLink::onResolved,
                                options_.host.c_str(), service.c_str(), &hints);
  if (rc != 0) {
    delete req;
    resolving_ = nullptr;
    failAttempt(std::string("cannot resolve: ") + uv_strerror(rc));
  }
}

void UpstreamLink::onResolved(uv_getaddrinfo_t* req, int status,
                              addrinfo* res) noexcept {
  auto* l = static_cast<UpstreamLink*>(req->data);
  const bool current = l->resolving_ == req;
  delete req;
  if (!current) {
    if (res != nullptr) uv_freeaddrinfo(res);
    return;
  }
  l->resolving_ = nullptr;
  if (status != 0) {
    if (res != nullptr) uv_freeaddrinfo(res);
    l->failAttempt(std::string("cannot resolve: ") + uv_strerror(status));
    return;
  }
  l->addrs_ = l->next_addr_ = res;
  l->state_ = State::kConnecting;
  l->connectNext();
}

void UpstreamLink::connectNext() noexcept {
  closeTcp();
  if (next_addr_ == nullptr) {
    failAttempt("cannot connect");
    return;
  }
  const addrinfo* ai = next_addr_;
  next_addr_ = next_addr_->ai_next;
  auto* t = new (std::nothrow) Tcp;
  if (t == nullptr) {
    failAttempt("out of memory");
    return;
  }
  t->link = this;
  if (uv_tcp_init(loop_, &t->handle) != 0) {
    delete t;
    failAttempt("uv_tcp_init failed");
    return;
  }
  t->handle.data = t;
  t->connect.data = t;
  tcp_ = t;
  const int rc = uv_tcp_connect(&t->connect, &t->handle, ai->ai_addr,
                                &UpstreamLink::onConnected);
  if (rc != 0) connectNext();
}

void UpstreamLink::onConnected(uv_connect_t* req, int status) noexcept {
  auto* t = static_cast<Tcp*>(req->data);
  UpstreamLink* l = t->link;
  if (status == UV_ECANCELED || t != l->tcp_) return;
  if (status != 0) {
    if (l->next_addr_ != nullptr) {
      l->connectNext();
    } else {
      l->failAttempt(std::string("cannot connect: ") + uv_strerror(status));
    }
    return;
  }
  if (l->addrs_ != nullptr) {
    uv_freeaddrinfo(l->addrs_);
    l->addrs_ = l->next_addr_ = nullptr;
  }
  uv_tcp_nodelay(&t->handle, 1);
  l->state_ = State::kHandshake;
  l->startReading();
  // The preamble: a short write, straight to the socket.
  auto* w = new (std::nothrow) Write;
  if (w == nullptr) {
    l->failAttempt("out of memory");
    return;
  }
  w->bytes.assign(mux::kMuxPreamble);
  w->link = l;
  w->generation = UINT64_MAX;  // never the current one: ignored
  w->req.data = w;
  uv_buf_t buf =
      uv_buf_init(w->bytes.data(), static_cast<unsigned>(w->bytes.size()));
  if (uv_write(&w->req, reinterpret_cast<uv_stream_t*>(&t->handle), &buf, 1,
               &UpstreamLink::onWritten) != 0) {
    delete w;
    l->failAttempt("cannot write the preamble");
  }
}

void UpstreamLink::handshake(const char* data, std::size_t n) noexcept {
  const std::string_view pre = mux::kMuxPreamble;
  const std::size_t take = std::min(n, pre.size() - in_.size());
  in_.append(data, take);
  if (std::memcmp(in_.data(), pre.data(), in_.size()) != 0) {
    failAttempt(notRelayCapable(options_.host, options_.port));
    return;
  }
  if (in_.size() < pre.size()) return;
  in_.clear();
  uv_timer_stop(timer_);
  state_ = State::kUp;
  ++generation_;
  failures_ = 0;
  last_failure_.clear();
  bumpRelay(counters_.reconnects);
  log(RelayLog::kWarn, "upstream " + name() + " is back: serving again");
  handler_.onLinkUp();
  if (take < n && state_ == State::kUp) handleBytes(data + take, n - take);
}

}  // namespace tcpstore::store::relay
