// EtcdBackend: a store::Backend that keeps the state in etcd v3, so the
// server in front of it is a stateless gateway (several may serve one job).
//
// Every key K of the job is stored as options.prefix + K; values are bytes.
// Commands map to etcd as follows (PyTorch's semantics, the Keyspace's reply
// bytes, both dialects):
//   SET -> a Txn: Put, fenced by a per-gateway marker key (below);
//   GET -> Range;  DELETE_KEY -> DeleteRange;
//   GETNUMKEYS -> count-only Range of the prefix;  LIST_KEYS -> keys-only
//   Range of the prefix;  CHECK / MULTI_GET -> Txns of Ranges (at most 128
//   ops each; later Txns read at the first one's revision: one snapshot);
//   MULTI_SET -> Txns of Puts (at most 128 each; not atomic past 128 keys;
//   an unknown outcome is an error for the connection, not retried);
//   COMPARE_SET, APPEND -> compare-on-mod_revision Txns, retried on conflict;
//   ADD -> the same, and concurrent ADDs to one key from this gateway are
//   combined: one Txn per batch, each caller handed its own value in the
//   batch's order;
//   WAIT -> a snapshot read, then ONE prefix Watch per backend (started at
//   the first waiter's read revision + 1, resumed across failures) that
//   releases local waiters as keys are written;
//   CANCEL_WAIT -> local.
//   BARRIER -> an increment combined with ADDs, then (if the count is short
//   of the world size) a wait on the key released by the watch when its
//   value parses as >= the world size;
//   QUEUE_PUSH/POP/LEN -> items under a key range per queue, outside the
//   job's range (etcd_backend_queue.cc); CHECK and WAIT count a non-empty
//   queue as an existing key, as the Keyspace does.
//   WATCH_KEY (1.13) -> registrations kept here, notified from one more
//   prefix watch (with previous values), started at the first WATCH_KEY
//   (etcd_backend_watchkey.cc).
//
// Failures: calls fail over to the next endpoint. Reads and Puts are
// retried; a compare-and-swap Txn whose outcome is unknown (a deadline or a
// lost connection while in flight) is sent again and a per-gateway marker
// key tells whether an earlier attempt was applied (etcd_backend_cas.cc), so
// it is applied once and answered once. DELETE_KEY is not retried after an
// unknown outcome. An operation that cannot complete within
// options.op_timeout closes the connection that asked with an error; never
// a guessed answer. Waiters are closed with an error if the watch is lost.
//
// Threads: the Backend contract (loop thread only); gRPC's completions are
// moved onto the loop by EtcdRpc.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "protocol/message.h"
#include "store/backend.h"
#include "store/etcd/etcd_options.h"

namespace etcdserverpb {
class WatchResponse;
}  // namespace etcdserverpb

namespace tcpstore::store {

namespace etcd {
class EtcdRpc;
class PrefixWatch;
}  // namespace etcd

class EtcdBackend final : public Backend {
 public:
  explicit EtcdBackend(EtcdOptions options);
  ~EtcdBackend() override;
  EtcdBackend(const EtcdBackend&) = delete;
  EtcdBackend& operator=(const EtcdBackend&) = delete;

  // Starts the gRPC polling thread and the loop bridge. Does not contact
  // etcd (the first request does): an unreachable etcd shows as errors on
  // the connections, not as a failed start.
  Status open(BackendHost& host, uv_loop_s* loop) override;
  Result<Outcome> submit(ConnId conn, const protocol::Request& req,
                         Effects& fx) override;
  void disconnect(ConnId conn) override;
  void close() override;

  const EtcdOptions& options() const noexcept { return options_; }
  // Etcd Txns sent for ADD (for tests of combining).
  std::uint64_t addTxns() const noexcept { return add_txns_; }
  // Connections with a pending WAIT.
  std::size_t numWaitingConnections() const noexcept { return waits_.size(); }

 private:
  // ---- plain commands (etcd_backend.cc) ----------------------------------
  std::string full(std::string_view key) const;
  void fail(ConnId conn, const Status& why);
  void reply(ConnId conn, std::string bytes);
  // Reads `keys` (full keys) at one revision. With `with_queues`, a key
  // without a value whose queue is non-empty reads as an empty value (for
  // CHECK and WAIT, where a queue makes a key exist).
  void readKeys(std::vector<std::string> keys,
                std::function<void(const Status&, std::int64_t revision,
                                   std::vector<const std::string*> values)>
                    done,
                bool with_queues = false);

  void doGet(ConnId conn, std::string_view key);
  void doDelete(ConnId conn, std::string_view key);
  void doNumKeys(ConnId conn);
  void doListKeys(ConnId conn);
  void doCheck(ConnId conn, const std::vector<std::string_view>& keys);
  void doMultiGet(ConnId conn, const std::vector<std::string_view>& keys);
  void doMultiSet(ConnId conn, const protocol::Request& req);

  // ---- compare-and-swap commands (etcd_backend_cas.cc) --------------------
  // One ADD, APPEND or COMPARE_SET, queued per key: one Txn in flight per
  // key per gateway; consecutive ADDs at the head go in one Txn.
  struct CasOp {
    ConnId conn = 0;
    protocol::Command command = protocol::Command::kAdd;
    std::string key;  // full key
    std::string value;
    std::string desired;
    std::int64_t delta = 0;
    std::int64_t world_size = 0;  // BARRIER
  };
  // A key's queue and the last state this gateway saw of it (a guess: the
  // Txn compares mod_revision and returns the real state on a mismatch).
  struct KeyCas {
    std::deque<std::unique_ptr<CasOp>> queue;
    bool running = false;
    bool exists = false;
    std::string value;
    std::int64_t mod_revision = 0;  // 0: missing
    // mod_revision of this gateway's marker key for this key (only this
    // gateway writes it, one Txn at a time, so this is exact once learnt).
    std::int64_t marker_revision = 0;
  };
  // A batch and the writing attempts made for it (any of which may turn out
  // to have been applied after an unknown outcome).
  struct CasBatch {
    struct Attempt {
      std::string marker;  // the marker value its Txn wrote
      std::string put;     // the value it stored
      std::vector<std::string> replies;
    };
    std::vector<std::unique_ptr<CasOp>> ops;
    std::vector<Attempt> attempts;
  };
  std::string markerKey(std::string_view full_key) const;
  void replyCas(CasBatch& batch, const Status& refusal,
                const std::vector<std::string>& replies);
  // BARRIER waits: released when the key's value parses as >= world size.
  void registerBarrier(ConnId conn, const std::string& key,
                       std::int64_t world_size);
  void checkBarrier(ConnId conn, std::uint64_t id, std::string key);
  void dropBarrier(ConnId conn);
  void enqueueCas(std::unique_ptr<CasOp> op);
  void runCas(const std::string& key);
  void attemptCas(const std::string& key, std::shared_ptr<CasBatch> batch,
                  std::chrono::steady_clock::time_point deadline);
  void finishCas(const std::string& key);

  // ---- queues (etcd_backend_queue.cc) -------------------------------------
  // The item range of the queue at full key `full_key`: [first, second).
  std::pair<std::string, std::string> queueRange(
      std::string_view full_key) const;
  // The full key of the queue an item key belongs to ("" if malformed).
  std::string queueOfItem(std::string_view item) const;
  void doQueuePush(ConnId conn, std::string_view key, std::string_view value);
  void doQueuePop(ConnId conn, std::string key,
                  std::chrono::steady_clock::time_point deadline);
  void doQueueLen(ConnId conn, std::string_view key);

  // ---- 1.13 WATCH_KEY (etcd_backend_watchkey.cc) --------------------------
  void doWatchKey(ConnId conn, std::string_view key);
  void onKeyEvents(const etcdserverpb::WatchResponse& resp);
  void onKeyWatchLost(const Status& why);
  void dropWatches(ConnId conn);

  // ---- waits (etcd_backend_wait.cc) ---------------------------------------
  struct Wait {
    std::uint64_t id = 0;
    std::unordered_set<std::string> keys;  // full keys still to be written
  };
  void doWait(ConnId conn, const std::vector<std::string_view>& keys);
  void readForWait(ConnId conn, std::uint64_t id,
                   std::vector<std::string> keys);
  struct WatchPut {
    std::string key;
    std::int64_t revision = 0;
    std::string value;  // only for keys with barrier waiters
    // An item pushed to the queue at `key`: it releases the oldest plain
    // wait on the key only, and no barrier wait (as in the Keyspace).
    bool queue_push = false;
  };
  void onWatchPuts(const std::vector<WatchPut>& puts);
  // Starts the watch at revision + 1 if there is none; true if the watch
  // covers every revision after `revision`.
  bool ensureWatch(std::int64_t revision);
  void onWatchLost(etcd::PrefixWatch* which, const Status& why);
  etcd::PrefixWatch* startWatch(std::string key, std::string range_end,
                                std::int64_t start, bool queues);
  void dropWait(ConnId conn);

  EtcdOptions options_;
  std::string range_end_;  // of the prefix
  BackendHost* host_ = nullptr;
  std::unique_ptr<etcd::EtcdRpc> rpc_;
  bool closed_ = false;

  std::unordered_map<std::string, std::unique_ptr<KeyCas>> cas_;
  std::uint64_t add_txns_ = 0;
  std::string gateway_id_;     // random, names this backend's marker keys
  std::uint64_t cas_seq_ = 0;  // numbers this backend's writing attempts

  etcd::PrefixWatch* watch_ = nullptr;  // owned by rpc_ once started
  std::int64_t watch_start_ = 0;        // first revision the watch covers
  // The watch of the queue items (started with watch_, same rules).
  etcd::PrefixWatch* queue_watch_ = nullptr;
  std::int64_t queue_watch_start_ = 0;
  std::string queue_prefix_;  // start of the queue items' range
  // WATCH_KEY: the watch (with previous values), the registrations per full
  // key (one entry per registration, in order), per connection, and the
  // connections whose registration waits for the watch to start.
  etcd::PrefixWatch* key_watch_ = nullptr;
  bool key_watch_starting_ = false;
  std::unordered_map<std::string, std::vector<ConnId>> key_watchers_;
  std::unordered_map<ConnId, std::vector<std::string>> conn_watches_;
  std::vector<ConnId> key_watch_pending_;
  std::uint64_t queue_seq_ = 0;  // numbers this backend's pushed items
  // Revision of the latest Put the watch delivered, per full key, recorded
  // while a wait's read is in flight (so a wait whose read raced the watch
  // is not left waiting for a write already seen); cleared when none is.
  std::unordered_map<std::string, std::int64_t> put_rev_;
  std::size_t wait_reads_ = 0;
  std::unordered_map<ConnId, Wait> waits_;
  std::unordered_map<std::string, std::unordered_set<ConnId>> waiters_;
  std::uint64_t next_wait_id_ = 1;
  struct BarrierWait {
    std::uint64_t id = 0;
    std::string key;  // full key
    std::int64_t world_size = 0;
  };
  std::unordered_map<ConnId, BarrierWait> barrier_waits_;
  std::unordered_map<std::string, std::unordered_set<ConnId>> barrier_waiters_;
};

}  // namespace tcpstore::store
