// Connections: every open connection (and mux channel) of a server, and what
// they share: the never-reused ConnId space, the loop-wide read buffer, the
// flush list run once per loop turn, the server-wide output total, the stall
// timer of paused connections and the rate-limited rejection log. Loop thread
// only.
#pragma once

#include <uv.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "protocol/codec.h"
#include "store/backend.h"
#include "store/server/backpressure.h"
#include "store/server/budget.h"
#include "store/server/connection.h"
#include "store/server/counters.h"
#include "store/server/log.h"
#include "store/server/loop_handles.h"
#include "store/server/outbox.h"

namespace tcpstore::server {

class Channel;

class Connections {
 public:
  // Bytes of the loop-wide read buffer.
  static constexpr std::size_t kScratchBytes = 64 * 1024;
  // Replies queued per loop turn (all connections) before connections with
  // more buffered requests yield (connection.h). Bounds the turn's work.
  static constexpr std::size_t kTurnOutputBytes = 4 * 1024 * 1024;
  // Likewise requests decoded per loop turn (a pipeline of 50,000 SETs
  // has no replies to count).
  static constexpr std::size_t kTurnRequests = 4096;
  // A connection yields (the turn's budget being spent) only once it did
  // this much work itself in the turn.
  static constexpr std::size_t kQuantumBytes = 64 * 1024;
  static constexpr std::size_t kQuantumRequests = 64;
  // Bytes read per loop turn (all connections) before reads of large
  // requests wait for the next turn (fresh pages cost a fault each).
  static constexpr std::size_t kTurnInputBytes = 8 * 1024 * 1024;

  // `limits` and `output` are copied; `ctr` and `log` outlive this.
  Connections(const protocol::Limits& limits, const OutputLimits& output,
              Counters& ctr, const Logger& log);
  ~Connections();
  Connections(const Connections&) = delete;
  Connections& operator=(const Connections&) = delete;

  // Adds this set's loop handles (flush check, stall and log timers).
  Status open(LoopHandles& handles);
  // Closes connections holding a partial request that got no byte for `ms`
  // (0: never), and connections that failed but whose owed replies are not
  // read within `ms` (60 s if 0). Call before open().
  void setPartialRequestMs(std::uint64_t ms) noexcept { partial_ms_ = ms; }
  // The server-wide memory budget (budget.h), charged with the backend's
  // memoryBytes(). `backend` outlives this. Call before open().
  void setBudget(std::uint64_t max_bytes,
                 const store::Backend* backend) noexcept {
    budget_ = MemoryBudget(max_bytes);
    backend_ = backend;
  }
  const MemoryBudget& budget() const noexcept { return budget_; }
  MemoryUse memoryUse() const noexcept {
    return MemoryUse{input_total_, total_output_,
                     backend_ != nullptr ? backend_->memoryBytes() : 0};
  }
  void setHandler(RequestHandler& handler) noexcept { handler_ = &handler; }
  // Most channels open at once on one mux connection (an OPEN past it is
  // refused with CLOSED). Call before open().
  void setMaxMuxChannels(std::uint64_t n) noexcept { max_mux_channels_ = n; }
  // Called once the last connection has closed after beginStop().
  void setOnDrained(void (*fn)(void*) noexcept, void* arg) noexcept {
    on_drained_ = fn;
    on_drained_arg_ = arg;
  }

  // Serves an accepted socket (owns `fd` from here on; the peer's address
  // is read again when a log line needs it). Throws std::bad_alloc (after
  // closing `fd`).
  void accept(int fd);
  std::size_t size() const noexcept { return by_id_.size(); }

  // The open connection `id`, or nullptr (closed, or never existed).
  Connection* find(ConnId id) const noexcept {
    auto it = by_id_.find(id);
    return it == by_id_.end() ? nullptr : it->second;
  }
  // The open connection or mux channel `id`, or nullptr.
  Endpoint* findEndpoint(ConnId id) const noexcept {
    if (Connection* c = find(id)) return c;
    if (channels_.empty()) return nullptr;
    auto it = channels_.find(id);
    return it == channels_.end() ? nullptr : it->second;
  }
  bool stopping() const noexcept { return stopping_; }
  // Stop: reads end; a connection without unsent output closes now, the
  // others once their output is written. Returns true if none is left.
  bool beginStop() noexcept;
  // Closes every connection at once.
  void closeAll() noexcept;
  // Output queued outside a read callback (a backend completing from a
  // timer) is flushed on this loop turn: the poll phase must not block.
  void flushSoon() noexcept {
    if (!flush_list_.empty()) uv_idle_start(flush_idle_, &Connections::onIdle);
  }
  // Input buffers and unsent output of closed connections at least this
  // large are freed over later loop turns, kFreePerTurnBytes a turn: many
  // closed at once would otherwise unmap GiBs in one callback.
  static constexpr std::size_t kDeferFreeBytes = 4 * 1024 * 1024;
  static constexpr std::size_t kFreePerTurnBytes = 16 * 1024 * 1024;
  // Takes `in`'s allocation, freed on a later loop turn.
  void freeLater(InputBuffer& in) noexcept {
    try {
      dead_inputs_.push_back(in.takeStorage());
      continueSoon();
    } catch (...) {  // freed now, when `in` is destroyed
    }
  }
  // Work done in this loop turn besides replies (bytes of values freed: a
  // pipeline of DELETEs of large values unmaps as much as it frees), counted
  // against kTurnOutputBytes.
  void chargeTurn(std::uint64_t bytes) noexcept { turn_output_ += bytes; }
  // A connection yielded: the loop must not block before it continues.
  void continueSoon() noexcept {
    uv_idle_start(flush_idle_, &Connections::onIdle);
  }
  // Warn lines about closed connections, rate-limited.
  void logRejection(std::string_view line) noexcept;

 private:
  friend class Connection;
  friend class MuxSession;
  friend class Channel;
  static void onCheck(uv_check_t* check) noexcept;
  static void onIdle(uv_idle_t*) noexcept {}
  static void onStallTimer(uv_timer_t* timer) noexcept;
  static void onLogTimer(uv_timer_t* timer) noexcept;
  static void onSweepTimer(uv_timer_t* timer) noexcept;
  // Input paused for the budget is not read, so a peer that hung up is not
  // seen through a read: every kHangupCheckMs the paused connections'
  // TCP state is looked at, and one whose peer sent its FIN (CLOSE_WAIT)
  // is closed: its partial request can never complete.
  static void onHangupTimer(uv_timer_t* timer) noexcept;
  static constexpr std::uint64_t kHangupCheckMs = 250;
  void paused(Connection& c);
  // Resumes yielded connections, oldest first, while the turn's output
  // budget lasts; the rest stay listed for the next turn.
  void continueYielded() noexcept;
  void closed(Connection& c) noexcept;
  // Past the soft line: drops the non-reading connections holding the most
  // unsent output until under it (at most every kShedEveryMs).
  void shedOutput() noexcept;
  // Input paused for the budget reads again once under the resume line.
  void resumeInput() noexcept;
  // Lowers the total under which resumeInput() is worth a look.
  void notePausedInput(const Connection& c) noexcept;
  std::uint64_t now() const noexcept { return uv_now(loop_); }
  // A busy state for a connection that has work (connection.h): a spare one
  // or a new one. Throws std::bad_alloc.
  BusyState* takeBusy();
  // Takes `b` back (its input buffer and outbox empty): kept as a spare
  // (its small buffers with it) or freed.
  void giveBusy(BusyState* b) noexcept;
  // Spares kept, and the largest buffer capacity a spare keeps.
  static constexpr std::size_t kMaxSpareBusy = 64;
  static constexpr std::size_t kSpareKeepBytes = 4096;

  uv_loop_t* loop_ = nullptr;
  const protocol::Limits limits_;
  const OutputLimits output_;
  Counters& ctr_;
  const Logger& log_;
  RequestHandler* handler_ = nullptr;
  std::unordered_map<ConnId, Connection*> by_id_;
  ConnId next_id_ = 1;  // connections and channels alike
  // Open mux channels (their ids come from next_id_ too).
  std::unordered_map<ConnId, Endpoint*> channels_;
  // Closed channels, freed in the check phase (a pointer to one stays valid
  // for the rest of the loop turn, like a closing Connection's).
  std::unique_ptr<Channel> dead_channels_;  // a list through next_dead_
  void freeDeadChannels() noexcept;
  std::uint64_t max_mux_channels_ = std::uint64_t{1} << 20;
  // Loop-wide read buffer: reads land here unless a connection is in the
  // middle of a message too large for it.
  std::unique_ptr<char[]> scratch_;
  FlushList<Connection> flush_list_;
  std::vector<BusyState*> spare_busy_;  // owned; capacity kMaxSpareBusy
  uv_idle_t* flush_idle_ = nullptr;     // active: the loop does not block
  std::uint64_t total_output_ = 0;      // sum of outbox sizes
  std::uint64_t turn_output_ = 0;       // bytes queued since the last check
  std::uint64_t turn_input_ = 0;        // bytes read since the last check
  std::uint64_t turn_requests_ = 0;     // requests decoded since the last check
  std::uint64_t turn_no_ = 1;           // loop turns (check phases) so far
  std::uint64_t last_check_cpu_us_ = 0;  // loop thread's CPU at the check
  // The turn's budget of replies or requests is spent: connections yield.
  bool turnSpent() const noexcept {
    return turn_output_ >= kTurnOutputBytes || turn_requests_ >= kTurnRequests;
  }
  // Yielded connections in order, [yield_head_, end) still to resume; may
  // hold stale ids.
  std::vector<ConnId> yielded_ids_;
  std::size_t yield_head_ = 0;
  // Paused connections checked for a stall; may hold stale or repeated ids.
  std::vector<ConnId> paused_ids_;
  uv_timer_t* stall_timer_ = nullptr;
  RateLimitedLog rejections_;
  uv_timer_t* log_timer_ = nullptr;
  std::uint64_t partial_ms_ = 0;
  uv_timer_t* sweep_timer_ = nullptr;  // partial requests, lingering fails
  std::vector<ConnId> sweep_ids_;      // scratch of onSweepTimer
  MemoryBudget budget_{0};
  const store::Backend* backend_ = nullptr;
  std::uint64_t input_total_ = 0;  // sum of connections' input capacities
  std::vector<ConnId> input_paused_ids_;           // may hold stale ids
  std::vector<InputBuffer::Storage> dead_inputs_;  // see freeLater()
  std::vector<OutChunk> dead_chunks_;              // closed connections' output
  // Frees some of dead_inputs_ and dead_chunks_; true if some are left.
  bool freeSome() noexcept;
  uv_timer_t* hangup_timer_ = nullptr;  // runs while input is paused
  // resumeInput() runs once the total is under this (the most any paused
  // connection can take).
  std::uint64_t input_resume_below_ = 0;
  std::uint64_t last_shed_ms_ = 0;
  // The request being decoded (views into a connection's bytes).
  protocol::Request req_;
  bool stopping_ = false;
  void (*on_drained_)(void*) noexcept = nullptr;
  void* on_drained_arg_ = nullptr;
};

}  // namespace tcpstore::server
