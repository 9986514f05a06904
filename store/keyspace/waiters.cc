#include "store/keyspace/waiters.h"

#include <algorithm>

#include "protocol/wire.h"
#include "store/keyspace/numeric.h"

namespace tcpstore::store::keyspace {

namespace {

// Dead items reclaimed right away by a cancel or disconnect when that is all
// there is to reclaim: the common small case leaves nothing behind; a large
// backlog (a burst of disconnects of huge WAITs: each removal from a table
// of millions of keys is a few cache misses) is left to reclaim(), which
// the backend runs under a time bound per loop turn.
constexpr std::size_t kInlineReclaim = 64;
// A connection's entry in conns_ (node and bucket share, roughly).
constexpr std::size_t kConnBytes = sizeof(ConnState) + 48;

}  // namespace

Waiters::~Waiters() {
  // Free everything without unlinking: the key lists die with regs_.
  auto free_all = [](ConnState& cs) {
    while (Wait* w = cs.waits.front()) {
      cs.waits.remove(w);
      delete w;
    }
    while (Watch* wa = cs.watches.front()) {
      cs.watches.remove(wa);
      delete wa;
    }
  };
  for (auto& [conn, cs] : conns_) free_all(*cs);
  for (auto& cs : graveyard_) free_all(*cs);
  free_all(retired_);
}

ConnState& Waiters::connFor(ConnId conn) {
  auto [it, created] = conns_.try_emplace(conn);
  if (created) {
    it->second = std::make_unique<ConnState>();
    it->second->conn = conn;
    bytes_ += kConnBytes;
  }
  return *it->second;
}

void Waiters::addWait(ConnId conn, bool barrier, std::int64_t world_size,
                      const std::vector<std::string_view>& keys) {
  ConnState& cs = connFor(conn);
  auto w = std::make_unique<Wait>();
  w->cs = &cs;
  w->remaining = keys.size();
  w->barrier = barrier;
  w->world_size = world_size;
  w->links.resize(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    KeyRegs* kr = regs_.findOrInsert(keys[i]).first;
    WaitLink& l = w->links[i];
    l.wait = w.get();
    l.regs = kr;
    kr->waits.pushBack(&l);
    if (barrier) {
      kr->barrier_min = std::min(kr->barrier_min, world_size);
    } else {
      ++kr->plain_links;
    }
  }
  bytes_ += sizeof(Wait) + w->links.capacity() * sizeof(WaitLink);
  cs.num_links += keys.size();
  if (cs.num_waits++ == 0) ++waiting_conns_;
  ++num_waits_;
  cs.waits.pushBack(w.release());
}

Wait* Waiters::beginWait(ConnId conn, std::size_t max_keys) {
  ConnState& cs = connFor(conn);
  auto w = std::make_unique<Wait>();
  w->cs = &cs;
  w->registering = true;
  w->links.reserve(max_keys);
  bytes_ += sizeof(Wait) + w->links.capacity() * sizeof(WaitLink);
  if (cs.num_waits++ == 0) ++waiting_conns_;
  ++num_waits_;
  cs.waits.pushBack(w.get());
  return w.release();
}

void Waiters::linkKey(Wait* w, std::string_view key, std::uint32_t hash) {
  KeyRegs* kr = regs_.findOrInsert(key, hash).first;
  // Within the reserved capacity: no reallocation moves linked links.
  WaitLink& l = w->links.emplace_back();
  l.wait = w;
  l.regs = kr;
  kr->waits.pushBack(&l);
  ++kr->plain_links;
  ++w->remaining;
  ++w->cs->num_links;
}

void Waiters::finishWait(Wait* w, Effects& fx) {
  w->registering = false;
  if (w->remaining == 0) release(w, fx);
}

void Waiters::addWatch(ConnId conn, std::string_view key) {
  ConnState& cs = connFor(conn);
  KeyRegs* kr = regs_.findOrInsert(key).first;
  auto* wa = new Watch;
  wa->cs = &cs;
  wa->regs = kr;
  kr->watches.pushBack(wa);
  cs.watches.pushBack(wa);
  ++cs.num_watches;
  ++num_watches_;
  bytes_ += sizeof(Watch);
}

void Waiters::unlink(WaitLink& l) noexcept {
  if (l.regs == nullptr) return;
  if (!l.wait->barrier) --l.regs->plain_links;
  l.regs->waits.remove(&l);
  l.regs = nullptr;
}

void Waiters::maybeErase(KeyRegs* kr) noexcept {
  if (kr->waits.empty() && kr->watches.empty()) regs_.eraseValue(kr);
}

void Waiters::freeWait(Wait* w) noexcept {
  bytes_ -= sizeof(Wait) + w->links.capacity() * sizeof(WaitLink);
  delete w;
}

void Waiters::freeWatch(Watch* wa) noexcept {
  bytes_ -= sizeof(Watch);
  delete wa;
}

// A live wait completed: unlink what is still linked (a barrier's one key;
// a plain wait is released only when all its keys arrived), send its
// STOP_WAITING and free it. The caller unlinked the link it iterates.
void Waiters::release(Wait* w, Effects& fx) {
  if (w->barrier) {
    for (WaitLink& l : w->links) {
      KeyRegs* kr = l.regs;
      if (kr == nullptr) continue;
      unlink(l);
      maybeErase(kr);
    }
  }
  ConnState& cs = *w->cs;
  cs.waits.remove(w);
  cs.num_links -= w->links.size();
  if (--cs.num_waits == 0) --waiting_conns_;
  --num_waits_;
  protocol::appendU8(fx.begin(cs.conn), protocol::kStopWaiting);
  fx.end();
  freeWait(w);
}

// Moves a live wait of a live connection to retired_: dead from now on.
void Waiters::retire(Wait* w) {
  ConnState& cs = *w->cs;
  cs.waits.remove(w);
  cs.num_links -= w->links.size();
  if (--cs.num_waits == 0) --waiting_conns_;
  --num_waits_;
  w->cs = &retired_;
  retired_.waits.pushBack(w);
  retired_.num_links += w->links.size();
  to_reclaim_ += w->links.size();
}

// kWrite: plain waits count the key as arrived; barrier waits are released
// iff the counter at the key now parses as >= their world_size (not by an
// unrelated write of the key, unlike PyTorch, which wakes them on any
// write). kAll: every barrier wait on the key is released too (plain waits
// still need their other keys).
void Waiters::wakeKey(KeyRegs* kr, const std::string& value, WakeMode mode,
                      Effects& fx) {
  if (kr->waits.empty()) return;
  bool parsed = false;
  bool numeric = false;
  std::int64_t counter = 0;
  if (mode == WakeMode::kWrite && kr->plain_links == 0) {
    // Only barrier waits: none goes before the counter reaches the
    // smallest world size among them.
    parsed = true;
    numeric = parseLikeStoll(value, counter);
    if (!numeric || counter < kr->barrier_min) return;
  }
  std::int64_t barrier_min = INT64_MAX;  // over the barrier waits that stay
  for (WaitLink* l = kr->waits.front(); l != nullptr;) {
    // `next` is never a link of the same wait (its keys are distinct), so
    // releasing `w` leaves it valid.
    WaitLink* next = decltype(kr->waits)::next(l);
    Wait* w = l->wait;
    if (w->cs->detached) {
      l = next;
      continue;
    }
    if (w->barrier) {
      bool go = mode == WakeMode::kAll;
      if (!go) {
        if (!parsed) {
          parsed = true;
          numeric = parseLikeStoll(value, counter);
        }
        go = numeric && counter >= w->world_size;
      }
      if (go) {
        unlink(*l);
        release(w, fx);
      } else {
        barrier_min = std::min(barrier_min, w->world_size);
      }
    } else {
      unlink(*l);
      if (--w->remaining == 0 && !w->registering) release(w, fx);
    }
    l = next;
  }
  kr->barrier_min = barrier_min;
}

void Waiters::afterWrite(KeyRegs* kr, std::string_view key,
                         const std::string& value, std::string_view old_value,
                         bool created, bool wake, WakeMode mode, Effects& fx) {
  if (kr == nullptr) return;
  if (wake) wakeKey(kr, value, mode, fx);
  if (watched(kr)) {
    notify(kr,
           static_cast<std::uint8_t>(created ? protocol::WatchEvent::kCreated
                                             : protocol::WatchEvent::kUpdated),
           key, old_value, value, fx);
  }
  maybeErase(kr);
}

void Waiters::notify(const KeyRegs* kr, std::uint8_t type, std::string_view key,
                     std::string_view old_value, std::string_view new_value,
                     Effects& fx) const {
  if (kr == nullptr) return;
  // Every watcher gets the same bytes: build them once (a SET of an 8 MiB
  // value watched by N connections must not cost N * 16 MiB here).
  bool built = false;
  Effects::Send like{};
  using Watches = decltype(kr->watches);
  for (const Watch* wa = kr->watches.front(); wa != nullptr;
       wa = Watches::next(wa)) {
    if (wa->cs->detached) continue;
    if (built) {
      fx.repeat(wa->cs->conn, like);
      continue;
    }
    std::string& b = fx.begin(wa->cs->conn);
    protocol::appendU8(b, type);
    protocol::appendStr(b, key);
    protocol::appendStr(b, old_value);
    protocol::appendStr(b, new_value);
    fx.end();
    like = fx.sends().back();
    built = true;
  }
}

void Waiters::wakeOne(std::string_view key, Effects& fx) {
  KeyRegs* kr = find(key);
  if (kr == nullptr) return;
  for (WaitLink* l = kr->waits.front(); l != nullptr;
       l = decltype(kr->waits)::next(l)) {
    Wait* w = l->wait;
    if (w->barrier || w->cs->detached) continue;
    unlink(*l);
    if (--w->remaining == 0 && !w->registering) release(w, fx);
    break;
  }
  maybeErase(kr);
}

void Waiters::cancelWaits(ConnId conn) {
  auto it = conns_.find(conn);
  if (it == conns_.end()) return;
  ConnState& cs = *it->second;
  while (Wait* w = cs.waits.front()) retire(w);
  reclaimIfSmall();
}

void Waiters::dropPlainWaits(ConnId conn) {
  if (waiting_conns_ == 0) return;
  auto it = conns_.find(conn);
  if (it == conns_.end()) return;
  ConnState& cs = *it->second;
  using Waits = decltype(cs.waits);
  for (Wait* w = cs.waits.front(); w != nullptr;) {
    Wait* next = Waits::next(w);
    if (!w->barrier) retire(w);
    w = next;
  }
  reclaimIfSmall();
}

void Waiters::disconnect(ConnId conn) {
  auto it = conns_.find(conn);
  if (it == conns_.end()) return;
  std::unique_ptr<ConnState> cs = std::move(it->second);
  conns_.erase(it);
  if (cs->num_waits != 0) --waiting_conns_;
  num_waits_ -= cs->num_waits;
  num_watches_ -= cs->num_watches;
  if (cs->waits.empty() && cs->watches.empty()) {
    bytes_ -= kConnBytes;
    return;
  }
  cs->detached = true;
  to_reclaim_ += cs->num_links + cs->num_watches;
  graveyard_.push_back(std::move(cs));
  reclaimIfSmall();
}

// Frees dead items of `cs` while `budget` lasts; true when none are left.
bool Waiters::drain(ConnState& cs, std::size_t& budget) noexcept {
  while (Wait* w = cs.waits.front()) {
    for (; budget > 0 && w->reclaimed < w->links.size(); --budget) {
      // Each key's registrations are a cache miss, and so is its table
      // slot: fetch them a few links ahead (a dead wait's links are freed
      // in order).
      constexpr std::size_t kAhead = 8;
      const std::size_t n = w->links.size();
      if (w->reclaimed + 2 * kAhead < n) {
        if (const KeyRegs* ahead = w->links[w->reclaimed + 2 * kAhead].regs)
          __builtin_prefetch(ahead);
      }
      if (w->reclaimed + kAhead < n) {
        if (const KeyRegs* ahead = w->links[w->reclaimed + kAhead].regs)
          regs_.prefetchValue(ahead);
      }
      WaitLink& l = w->links[w->reclaimed++];
      --to_reclaim_;
      KeyRegs* kr = l.regs;
      if (kr == nullptr) continue;
      unlink(l);
      maybeErase(kr);
    }
    if (w->reclaimed < w->links.size()) return false;
    cs.waits.remove(w);
    cs.num_links -= w->links.size();
    freeWait(w);
  }
  for (; budget > 0; --budget) {
    Watch* wa = cs.watches.front();
    if (wa == nullptr) break;
    cs.watches.remove(wa);
    wa->regs->watches.remove(wa);
    maybeErase(wa->regs);
    --cs.num_watches;
    --to_reclaim_;
    freeWatch(wa);
  }
  return cs.watches.empty();
}

void Waiters::reclaimIfSmall() {
  if (to_reclaim_ <= kInlineReclaim) reclaim(kInlineReclaim);
}

std::size_t Waiters::reclaim(std::size_t max_items) {
  std::size_t budget = max_items;
  if (!drain(retired_, budget)) return to_reclaim_;
  while (!graveyard_.empty() && drain(*graveyard_.front(), budget)) {
    graveyard_.pop_front();
    bytes_ -= kConnBytes;
  }
  return to_reclaim_;
}

}  // namespace tcpstore::store::keyspace
