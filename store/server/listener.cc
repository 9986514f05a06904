#include "store/server/listener.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>

namespace tcpstore::server {

namespace {
constexpr std::uint64_t kRetryMs = 100;
constexpr std::uint64_t kLogEveryMs = 1000;

int openReserve() noexcept { return ::open("/dev/null", O_RDONLY | O_CLOEXEC); }
}  // namespace

Listener::~Listener() {
  // The poll handle is gone by now (the loop ran to its end) or never
  // existed; an fd left here was not handed to it.
  if (poll_ == nullptr && fd_ >= 0) ::close(fd_);
  if (reserve_fd_ >= 0) ::close(reserve_fd_);
}

Status Listener::open(const ListenSocket& sock) {
  fd_ = sock.fd;
  reserve_fd_ = openReserve();
  auto retry = handles_.addTimer(this);
  if (!retry) return retry.error();
  retry_ = *retry;
  auto poll = handles_.addPoll(fd_, this, &Listener::onPollClosed);
  if (!poll) return poll.error();
  poll_ = *poll;
  int rc = uv_poll_start(poll_, UV_READABLE, &Listener::onReadable);
  if (rc != 0) {
    return Status::ioError(fmt::format("uv_poll_start: {}", uv_strerror(rc)));
  }
  return Status::ok();
}

void Listener::close() noexcept {
  if (closing_) return;
  closing_ = true;
  if (retry_ != nullptr) uv_timer_stop(retry_);
  if (poll_ != nullptr) handles_.close(poll_);
}

void Listener::closeReserve() noexcept {
  if (reserve_fd_ >= 0) ::close(reserve_fd_);
  reserve_fd_ = -1;
}

void Listener::onPollClosed(void* self) noexcept {
  auto* l = static_cast<Listener*>(self);
  if (l->fd_ >= 0) ::close(l->fd_);
  l->fd_ = -1;
  l->poll_ = nullptr;
}

void Listener::onReadable(uv_poll_t* poll, int status, int) noexcept {
  auto* l = static_cast<Listener*>(poll->data);
  if (l->closing_) return;
  if (status < 0) {
    bump(l->ctr_.accept_errors);
    l->noteError(-status, 0);
    l->pause();
    return;
  }
  l->acceptAll();
}

// Accepts every pending connection (one wake-up may carry thousands).
void Listener::acceptAll() noexcept {
  while (!closing_) {
    int fd = ::accept4(fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      try {
        handler_.onAccepted(fd);
      } catch (...) {
        log_.log(LogLevel::kError,
                 "out of memory while accepting a connection");
        bump(ctr_.accept_errors);
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
        bump(ctr_.accept_errors);
        shed();
        return;
      default:  // ENOBUFS, ENOMEM, ...: back off briefly
        bump(ctr_.accept_errors);
        noteError(err, 0);
        pause();
        return;
    }
  }
}

void Listener::shed() noexcept {
  std::uint64_t n = 0;
  int last_err = EMFILE;
  if (reserve_fd_ >= 0) {
    ::close(reserve_fd_);
    reserve_fd_ = -1;
    for (;;) {
      int fd = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) {
        ::close(fd);
        ++n;
        continue;
      }
      last_err = errno;
      if (last_err == EINTR || last_err == ECONNABORTED) continue;
      break;
    }
    reserve_fd_ = openReserve();
  }
  bump(ctr_.connections_shed, n);
  noteError(EMFILE, n);
  // Still out of fds (no reserve, or another thread took it): a readable
  // listener would spin the loop, so stop polling it for a moment.
  if (reserve_fd_ < 0 || (last_err != EAGAIN && last_err != EWOULDBLOCK)) {
    pause();
  }
}

void Listener::pause() noexcept {
  if (closing_) return;
  uv_poll_stop(poll_);
  uv_timer_start(retry_, &Listener::onRetry, kRetryMs, 0);
}

void Listener::onRetry(uv_timer_t* timer) noexcept {
  auto* l = static_cast<Listener*>(timer->data);
  if (l->closing_) return;
  if (l->reserve_fd_ < 0) l->reserve_fd_ = openReserve();
  uv_poll_start(l->poll_, UV_READABLE, &Listener::onReadable);
}

// At most one log line per second about accept failures.
void Listener::noteError(int err, std::uint64_t shed_now) noexcept {
  ++errors_unlogged_;
  shed_unlogged_ += shed_now;
  const std::uint64_t now = uv_now(handles_.loop());
  if (logged_once_ && now - last_log_ms_ < kLogEveryMs) return;
  try {
    log_.log(LogLevel::kWarn,
             fmt::format("accept failed: {}; {} error(s), {} connection(s) "
                         "shed since the last report; {} connection(s) still "
                         "served",
                         errnoText(err), errors_unlogged_, shed_unlogged_,
                         handler_.numConnections()));
  } catch (...) {
  }
  errors_unlogged_ = 0;
  shed_unlogged_ = 0;
  last_log_ms_ = now;
  logged_once_ = true;
}

}  // namespace tcpstore::server
