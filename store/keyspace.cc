// The store's state machine. See keyspace.h for the contract and protocol.md
// §3 / §4 for the semantics reproduced here.
//
// Data structures
//  - Keys/values: Keyspace::Table, an open-addressing table of Entry pointers.
//    Each entry is a single heap block [std::string value][u32 hash][u32 key
//    size][key bytes]. A 96-byte key with a value of <= 15 bytes costs one
//    144-byte malloc chunk (40 + 96 requested) plus 8 bytes per slot at a load
//    between 3/8 and 3/4, i.e. about 155-165 bytes per key. Lookups take a
//    string_view and never allocate; SET of an existing key reuses the value's
//    capacity.
//  - Queues: a separate map of deques (QUEUE_*), sharing the key namespace
//    only for WAIT/CHECK presence.
//  - Waits: a Wait per WAIT/BARRIER registration, linked into an intrusive
//    list per key (KeyRegs, via one WaitLink per distinct key) and into an
//    intrusive list per connection (ConnState). Waking a key touches only that
//    key's list; CANCEL_WAIT and disconnect() touch only that connection's
//    waits. Watches (1.13 WATCH_KEY) are linked the same way.
#include "store/keyspace.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <limits>
#include <new>
#include <tuple>
#include <utility>

#include "protocol/wire.h"

namespace tcpstore::store {

namespace {

using protocol::appendI64;
using protocol::appendStr;
using protocol::appendU32;
using protocol::appendU8;
using protocol::Command;
using protocol::WatchEvent;

std::uint32_t hashOf(std::string_view key) noexcept {
  return static_cast<std::uint32_t>(std::hash<std::string_view>{}(key));
}

bool isCSpace(char c) noexcept {
  return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' ||
         c == '\r';
}

// Parses `s` the way std::stoll(s) does in the C locale: optional leading
// white space, optional sign, decimal digits up to the first non-digit.
// Returns false where stoll throws (no digits, or out of int64 range).
bool parseLikeStoll(std::string_view s, std::int64_t& out) noexcept {
  std::size_t i = 0;
  while (i < s.size() && isCSpace(s[i])) ++i;
  bool negative = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) {
    negative = s[i] == '-';
    ++i;
  }
  const std::uint64_t limit =
      negative ? (std::uint64_t{1} << 63) : (std::uint64_t{1} << 63) - 1;
  const std::size_t first_digit = i;
  std::uint64_t magnitude = 0;
  bool overflow = false;
  for (; i < s.size() && s[i] >= '0' && s[i] <= '9'; ++i) {
    auto d = static_cast<std::uint64_t>(s[i] - '0');
    if (overflow || magnitude > (limit - d) / 10) {
      overflow = true;
    } else {
      magnitude = magnitude * 10 + d;
    }
  }
  if (i == first_digit || overflow) return false;
  // Two's-complement conversion is defined in C++20 (2^63 -> INT64_MIN).
  out = static_cast<std::int64_t>(negative ? std::uint64_t{0} - magnitude
                                           : magnitude);
  return true;
}

// a + b with two's-complement wrap-around, without signed overflow.
std::int64_t wrappingAdd(std::int64_t a, std::int64_t b) noexcept {
  return static_cast<std::int64_t>(static_cast<std::uint64_t>(a) +
                                   static_cast<std::uint64_t>(b));
}

void assignDecimal(std::string& out, std::int64_t v) {
  char buf[24];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  (void)ec;  // 24 bytes always suffice for an int64
  out.assign(buf, static_cast<std::size_t>(end - buf));
}

std::string quoted(std::string_view key) {
  // Keys are arbitrary bytes: keep the message printable and bounded.
  constexpr std::size_t kMax = 64;
  std::string s = "'";
  for (std::size_t i = 0; i < key.size() && i < kMax; ++i) {
    auto c = static_cast<unsigned char>(key[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') {
      s.push_back(static_cast<char>(c));
    } else {
      static constexpr char kHex[] = "0123456789abcdef";
      s += "\\x";
      s.push_back(kHex[c >> 4]);
      s.push_back(kHex[c & 0xf]);
    }
  }
  if (key.size() > kMax) s += "...";
  s += "'";
  return s;
}

Status replyTooLarge(std::uint64_t bytes, std::uint64_t limit) {
  return Status::limitExceeded("reply of " + std::to_string(bytes) +
                               " bytes over the reply limit " +
                               std::to_string(limit));
}

void sendByte(Effects& fx, ConnId conn, std::uint8_t b) {
  appendU8(fx.begin(conn), b);
  fx.end();
}

void sendI64(Effects& fx, ConnId conn, std::int64_t v) {
  appendI64(fx.begin(conn), v);
  fx.end();
}

void sendStr(Effects& fx, ConnId conn, std::string_view s) {
  appendStr(fx.begin(conn), s);
  fx.end();
}

}  // namespace

// ---- Table -----------------------------------------------------------------

Keyspace::Table::~Table() { clear(); }

Keyspace::Table::Table(Table&& other) noexcept
    : slots_(std::exchange(other.slots_, nullptr)),
      mask_(std::exchange(other.mask_, 0)),
      size_(std::exchange(other.size_, 0)) {}

Keyspace::Table& Keyspace::Table::operator=(Table&& other) noexcept {
  if (this != &other) {
    clear();
    slots_ = std::exchange(other.slots_, nullptr);
    mask_ = std::exchange(other.mask_, 0);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void Keyspace::Table::clear() noexcept {
  if (slots_ == nullptr) return;
  for (std::size_t i = 0; i <= mask_; ++i) {
    if (Entry* e = slots_[i]) {
      e->~Entry();
      ::operator delete(e);
    }
  }
  delete[] slots_;
  slots_ = nullptr;
  mask_ = 0;
  size_ = 0;
}

Keyspace::Entry* Keyspace::Table::find(std::string_view key) const noexcept {
  if (slots_ == nullptr) return nullptr;
  const std::uint32_t h = hashOf(key);
  for (std::size_t i = h & mask_;; i = (i + 1) & mask_) {
    Entry* e = slots_[i];
    if (e == nullptr) return nullptr;
    if (e->hash == h && e->key() == key) return e;
  }
}

void Keyspace::Table::grow() {
  const std::size_t old_cap = slots_ == nullptr ? 0 : mask_ + 1;
  const std::size_t new_cap = old_cap == 0 ? 16 : old_cap * 2;
  auto** fresh = new Entry*[new_cap]();
  const std::size_t new_mask = new_cap - 1;
  for (std::size_t i = 0; i < old_cap; ++i) {
    Entry* e = slots_[i];
    if (e == nullptr) continue;
    std::size_t j = e->hash & new_mask;
    while (fresh[j] != nullptr) j = (j + 1) & new_mask;
    fresh[j] = e;
  }
  delete[] slots_;
  slots_ = fresh;
  mask_ = new_mask;
}

std::pair<Keyspace::Entry*, bool> Keyspace::Table::findOrInsert(
    std::string_view key) {
  if (slots_ == nullptr || (size_ + 1) * 4 > (mask_ + 1) * 3) {
    if (Entry* e = find(key)) return {e, false};
    grow();
  }
  const std::uint32_t h = hashOf(key);
  std::size_t i = h & mask_;
  for (;; i = (i + 1) & mask_) {
    Entry* e = slots_[i];
    if (e == nullptr) break;
    if (e->hash == h && e->key() == key) return {e, false};
  }
  void* mem = ::operator new(sizeof(Entry) + key.size());
  auto* e =
      new (mem) Entry{std::string(), h, static_cast<std::uint32_t>(key.size())};
  if (!key.empty())
    std::memcpy(reinterpret_cast<char*>(e + 1), key.data(), key.size());
  slots_[i] = e;
  ++size_;
  return {e, true};
}

bool Keyspace::Table::erase(std::string_view key) noexcept {
  if (slots_ == nullptr) return false;
  const std::uint32_t h = hashOf(key);
  std::size_t i = h & mask_;
  for (;; i = (i + 1) & mask_) {
    Entry* e = slots_[i];
    if (e == nullptr) return false;
    if (e->hash == h && e->key() == key) {
      e->~Entry();
      ::operator delete(e);
      break;
    }
  }
  // Backward-shift deletion: move later members of the probe run into the
  // hole unless their home slot lies cyclically in (hole, j].
  std::size_t j = i;
  for (;;) {
    j = (j + 1) & mask_;
    Entry* e = slots_[j];
    if (e == nullptr) break;
    const std::size_t home = e->hash & mask_;
    const bool stays =
        i <= j ? (i < home && home <= j) : (i < home || home <= j);
    if (stays) continue;
    slots_[i] = e;
    i = j;
  }
  slots_[i] = nullptr;
  --size_;
  return true;
}

// ---- Keyspace: lifetime ----------------------------------------------------

Keyspace::Keyspace(KeyspaceOptions options) : options_(options) {}

Keyspace::~Keyspace() { destroyAll(); }

Keyspace::Keyspace(Keyspace&& other) noexcept
    : options_(other.options_),
      table_(std::move(other.table_)),
      queues_(std::move(other.queues_)),
      regs_(std::move(other.regs_)),
      conns_(std::move(other.conns_)),
      waiting_conns_(std::exchange(other.waiting_conns_, 0)),
      num_waits_(std::exchange(other.num_waits_, 0)),
      num_watches_(std::exchange(other.num_watches_, 0)) {
  // Node-based maps hand over their nodes, so the raw pointers between the
  // structures stay valid. Make sure the source owns nothing any more.
  other.queues_.clear();
  other.regs_.clear();
  other.conns_.clear();
}

Keyspace& Keyspace::operator=(Keyspace&& other) noexcept {
  if (this != &other) {
    destroyAll();
    options_ = other.options_;
    table_ = std::move(other.table_);
    queues_ = std::move(other.queues_);
    regs_ = std::move(other.regs_);
    conns_ = std::move(other.conns_);
    waiting_conns_ = std::exchange(other.waiting_conns_, 0);
    num_waits_ = std::exchange(other.num_waits_, 0);
    num_watches_ = std::exchange(other.num_watches_, 0);
    other.queues_.clear();
    other.regs_.clear();
    other.conns_.clear();
  }
  return *this;
}

void Keyspace::destroyAll() noexcept {
  for (auto& [conn, cs] : conns_) {
    for (Wait* w = cs.wait_head; w != nullptr;) {
      Wait* next = w->conn_next;
      delete w;
      w = next;
    }
    for (Watch* wa = cs.watch_head; wa != nullptr;) {
      Watch* next = wa->conn_next;
      delete wa;
      wa = next;
    }
  }
  conns_.clear();
  regs_.clear();
  queues_.clear();
  table_.clear();
  waiting_conns_ = num_waits_ = num_watches_ = 0;
}

// ---- read-only views -------------------------------------------------------

const std::string* Keyspace::find(std::string_view key) const {
  const Entry* e = table_.find(key);
  return e == nullptr ? nullptr : &e->value;
}

std::size_t Keyspace::queueLength(std::string_view key) const {
  auto it = queues_.find(key);
  return it == queues_.end() ? 0 : it->second.size();
}

bool Keyspace::present(std::string_view key) const {
  return table_.find(key) != nullptr ||
         (!queues_.empty() && queues_.find(key) != queues_.end());
}

// ---- registration bookkeeping ---------------------------------------------

Keyspace::KeyRegs* Keyspace::regsOf(std::string_view key) {
  if (regs_.empty()) return nullptr;
  auto it = regs_.find(key);
  return it == regs_.end() ? nullptr : &it->second;
}

Keyspace::KeyRegs& Keyspace::regsFor(std::string_view key) {
  auto it = regs_.find(key);
  if (it == regs_.end()) {
    it = regs_.emplace(std::string(key), KeyRegs{}).first;
    it->second.key = it->first;
  }
  return it->second;
}

void Keyspace::maybeEraseRegs(KeyRegs* kr) {
  if (kr == nullptr || kr->wait_head != nullptr || kr->watch_head != nullptr)
    return;
  auto it = regs_.find(kr->key);
  if (it != regs_.end()) regs_.erase(it);
}

Keyspace::ConnState& Keyspace::connFor(ConnId conn) { return conns_[conn]; }

void Keyspace::unlink(WaitLink& l) noexcept {
  KeyRegs* kr = l.regs;
  if (kr == nullptr) return;
  (l.prev != nullptr ? l.prev->next : kr->wait_head) = l.next;
  (l.next != nullptr ? l.next->prev : kr->wait_tail) = l.prev;
  l.prev = l.next = nullptr;
  l.regs = nullptr;
}

void Keyspace::addWait(ConnId conn, bool barrier, std::int64_t world_size,
                       const std::vector<std::string_view>& keys) {
  ConnState& cs = connFor(conn);
  auto* w = new Wait;
  w->conn = conn;
  w->cs = &cs;
  w->remaining = keys.size();
  w->barrier = barrier;
  w->world_size = world_size;
  w->links.resize(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    KeyRegs& kr = regsFor(keys[i]);
    WaitLink& l = w->links[i];
    l.wait = w;
    l.regs = &kr;
    l.prev = kr.wait_tail;
    (kr.wait_tail != nullptr ? kr.wait_tail->next : kr.wait_head) = &l;
    kr.wait_tail = &l;
  }
  w->conn_prev = cs.wait_tail;
  (cs.wait_tail != nullptr ? cs.wait_tail->conn_next : cs.wait_head) = w;
  cs.wait_tail = w;
  if (cs.num_waits++ == 0) ++waiting_conns_;
  ++num_waits_;
}

// Removes `w` from every list and frees it; with `emit`, sends its
// STOP_WAITING. The caller has already unlinked the link it is iterating
// (and erases that key's KeyRegs itself if it became empty).
void Keyspace::releaseWait(Wait* w, Effects& fx, bool emit) {
  for (WaitLink& l : w->links) {
    KeyRegs* kr = l.regs;
    if (kr == nullptr) continue;
    unlink(l);
    maybeEraseRegs(kr);
  }
  ConnState& cs = *w->cs;
  (w->conn_prev != nullptr ? w->conn_prev->conn_next : cs.wait_head) =
      w->conn_next;
  (w->conn_next != nullptr ? w->conn_next->conn_prev : cs.wait_tail) =
      w->conn_prev;
  if (--cs.num_waits == 0) --waiting_conns_;
  --num_waits_;
  if (emit) sendByte(fx, w->conn, protocol::kStopWaiting);
  delete w;
}

// A write woke key `kr` (its entry now `e`, or nullptr). kWrite: plain waits
// count the key as arrived; barrier waits are released iff the counter at the
// key now parses as >= their world_size (a barrier waiter is not released by
// an unrelated write of its key, unlike PyTorch which wakes it on any write).
// kAll (a BARRIER reached its count): every waiter on the key is released
// (plain waits still need their other keys).
void Keyspace::wakeKey(KeyRegs* kr, const Entry* e, WakeMode mode,
                       Effects& fx) {
  if (kr == nullptr || kr->wait_head == nullptr) return;
  bool parsed = false;
  bool numeric = false;
  std::int64_t counter = 0;
  for (WaitLink* l = kr->wait_head; l != nullptr;) {
    WaitLink* next = l->next;  // never a link of the same wait (keys distinct)
    Wait* w = l->wait;
    if (w->barrier) {
      bool release = mode == WakeMode::kAll;
      if (!release) {
        if (!parsed) {
          parsed = true;
          numeric = e != nullptr && parseLikeStoll(e->value, counter);
        }
        release = numeric && counter >= w->world_size;
      }
      if (release) {
        unlink(*l);
        releaseWait(w, fx, true);
      }
    } else {
      unlink(*l);
      if (--w->remaining == 0) releaseWait(w, fx, true);
    }
    l = next;
  }
  maybeEraseRegs(kr);
}

// QUEUE_PUSH: the oldest plain wait on `key` counts the key as arrived (and
// is released if that was its last key); the others keep waiting. Barrier
// waits are skipped: a queue item does not change a counter.
void Keyspace::wakeOne(std::string_view key, Effects& fx) {
  KeyRegs* kr = regsOf(key);
  if (kr == nullptr) return;
  for (WaitLink* l = kr->wait_head; l != nullptr; l = l->next) {
    Wait* w = l->wait;
    if (w->barrier) continue;
    unlink(*l);
    if (--w->remaining == 0) releaseWait(w, fx, true);
    break;
  }
  maybeEraseRegs(kr);
}

void Keyspace::notifyWatchers(const KeyRegs* kr, std::uint8_t type,
                              std::string_view key, std::string_view old_value,
                              std::string_view new_value, Effects& fx) const {
  if (kr == nullptr || kr->watch_head == nullptr) return;
  // Every watcher gets the same bytes: build them once (a SET of an 8 MiB
  // value watched by N connections must not cost N * 16 MiB here).
  const Watch* first = kr->watch_head;
  std::string& b = fx.begin(first->conn);
  appendU8(b, type);
  appendStr(b, key);
  appendStr(b, old_value);
  appendStr(b, new_value);
  fx.end();
  const Effects::Send like = fx.sends().back();
  for (const Watch* wa = first->next; wa != nullptr; wa = wa->next) {
    fx.repeat(wa->conn, like);
  }
}

void Keyspace::afterWrite(KeyRegs* kr, const Entry* e, bool created, bool wake,
                          WakeMode mode, Effects& fx) {
  if (kr == nullptr) return;
  // Watchers first captured (kr stays alive: wakeKey erases it only when it
  // also has no watchers, and then there is nothing to notify).
  const bool watched = kr->watch_head != nullptr;
  if (wake) wakeKey(kr, e, mode, fx);  // may erase kr if unwatched
  if (watched) {
    notifyWatchers(kr,
                   static_cast<std::uint8_t>(created ? WatchEvent::kCreated
                                                     : WatchEvent::kUpdated),
                   e->key(), old_scratch_, e->value, fx);
  }
}

void Keyspace::setValue(std::string_view key, std::string_view value,
                        Effects& fx) {
  auto [e, created] = table_.findOrInsert(key);
  KeyRegs* kr = regsOf(key);
  if (kr != nullptr && kr->watch_head != nullptr) old_scratch_.assign(e->value);
  e->value.assign(value.data(), value.size());
  afterWrite(kr, e, created, true, WakeMode::kWrite, fx);
}

void Keyspace::cancelWaits(ConnId conn, Effects& fx) {
  auto it = conns_.find(conn);
  if (it == conns_.end()) return;
  for (Wait* w = it->second.wait_head; w != nullptr;) {
    Wait* next = w->conn_next;
    releaseWait(w, fx, false);
    w = next;
  }
}

void Keyspace::dropPlainWaits(ConnId conn, Effects& fx) {
  if (waiting_conns_ == 0) return;
  auto it = conns_.find(conn);
  if (it == conns_.end()) return;
  for (Wait* w = it->second.wait_head; w != nullptr;) {
    Wait* next = w->conn_next;
    if (!w->barrier) releaseWait(w, fx, false);
    w = next;
  }
}

void Keyspace::disconnect(ConnId conn) {
  auto it = conns_.find(conn);
  if (it == conns_.end()) return;
  Effects unused;
  cancelWaits(conn, unused);
  ConnState& cs = it->second;
  for (Watch* wa = cs.watch_head; wa != nullptr;) {
    Watch* next = wa->conn_next;
    KeyRegs* kr = wa->regs;
    (wa->prev != nullptr ? wa->prev->next : kr->watch_head) = wa->next;
    (wa->next != nullptr ? wa->next->prev : kr->watch_tail) = wa->prev;
    maybeEraseRegs(kr);
    --num_watches_;
    delete wa;
    wa = next;
  }
  conns_.erase(it);
}

// ---- apply -----------------------------------------------------------------

Status Keyspace::apply(ConnId conn, const protocol::Request& req, Effects& fx) {
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
      const Entry* e = table_.find(req.key);
      if (e == nullptr && !options_.get_missing_returns_empty) {
        return Status::protocolError("GET of missing key " + quoted(req.key));
      }
      sendStr(fx, conn,
              e == nullptr ? std::string_view() : std::string_view(e->value));
      return Status::ok();
    }

    case Command::kAdd: {
      Entry* e = table_.find(req.key);
      std::int64_t current = 0;
      if (e != nullptr && !parseLikeStoll(e->value, current)) {
        return Status::protocolError("ADD on non-numeric value of key " +
                                     quoted(req.key));
      }
      const std::int64_t result = wrappingAdd(current, req.number);
      bool created = false;
      if (e == nullptr) std::tie(e, created) = table_.findOrInsert(req.key);
      KeyRegs* kr = regsOf(req.key);
      if (kr != nullptr && kr->watch_head != nullptr)
        old_scratch_.assign(e->value);
      assignDecimal(e->value, result);
      sendI64(fx, conn, result);
      afterWrite(kr, e, created, true, WakeMode::kWrite, fx);
      return Status::ok();
    }

    case Command::kCompareSet: {
      Entry* e = table_.find(req.key);
      const bool stores =
          e == nullptr ? req.value.empty() : e->value == req.value;
      if (!stores) {
        sendStr(fx, conn,
                e == nullptr ? req.value : std::string_view(e->value));
        return Status::ok();
      }
      bool created = false;
      if (e == nullptr) std::tie(e, created) = table_.findOrInsert(req.key);
      KeyRegs* kr = regsOf(req.key);
      if (kr != nullptr && kr->watch_head != nullptr)
        old_scratch_.assign(e->value);
      e->value.assign(req.desired.data(), req.desired.size());
      sendStr(fx, conn, e->value);
      afterWrite(kr, e, created, options_.compare_set_wakes, WakeMode::kWrite,
                 fx);
      return Status::ok();
    }

    case Command::kCheck: {
      bool all = true;
      for (std::string_view k : req.keys) {
        if (!present(k)) {
          all = false;
          break;
        }
      }
      sendByte(fx, conn,
               all ? protocol::kCheckReady : protocol::kCheckNotReady);
      return Status::ok();
    }

    case Command::kWait: {
      // One pending plain WAIT per connection, like PyTorch's per-connection
      // counter: a blocking client sends a new WAIT only after giving up the
      // previous one (1.13 times out without telling the server), so the
      // earlier plain waits of this connection are dropped silently.
      // Otherwise each would later send its own stale STOP_WAITING and shift
      // every later reply (PyTorch sends at most one).
      dropPlainWaits(conn, fx);
      keys_scratch_.clear();
      for (std::string_view k : req.keys) {
        if (!present(k)) keys_scratch_.push_back(k);
      }
      if (keys_scratch_.empty()) {
        sendByte(fx, conn, protocol::kStopWaiting);
        return Status::ok();
      }
      if (keys_scratch_.size() > 1) {
        std::sort(keys_scratch_.begin(), keys_scratch_.end());
        keys_scratch_.erase(
            std::unique(keys_scratch_.begin(), keys_scratch_.end()),
            keys_scratch_.end());
      }
      addWait(conn, false, 0, keys_scratch_);
      return Status::ok();
    }

    case Command::kGetNumKeys:
      sendI64(fx, conn, static_cast<std::int64_t>(table_.size()));
      return Status::ok();

    case Command::kDeleteKey: {
      Entry* e = table_.find(req.key);
      if (e == nullptr) {
        sendI64(fx, conn, 0);
        return Status::ok();
      }
      notifyWatchers(regsOf(req.key),
                     static_cast<std::uint8_t>(WatchEvent::kDeleted), req.key,
                     e->value, std::string_view(), fx);
      table_.erase(req.key);
      sendI64(fx, conn, 1);
      return Status::ok();
    }

    case Command::kAppend: {
      const Entry* cur = table_.find(req.key);
      const std::uint64_t grown =
          (cur == nullptr ? 0 : std::uint64_t{cur->value.size()}) +
          req.value.size();
      if (grown > options_.max_value_bytes) {
        return Status::limitExceeded(
            "APPEND would grow the value of key " + quoted(req.key) + " to " +
            std::to_string(grown) + " bytes, over the value limit " +
            std::to_string(options_.max_value_bytes));
      }
      auto [e, created] = table_.findOrInsert(req.key);
      KeyRegs* kr = regsOf(req.key);
      if (kr != nullptr && kr->watch_head != nullptr)
        old_scratch_.assign(e->value);
      e->value.append(req.value.data(), req.value.size());
      afterWrite(kr, e, created, true, WakeMode::kWrite, fx);
      return Status::ok();
    }

    case Command::kMultiGet: {
      if (!options_.get_missing_returns_empty) {
        for (std::string_view k : req.keys) {
          if (table_.find(k) == nullptr) {
            return Status::protocolError("MULTI_GET of missing key " +
                                         quoted(k));
          }
        }
      }
      std::uint64_t total = 0;
      for (std::string_view k : req.keys) {
        const Entry* e = table_.find(k);
        total += 8 + (e == nullptr ? 0 : std::uint64_t{e->value.size()});
      }
      if (total > options_.max_reply_bytes) {
        return replyTooLarge(total, options_.max_reply_bytes);
      }
      std::string& b = fx.begin(conn);
      for (std::string_view k : req.keys) {
        const Entry* e = table_.find(k);
        appendStr(
            b, e == nullptr ? std::string_view() : std::string_view(e->value));
      }
      fx.end();
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
      cancelWaits(conn, fx);
      sendByte(fx, conn, protocol::kWaitCanceled);
      return Status::ok();

    case Command::kQueuePush: {
      auto it = queues_.find(req.key);
      if (it == queues_.end())
        it = queues_.emplace(std::string(req.key), std::deque<std::string>())
                 .first;
      it->second.emplace_back(req.value);
      wakeOne(req.key, fx);
      return Status::ok();
    }

    case Command::kQueuePop: {
      auto it = queues_.find(req.key);
      if (it == queues_.end()) {
        sendI64(fx, conn, 0);
        return Status::ok();
      }
      std::string& b = fx.begin(conn);
      appendI64(b, static_cast<std::int64_t>(it->second.size()));
      appendStr(b, it->second.front());
      fx.end();
      it->second.pop_front();
      if (it->second.empty()) queues_.erase(it);
      return Status::ok();
    }

    case Command::kQueueLen:
      sendI64(fx, conn, static_cast<std::int64_t>(queueLength(req.key)));
      return Status::ok();

    case Command::kListKeys: {
      std::uint64_t total = 8;
      table_.forEach([&total](const Entry& e) { total += 8 + e.key_size; });
      if (total > options_.max_reply_bytes) {
        return replyTooLarge(total, options_.max_reply_bytes);
      }
      std::string& b = fx.begin(conn);
      appendI64(b, static_cast<std::int64_t>(table_.size()));
      table_.forEach([&b](const Entry& e) { appendStr(b, e.key()); });
      fx.end();
      return Status::ok();
    }

    case Command::kBarrier: {
      Entry* e = table_.find(req.key);
      std::int64_t current = 0;
      if (e != nullptr && !parseLikeStoll(e->value, current)) {
        return Status::protocolError("BARRIER on non-numeric value of key " +
                                     quoted(req.key));
      }
      const std::int64_t count = wrappingAdd(current, 1);
      bool created = false;
      if (e == nullptr) std::tie(e, created) = table_.findOrInsert(req.key);
      KeyRegs* kr = regsOf(req.key);
      if (kr != nullptr && kr->watch_head != nullptr)
        old_scratch_.assign(e->value);
      assignDecimal(e->value, count);
      if (count >= req.number) {
        sendByte(fx, conn, protocol::kStopWaiting);
        afterWrite(kr, e, created, true, WakeMode::kAll, fx);
      } else {
        // The increment is a write of the key: plain waiters count it, other
        // barrier waiters are re-evaluated. Then this caller waits.
        afterWrite(kr, e, created, true, WakeMode::kWrite, fx);
        keys_scratch_.assign(1, req.key);
        addWait(conn, true, req.number, keys_scratch_);
      }
      return Status::ok();
    }

    case Command::kWatchKey: {
      ConnState& cs = connFor(conn);
      KeyRegs& kr = regsFor(req.key);
      auto* wa = new Watch;
      wa->conn = conn;
      wa->cs = &cs;
      wa->regs = &kr;
      wa->prev = kr.watch_tail;
      (kr.watch_tail != nullptr ? kr.watch_tail->next : kr.watch_head) = wa;
      kr.watch_tail = wa;
      wa->conn_prev = cs.watch_tail;
      (cs.watch_tail != nullptr ? cs.watch_tail->conn_next : cs.watch_head) =
          wa;
      cs.watch_tail = wa;
      ++num_watches_;
      sendByte(fx, conn, static_cast<std::uint8_t>(WatchEvent::kRegistered));
      return Status::ok();
    }
  }
  return Status::protocolError(
      "unknown command " + std::to_string(static_cast<unsigned>(req.command)));
}

}  // namespace tcpstore::store
