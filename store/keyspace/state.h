// Keyspace::State: the keyspace's tables and their byte counts, and the
// primitives its commands are built from (the one write path that keeps
// watchers, waiters and the reply cache in step, counters, large reads).
// Private to store/keyspace.cc, which holds the commands' semantics.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "protocol/wire.h"
#include "store/keyspace.h"
#include "store/keyspace/numeric.h"
#include "store/keyspace/pending_waits.h"
#include "store/keyspace/replies.h"
#include "store/keyspace/reply_cache.h"
#include "store/keyspace/table.h"
#include "store/keyspace/waiters.h"

namespace tcpstore::store {

struct Keyspace::State final : keyspace::KeyPresence {
  explicit State(const KeyspaceOptions& o)
      : options(o), cache(cacheLimits(o)) {}

  static keyspace::ReplyCache::Limits cacheLimits(
      const KeyspaceOptions& o) noexcept {
    keyspace::ReplyCache::Limits l;
    l.max_bytes = static_cast<std::size_t>(
        std::min<std::uint64_t>(o.reply_cache_bytes, SIZE_MAX));
    l.min_reply_bytes = static_cast<std::size_t>(
        std::clamp<std::uint64_t>(o.reply_cache_min_bytes, 1, SIZE_MAX));
    return l;
  }

  using Slot = std::pair<std::string*, bool>;  // value, created

  Status apply(ConnId conn, const protocol::Request& req, Effects& fx);

  bool present(std::string_view key) const {
    return present(key, keyspace::KeyTable<std::string>::hashOf(key));
  }
  bool present(std::string_view key, std::uint32_t hash) const override {
    return values.find(key, hash) != nullptr ||
           queues.find(key, hash) != nullptr;
  }
  void prefetch(std::uint32_t hash) const noexcept override {
    values.prefetch(hash);
  }

  // WAIT (pending_waits.h). One pending plain WAIT per connection, like
  // PyTorch's per-connection counter: a client sends a new WAIT only after
  // giving up the previous one (1.13 times out without telling the server),
  // so the earlier ones (and one still registering) are dropped silently;
  // each would otherwise send a stale STOP_WAITING, shifting later replies.
  bool startWait(ConnId conn, const protocol::Request& req, Effects& fx,
                 std::size_t sync_keys) {
    if (pending.size() != 0) pending.cancel(conn);
    waiters.dropPlainWaits(conn);
    return pending.start(conn, req.keys, *this, sync_keys, fx);
  }

  // Every write of a key goes through here: keeps the old value for
  // watchers, runs update(value), then reply() (which sends the reply to the
  // writer, if any, and returns how the write wakes waiters), then wakes
  // waiters (if `wake`) and notifies watchers.
  template <typename Update, typename Reply>
  void write(std::string_view key, Slot slot, Update&& update, Reply&& reply,
             bool wake, Effects& fx) {
    auto [v, created] = slot;
    cache.invalidate(key);
    keyspace::KeyRegs* kr = waiters.find(key);
    const bool watched = keyspace::Waiters::watched(kr);
    if (watched) old_scratch.assign(*v);
    value_bytes -= v->size();
    update(*v);
    value_bytes += v->size();
    const keyspace::Waiters::WakeMode mode = reply();
    waiters.afterWrite(kr, key, *v,
                       watched ? std::string_view(old_scratch) : "", created,
                       wake, mode, fx);
    if (watched) trimScratch();
  }

  // Scratch buffers keep their capacity (steady-state apply() does not
  // allocate) unless one huge request grew them.
  void trimScratch() {
    constexpr std::size_t kKeepBytes = 64 * 1024;
    if (old_scratch.capacity() > kKeepBytes) std::string().swap(old_scratch);
  }

  void setValue(std::string_view key, std::string_view value, Effects& fx) {
    write(
        key, values.findOrInsert(key),
        [value](std::string& v) { v.assign(value.data(), value.size()); },
        [] { return keyspace::Waiters::WakeMode::kWrite; }, true, fx);
  }

  // ADD and BARRIER: adds `delta` to the counter at `key` (a missing key
  // counts as 0). A value that does not parse as a number is an error and
  // changes nothing. Otherwise on_result(new count) sends the reply and
  // returns how the write wakes waiters.
  template <typename OnResult>
  Status increment(std::string_view key, std::int64_t delta,
                   std::string_view command, OnResult&& on_result,
                   Effects& fx) {
    std::string* v = values.find(key);
    std::int64_t current = 0;
    if (v != nullptr && !keyspace::parseLikeStoll(*v, current)) {
      return Status::protocolError(std::string(command) +
                                   " on non-numeric value of key " +
                                   keyspace::quoted(key));
    }
    const std::int64_t result = keyspace::wrappingAdd(current, delta);
    write(
        key, v != nullptr ? Slot{v, false} : values.findOrInsert(key),
        [result](std::string& s) { keyspace::assignDecimal(s, result); },
        [&] { return on_result(result); }, true, fx);
    return Status::ok();
  }

  std::size_t memoryBytes() const noexcept {
    return values.memoryBytes() + value_bytes + queues.memoryBytes() +
           queue_bytes + waiters.memoryBytes() + pending.memoryBytes() +
           cache.memoryBytes();
  }

  // A large read's reply from the cache (true: sent to `conn`).
  bool sendCached(ConnId conn, keyspace::ReplyCache::Query& q, Effects& fx) {
    const SharedBytes* r = cache.find(q);
    if (r == nullptr) return false;
    fx.sendShared(conn, *r);
    return true;
  }
  // Sends the reply to a read of `keys` (all present unless
  // get_missing_returns_empty; `total` bytes): as a shared buffer, and
  // cached, if the cache admits it.
  void sendValues(ConnId conn, keyspace::ReplyCache::Query& q,
                  std::span<const std::string_view> keys, std::size_t total,
                  Effects& fx) {
    const bool shared = cache.admit(q, total);
    std::string built;
    std::string& b = shared ? built : fx.begin(conn);
    if (shared) b.reserve(total);
    for (std::string_view k : keys) {
      const std::string* v = values.find(k);
      protocol::appendStr(b, v == nullptr ? std::string_view() : *v);
    }
    if (!shared) {
      fx.end();
      return;
    }
    const SharedBytes reply = SharedBytes::adopt(std::move(built));
    cache.insert(q, reply);
    fx.sendShared(conn, reply);
  }

  KeyspaceOptions options;
  keyspace::KeyTable<std::string> values;
  std::size_t value_bytes = 0;  // sum of the values' sizes
  keyspace::KeyTable<std::deque<std::string>>
      queues;                   // never holds an empty queue
  std::size_t queue_bytes = 0;  // items and per-queue overhead
  keyspace::Waiters waiters;
  keyspace::PendingWaits pending{waiters};  // WAITs registered in steps
  keyspace::ReplyCache
      cache;  // every change of a stored value invalidates its key
  // Scratch buffers reused across calls (keep steady-state apply()
  // allocation-free).
  std::string old_scratch;
  std::vector<std::string_view> keys_scratch;  // BARRIER's one key
};

}  // namespace tcpstore::store
