#include "store/memory_backend.h"

#include <malloc.h>
#include <uv.h>

#include <cstdlib>

namespace tcpstore::store {

MemoryBackend::~MemoryBackend() {
  // close() normally ran; a backend destroyed without it (never opened, or
  // its loop gone) must not leave the handle pointing at it.
  if (idle_ != nullptr) idle_->data = nullptr;
}

Status MemoryBackend::open(BackendHost& host, uv_loop_s* loop) {
  host_ = &host;
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
  if (req.command == protocol::Command::kWait) {
    // Without a loop (or a host) nothing could finish it later.
    const bool stepped = idle_ != nullptr && host_ != nullptr;
    const bool pending = keyspace_.startWait(
        conn, req, fx, stepped ? kSyncWaitKeys : static_cast<std::size_t>(-1));
    scheduleWork();  // registration, or the waits it replaced
    return pending ? Outcome::kPending : Outcome::kDone;
  }
  Status st = keyspace_.apply(conn, req, fx);
  // CANCEL_WAIT detaches registrations.
  if (req.command == protocol::Command::kCancelWait) scheduleWork();
  noteMemory();
  if (!st.isOk()) return st;
  return Outcome::kDone;
}

void MemoryBackend::disconnect(ConnId conn) {
  keyspace_.disconnect(conn);
  scheduleWork();
}

void MemoryBackend::noteMemory() noexcept {
  const std::size_t now = keyspace_.memoryBytes();
  if (now > trim_mark_) {
    trim_mark_ = now;
  } else if (trim_mark_ >= now + kTrimSliceBytes) {
    scheduleWork();  // the trim runs on the idle handle, not in this request
  }
}

void MemoryBackend::scheduleWork() noexcept {
  if (idle_ == nullptr || working_) return;
  const bool reclaim = keyspace_.reclaim(0) != 0;  // O(1): how many are left
  const bool trim_due =
      trim_mark_ >= keyspace_.memoryBytes() + kTrimSliceBytes;
  if (!reclaim && !trim_due && keyspace_.waitsInProgress() == 0) return;
  if (reclaim && trim_mark_ < keyspace_.memoryBytes()) {
    trim_mark_ = keyspace_.memoryBytes();
  }
  working_ = true;
  uv_idle_start(idle_, &MemoryBackend::onIdle);
}

void MemoryBackend::onIdle(uv_idle_t* idle) noexcept {
  auto* b = static_cast<MemoryBackend*>(idle->data);
  if (b == nullptr) return;
  b->registerSome();
  if (b->idle_ == nullptr) return;  // closed by a completion
  // Registrations freed by disconnects during this turn count for the trim.
  if (b->trim_mark_ < b->keyspace_.memoryBytes()) {
    b->trim_mark_ = b->keyspace_.memoryBytes();
  }
  const bool freed_all = b->reclaimSome();
  if (!freed_all || b->keyspace_.waitsInProgress() != 0) {
    // A long reclaim returns memory as it goes: one trim after everything
    // would cost tens of ms (57 ms measured after 1.1 GiB).
    if (b->trim_mark_ >= b->keyspace_.memoryBytes() + kTrimSliceBytes) {
      b->trim();
    }
    return;
  }
  uv_idle_stop(idle);
  b->working_ = false;
  b->maybeTrim();
}

void MemoryBackend::registerSome() noexcept {
  const std::uint64_t start = uv_hrtime();
  while (keyspace_.waitsInProgress() != 0) {
    fx_.clear();
    if (auto done = keyspace_.advanceWaits(kStepKeys, fx_)) {
      // May resume the connection and re-enter submit().
      host_->complete(done->conn,
                      done->ok ? Status::ok()
                               : Status::limitExceeded(
                                     "out of memory registering the WAIT"),
                      fx_);
      if (idle_ == nullptr) return;
    }
    if (uv_hrtime() - start >= kRegisterNsPerTurn) break;
  }
  if (fx_.bytes().capacity() > 4096) fx_ = Effects();
}

bool MemoryBackend::reclaimSome() noexcept {
  const std::uint64_t start = uv_hrtime();
  while (keyspace_.reclaim(kReclaimStep) != 0) {
    if (uv_hrtime() - start >= kReclaimNsPerTurn) return false;
  }
  return true;
}

void MemoryBackend::maybeTrim() noexcept {
  // Everything detached is freed: give large freed amounts back to the OS
  // (glibc keeps freed small blocks in its arenas otherwise). The cost of a
  // trim follows what was freed since the last one, so no rate limit: a
  // trim follows at least kTrimAfterBytes of freeing.
  if (trim_mark_ >= keyspace_.memoryBytes() + kTrimAfterBytes) trim();
}

void MemoryBackend::trim() noexcept {
  const std::uint64_t t0 = uv_hrtime();
  malloc_trim(0);
  // It leaves a thread arena's top chunk; a free of 64 KiB or more trims
  // that down to the trim threshold (this block comes from the arena: it
  // is under the mmap threshold).
  void* volatile block = std::malloc(96u << 10);
  std::free(block);
  last_trim_ns_ = uv_hrtime() - t0;
  ++trims_;
  trim_mark_ = keyspace_.memoryBytes();
}

void MemoryBackend::close() {
  if (idle_ == nullptr) return;
  uv_idle_t* idle = idle_;
  idle_ = nullptr;
  working_ = false;
  idle->data = nullptr;
  uv_close(reinterpret_cast<uv_handle_t*>(idle), [](uv_handle_t* h) noexcept {
    delete reinterpret_cast<uv_idle_t*>(h);
  });
}

}  // namespace tcpstore::store
