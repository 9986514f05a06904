#include "store/keyspace/pending_waits.h"

#include <algorithm>
#include <bit>
#include <new>
#include <string>

#include "protocol/wire.h"

namespace tcpstore::store::keyspace {

namespace {

using Regs = KeyTable<KeyRegs>;

// A dedup set keeps (hash << 32 | index + 1) per key seen, 0 when free, at
// a load of at most 1/2. A WAIT of one key needs none.
std::size_t seenSlots(std::size_t keys) noexcept {
  return keys < 2 ? 0 : std::bit_ceil(keys * 2);
}

// The sync path's set keeps its capacity between calls unless one WAIT
// grew it past this.
constexpr std::size_t kKeepSeenSlots = 8192;

// Keys given as views (start()); a Reg reads its copy the same way.
struct ViewKeys {
  const std::vector<std::string_view>& v;
  std::size_t size() const noexcept { return v.size(); }
  std::string_view operator[](std::size_t i) const noexcept { return v[i]; }
};

}  // namespace

struct PendingWaits::Reg {
  ConnId conn = 0;
  std::string blob;                 // the keys' bytes, back to back
  std::vector<std::uint32_t> ends;  // end offset of key i in blob
  std::vector<std::uint64_t> seen;  // dedup set
  std::size_t next = 0;             // keys done
  std::uint64_t since = 0;          // seq_ at start()
  Wait* wait = nullptr;             // made at the first absent key
  std::size_t bytes = 0;            // charged in reg_bytes_

  std::size_t size() const noexcept { return ends.size(); }
  std::string_view operator[](std::size_t i) const noexcept {
    const std::size_t b = i == 0 ? 0 : ends[i - 1];
    return std::string_view(blob).substr(b, ends[i] - b);
  }
  // Copies, dedup set, and an entry block per key not yet registered.
  std::size_t charge() const noexcept {
    const std::size_t done_bytes = next == 0 ? 0 : ends[next - 1];
    return blob.capacity() + ends.capacity() * sizeof(std::uint32_t) +
           seen.capacity() * sizeof(std::uint64_t) +
           (size() - next) * Regs::blockBytes(0) + (blob.size() - done_bytes);
  }
};

PendingWaits::PendingWaits(Waiters& waiters) : waiters_(waiters) {}
PendingWaits::~PendingWaits() = default;

template <typename Keys>
void PendingWaits::steps(const Keys& keys, std::size_t& next, std::size_t end,
                         std::uint64_t since, std::vector<std::uint64_t>& seen,
                         const KeyPresence& presence, ConnId conn,
                         Wait*& wait) {
  // Lookups in big tables are cache misses: start each key's a few keys
  // before its turn, so that they overlap.
  constexpr std::size_t kAhead = 8;
  std::uint32_t ring[kAhead];
  auto hashAt = [&](std::size_t i) {
    const std::uint32_t h = Regs::hashOf(keys[i]);
    waiters_.prefetch(h);
    presence.prefetch(h);
    return h;
  };
  for (std::size_t j = next; j < end && j < next + kAhead; ++j) {
    ring[j % kAhead] = hashAt(j);
  }
  for (; next < end; ++next) {
    const std::uint32_t h = ring[next % kAhead];
    if (next + kAhead < end) ring[next % kAhead] = hashAt(next + kAhead);
    step(keys, next, h, since, seen, presence, conn, wait);
  }
}

template <typename Keys>
void PendingWaits::step(const Keys& keys, std::size_t i, std::uint32_t h,
                        std::uint64_t since, std::vector<std::uint64_t>& seen,
                        const KeyPresence& presence, ConnId conn, Wait*& wait) {
  const std::string_view key = keys[i];
  if (!seen.empty()) {
    const std::size_t mask = seen.size() - 1;
    std::size_t s = h & mask;
    for (; seen[s] != 0; s = (s + 1) & mask) {
      if ((seen[s] >> 32) == h && keys[(seen[s] & 0xffffffffu) - 1] == key) {
        return;  // a duplicate counts once
      }
    }
    seen[s] = (std::uint64_t{h} << 32) | (i + 1);
  }
  if (presence.present(key, h)) return;
  if (since < seq_) {
    const std::uint64_t* gone = vanished_.find(key, h);
    if (gone != nullptr && *gone > since) return;  // existed since start()
  }
  if (wait == nullptr) wait = waiters_.beginWait(conn, keys.size() - i);
  waiters_.linkKey(wait, key, h);
}

void PendingWaits::finish(ConnId conn, Wait* wait, Effects& fx) {
  if (wait != nullptr) {
    waiters_.finishWait(wait, fx);
  } else {
    protocol::appendU8(fx.begin(conn), protocol::kStopWaiting);
    fx.end();
  }
}

bool PendingWaits::start(ConnId conn, const std::vector<std::string_view>& keys,
                         const KeyPresence& presence, std::size_t sync_keys,
                         Effects& fx) {
  std::size_t total = 0;
  for (std::string_view k : keys) total += k.size();
  // (The copy keeps 32-bit offsets: far above the codec's request limit.)
  if (keys.size() <= sync_keys || total > UINT32_MAX) {
    std::vector<std::uint64_t>& seen = seen_scratch_;
    seen.assign(seenSlots(keys.size()), 0);
    Wait* wait = nullptr;
    const ViewKeys view{keys};
    std::size_t next = 0;
    steps(view, next, keys.size(), seq_, seen, presence, conn, wait);
    if (seen.capacity() > kKeepSeenSlots) {
      std::vector<std::uint64_t>().swap(seen);
    }
    finish(conn, wait, fx);
    return false;
  }
  auto r = std::make_unique<Reg>();
  r->conn = conn;
  r->since = seq_;
  r->blob.reserve(total);
  r->ends.reserve(keys.size());
  for (std::string_view k : keys) {
    r->blob.append(k);
    r->ends.push_back(static_cast<std::uint32_t>(r->blob.size()));
  }
  r->seen.assign(seenSlots(keys.size()), 0);
  r->bytes = r->charge();
  reg_bytes_ += r->bytes;
  regs_.push_back(std::move(r));
  return true;
}

std::optional<PendingWaits::Finished> PendingWaits::advance(
    std::size_t max_keys, const KeyPresence& presence, Effects& fx) noexcept {
  if (regs_.empty()) return std::nullopt;
  Reg& r = *regs_.front();
  try {
    const std::size_t end = std::min(r.size(), r.next + max_keys);
    steps(r, r.next, end, r.since, r.seen, presence, r.conn, r.wait);
    if (r.next < r.size()) {
      reg_bytes_ -= r.bytes;
      r.bytes = r.charge();
      reg_bytes_ += r.bytes;
      return std::nullopt;
    }
    const ConnId conn = r.conn;
    Wait* wait = r.wait;
    forget(0);
    finish(conn, wait, fx);
    return Finished{conn, true};
  } catch (...) {
    // Out of memory: the keys linked so far stay with the connection,
    // which the caller closes.
    const ConnId conn = r.conn;
    forget(0);
    return Finished{conn, false};
  }
}

void PendingWaits::forget(std::size_t index) noexcept {
  reg_bytes_ -= regs_[index]->bytes;
  regs_.erase(regs_.begin() + static_cast<std::ptrdiff_t>(index));
  // The log only serves WAITs in progress. (Its size is the removals made
  // while they were, each one a request of its own.)
  if (regs_.empty()) vanished_.clear();
}

void PendingWaits::cancel(ConnId conn) noexcept {
  for (std::size_t i = 0; i < regs_.size(); ++i) {
    if (regs_[i]->conn == conn) {
      forget(i);
      return;
    }
  }
}

void PendingWaits::vanished(std::string_view key) {
  if (regs_.empty()) return;
  *vanished_.findOrInsert(key).first = ++seq_;
}

std::size_t PendingWaits::memoryBytes() const noexcept {
  // (Not seen_scratch_: a scratch of at most 64 KiB between calls, like
  // the keyspace's other scratch buffers.)
  return reg_bytes_ + vanished_.memoryBytes();
}

}  // namespace tcpstore::store::keyspace
