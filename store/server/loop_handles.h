// LoopHandles: the server's libuv loop and the loop's own handles (timers,
// the stop async, the flush check, the listening poll), each added in one
// place here and freed in one close callback here.
//
// add*() initializes a handle, sets its data pointer and counts it; close()
// closes one handle once (a second call is a no-op); closeAll() closes every
// handle still open. Connections (uv_poll_t) are not loop handles: each one
// is owned by its Connection. Loop thread only, except init() and
// abandon(), which run on the starting thread before the loop thread exists.
#pragma once

#include <uv.h>

#include <cstddef>
#include <vector>

#include "tcpstore/status.h"

namespace tcpstore::server {

class LoopHandles {
 public:
  // Called from a handle's close callback with the handle's data pointer,
  // before the handle is freed (e.g. to close the fd a poll watched).
  using OnClosed = void (*)(void* data) noexcept;

  LoopHandles() = default;
  LoopHandles(const LoopHandles&) = delete;
  LoopHandles& operator=(const LoopHandles&) = delete;
  ~LoopHandles();

  Status init();
  uv_loop_t* loop() noexcept { return &loop_; }

  // Each returns the initialized handle (data = `data`), or an error.
  // The check runs `cb` after every poll phase and does not keep the loop
  // alive; timers, idles and polls are created stopped.
  Result<uv_timer_t*> addTimer(void* data);
  Result<uv_async_t*> addAsync(void* data, uv_async_cb cb);
  Result<uv_check_t*> addCheck(void* data, uv_check_cb cb);
  Result<uv_idle_t*> addIdle(void* data);
  Result<uv_poll_t*> addPoll(int fd, void* data, OnClosed on_closed);

  void close(void* handle) noexcept;
  void closeAll() noexcept;
  // Handles added and not yet through their close callback.
  std::size_t open() const noexcept { return live_.size(); }

  // Loop thread: runs the loop until no handle is left, then closes it.
  // An error names the handles still open (they are closed first).
  Status run() noexcept;
  // After a failed start: closes every handle, runs the loop until they
  // are freed, closes the loop.
  void abandon() noexcept;

 private:
  struct Slot;
  template <typename Init>
  Result<Slot*> add(void* data, OnClosed on_closed, const char* what,
                    Init init);
  static void onClosed(uv_handle_t* h) noexcept;

  uv_loop_t loop_{};
  bool inited_ = false;
  std::vector<Slot*> live_;
};

}  // namespace tcpstore::server
