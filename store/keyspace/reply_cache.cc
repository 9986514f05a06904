#include "store/keyspace/reply_cache.h"

#include <algorithm>
#include <cstring>
#include <new>

#include "store/keyspace/hash.h"

namespace tcpstore::store::keyspace {

namespace {
// Per-entry cost beyond its reply and key list (the buffers' headers and
// allocator overhead; the slots themselves are part of the cache object).
constexpr std::size_t kEntryOverhead = 128;
// The scratch encoding keeps its capacity up to this size.
constexpr std::size_t kKeepScratchBytes = 64 * 1024;

void putU32(char* at, std::uint32_t v) noexcept {
  for (int i = 0; i < 4; ++i) at[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
std::uint32_t getU32(const char* at) noexcept {
  std::uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(at[i]);
  return v;
}

// Calls f(key) for every key of an encoded key list.
template <typename F>
void forEachKey(std::string_view enc, F&& f) {
  while (enc.size() >= 4) {
    const std::uint32_t n = getU32(enc.data());
    f(enc.substr(4, n));
    enc.remove_prefix(4 + std::size_t{n});
  }
}
}  // namespace

ReplyCache::Query::Query(std::span<const std::string_view> keys) noexcept
    : keys_(keys) {
  for (std::string_view k : keys) encoded_ += 4 + k.size();
}

void ReplyCache::hash(Query& q) {
  if (q.hashed_) return;
  if (scratch_.capacity() > kKeepScratchBytes &&
      q.encoded_ <= kKeepScratchBytes) {
    std::string().swap(scratch_);
  }
  scratch_.resize(q.encoded_);
  char* at = scratch_.data();
  for (std::string_view k : q.keys_) {
    putU32(at, static_cast<std::uint32_t>(k.size()));
    if (!k.empty()) std::memcpy(at + 4, k.data(), k.size());
    at += 4 + k.size();
  }
  q.hash_ = keyedHash(scratch_) | 1;  // 0 marks an empty seen_ slot
  q.hashed_ = true;
}

const SharedBytes* ReplyCache::find(Query& q) {
  if (used_ == 0 || q.keys_.empty()) return nullptr;
  // Cheap filter first: no entry of this shape, no hashing.
  const auto count = static_cast<std::uint32_t>(q.keys_.size());
  bool maybe = false;
  for (const Entry& e : entries_) {
    if (e.used && e.count == count && e.keys.size() == q.encoded_) {
      maybe = true;
      break;
    }
  }
  if (!maybe) return nullptr;
  hash(q);
  for (Entry& e : entries_) {
    if (!e.used || e.hash != q.hash_ || e.count != count ||
        e.keys != scratch_) {
      continue;
    }
    e.stamp = ++clock_;
    ++stats_.hits;
    return &e.reply;
  }
  return nullptr;
}

bool ReplyCache::admit(Query& q, std::size_t reply_bytes) {
  if (limits_.max_bytes == 0 || q.keys_.empty() || q.keys_.size() > kMaxKeys ||
      reply_bytes < limits_.min_reply_bytes ||
      reply_bytes + q.encoded_ + kEntryOverhead > limits_.max_bytes / 2) {
    return false;
  }
  hash(q);
  for (std::uint64_t& h : seen_) {
    if (h == q.hash_) {
      h = 0;
      return true;
    }
  }
  seen_[seen_next_] = q.hash_;
  seen_next_ = (seen_next_ + 1) % kSeen;
  return false;
}

std::size_t ReplyCache::makeRoom(std::size_t bytes) noexcept {
  if (bytes > limits_.max_bytes) return kMaxEntries;
  while (used_ == kMaxEntries || bytes_ + bytes > limits_.max_bytes) {
    std::size_t oldest = kMaxEntries;
    for (std::size_t i = 0; i < kMaxEntries; ++i) {
      if (entries_[i].used &&
          (oldest == kMaxEntries || entries_[i].stamp < entries_[oldest].stamp))
        oldest = i;
    }
    if (oldest == kMaxEntries) return kMaxEntries;
    drop(oldest);
    ++stats_.evicted;
  }
  for (std::size_t i = 0; i < kMaxEntries; ++i) {
    if (!entries_[i].used) return i;
  }
  return kMaxEntries;
}

void ReplyCache::insert(Query& q, const SharedBytes& reply) noexcept {
  if (!q.hashed_ || reply.empty()) return;
  const std::size_t charged = reply.size() + q.encoded_ + kEntryOverhead;
  const std::size_t slot = makeRoom(charged);
  if (slot == kMaxEntries) return;
  Entry& e = entries_[slot];
  try {
    e.keys = scratch_;
  } catch (const std::bad_alloc&) {
    return;  // not cached
  }
  e.used = true;
  e.count = static_cast<std::uint32_t>(q.keys_.size());
  e.hash = q.hash_;
  e.stamp = ++clock_;
  e.reply = reply;
  e.charged = charged;
  bytes_ += charged;
  ++used_;
  const std::uint32_t bit = std::uint32_t{1} << slot;
  try {
    for (std::string_view k : q.keys_) *index_.findOrInsert(k).first |= bit;
  } catch (const std::bad_alloc&) {
    drop(slot);  // unmarks the keys marked so far
    return;
  }
  ++stats_.inserts;
}

void ReplyCache::drop(std::size_t slot) noexcept {
  Entry& e = entries_[slot];
  if (!e.used) return;
  const std::uint32_t bit = std::uint32_t{1} << slot;
  forEachKey(e.keys, [&](std::string_view k) {
    std::uint32_t* mask = index_.find(k);
    if (mask == nullptr || (*mask & bit) == 0) return;  // a repeated key
    *mask &= ~bit;
    if (*mask == 0) index_.eraseValue(mask);
  });
  bytes_ -= e.charged;
  --used_;
  e.used = false;
  e.reply.reset();
  e.charged = 0;
  if (e.keys.capacity() > kKeepScratchBytes) {
    std::string().swap(e.keys);
  } else {
    e.keys.clear();
  }
}

void ReplyCache::invalidate(std::string_view key) noexcept {
  if (index_.empty()) return;
  const std::uint32_t* mask = index_.find(key);
  if (mask == nullptr) return;
  std::uint32_t m = *mask;  // drop() erases the node with the last bit
  while (m != 0) {
    const auto slot = static_cast<std::size_t>(__builtin_ctz(m));
    m &= m - 1;
    drop(slot);
    ++stats_.invalidated;
  }
}

void ReplyCache::clear() noexcept {
  for (std::size_t i = 0; i < kMaxEntries; ++i) drop(i);
  seen_.fill(0);
}

}  // namespace tcpstore::store::keyspace
