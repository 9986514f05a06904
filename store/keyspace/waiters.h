// Wait and watch registrations: which connection waits for which keys
// (WAIT, BARRIER) or watches them (1.13 WATCH_KEY), and who a write wakes.
//
// Each WAIT/BARRIER is a Wait with one WaitLink per distinct key, linked
// into the key's list (KeyRegs, in a keyed table) and into its connection's
// list (ConnState). Waking a key touches only that key's list; CANCEL_WAIT
// and disconnect touch only that connection's. Watches are linked the same
// way.
//
// Detaching is O(1) per wait and per connection: a cancelled wait, or a
// disconnected connection with all it registered, is marked dead (its
// ConnState is `detached`) and left linked; writes skip dead entries, and
// reclaim() unlinks and frees them a bounded number at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "store/effects.h"
#include "store/keyspace/list.h"
#include "store/keyspace/table.h"

namespace tcpstore::store::keyspace {

struct ConnState;
struct KeyRegs;
struct Wait;

// Membership of one wait in one key's list.
struct WaitLink {
  Wait* wait = nullptr;
  KeyRegs* regs = nullptr;  // nullptr once unlinked
  Link<WaitLink> hook;
};

// One WAIT (counting its distinct missing keys) or one BARRIER.
struct Wait {
  ConnState* cs = nullptr;      // dead when cs->detached
  Link<Wait> hook;              // in cs->waits
  std::size_t remaining = 0;    // plain wait: keys still to arrive
  std::int64_t world_size = 0;  // barrier: released when counter >= this
  bool barrier = false;
  // Its keys are still being linked (Waiters::beginWait): not released even
  // if `remaining` drops to 0, until finishWait().
  bool registering = false;
  std::size_t reclaimed = 0;  // links already unlinked by reclaim()
  // Never reallocated once linked: sized (or reserved) when the wait is
  // made; a registering wait appends within its reserved capacity.
  std::vector<WaitLink> links;
};

struct Watch {
  ConnState* cs = nullptr;  // dead when cs->detached
  KeyRegs* regs = nullptr;
  Link<Watch> key_hook;   // in regs->watches
  Link<Watch> conn_hook;  // in cs->watches
};

// Registrations on one key; erased when both lists are empty.
//
// A write of a key that only barrier waits wait on releases nothing unless
// the counter reached the smallest world size among them, so such a write
// skips the list: BARRIER arrivals 1..N-1 on one key cost O(1) each, not
// O(waiters) (N^2/2 wait visits for one N-rank barrier otherwise).
struct KeyRegs {
  List<WaitLink, &WaitLink::hook> waits;
  List<Watch, &Watch::key_hook> watches;
  std::size_t plain_links = 0;  // linked links of plain waits (live or dead)
  // <= the world size of every live barrier wait linked here (a lower
  // bound: exact after each scan of the list, lowered by each new one).
  std::int64_t barrier_min = INT64_MAX;
};

// Registrations of one connection.
struct ConnState {
  ConnId conn = 0;
  bool detached = false;
  List<Wait, &Wait::hook> waits;
  List<Watch, &Watch::conn_hook> watches;
  std::size_t num_waits = 0;
  std::size_t num_links = 0;  // over its waits
  std::size_t num_watches = 0;
};

class Waiters {
 public:
  enum class WakeMode {
    kWrite,  // plain waits count the key; barrier waits check the counter
    kAll,    // a BARRIER completed: every barrier wait on the key released
  };

  Waiters() = default;
  ~Waiters();
  Waiters(const Waiters&) = delete;
  Waiters& operator=(const Waiters&) = delete;

  // The registrations on `key`, or nullptr (no lookup when there are none).
  KeyRegs* find(std::string_view key) const noexcept {
    return regs_.empty() ? nullptr : regs_.find(key);
  }
  // KeyTable::prefetch() of the registrations table.
  void prefetch(std::uint32_t hash) const noexcept { regs_.prefetch(hash); }
  // Whether a write of the key must capture its old value for watchers.
  static bool watched(const KeyRegs* kr) noexcept {
    return kr != nullptr && !kr->watches.empty();
  }

  // Registers a wait of `conn` on `keys` (distinct, at least one).
  void addWait(ConnId conn, bool barrier, std::int64_t world_size,
               const std::vector<std::string_view>& keys);

  // A plain wait registered key by key (pending_waits.h registers a huge
  // WAIT over several loop turns): beginWait() makes it pending (it counts
  // in numPendingWaits, CANCEL_WAIT and disconnect detach it) with room
  // for `max_keys` links; linkKey() adds one absent key (distinct from its
  // others; `hash` is KeyTable::hashOf(key)), which a write releases from
  // then on as for any wait; finishWait() ends the registration and
  // releases the wait (STOP_WAITING in `fx`) if every linked key has been
  // written meanwhile. A wait with no key linked is released too.
  // linkKey() throws std::bad_alloc (nothing changed) if memory runs out.
  Wait* beginWait(ConnId conn, std::size_t max_keys);
  void linkKey(Wait* w, std::string_view key, std::uint32_t hash);
  void finishWait(Wait* w, Effects& fx);
  void addWatch(ConnId conn, std::string_view key);

  // After `key` (registrations `kr`, may be nullptr) was written: with
  // `wake`, releases the waits the write completes (STOP_WAITING, in
  // registration order), then notifies its watchers (created or updated,
  // from `old_value` to `value`). Dead registrations are skipped.
  void afterWrite(KeyRegs* kr, std::string_view key, const std::string& value,
                  std::string_view old_value, bool created, bool wake,
                  WakeMode mode, Effects& fx);
  // Sends one watch notification to every live watcher of `kr`, sharing
  // one copy of the bytes.
  void notify(const KeyRegs* kr, std::uint8_t type, std::string_view key,
              std::string_view old_value, std::string_view new_value,
              Effects& fx) const;
  // QUEUE_PUSH: the oldest live plain wait on `key` counts it as arrived.
  void wakeOne(std::string_view key, Effects& fx);

  // Detach (O(1) per wait), then reclaim a few items inline.
  void cancelWaits(ConnId conn);
  void dropPlainWaits(ConnId conn);
  // Detaches everything `conn` registered: O(1).
  void disconnect(ConnId conn);
  // Unlinks and frees at most `max_items` dead registrations (one item:
  // one key of a wait, or one watch); returns how many are left.
  std::size_t reclaim(std::size_t max_items);

  std::size_t numWaitingConnections() const noexcept { return waiting_conns_; }
  std::size_t numPendingWaits() const noexcept { return num_waits_; }
  std::size_t numWatchers() const noexcept { return num_watches_; }
  std::size_t toReclaim() const noexcept { return to_reclaim_; }
  // Estimated bytes held by registrations (live and dead), O(1).
  std::size_t memoryBytes() const noexcept {
    return bytes_ + regs_.memoryBytes();
  }

 private:
  // reclaim(kInlineReclaim) when no more than that is left to reclaim.
  void reclaimIfSmall();
  ConnState& connFor(ConnId conn);
  void retire(Wait* w);
  void release(Wait* w, Effects& fx);
  void unlink(WaitLink& l) noexcept;
  void maybeErase(KeyRegs* kr) noexcept;
  void freeWait(Wait* w) noexcept;
  void freeWatch(Watch* wa) noexcept;
  bool drain(ConnState& cs, std::size_t& budget) noexcept;
  void wakeKey(KeyRegs* kr, const std::string& value, WakeMode mode,
               Effects& fx);

  KeyTable<KeyRegs> regs_;
  std::unordered_map<ConnId, std::unique_ptr<ConnState>> conns_;
  // Dead waits of live connections (CANCEL_WAIT, a WAIT replacing one).
  ConnState retired_{0, true, {}, {}, 0, 0, 0};
  // Disconnected connections whose registrations are not all freed yet.
  std::deque<std::unique_ptr<ConnState>> graveyard_;
  std::size_t waiting_conns_ = 0;
  std::size_t num_waits_ = 0;
  std::size_t num_watches_ = 0;
  std::size_t to_reclaim_ = 0;
  std::size_t bytes_ = 0;
};

}  // namespace tcpstore::store::keyspace
