#include "store/memory_backend.h"

#include <malloc.h>
#include <uv.h>

namespace tcpstore::store {

MemoryBackend::~MemoryBackend() {
  // close() normally ran; a backend destroyed without it (never opened, or
  // its loop gone) must not leave the handle pointing at it.
  if (idle_ != nullptr) idle_->data = nullptr;
}

Status MemoryBackend::open(BackendHost&, uv_loop_s* loop) {
  if (loop == nullptr) return Status::ok();
  auto* idle = new uv_idle_t{};
  if (int rc = uv_idle_init(loop, idle); rc != 0) {
    delete idle;
    return Status(StatusCode::kIoError,
                  std::string("uv_idle_init: ") + uv_strerror(rc));
  }
  idle->data = this;
  idle_ = idle;
  return Status::ok();
}

Result<Backend::Outcome> MemoryBackend::submit(ConnId conn,
                                               const protocol::Request& req,
                                               Effects& fx) {
  Status st = keyspace_.apply(conn, req, fx);
  // A WAIT replacing a pending one, or CANCEL_WAIT, detaches registrations.
  if (req.command == protocol::Command::kWait ||
      req.command == protocol::Command::kCancelWait) {
    scheduleReclaim();
  }
  if (!st.isOk()) return st;
  return Outcome::kDone;
}

void MemoryBackend::disconnect(ConnId conn) {
  keyspace_.disconnect(conn);
  scheduleReclaim();
}

void MemoryBackend::scheduleReclaim() noexcept {
  if (idle_ == nullptr || reclaiming_) return;
  if (keyspace_.reclaim(0) == 0) return;  // O(1): how many are left
  if (trim_mark_ < keyspace_.memoryBytes()) {
    trim_mark_ = keyspace_.memoryBytes();
  }
  reclaiming_ = true;
  uv_idle_start(idle_, &MemoryBackend::onIdle);
}

void MemoryBackend::onIdle(uv_idle_t* idle) noexcept {
  auto* b = static_cast<MemoryBackend*>(idle->data);
  if (b == nullptr) return;
  if (b->keyspace_.reclaim(kReclaimPerTurn) > 0) return;
  uv_idle_stop(idle);
  b->reclaiming_ = false;
  // Everything detached is freed: give large freed amounts back to the OS
  // (glibc keeps freed small blocks in its arenas otherwise).
  const std::size_t now_bytes = b->keyspace_.memoryBytes();
  const std::uint64_t now = uv_now(idle->loop);
  if (b->trim_mark_ >= now_bytes + kTrimAfterBytes &&
      (b->trims_ == 0 || now - b->last_trim_ms_ >= kTrimEveryMs)) {
    malloc_trim(0);
    b->last_trim_ms_ = now;
    ++b->trims_;
    b->trim_mark_ = now_bytes;
  }
}

void MemoryBackend::close() {
  if (idle_ == nullptr) return;
  uv_idle_t* idle = idle_;
  idle_ = nullptr;
  reclaiming_ = false;
  idle->data = nullptr;
  uv_close(reinterpret_cast<uv_handle_t*>(idle), [](uv_handle_t* h) noexcept {
    delete reinterpret_cast<uv_idle_t*>(h);
  });
}

}  // namespace tcpstore::store
