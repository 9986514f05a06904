// Dispatcher: each decoded request of an Endpoint (a connection, or a mux
// channel: endpoint.h) goes to the Backend; the Effects it
// returns are routed to the connections' outboxes. Counts requests per
// command, turns a failed request into a closed connection (with its
// reason and counter), and logs "joined K/N" progress: torch's "init/"
// counter (--world-size) and tcpstore:// jobs (job_progress.h).
//
// The dispatcher knows the backend only through store::Backend and is its
// store::BackendHost. A request the backend leaves pending stops its
// connection's decoding (its later bytes stay buffered) until complete();
// completions arriving while a request is being dispatched (a backend
// finishing one connection's request from another's submit()) resume their
// connection once that dispatch has returned, so dispatch never re-enters
// itself. ConnIds are never reused: a completion for a closed connection is
// dropped. Loop thread only.
#pragma once

#include <uv.h>

#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

#include "store/backend.h"
#include "store/server/connections.h"
#include "store/server/counters.h"
#include "store/server/job_progress.h"
#include "store/server/log.h"
#include "store/server/loop_handles.h"

namespace tcpstore::server {

class Dispatcher final : public RequestHandler, public store::BackendHost {
 public:
  // world_size > 0 logs join progress of torch's "init/" counter.
  // job_stall_ms: no new rank for this long logs a tcpstore:// job's
  // missing ranks (JobProgress::Limits::stall_ms).
  Dispatcher(Connections& conns, store::Backend& backend, Counters& ctr,
             const Logger& log, std::int64_t world_size,
             std::uint64_t job_stall_ms = JobProgress::Limits{}.stall_ms);

  // Adds the dispatcher's loop handles and opens the backend.
  Status open(LoopHandles& handles);

  // RequestHandler
  void onRequest(Endpoint& c, const protocol::Request& req) override;
  void onClosing(Endpoint& c) noexcept override;
  bool onPeerEof(Endpoint& c) override;

  // BackendHost (never throw: out of memory closes the connection).
  void deliver(const store::Effects& fx) override;
  void complete(store::ConnId conn, const Status& status,
                const store::Effects& fx) override;
  void close(store::ConnId conn, const Status& why) override;
  std::size_t unsentBytes(store::ConnId conn) const noexcept override;

 private:
  // What a pending request needs when it completes.
  struct Pending {
    protocol::Command command;
    std::int64_t join_count;  // kNoCount, kFromReply, or a SET's count
  };
  static constexpr std::int64_t kNoCount = -1;
  static constexpr std::int64_t kFromReply = -2;

  void route(const store::Effects& fx, Endpoint* self);
  void rejectRequest(Endpoint& c, protocol::Command cmd, const Status& st);
  // Refuses `req` (closing `c` after its owed replies) if `extra` more bytes
  // would cross the memory budget (its soft line if `large`).
  bool refusedForBudget(Endpoint& c, const protocol::Request& req,
                        std::uint64_t extra, bool large = false);
  static bool isReadOnly(protocol::Command cmd) noexcept;
  // fx is one send to `self` of all its bytes, a large one: it can be
  // handed over instead of copied.
  static bool isWholeLargeReply(const store::Effects& fx, ConnId self) noexcept;
  std::int64_t joinCount(const protocol::Request& req) const noexcept;
  void noteJoin(std::int64_t count, const store::Effects& fx,
                store::ConnId conn) noexcept;
  static void onJoinTimer(uv_timer_t* timer) noexcept;
  void noteJob(const protocol::Request& req) noexcept;
  static void onJobTimer(uv_timer_t* timer) noexcept;
  void leaveDispatch() noexcept;

  Connections& conns_;
  store::Backend& backend_;
  Counters& ctr_;
  const Logger& log_;
  store::Effects fx_;
  int depth_ = 0;  // onRequest() calls on the stack
  std::vector<store::ConnId> to_resume_;
  std::unordered_map<store::ConnId, Pending> pending_;
  std::optional<JoinProgress> join_;
  uv_timer_t* join_timer_ = nullptr;
  JobProgress jobs_;
  uv_timer_t* job_timer_ = nullptr;
  uv_loop_t* loop_ = nullptr;
};

}  // namespace tcpstore::server
