#include "store/server/loop_handles.h"

#include <fmt/format.h>

#include <algorithm>
#include <new>
#include <string>

namespace tcpstore::server {

// The handle comes first, so a uv_handle_t* is also a Slot*.
struct LoopHandles::Slot {
  union {
    uv_handle_t handle;
    uv_timer_t timer;
    uv_async_t async;
    uv_check_t check;
    uv_idle_t idle;
    uv_poll_t poll;
  };
  LoopHandles* owner = nullptr;
  OnClosed on_closed = nullptr;
  Slot() : timer() {}
};

LoopHandles::~LoopHandles() {
  // Only reached with handles left if the loop never ran; free them anyway.
  for (Slot* s : live_) delete s;
}

Status LoopHandles::init() {
  int rc = uv_loop_init(&loop_);
  if (rc != 0) {
    return Status::ioError(fmt::format("uv_loop_init: {}", uv_strerror(rc)));
  }
  inited_ = true;
  return Status::ok();
}

// Allocates a slot, runs `init` on it (a libuv *_init call) and registers
// it. A handle whose init failed was never registered with the loop: its
// slot is freed without a close.
template <typename Init>
Result<LoopHandles::Slot*> LoopHandles::add(void* data, OnClosed on_closed,
                                            const char* what, Init init) {
  auto* s = new (std::nothrow) Slot();
  if (s == nullptr) return Status::ioError("out of memory for a loop handle");
  try {
    live_.reserve(live_.size() + 1);
  } catch (...) {
    delete s;
    return Status::ioError("out of memory for a loop handle");
  }
  int rc = init(*s);
  if (rc != 0) {
    delete s;
    return Status::ioError(fmt::format("{}: {}", what, uv_strerror(rc)));
  }
  s->owner = this;
  s->on_closed = on_closed;
  s->handle.data = data;
  live_.push_back(s);
  return s;
}

Result<uv_timer_t*> LoopHandles::addTimer(void* data) {
  auto s = add(data, nullptr, "uv_timer_init",
               [&](Slot& x) { return uv_timer_init(&loop_, &x.timer); });
  if (!s) return s.error();
  return &(*s)->timer;
}

Result<uv_async_t*> LoopHandles::addAsync(void* data, uv_async_cb cb) {
  auto s = add(data, nullptr, "uv_async_init",
               [&](Slot& x) { return uv_async_init(&loop_, &x.async, cb); });
  if (!s) return s.error();
  return &(*s)->async;
}

Result<uv_check_t*> LoopHandles::addCheck(void* data, uv_check_cb cb) {
  auto s = add(data, nullptr, "uv_check_init",
               [&](Slot& x) { return uv_check_init(&loop_, &x.check); });
  if (!s) return s.error();
  uv_check_start(&(*s)->check, cb);
  uv_unref(&(*s)->handle);
  return &(*s)->check;
}

Result<uv_idle_t*> LoopHandles::addIdle(void* data) {
  auto s = add(data, nullptr, "uv_idle_init",
               [&](Slot& x) { return uv_idle_init(&loop_, &x.idle); });
  if (!s) return s.error();
  return &(*s)->idle;
}

Result<uv_poll_t*> LoopHandles::addPoll(int fd, void* data,
                                        OnClosed on_closed) {
  auto s = add(data, on_closed, "uv_poll_init_socket", [&](Slot& x) {
    return uv_poll_init_socket(&loop_, &x.poll, fd);
  });
  if (!s) return s.error();
  return &(*s)->poll;
}

void LoopHandles::close(void* handle) noexcept {
  auto* h = static_cast<uv_handle_t*>(handle);
  if (h != nullptr && !uv_is_closing(h)) uv_close(h, &LoopHandles::onClosed);
}

void LoopHandles::closeAll() noexcept {
  for (Slot* s : live_) close(&s->handle);
}

void LoopHandles::onClosed(uv_handle_t* h) noexcept {
  auto* s = reinterpret_cast<Slot*>(h);
  if (s->on_closed != nullptr) s->on_closed(h->data);
  auto& live = s->owner->live_;
  live.erase(std::find(live.begin(), live.end(), s));
  delete s;
}

Status LoopHandles::run() noexcept {
  uv_run(&loop_, UV_RUN_DEFAULT);
  int rc = uv_loop_close(&loop_);
  if (rc == 0) {
    inited_ = false;
    return Status::ok();
  }
  std::string names;
  uv_walk(
      &loop_,
      [](uv_handle_t* h, void* arg) noexcept {
        auto* out = static_cast<std::string*>(arg);
        try {
          if (!out->empty()) *out += ", ";
          *out += uv_handle_type_name(uv_handle_get_type(h));
        } catch (...) {
        }
        if (!uv_is_closing(h)) uv_close(h, nullptr);
      },
      &names);
  uv_run(&loop_, UV_RUN_DEFAULT);
  (void)uv_loop_close(&loop_);
  inited_ = false;
  try {
    return Status::ioError(fmt::format("uv_loop_close: {} (leaked handles: {})",
                                       uv_strerror(rc),
                                       names.empty() ? "none" : names));
  } catch (...) {
    return Status::ioError("uv_loop_close failed (leaked handles)");
  }
}

void LoopHandles::abandon() noexcept {
  if (!inited_) return;
  closeAll();
  uv_run(&loop_, UV_RUN_DEFAULT);
  (void)uv_loop_close(&loop_);
  inited_ = false;
}

}  // namespace tcpstore::server
