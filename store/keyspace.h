// The store's state machine: keys, values, queues, waiters and watchers.
//
// Pure: no I/O, no clocks, no threads (its one outside input: the random
// hash key, drawn once per process at first use). The server feeds it
// decoded requests (with the connection they came from) and writes the bytes
// it returns. One keyspace serves both dialects; the reply bytes are
// dialect-independent, except that only 1.13 connections may register
// watches.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "protocol/message.h"
#include "store/effects.h"
#include "tcpstore/status.h"

namespace tcpstore::store {

struct KeyspaceOptions {
  // COMPARE_SET wakes the key's waiters when it stores a value (what the libuv
  // backend does, and what a waiting client needs). The classic servers do not;
  // false reproduces them.
  bool compare_set_wakes = true;
  // GET (and MULTI_GET) of a missing key: false closes the connection like
  // every verified server; true answers an empty value like the libuv backend.
  bool get_missing_returns_empty = false;
  // Longest value APPEND may build (SET is bounded by the codec's value
  // limit; without this, repeated APPENDs grow one value without bound).
  // An APPEND past it is an error for that connection, the value unchanged.
  std::uint64_t max_value_bytes = UINT64_MAX;
  // Largest reply a MULTI_GET or LIST_KEYS may produce (a 1 MiB MULTI_GET
  // naming one 8 MiB value 128Ki times would otherwise make the server build
  // a 1 TiB reply). Over it: an error for that connection, nothing built.
  // (GET, COMPARE_SET and QUEUE_POP replies are bounded by max_value_bytes.)
  std::uint64_t max_reply_bytes = UINT64_MAX;
  // Large MULTI_GET/GET replies are built once and shared while none of
  // their keys changes (store/keyspace/reply_cache.h): at most this many
  // bytes of them (0: no cache), each at least reply_cache_min_bytes long.
  std::uint64_t reply_cache_bytes = 32u << 20;
  std::uint64_t reply_cache_min_bytes = 4096;
};

// The reply cache's figures (for tests, benchmarks and logs).
struct ReplyCacheStats {
  std::uint64_t hits = 0;         // replies served from the cache
  std::uint64_t inserts = 0;      // replies cached
  std::uint64_t invalidated = 0;  // dropped because a key of theirs changed
  std::uint64_t evicted = 0;      // dropped for room
  std::size_t entries = 0;        // cached now
};

// PyTorch's semantics (docs/protocol.md §3, §4), with these deliberate choices
// where PyTorch is buggy or silent:
//  - WAIT registers one wait that counts its distinct missing keys, and
//    replaces (silently drops) any plain wait the connection still had
//    pending: a blocking client only sends a new WAIT after giving up the
//    previous one. PyTorch keeps one counter per connection, overwritten by
//    each WAIT, so it too sends one STOP_WAITING for the latest WAIT; unlike
//    PyTorch, keys of an abandoned wait can no longer release the new one.
//  - BARRIER: a barrier waiter is released when the counter at its key parses
//    as >= its world_size (after any waking write: ADD, SET, APPEND, ...), or
//    when a BARRIER call completes the count (that releases every waiter on
//    the key). A BARRIER increment that does not complete still counts as a
//    write of the key for plain WAITs on it.
//  - QUEUE_PUSH counts the key as arrived for the oldest plain wait on it
//    only (and removes it from the key's list); barrier waits are skipped.
//  - disconnect() drops watches too (1.13 leaked them to reused fds).
// Keys must be shorter than 4 GiB (the codec's limits are far below).
//
// Bounded work: no call does work beyond its own request's size, except
// reclaim() and advanceWaits(), which do at most what they are told; a
// huge WAIT can be registered in such steps (startWait()), and a removal
// (DELETE_KEY, the last QUEUE_POP) while one is in progress also logs its
// key (pending_waits.h). Tables grow incrementally
// and are keyed by a per-process random key (store/keyspace/hash.h), so
// chosen keys cannot make lookups slow.
//
// Single-threaded: one thread at a time per keyspace.
// Movable (state moves with it, the source is left empty), not copyable.
class Keyspace {
 public:
  explicit Keyspace(KeyspaceOptions options = {});
  ~Keyspace();
  Keyspace(const Keyspace&) = delete;
  Keyspace& operator=(const Keyspace&) = delete;
  Keyspace(Keyspace&& other) noexcept;
  Keyspace& operator=(Keyspace&& other) noexcept;

  // Applies `req` from connection `conn` and appends the resulting bytes to
  // `fx` (the reply to `conn` (a large MULTI_GET/GET reply as a shared
  // buffer, Effects::sendShared, possibly one sent before), STOP_WAITING bytes
  // to woken waiters, 1.13 watch notifications). A non-OK Status means the
  // request is a protocol error for that connection (ADD on a non-numeric
  // value, GET of a missing key, ...): the caller logs it and closes `conn`
  // (and then calls disconnect). No state was changed in that case and no bytes
  // were added for `conn`.
  //
  // VALIDATE and PING are handshake commands; apply() answers PING (echo) and
  // ignores VALIDATE, so the caller may pass every decoded request.
  //
  // Order of the sends of one request: the reply to `conn` first, then the
  // STOP_WAITING bytes (in registration order of the released waits), then
  // watch notifications (DELETE_KEY: notifications before the reply, as 1.13).
  Status apply(ConnId conn, const protocol::Request& req, Effects& fx);

  // A WAIT registered in bounded steps, so a huge one never makes one long
  // call. `req` must be a WAIT. With at most `sync_keys` keys this is
  // apply(conn, req, fx) and returns false. Otherwise it copies the keys
  // (O(request size), no lookups) and returns true: the WAIT is in
  // progress, advanceWaits() registers it, and until that reports it
  // finished the caller applies no request of `conn` (a WAIT or CANCEL_WAIT
  // of `conn`, or disconnect(conn), would cancel it). The result is as if
  // every key were registered by this call: a key that exists at any time
  // from this call on counts as arrived (see store/keyspace/pending_waits.h).
  // Throws std::bad_alloc if memory runs out (nothing registered).
  bool startWait(ConnId conn, const protocol::Request& req, Effects& fx,
                 std::size_t sync_keys);
  struct WaitDone {
    ConnId conn = 0;
    bool ok = true;  // false: out of memory; the caller closes `conn`
  };
  // Registers at most `max_keys` more keys of the oldest WAIT in progress
  // (O(max_keys)); when its last key is done, returns its connection, with
  // its STOP_WAITING in `fx` if every key has arrived by then. The caller
  // then sends `fx` as the WAIT's outcome and may apply `conn`'s next
  // requests. Never throws.
  std::optional<WaitDone> advanceWaits(std::size_t max_keys, Effects& fx);
  // WAITs in progress (started, not yet finished or cancelled).
  std::size_t waitsInProgress() const noexcept;

  // Forgets every wait and watch registration of `conn` (and its WAIT in
  // progress, if any), in O(1): they are
  // detached at once (no later write wakes or notifies them, and they no
  // longer count in numWaitingConnections/numPendingWaits/numWatchers), and
  // freed by reclaim(). A few are freed right away, so a connection with
  // small registrations leaves nothing behind.
  void disconnect(ConnId conn);

  // Frees at most `max_items` detached registrations (one item: one key of a
  // WAIT/BARRIER, or one watch; they come from disconnect(), CANCEL_WAIT,
  // and a WAIT that replaces a pending one) and returns how many are left.
  // O(max_items). The owner calls it regularly (the server: once per loop
  // turn) until it returns 0; until then memoryBytes() still counts them.
  // (apply() also frees up to 16 per call, so they drain with the traffic
  // even without reclaim() calls, only more slowly.)
  std::size_t reclaim(std::size_t max_items);

  // The reply cache's figures. O(1).
  ReplyCacheStats replyCacheStats() const noexcept;

  // Read-only views (for the server's progress log and for tests). All O(1)
  // except find() and queueLength() (one lookup).
  // find(): the stored value, or nullptr. The pointer stays valid (and shows
  // later writes) until the key is deleted or the keyspace is destroyed.
  const std::string* find(std::string_view key) const;
  std::size_t numKeys() const noexcept;
  // Connections with at least one pending wait (WAIT or BARRIER).
  std::size_t numWaitingConnections() const noexcept;
  // Watch registrations (each WATCH_KEY counts once, also repeated ones).
  std::size_t numWatchers() const noexcept;
  // Pending waits over all connections (one WAIT or BARRIER each).
  std::size_t numPendingWaits() const noexcept;
  // Length of the queue named `key` (0 if there is none).
  std::size_t queueLength(std::string_view key) const;
  // Bytes held by stored keys and values, queues and registrations
  // (detached ones until reclaimed), for a server-wide memory budget. An
  // estimate from sizes (entry headers, key and value lengths, table slots,
  // per-registration structs), not malloc's figure: it leaves out allocator
  // overhead and spare string capacity. Includes the reply cache (its
  // replies, key lists and index). Kept incrementally, O(1).
  std::size_t memoryBytes() const noexcept;

 private:
  struct State;  // store/keyspace.cc
  State& state();

  KeyspaceOptions options_;
  // Never null except in a moved-from keyspace (which reads as empty and
  // makes a fresh state on its next apply()).
  std::unique_ptr<State> state_;
};

}  // namespace tcpstore::store
