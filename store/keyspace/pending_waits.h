// PendingWaits: WAITs whose keys are registered a bounded number at a time,
// so one WAIT of 128Ki keys is never one long step for the server's loop
// (issue #13: ~15 ms on an empty server, ~200 ms with 10M registrations).
//
// A WAIT too large to register at once is copied (its keys, with an end
// offset each) and registered by later advance() calls, oldest WAIT first.
// Meanwhile it is one registering Wait (waiters.h): every key linked so far
// is released by writes as usual, and it is not released before its last
// key is linked. The result is the same as registering every key at the
// time of start(): a key counts as arrived if it exists at some time since
// start(), i.e. it
//  - exists when its turn comes (it was there, or was written meanwhile), or
//  - is written after its turn (the link is released as for any wait), or
//  - was there or written since start() but removed before its turn: every
//    removal while a registration is in progress is logged (vanished()),
//    and a logged key counts for the registrations older than the removal.
// Duplicate keys count once (a per-WAIT set of key hashes).
//
// Single-threaded, owned by the Keyspace; no I/O, no clocks (the caller
// bounds each advance() by a key count).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "store/effects.h"
#include "store/keyspace/table.h"
#include "store/keyspace/waiters.h"

namespace tcpstore::store::keyspace {

// Whether a key exists now (a value or a queue). `hash` is
// KeyTable::hashOf(key), shared by every table.
class KeyPresence {
 public:
  virtual bool present(std::string_view key, std::uint32_t hash) const = 0;
  // A hint that present(…, hash) follows soon.
  virtual void prefetch(std::uint32_t hash) const noexcept = 0;

 protected:
  ~KeyPresence() = default;
};

class PendingWaits {
 public:
  explicit PendingWaits(Waiters& waiters);
  ~PendingWaits();
  PendingWaits(const PendingWaits&) = delete;
  PendingWaits& operator=(const PendingWaits&) = delete;

  // Registers a WAIT of `conn` on `keys` (the caller has dropped its earlier
  // plain waits). With at most `sync_keys` keys it is registered now and
  // start() returns false: STOP_WAITING for `conn` is in `fx` if every key
  // exists. Otherwise the keys are copied (the views may die after the call)
  // and start() returns true: advance() registers them. Throws
  // std::bad_alloc if memory runs out (nothing registered then).
  bool start(ConnId conn, const std::vector<std::string_view>& keys,
             const KeyPresence& presence, std::size_t sync_keys, Effects& fx);

  struct Finished {
    ConnId conn = 0;
    bool ok = true;  // false: out of memory, the rest was not registered
  };
  // Registers at most `max_keys` more keys of the oldest WAIT in progress.
  // When its last key is done, returns it (STOP_WAITING for its connection
  // is in `fx` if every key has arrived by then) and forgets it. Never
  // throws: out of memory ends the WAIT with ok == false (the caller closes
  // its connection; what it registered goes with the disconnect).
  std::optional<Finished> advance(std::size_t max_keys,
                                  const KeyPresence& presence,
                                  Effects& fx) noexcept;

  // Forgets the WAIT in progress of `conn`, if any (its Wait stays for the
  // caller to retire or disconnect). O(WAITs in progress).
  void cancel(ConnId conn) noexcept;
  // `key` stopped existing (DELETE_KEY, the last QUEUE_POP): logged while
  // any WAIT is in progress, so that it still counts for them.
  void vanished(std::string_view key);

  std::size_t size() const noexcept { return regs_.size(); }
  // Bytes of the copies and dedup sets, plus the registration blocks the
  // unregistered keys will need at most (an upper estimate for the budget).
  std::size_t memoryBytes() const noexcept;

 private:
  struct Reg;
  // Registers key `i` of `keys` for the WAIT of `conn`; `wait` is made at
  // the first absent key.
  template <typename Keys>
  void step(const Keys& keys, std::size_t i, std::uint32_t hash,
            std::uint64_t since, std::vector<std::uint64_t>& seen,
            const KeyPresence& presence, ConnId conn, Wait*& wait);
  // step() for keys [next, end), advancing `next`; each key's table slots
  // are prefetched a few keys ahead.
  template <typename Keys>
  void steps(const Keys& keys, std::size_t& next, std::size_t end,
             std::uint64_t since, std::vector<std::uint64_t>& seen,
             const KeyPresence& presence, ConnId conn, Wait*& wait);
  void finish(ConnId conn, Wait* wait, Effects& fx);
  void forget(std::size_t index) noexcept;

  Waiters& waiters_;
  std::deque<std::unique_ptr<Reg>> regs_;
  std::size_t reg_bytes_ = 0;  // sum of Reg::bytes
  // Keys removed while a WAIT is in progress, with the value of seq_ then.
  KeyTable<std::uint64_t> vanished_;
  std::uint64_t seq_ = 0;
  std::vector<std::uint64_t> seen_scratch_;  // dedup set of start()
};

}  // namespace tcpstore::store::keyspace
