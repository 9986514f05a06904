// The per-endpoint connection set behind every Client handle: one primary
// connection for short operations, a lazy pool of connections for blocking
// ones, the capabilities learnt from the server, and the process-wide
// registry that lets Clients of one endpoint share all of it.
// Internal to tcpstore::client; thread-safe unless a method says otherwise.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "protocol/codec.h"
#include "protocol/requests.h"
#include "store/client/connection.h"
#include "store/client/probe.h"
#include "tcpstore/client.h"
#include "tcpstore/status.h"

namespace tcpstore::client_detail {

// The public Dialect and the codec's: same values, one conversion each way.
static_assert(static_cast<int>(Dialect::kV113) ==
                  static_cast<int>(protocol::Dialect::kV113) &&
              static_cast<int>(Dialect::kV2) ==
                  static_cast<int>(protocol::Dialect::kV2));
constexpr protocol::Dialect toProtocol(Dialect d) noexcept {
  return d == Dialect::kV113 ? protocol::Dialect::kV113
                             : protocol::Dialect::kV2;
}
constexpr Dialect fromProtocol(protocol::Dialect d) noexcept {
  return d == protocol::Dialect::kV113 ? Dialect::kV113 : Dialect::kV2;
}

// The key torch's TCPStore puts on the wire for user key `key` under a
// PrefixStore chain `prefix` ("" or "b/a/"): "/" + prefix + key.
std::string wireKey(std::string_view prefix, std::string_view key);
std::vector<std::string> wireKeys(std::string_view prefix,
                                  const std::vector<std::string>& keys);
// "a, b, c", for error messages.
std::string joinKeys(const std::vector<std::string>& keys);

// A failure that means the connection was lost (closed, reset, a socket
// error), as opposed to a deadline or a bad reply.
inline bool lostConnection(const Status& s) {
  return s.isClosed() || s.code() == StatusCode::kIoError;
}
// Commands that may be sent again after a lost connection (failover): they
// change nothing, so a second copy cannot double-apply.
bool idempotent(protocol::Command c) noexcept;

class Shared {
 public:
  // The connection set for `config`: the registered one if `share` and one
  // exists (its primary connection checked or reconnected), else a new one
  // whose primary connection is open. Errors: those of Connection::open.
  static Result<std::shared_ptr<Shared>> attach(
      const ConnectConfig& config, std::chrono::milliseconds connect_timeout,
      std::size_t max_idle, bool share);

  Shared(const ConnectConfig& config, std::chrono::milliseconds connect_timeout,
         std::size_t max_idle)
      : config_(config),
        connect_timeout_(connect_timeout),
        max_idle_(max_idle) {}
  ~Shared();
  Shared(const Shared&) = delete;
  Shared& operator=(const Shared&) = delete;

  Dialect dialect() const noexcept { return fromProtocol(config_.dialect); }
  bool v2() const noexcept { return config_.dialect == protocol::Dialect::kV2; }
  // Two or more endpoints: client.h's "Several endpoints".
  bool failover() const noexcept { return config_.endpoints.size() > 1; }

  // Runs op() (an idempotent operation) and, in failover mode, runs it again
  // while it fails because its connection was lost: at most once per
  // endpoint, not past `deadline`. The lost connection has already moved
  // the next connection to the next endpoint (noteDropped).
  template <typename Op>
  auto reissuing(Deadline deadline, Op&& op) -> decltype(op()) {
    for (std::size_t tries = 1;; ++tries) {
      auto outcome = op();
      const Status s = statusOf(outcome);
      if (s || !lostConnection(s) || tries >= config_.endpoints.size() ||
          Clock::now() >= deadline) {
        return outcome;
      }
      reissued_.fetch_add(1, std::memory_order_relaxed);
    }
  }
  // Operations re-issued so far (for tests and diagnostics).
  std::uint64_t reissued() const noexcept {
    return reissued_.load(std::memory_order_relaxed);
  }
  // In failover mode, `s` (a lost connection after `command` was sent)
  // marked as an unknown outcome; `s` otherwise.
  Status outcomeUnknown(const Status& s, protocol::Command command) const;

  // A connection borrowed for one blocking operation; given back to the pool
  // (if still healthy) when the lease ends.
  class Lease {
   public:
    Lease(Shared* s, std::unique_ptr<Connection> c) : s_(s), c_(std::move(c)) {}
    Lease(Lease&& o) noexcept : s_(o.s_), c_(std::move(o.c_)) {
      o.s_ = nullptr;
    }
    Lease& operator=(Lease&&) = delete;
    ~Lease() {
      if (s_ != nullptr) s_->giveBack(std::move(c_));
    }
    Connection& operator*() { return *c_; }
    Connection* operator->() { return c_.get(); }

   private:
    Shared* s_;
    std::unique_ptr<Connection> c_;
  };

  // Runs f(Connection&) on the primary connection (reconnecting it first if
  // needed) under the primary mutex. A connection f leaves broken is dropped.
  template <typename F>
  auto withPrimary(Deadline deadline, F&& f)
      -> decltype(f(std::declval<Connection&>())) {
    std::lock_guard<std::mutex> lock(primary_mu_);
    if (primary_ && !primary_->idleHealthy()) {
      noteDropped(*primary_);
      primary_.reset();
    }
    if (!primary_) {
      auto c = open(deadline);
      if (!c) return c.error();
      primary_ = std::move(*c);
      // The old connection's writes were flushed or lost with it.
      clean();
    }
    auto result = f(*primary_);
    if (primary_->broken()) {
      noteDropped(*primary_);
      primary_.reset();
    }
    return result;
  }

  // One request on the primary connection and its reply (`count`: strings
  // in a MULTI_GET reply). A reply-less request marks the connection dirty
  // for syncWrites(); a reply proves earlier requests were applied.
  Result<OwnedReply> shortOp(const protocol::Request& req, Deadline deadline,
                             std::uint64_t count = 0);

  // Makes reply-less writes sent on the primary visible to reads on other
  // connections: the server handles one connection's requests in order, so
  // one round trip after them proves they were applied.
  Status syncWrites(Deadline deadline);

  Result<Lease> borrow(Deadline deadline);

  // syncWrites(), then f(Connection&) on a borrowed connection.
  template <typename F>
  auto withLease(Deadline deadline, F&& f)
      -> decltype(f(std::declval<Connection&>())) {
    Status s = syncWrites(deadline);
    if (!s) return s;
    auto lease = borrow(deadline);
    if (!lease) return lease.error();
    return f(**lease);
  }

  // Sends a WAIT-like request (WAIT or BARRIER) and reads its STOP_WAITING.
  // On timeout: 2.x cancels (CANCEL_WAIT, absorbing "01" or "00 01"; in the
  // latter case the wait did complete and OK is returned); 1.13 cannot
  // cancel, so the connection is dropped (a stale "00" would follow).
  Status blockingWait(Connection& c, const protocol::Request& req,
                      Deadline deadline, std::string_view what);

  // Waits (on a borrowed connection, after syncWrites) until all `wire_keys`
  // exist, then returns read(Connection&) run on the same connection; the
  // wait's error if it fails.
  template <typename Read>
  auto waitThen(const std::vector<std::string>& wire_keys, Deadline deadline,
                std::string_view what, Read&& read)
      -> decltype(read(std::declval<Connection&>())) {
    return withLease(
        deadline,
        [&](Connection& c) -> decltype(read(std::declval<Connection&>())) {
          Status s = blockingWait(c, protocol::requests::wait(wire_keys),
                                  deadline, what);
          if (!s) return s;
          return read(c);
        });
  }

  // A WAIT: re-issued after a lost connection in failover mode.
  Status waitKeys(const std::vector<std::string>& wire_keys, Deadline deadline,
                  std::string_view what) {
    return reissuing(deadline, [&] {
      return waitThen(wire_keys, deadline, what,
                      [](Connection&) { return Status::ok(); });
    });
  }

  // Capabilities::probed with "a fresh connection works" as the test.
  template <typename Op>
  auto probed(Feature f, Deadline deadline, Op&& op) {
    return caps_.probed(f, std::forward<Op>(op),
                        [&] { return borrow(deadline).has_value(); });
  }
  Capabilities::Support support(Feature f) const noexcept {
    return caps_.support(f);
  }

  // Primary + idle pooled + borrowed connections.
  std::size_t openConnections();

 private:
  // A (re)connect made for a call is bounded by the call's deadline, but
  // gets at least min(connect_timeout, 1 s), so a short wait on a client
  // that must first reconnect reports the wait's outcome, not a connect
  // failure.
  Deadline connectDeadline(Deadline call) const;
  // A new connection for a call with `deadline`, starting at the current
  // endpoint (which it then becomes).
  Result<std::unique_ptr<Connection>> open(Deadline deadline);
  // A connection about to be closed: if it was lost, later connections start
  // at the endpoint after its own (failover mode).
  void noteDropped(const Connection& c);
  // A reply-less write followed by a PING (1.13: an empty CHECK) in one
  // send; OK once that answer came (failover mode).
  Result<OwnedReply> confirmedWrite(Connection& c, const protocol::Request& req,
                                    Deadline deadline);
  void giveBack(std::unique_ptr<Connection> c);
  // Caller holds primary_mu_.
  void markDirty() {
    dirty_ = true;
    dirty_hint_ = true;
  }
  void clean() {
    dirty_ = false;
    dirty_hint_ = false;
  }

  const ConnectConfig config_;
  const std::chrono::milliseconds connect_timeout_;
  const std::size_t max_idle_;
  // Registry slot, set once by attach() before the Shared is published.
  std::string registry_key_;
  bool registered_ = false;

  std::mutex primary_mu_;
  std::unique_ptr<Connection> primary_;  // guarded by primary_mu_
  // Reply-less writes on primary_ not yet confirmed (primary_mu_); the hint
  // lets syncWrites() skip the lock when there are none.
  bool dirty_ = false;
  std::atomic<bool> dirty_hint_{false};

  std::mutex pool_mu_;
  std::vector<std::unique_ptr<Connection>> idle_;  // guarded by pool_mu_
  std::size_t borrowed_ = 0;                       // guarded by pool_mu_

  Capabilities caps_;

  // Index into config_.endpoints where the next connection starts.
  std::atomic<std::size_t> current_{0};
  std::atomic<std::uint64_t> reissued_{0};
};

}  // namespace tcpstore::client_detail
