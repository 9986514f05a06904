#include "store/memory_backend.h"

namespace tcpstore::store {

Status MemoryBackend::open(BackendHost&, uv_loop_s*) { return Status::ok(); }

Result<Backend::Outcome> MemoryBackend::submit(ConnId conn,
                                               const protocol::Request& req,
                                               Effects& fx) {
  Status st = keyspace_.apply(conn, req, fx);
  if (!st.isOk()) return st;
  return Outcome::kDone;
}

}  // namespace tcpstore::store
