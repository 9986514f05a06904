// The store's state machine: keys, values, queues, waiters and watchers.
//
// Pure: no I/O, no clocks, no threads. The server feeds it decoded requests
// (with the connection they came from) and writes the bytes it returns. One
// keyspace serves both dialects; the reply bytes are dialect-independent,
// except that only 1.13 connections may register watches.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

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
};

// PyTorch's semantics (protocol.md §3, §4), with these deliberate choices
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
  // `fx` (the reply to `conn`, STOP_WAITING bytes to woken waiters, 1.13 watch
  // notifications). A non-OK Status means the request is a protocol error for
  // that connection (ADD on a non-numeric value, GET of a missing key, ...):
  // the caller logs it and closes `conn` (and then calls disconnect). No state
  // was changed in that case and no bytes were added for `conn`.
  //
  // VALIDATE and PING are handshake commands; apply() answers PING (echo) and
  // ignores VALIDATE, so the caller may pass every decoded request.
  //
  // Order of the sends of one request: the reply to `conn` first, then the
  // STOP_WAITING bytes (in registration order of the released waits), then
  // watch notifications (DELETE_KEY: notifications before the reply, as 1.13).
  Status apply(ConnId conn, const protocol::Request& req, Effects& fx);

  // Forgets every wait and watch registration of `conn`. O(its registrations).
  void disconnect(ConnId conn);

  // Read-only views (for the server's progress log and for tests).
  // find(): the stored value, or nullptr. The pointer stays valid (and shows
  // later writes) until the key is deleted or the keyspace is destroyed.
  const std::string* find(std::string_view key) const;
  std::size_t numKeys() const noexcept { return table_.size(); }
  // Connections with at least one pending wait (WAIT or BARRIER).
  std::size_t numWaitingConnections() const noexcept { return waiting_conns_; }
  // Watch registrations (each WATCH_KEY counts once, also repeated ones).
  std::size_t numWatchers() const noexcept { return num_watches_; }
  // Pending waits over all connections (one WAIT or BARRIER each).
  std::size_t numPendingWaits() const noexcept { return num_waits_; }
  // Length of the queue named `key` (0 if there is none).
  std::size_t queueLength(std::string_view key) const;

 private:
  // ---- key/value table ---------------------------------------------------
  // One heap block per entry: this header followed by the key bytes. Small
  // values (<= 15 bytes with libstdc++) live inside `value` (SSO), so a key
  // with a small value costs one allocation plus one 8-byte table slot.
  struct Entry {
    std::string value;
    std::uint32_t hash;
    std::uint32_t key_size;
    std::string_view key() const noexcept {
      return {reinterpret_cast<const char*>(this + 1), key_size};
    }
  };
  // Open addressing, linear probing, backward-shift deletion (no tombstones),
  // slots are Entry pointers; max load 3/4, capacity a power of two.
  class Table {
   public:
    Table() = default;
    ~Table();
    Table(const Table&) = delete;
    Table& operator=(const Table&) = delete;
    Table(Table&& other) noexcept;
    Table& operator=(Table&& other) noexcept;

    Entry* find(std::string_view key) const noexcept;
    // The entry of `key`, created with an empty value if missing (second:
    // true if created).
    std::pair<Entry*, bool> findOrInsert(std::string_view key);
    bool erase(std::string_view key) noexcept;
    void clear() noexcept;
    std::size_t size() const noexcept { return size_; }
    std::size_t capacity() const noexcept { return mask_ + 1; }
    template <typename F>
    void forEach(F&& f) const {
      if (slots_ == nullptr) return;
      for (std::size_t i = 0; i <= mask_; ++i) {
        if (slots_[i] != nullptr) f(*slots_[i]);
      }
    }

   private:
    void grow();
    Entry** slots_ = nullptr;
    std::size_t mask_ = 0;  // capacity - 1 (when slots_ != nullptr)
    std::size_t size_ = 0;
  };

  // ---- waiters and watchers ----------------------------------------------
  struct Wait;
  struct KeyRegs;
  struct ConnState;
  // Membership of one wait in one key's waiter list (intrusive, so removing
  // it is O(1)).
  struct WaitLink {
    Wait* wait = nullptr;
    KeyRegs* regs = nullptr;  // nullptr once unlinked
    WaitLink* prev = nullptr;
    WaitLink* next = nullptr;
  };
  // One WAIT (counting distinct missing keys) or one BARRIER registration.
  struct Wait {
    ConnId conn = 0;
    ConnState* cs = nullptr;
    std::size_t remaining = 0;  // plain wait: keys still to be woken
    bool barrier = false;
    std::int64_t world_size = 0;  // barrier: released when counter >= this
    Wait* conn_prev = nullptr;
    Wait* conn_next = nullptr;
    std::vector<WaitLink> links;  // fixed size once linked
  };
  struct Watch {
    ConnId conn = 0;
    ConnState* cs = nullptr;
    KeyRegs* regs = nullptr;
    Watch* prev = nullptr;  // in the key's list
    Watch* next = nullptr;
    Watch* conn_prev = nullptr;  // in the connection's list
    Watch* conn_next = nullptr;
  };
  // Registrations on one key; erased when both lists are empty.
  struct KeyRegs {
    std::string_view key;  // the map node's key (stable)
    WaitLink* wait_head = nullptr;
    WaitLink* wait_tail = nullptr;
    Watch* watch_head = nullptr;
    Watch* watch_tail = nullptr;
  };
  // Registrations of one connection; erased by disconnect().
  struct ConnState {
    Wait* wait_head = nullptr;
    Wait* wait_tail = nullptr;
    std::size_t num_waits = 0;
    Watch* watch_head = nullptr;
    Watch* watch_tail = nullptr;
  };

  struct StringHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept {
      return std::hash<std::string_view>{}(s);
    }
  };
  template <typename V>
  using StringMap =
      std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

  enum class WakeMode { kWrite, kAll };

  bool present(std::string_view key) const;
  KeyRegs* regsOf(std::string_view key);
  KeyRegs& regsFor(std::string_view key);
  void maybeEraseRegs(KeyRegs* kr);
  ConnState& connFor(ConnId conn);
  static void unlink(WaitLink& l) noexcept;
  void releaseWait(Wait* w, Effects& fx, bool emit);
  void wakeKey(KeyRegs* kr, const Entry* e, WakeMode mode, Effects& fx);
  void wakeOne(std::string_view key, Effects& fx);
  void notifyWatchers(const KeyRegs* kr, std::uint8_t type,
                      std::string_view key, std::string_view old_value,
                      std::string_view new_value, Effects& fx) const;
  // Bookkeeping after `e` (key) was written; old value in old_scratch_ when
  // watchers exist (kr non-null and watched).
  void afterWrite(KeyRegs* kr, const Entry* e, bool created, bool wake,
                  WakeMode mode, Effects& fx);
  void setValue(std::string_view key, std::string_view value, Effects& fx);
  void addWait(ConnId conn, bool barrier, std::int64_t world_size,
               const std::vector<std::string_view>& keys);
  void cancelWaits(ConnId conn, Effects& fx);
  void dropPlainWaits(ConnId conn, Effects& fx);
  void destroyAll() noexcept;

  KeyspaceOptions options_;
  Table table_;
  StringMap<std::deque<std::string>> queues_;  // never holds an empty queue
  StringMap<KeyRegs> regs_;
  std::unordered_map<ConnId, ConnState> conns_;
  std::size_t waiting_conns_ = 0;
  std::size_t num_waits_ = 0;
  std::size_t num_watches_ = 0;
  // Scratch buffers reused across calls (keep steady-state apply()
  // allocation-free).
  std::string old_scratch_;
  std::vector<std::string_view> keys_scratch_;
};

}  // namespace tcpstore::store
