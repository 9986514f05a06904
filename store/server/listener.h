// Listener: the listening socket and the accept loop.
//
// The socket is polled by us and accepted with accept4(), so EMFILE is seen
// and counted (libuv's uv_listen would shed silently). Out of fds, the
// listener gives up a reserve fd, accepts and closes every pending
// connection (their clients see a close at once instead of hanging in the
// backlog), and takes the reserve back. Other accept failures pause
// accepting for 100 ms. Failures are logged at most once a second.
// Loop thread only (open() runs before the loop thread starts).
#pragma once

#include <sys/socket.h>
#include <uv.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "store/server/counters.h"
#include "store/server/log.h"
#include "store/server/loop_handles.h"
#include "store/server/net.h"

namespace tcpstore::server {

// What the listener hands accepted sockets to.
class AcceptHandler {
 public:
  // Owns `fd` (non-blocking, close-on-exec) from here on (closes it on
  // failure). May throw std::bad_alloc (the fd is closed first).
  virtual void onAccepted(int fd) = 0;
  // Connections being served (for the accept-failure log line).
  virtual std::size_t numConnections() const noexcept = 0;

 protected:
  ~AcceptHandler() = default;
};

class Listener {
 public:
  Listener(LoopHandles& handles, Counters& ctr, const Logger& log,
           AcceptHandler& handler) noexcept
      : handles_(handles), ctr_(ctr), log_(log), handler_(handler) {}
  ~Listener();
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  // Takes `sock` (closed with the listener, even on error) and starts
  // polling it.
  Status open(const ListenSocket& sock);
  // Stops accepting and closes the socket (once its poll handle is closed).
  void close() noexcept;
  // Gives the reserve fd back (after the loop ended).
  void closeReserve() noexcept;

 private:
  static void onReadable(uv_poll_t* poll, int status, int events) noexcept;
  static void onRetry(uv_timer_t* timer) noexcept;
  static void onPollClosed(void* self) noexcept;
  void acceptAll() noexcept;
  void shed() noexcept;
  void pause() noexcept;
  void noteError(int err, std::uint64_t shed_now) noexcept;

  LoopHandles& handles_;
  Counters& ctr_;
  const Logger& log_;
  AcceptHandler& handler_;
  uv_poll_t* poll_ = nullptr;
  uv_timer_t* retry_ = nullptr;
  int fd_ = -1;
  int reserve_fd_ = -1;  // spare fd given up to shed connections on EMFILE
  bool closing_ = false;
  // Accept-failure log throttle.
  std::uint64_t last_log_ms_ = 0;
  bool logged_once_ = false;
  std::uint64_t errors_unlogged_ = 0;
  std::uint64_t shed_unlogged_ = 0;
};

}  // namespace tcpstore::server
