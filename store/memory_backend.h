// MemoryBackend: the in-memory Backend, a Keyspace answering every request
// inside submit() (always kDone). The default backend of tcpstore-server.
//
// Detached registrations (a closed connection's waits and watches, replaced
// or cancelled waits) are freed incrementally: while any are left, a uv_idle
// handle frees at most kReclaimPerTurn of them per loop turn, so releasing a
// huge WAIT never stalls the loop. Once a large amount has been freed the
// allocator is asked to return free pages to the OS (malloc_trim, at most
// once per kTrimEveryMs).
#pragma once

#include <cstddef>
#include <cstdint>

#include "store/backend.h"
#include "store/keyspace.h"

struct uv_idle_s;

namespace tcpstore::store {

class MemoryBackend final : public Backend {
 public:
  // Registrations freed per loop turn (one key of a WAIT, or one watch):
  // the worst turn measured 5-8 ms on a busy 2-vCPU machine (issue #13:
  // no stall over 10 ms), malloc_trim 3-9 ms after 6 x 128Ki waited keys.
  static constexpr std::size_t kReclaimPerTurn = 4096;
  // Freed bytes (by memoryBytes()) since the last trim that make a trim
  // worth its cost, and the shortest time between two trims.
  static constexpr std::size_t kTrimAfterBytes = 16u << 20;
  static constexpr std::uint64_t kTrimEveryMs = 1000;

  explicit MemoryBackend(KeyspaceOptions options = {})
      : keyspace_(std::move(options)) {}
  ~MemoryBackend() override;

  // Creates the reclaim handle on `loop` (none if `loop` is null: then
  // registrations drain only with the traffic). kIoError if libuv fails.
  Status open(BackendHost& host, uv_loop_s* loop) override;
  // Keyspace::apply(); its error, or kDone.
  Result<Outcome> submit(ConnId conn, const protocol::Request& req,
                         Effects& fx) override;
  void disconnect(ConnId conn) override;
  // Closes the reclaim handle (freed in its close callback).
  void close() override;
  std::size_t numKeys() const noexcept override { return keyspace_.numKeys(); }
  std::size_t memoryBytes() const noexcept override {
    return keyspace_.memoryBytes();
  }

  const Keyspace& keyspace() const noexcept { return keyspace_; }
  // Times the allocator was asked to return memory (for tests and logs).
  std::uint64_t trims() const noexcept { return trims_; }

 private:
  static void onIdle(uv_idle_s* idle) noexcept;
  // Starts the reclaim handle if the keyspace has detached registrations.
  void scheduleReclaim() noexcept;

  Keyspace keyspace_;
  uv_idle_s* idle_ = nullptr;
  bool reclaiming_ = false;
  std::size_t trim_mark_ = 0;  // memoryBytes() after the last trim (or peak)
  std::uint64_t last_trim_ms_ = 0;
  std::uint64_t trims_ = 0;
};

}  // namespace tcpstore::store
