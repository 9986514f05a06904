// MemoryBackend: the in-memory Backend, a Keyspace answering every request
// inside submit(), except a WAIT naming many keys.
//
// Loop work is bounded per turn (issue #13: no loop stall from one event).
// One uv_idle handle, active only while there is work, does per loop turn:
//  - registration: a WAIT of more than kSyncWaitKeys keys is left pending
//    (kPending: its connection decodes nothing else meanwhile) and its keys
//    are registered kStepKeys at a time for at most kRegisterNsPerTurn per
//    turn, oldest WAIT first, other connections being served between turns;
//    then its outcome goes out through BackendHost::complete() (nothing, or
//    STOP_WAITING if every key has arrived meanwhile). The result is that of
//    registering it at once (Keyspace::startWait());
//  - reclaim: detached registrations (a closed connection's waits and
//    watches, replaced or cancelled waits) are freed for at most
//    kReclaimNsPerTurn per turn. The allocator is asked to return free
//    pages to the OS (malloc_trim) after every kTrimSliceBytes freed, and
//    when they are all freed if kTrimAfterBytes were freed since the last
//    trim: a trim's cost grows with what was freed since the last one
//    (measured: 2-12 ms per 32 MiB slice, 42-57 ms for one trim after
//    1.1 GiB, on a loaded 2-vCPU machine);
//  - trim after deletes: once kTrimSliceBytes of stored data (deleted
//    values, popped queues) are gone since the peak, one trim on the idle
//    handle. Large values are mmapped (the binary's allocator policy), but
//    after a WAIT drop glibc serves them from the arena's freed chunks,
//    which it keeps once they are freed: RSS stayed 615 MiB up after 936 MiB
//    of 8 MiB values were deleted.
#pragma once

#include <cstddef>
#include <cstdint>

#include "store/backend.h"
#include "store/keyspace.h"

struct uv_idle_s;

namespace tcpstore::store {

class MemoryBackend final : public Backend {
 public:
  // A WAIT of at most this many keys is registered inside submit() (about
  // 1.5 ms at the worst measured ~0.7 us per key, with ~10M registrations).
  static constexpr std::size_t kSyncWaitKeys = 2048;
  // Keys registered between two clock reads.
  static constexpr std::size_t kStepKeys = 256;
  // Loop time per turn for registering, and for freeing.
  static constexpr std::uint64_t kRegisterNsPerTurn = 2'000'000;
  static constexpr std::uint64_t kReclaimNsPerTurn = 2'000'000;
  // Registrations freed between two clock reads (one key of a WAIT, or one
  // watch).
  static constexpr std::size_t kReclaimStep = 64;
  // Freed bytes (by memoryBytes()) since the last trim that make a trim
  // worth its cost: once everything is freed, and while freeing goes on.
  static constexpr std::size_t kTrimAfterBytes = 4u << 20;
  static constexpr std::size_t kTrimSliceBytes = 32u << 20;

  explicit MemoryBackend(KeyspaceOptions options = {})
      : keyspace_(std::move(options)) {}
  ~MemoryBackend() override;

  // Creates the idle handle on `loop` (none if `loop` is null: then every
  // WAIT is registered inside submit() and registrations drain only with
  // the traffic). kIoError if libuv fails.
  Status open(BackendHost& host, uv_loop_s* loop) override;
  // Keyspace::apply(); its error, or kDone. A WAIT of more than
  // kSyncWaitKeys keys: kPending (when a loop was given to open()).
  Result<Outcome> submit(ConnId conn, const protocol::Request& req,
                         Effects& fx) override;
  // Also cancels `conn`'s WAIT in progress.
  void disconnect(ConnId conn) override;
  // Closes the idle handle (freed in its close callback). WAITs still in
  // progress are never completed (their connections are closing).
  void close() override;
  std::size_t numKeys() const noexcept override { return keyspace_.numKeys(); }
  std::size_t memoryBytes() const noexcept override {
    return keyspace_.memoryBytes();
  }

  const Keyspace& keyspace() const noexcept { return keyspace_; }
  // Times the allocator was asked to return memory, and how long the last
  // time took (for tests and logs).
  std::uint64_t trims() const noexcept { return trims_; }
  std::uint64_t lastTrimNs() const noexcept { return last_trim_ns_; }

 private:
  static void onIdle(uv_idle_s* idle) noexcept;
  // Starts the idle handle if there is work for it.
  void scheduleWork() noexcept;
  void registerSome() noexcept;
  // True when nothing is left to free.
  bool reclaimSome() noexcept;
  void maybeTrim() noexcept;
  // After a request: raises trim_mark_ to a new peak, or schedules a trim
  // once kTrimSliceBytes were freed since (deleted values, popped queues).
  void noteMemory() noexcept;
  void trim() noexcept;

  Keyspace keyspace_;
  BackendHost* host_ = nullptr;
  uv_idle_s* idle_ = nullptr;
  bool working_ = false;       // idle_ started
  Effects fx_;                 // a finished WAIT's outcome
  std::size_t trim_mark_ = 0;  // memoryBytes() after the last trim (or peak)
  std::uint64_t trims_ = 0;
  std::uint64_t last_trim_ns_ = 0;
};

}  // namespace tcpstore::store
