// ReplyCache: large read replies (MULTI_GET, and GET of a large value) built
// once and handed out as one shared buffer while they are exact. In torch
// 2.x's scalable NCCL init every rank MULTI_GETs the same keys: the reply is
// then built once instead of once per rank, and every rank's outbox
// references it (store/shared_bytes.h).
//
// Exact: an entry is dropped at once when any of its keys is written,
// created, deleted or appended to (the keyspace calls invalidate(key) on
// every change of a stored value), so a hit returns the bytes a fresh build
// would. An index from each cached key to the entries holding it (a bit
// mask: at most kMaxEntries entries) makes that O(1) for a key in no entry
// and never touches entries of other keys: unrelated writes (ranks ADDing
// "init/" while others MULTI_GET) keep the cache.
//
// Keyed by the request's key list (count, lengths and bytes): the list is
// hashed (keyed SipHash, hash.h) and compared byte for byte on a hit, so a
// lookup costs O(request bytes) whatever the reply's size. Replies shorter
// than min_reply_bytes are never cached (copying them is cheap). A key list
// is admitted the second time it is seen among the last kSeen large reads,
// so reads that never repeat cost one hash each, not an entry and index
// nodes. Key lists longer than kMaxKeys are not cached, so invalidating
// costs at most kMaxEntries x kMaxKeys index updates (amortized: each
// entry's keys were indexed once when it was inserted). Bounded: kMaxEntries
// entries and max_bytes (replies, key lists and index), the least recently used
// entry evicted first; memoryBytes() reports what it holds (charged to the
// server's memory budget with the keyspace).
//
// Single-threaded (one thread at a time), like the keyspace.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "store/keyspace/table.h"
#include "store/shared_bytes.h"

namespace tcpstore::store::keyspace {

class ReplyCache {
 public:
  static constexpr std::size_t kMaxEntries = 32;  // bits of the index mask
  static constexpr std::size_t kSeen = 64;        // admission memory
  // Longest key list cached: a write of one key drops at most kMaxEntries
  // entries of at most this many keys (bounded work per write).
  static constexpr std::size_t kMaxKeys = 4096;

  struct Limits {
    std::size_t max_bytes = 32u << 20;  // 0: no cache
    std::size_t min_reply_bytes = 4096;
  };
  struct Stats {
    std::uint64_t hits = 0;
    std::uint64_t inserts = 0;
    std::uint64_t invalidated = 0;  // entries dropped by a write of a key
    std::uint64_t evicted = 0;      // entries dropped for room
    std::size_t entries = 0;
  };

  // The identity of one read (its key list), computed on demand. Lives
  // within one request; pass it to find(), then admit() and insert().
  class Query {
   public:
    explicit Query(std::span<const std::string_view> keys) noexcept;

   private:
    friend class ReplyCache;
    std::span<const std::string_view> keys_;
    std::size_t encoded_ = 0;  // bytes of the key list's encoding
    bool hashed_ = false;      // hash_ is set, encoding in scratch_
    std::uint64_t hash_ = 0;
  };

  explicit ReplyCache(Limits limits) noexcept : limits_(limits) {}
  ReplyCache(const ReplyCache&) = delete;
  ReplyCache& operator=(const ReplyCache&) = delete;

  // Smallest reply worth caching.
  std::size_t minReplyBytes() const noexcept { return limits_.min_reply_bytes; }
  // The cached reply to `q`, or nullptr. O(request bytes). Throws
  // std::bad_alloc (scratch growth).
  const SharedBytes* find(Query& q);
  // After a miss whose reply has `reply_bytes`: true if it should be built
  // as a shared buffer and insert()ed (its key list was seen recently).
  // Throws std::bad_alloc.
  bool admit(Query& q, std::size_t reply_bytes);
  // Caches `reply` as the answer to `q` (after admit()), evicting the
  // least recently used entries for room. Out of memory: not cached.
  void insert(Query& q, const SharedBytes& reply) noexcept;
  // `key`'s stored value changed (or appeared, or went): drops every entry
  // holding it. O(1) if none does.
  void invalidate(std::string_view key) noexcept;
  // Drops everything.
  void clear() noexcept;

  std::size_t memoryBytes() const noexcept {
    return bytes_ + index_.memoryBytes();
  }
  Stats stats() const noexcept {
    Stats s = stats_;
    s.entries = used_;
    return s;
  }

 private:
  struct Entry {
    bool used = false;
    std::uint32_t count = 0;  // keys
    std::uint64_t hash = 0;
    std::uint64_t stamp = 0;  // last use, for LRU
    std::string keys;         // the key list's encoding
    SharedBytes reply;
    std::size_t charged = 0;  // bytes_ share (index nodes aside)
  };

  // Encodes q's key list into scratch_ and hashes it (once per Query).
  void hash(Query& q);
  void drop(std::size_t slot) noexcept;
  // A slot for a new entry of `bytes`, evicting for room (or kMaxEntries
  // if it cannot fit at all).
  std::size_t makeRoom(std::size_t bytes) noexcept;

  Limits limits_;
  std::array<Entry, kMaxEntries> entries_;
  std::size_t used_ = 0;
  std::size_t bytes_ = 0;
  std::uint64_t clock_ = 0;
  KeyTable<std::uint32_t> index_;  // key -> mask of entries holding it
  std::array<std::uint64_t, kSeen> seen_{};
  std::size_t seen_next_ = 0;
  std::string scratch_;
  Stats stats_;
};

}  // namespace tcpstore::store::keyspace
