// The store's state machine: command semantics. See keyspace.h for the
// contract and docs/protocol.md §3 / §4 for the semantics reproduced here.
//
// Data structures (store/keyspace/; the tables and the one write path live in
// Keyspace::State, state.h):
//  - Keys/values: a KeyTable<std::string> (table.h), one heap block per key
//    [std::string value][hash, key size][key bytes]. A 96-byte key with a
//    value of <= 15 bytes costs one 144-byte malloc chunk plus 8 bytes per
//    slot at a load between 3/8 and 3/4. Lookups take a string_view and never
//    allocate; SET of an existing key reuses the value's capacity.
//  - Queues: a KeyTable of deques (QUEUE_*), sharing the key namespace only
//    for WAIT/CHECK presence.
//  - Waits and watches: Waiters (waiters.h). A WAIT costs per distinct absent
//    key one 32-byte WaitLink plus one registration block [KeyRegs (two list
//    heads)][hash, key size][key bytes] shared by all waits and watches on
//    the key: about 112 bytes per 26-byte key as malloc counts (bench
//    BM_WaitMemoryPerKey; 170-200 before, with a std::string per key).
//  - A huge WAIT is registered in steps (pending_waits.h).
//  - Large MULTI_GET/GET replies: a ReplyCache (reply_cache.h) of shared
//    buffers; write() and DELETE_KEY invalidate the key's entries.
//  - All tables hash with keyed SipHash (hash.h) and grow incrementally;
//    detached registrations are freed by reclaim() (and a few per apply()).
#include "store/keyspace.h"

#include <algorithm>
#include <deque>
#include <span>
#include <utility>
#include <vector>

#include "protocol/wire.h"
#include "store/keyspace/numeric.h"
#include "store/keyspace/pending_waits.h"
#include "store/keyspace/replies.h"
#include "store/keyspace/reply_cache.h"
#include "store/keyspace/state.h"
#include "store/keyspace/table.h"
#include "store/keyspace/waiters.h"

namespace tcpstore::store {

namespace {

using keyspace::quoted;
using keyspace::ReplyCache;
using keyspace::replyTooLarge;
using keyspace::sendByte;
using keyspace::sendI64;
using keyspace::sendStr;
using keyspace::Waiters;
using WakeMode = Waiters::WakeMode;
using protocol::appendI64;
using protocol::appendStr;
using protocol::appendU32;
using protocol::Command;
using protocol::WatchEvent;

// Dead registrations freed by each apply(): a drip of reclaiming with the
// traffic, so they drain even if the owner never calls reclaim().
constexpr std::size_t kReclaimPerApply = 16;

// Rough per-queue cost of a std::deque beyond its object (map + one block).
constexpr std::size_t kQueueBytes = 64 + 512;

std::size_t itemBytes(const std::string& item) noexcept {
  return sizeof(std::string) + item.size();
}

}  // namespace

// ---- lifetime and views ----------------------------------------------------

Keyspace::Keyspace(KeyspaceOptions options)
    : options_(options), state_(std::make_unique<State>(options)) {}

Keyspace::~Keyspace() = default;
Keyspace::Keyspace(Keyspace&& other) noexcept = default;
Keyspace& Keyspace::operator=(Keyspace&& other) noexcept = default;

Keyspace::State& Keyspace::state() {
  if (state_ == nullptr) state_ = std::make_unique<State>(options_);
  return *state_;
}

Status Keyspace::apply(ConnId conn, const protocol::Request& req, Effects& fx) {
  State& st = state();
  Status result = st.apply(conn, req, fx);
  // A drip of reclaiming with the traffic, so dead registrations drain
  // even if the owner never calls reclaim().
  if (st.waiters.toReclaim() != 0) st.waiters.reclaim(kReclaimPerApply);
  return result;
}

bool Keyspace::startWait(ConnId conn, const protocol::Request& req, Effects& fx,
                         std::size_t sync_keys) {
  State& st = state();
  const bool started = st.startWait(conn, req, fx, sync_keys);
  if (st.waiters.toReclaim() != 0) st.waiters.reclaim(kReclaimPerApply);
  return started;
}

std::optional<Keyspace::WaitDone> Keyspace::advanceWaits(std::size_t max_keys,
                                                         Effects& fx) {
  if (state_ == nullptr) return std::nullopt;
  auto done = state_->pending.advance(max_keys, *state_, fx);
  if (!done) return std::nullopt;
  return WaitDone{done->conn, done->ok};
}

std::size_t Keyspace::waitsInProgress() const noexcept {
  return state_ == nullptr ? 0 : state_->pending.size();
}

void Keyspace::disconnect(ConnId conn) {
  if (state_ == nullptr) return;
  if (state_->pending.size() != 0) state_->pending.cancel(conn);
  state_->waiters.disconnect(conn);
}

std::size_t Keyspace::reclaim(std::size_t max_items) {
  return state_ == nullptr ? 0 : state_->waiters.reclaim(max_items);
}

const std::string* Keyspace::find(std::string_view key) const {
  return state_ == nullptr ? nullptr : state_->values.find(key);
}

std::size_t Keyspace::numKeys() const noexcept {
  return state_ == nullptr ? 0 : state_->values.size();
}

std::size_t Keyspace::numWaitingConnections() const noexcept {
  return state_ == nullptr ? 0 : state_->waiters.numWaitingConnections();
}

std::size_t Keyspace::numWatchers() const noexcept {
  return state_ == nullptr ? 0 : state_->waiters.numWatchers();
}

std::size_t Keyspace::numPendingWaits() const noexcept {
  return state_ == nullptr ? 0 : state_->waiters.numPendingWaits();
}

std::size_t Keyspace::queueLength(std::string_view key) const {
  if (state_ == nullptr) return 0;
  const auto* q = state_->queues.find(key);
  return q == nullptr ? 0 : q->size();
}

ReplyCacheStats Keyspace::replyCacheStats() const noexcept {
  if (state_ == nullptr) return {};
  const ReplyCache::Stats c = state_->cache.stats();
  return ReplyCacheStats{c.hits, c.inserts, c.invalidated, c.evicted,
                         c.entries};
}

std::size_t Keyspace::memoryBytes() const noexcept {
  return state_ == nullptr ? 0 : state_->memoryBytes();
}

// ---- apply -----------------------------------------------------------------

Status Keyspace::State::apply(ConnId conn, const protocol::Request& req,
                              Effects& fx) {
  switch (req.command) {
    case Command::kValidate:
      return Status::ok();

    case Command::kPing:
      appendU32(fx.begin(conn), req.u32);
      fx.end();
      return Status::ok();

    case Command::kSet:
      setValue(req.key, req.value, fx);
      return Status::ok();

    case Command::kGet: {
      const std::string* v = values.find(req.key);
      if (v == nullptr && !options.get_missing_returns_empty) {
        return Status::protocolError("GET of missing key " + quoted(req.key));
      }
      if (v != nullptr && v->size() + 8 >= cache.minReplyBytes()) {
        const std::span<const std::string_view> one(&req.key, 1);
        ReplyCache::Query q(one);
        if (!sendCached(conn, q, fx))
          sendValues(conn, q, one, 8 + v->size(), fx);
        return Status::ok();
      }
      sendStr(fx, conn, v == nullptr ? std::string_view() : *v);
      return Status::ok();
    }

    case Command::kAdd:
      return increment(
          req.key, req.number, "ADD",
          [&](std::int64_t result) {
            sendI64(fx, conn, result);
            return WakeMode::kWrite;
          },
          fx);

    case Command::kCompareSet: {
      std::string* v = values.find(req.key);
      const bool stores = v == nullptr ? req.value.empty() : *v == req.value;
      if (!stores) {
        sendStr(fx, conn, v == nullptr ? req.value : std::string_view(*v));
        return Status::ok();
      }
      write(
          req.key, v != nullptr ? Slot{v, false} : values.findOrInsert(req.key),
          [&](std::string& s) {
            s.assign(req.desired.data(), req.desired.size());
          },
          [&] {
            sendStr(fx, conn, req.desired);
            return WakeMode::kWrite;
          },
          options.compare_set_wakes, fx);
      return Status::ok();
    }

    case Command::kCheck: {
      const bool all =
          std::all_of(req.keys.begin(), req.keys.end(),
                      [this](std::string_view k) { return present(k); });
      sendByte(fx, conn,
               all ? protocol::kCheckReady : protocol::kCheckNotReady);
      return Status::ok();
    }

    case Command::kWait:
      startWait(conn, req, fx, SIZE_MAX);
      return Status::ok();

    case Command::kGetNumKeys:
      sendI64(fx, conn, static_cast<std::int64_t>(values.size()));
      return Status::ok();

    case Command::kDeleteKey: {
      const std::string* v = values.find(req.key);
      if (v == nullptr) {
        sendI64(fx, conn, 0);
        return Status::ok();
      }
      waiters.notify(waiters.find(req.key),
                     static_cast<std::uint8_t>(WatchEvent::kDeleted), req.key,
                     *v, std::string_view(), fx);
      cache.invalidate(req.key);
      value_bytes -= v->size();
      values.erase(req.key);
      if (queues.find(req.key) == nullptr) pending.vanished(req.key);
      sendI64(fx, conn, 1);
      return Status::ok();
    }

    case Command::kAppend: {
      const std::string* cur = values.find(req.key);
      const std::uint64_t grown =
          (cur == nullptr ? 0 : std::uint64_t{cur->size()}) + req.value.size();
      if (grown > options.max_value_bytes) {
        return Status::limitExceeded(
            "APPEND would grow the value of key " + quoted(req.key) + " to " +
            std::to_string(grown) + " bytes, over the value limit " +
            std::to_string(options.max_value_bytes));
      }
      write(
          req.key, values.findOrInsert(req.key),
          [&](std::string& s) { s.append(req.value.data(), req.value.size()); },
          [] { return WakeMode::kWrite; }, true, fx);
      return Status::ok();
    }

    case Command::kMultiGet: {
      // A hit needs no checks: its keys are unchanged since it was built.
      ReplyCache::Query q(req.keys);
      if (sendCached(conn, q, fx)) return Status::ok();
      if (!options.get_missing_returns_empty) {
        for (std::string_view k : req.keys) {
          if (values.find(k) == nullptr) {
            return Status::protocolError("MULTI_GET of missing key " +
                                         quoted(k));
          }
        }
      }
      std::uint64_t total = 0;
      for (std::string_view k : req.keys) {
        const std::string* v = values.find(k);
        total += 8 + (v == nullptr ? 0 : std::uint64_t{v->size()});
      }
      if (total > options.max_reply_bytes) {
        return replyTooLarge(total, options.max_reply_bytes);
      }
      sendValues(conn, q, req.keys, static_cast<std::size_t>(total), fx);
      return Status::ok();
    }

    case Command::kMultiSet: {
      if (req.keys.size() != req.values.size()) {
        return Status::protocolError(
            "MULTI_SET with " + std::to_string(req.keys.size()) + " keys but " +
            std::to_string(req.values.size()) + " values");
      }
      for (std::size_t i = 0; i < req.keys.size(); ++i)
        setValue(req.keys[i], req.values[i], fx);
      return Status::ok();
    }

    case Command::kCancelWait:
      if (pending.size() != 0) pending.cancel(conn);
      waiters.cancelWaits(conn);
      sendByte(fx, conn, protocol::kWaitCanceled);
      return Status::ok();

    case Command::kQueuePush: {
      auto [q, created] = queues.findOrInsert(req.key);
      if (created) queue_bytes += kQueueBytes;
      q->emplace_back(req.value);
      queue_bytes += itemBytes(q->back());
      waiters.wakeOne(req.key, fx);
      return Status::ok();
    }

    case Command::kQueuePop: {
      auto* q = queues.find(req.key);
      if (q == nullptr) {
        sendI64(fx, conn, 0);
        return Status::ok();
      }
      std::string& b = fx.begin(conn);
      appendI64(b, static_cast<std::int64_t>(q->size()));
      appendStr(b, q->front());
      fx.end();
      queue_bytes -= itemBytes(q->front());
      q->pop_front();
      if (q->empty()) {
        queues.erase(req.key);
        queue_bytes -= kQueueBytes;
        if (values.find(req.key) == nullptr) pending.vanished(req.key);
      }
      return Status::ok();
    }

    case Command::kQueueLen: {
      const auto* q = queues.find(req.key);
      sendI64(fx, conn,
              q == nullptr ? 0 : static_cast<std::int64_t>(q->size()));
      return Status::ok();
    }

    case Command::kListKeys: {
      std::uint64_t total = 8;
      values.forEach([&total](std::string_view k, const std::string&) {
        total += 8 + k.size();
      });
      if (total > options.max_reply_bytes) {
        return replyTooLarge(total, options.max_reply_bytes);
      }
      std::string& b = fx.begin(conn);
      appendI64(b, static_cast<std::int64_t>(values.size()));
      values.forEach(
          [&b](std::string_view k, const std::string&) { appendStr(b, k); });
      fx.end();
      return Status::ok();
    }

    case Command::kBarrier: {
      bool complete = false;
      Status st = increment(
          req.key, 1, "BARRIER",
          [&](std::int64_t count) {
            // A complete count releases every waiter on the key; otherwise
            // the increment is a write of the key (plain waiters count it,
            // other barrier waiters are re-evaluated), then this caller waits.
            complete = count >= req.number;
            if (!complete) return WakeMode::kWrite;
            sendByte(fx, conn, protocol::kStopWaiting);
            return WakeMode::kAll;
          },
          fx);
      if (st.isOk() && !complete) {
        keys_scratch.assign(1, req.key);
        waiters.addWait(conn, true, req.number, keys_scratch);
      }
      return st;
    }

    case Command::kWatchKey:
      waiters.addWatch(conn, req.key);
      sendByte(fx, conn, static_cast<std::uint8_t>(WatchEvent::kRegistered));
      return Status::ok();
  }
  return Status::protocolError(
      "unknown command " + std::to_string(static_cast<unsigned>(req.command)));
}

}  // namespace tcpstore::store
