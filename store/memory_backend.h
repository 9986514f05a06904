// MemoryBackend: the in-memory Backend, a Keyspace answering every request
// inside submit() (always kDone). The default backend of tcpstore-server.
#pragma once

#include "store/backend.h"
#include "store/keyspace.h"

namespace tcpstore::store {

class MemoryBackend final : public Backend {
 public:
  explicit MemoryBackend(KeyspaceOptions options = {})
      : keyspace_(std::move(options)) {}

  // Needs neither the loop nor the host: never fails.
  Status open(BackendHost& host, uv_loop_s* loop) override;
  // Keyspace::apply(); its error, or kDone.
  Result<Outcome> submit(ConnId conn, const protocol::Request& req,
                         Effects& fx) override;
  void disconnect(ConnId conn) override { keyspace_.disconnect(conn); }
  void close() override {}
  std::size_t numKeys() const noexcept override { return keyspace_.numKeys(); }

  const Keyspace& keyspace() const noexcept { return keyspace_; }

 private:
  Keyspace keyspace_;
};

}  // namespace tcpstore::store
