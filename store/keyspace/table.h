// The keyspace's hash tables: entries keyed by arbitrary byte strings, each
// entry one heap block [value][hash, key size][key bytes], so a lookup takes
// a string_view and never allocates, and an entry's address never changes.
//
// NodeTable is the probing algorithm (no types, no allocation of entries);
// KeyTable<V> adds typed values on top. Both are single-threaded.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <string_view>
#include <utility>

#include "store/keyspace/hash.h"

namespace tcpstore::store::keyspace {

// What the table reads of an entry. The key bytes follow it in memory.
struct Node {
  std::uint32_t hash;
  std::uint32_t key_size;
  std::string_view key() const noexcept {
    return {reinterpret_cast<const char*>(this + 1), key_size};
  }
};

// How far lookups walk, for tests and benchmarks (computed by a full scan:
// O(capacity), never on a request path).
struct ProbeStats {
  std::size_t longest = 0;  // slots a lookup of the worst stored key reads
  std::size_t total = 0;    // the same summed over all stored keys
};

// Open addressing with linear probing over Node pointers; capacity a power
// of two, load at most 3/4, backward-shift deletion (no tombstones).
//
// Growth is incremental: a grow allocates the doubled array (calloc: the
// kernel's zero pages, no memset) and moves the old array's entries a few
// slots per later insert or remove. Until it is done, lookups read both
// arrays; the old one is never inserted into, and its removed or moved
// slots become tombstones. So no single call moves more than a few entries.
// A table that becomes empty frees its arrays.
class NodeTable {
 public:
  NodeTable() = default;
  // Frees the slot arrays, never the nodes (the owner frees those first).
  ~NodeTable();
  NodeTable(const NodeTable&) = delete;
  NodeTable& operator=(const NodeTable&) = delete;
  NodeTable(NodeTable&& other) noexcept;
  NodeTable& operator=(NodeTable&& other) noexcept;

  // The node of `key` (whose hash is `hash`), or nullptr.
  Node* find(std::string_view key, std::uint32_t hash) const noexcept {
    Node* n = probe(cur_, key, hash);
    return n != nullptr || old_.at == nullptr ? n : probe(old_, key, hash);
  }
  // Hints the CPU to fetch the first slot a lookup of `hash` reads (a
  // caller about to look up many keys overlaps their cache misses).
  void prefetch(std::uint32_t hash) const noexcept {
    if (cur_.at != nullptr) __builtin_prefetch(cur_.at + (hash & cur_.mask));
  }
  // Adds `node`, whose key must be absent. Throws std::bad_alloc if a grow
  // cannot allocate (the table is then unchanged).
  void insert(Node* node);
  // Unlinks the node of `key` and returns it (nullptr if absent).
  Node* remove(std::string_view key, std::uint32_t hash) noexcept;
  // Unlinks `node`, which must be in the table (no key comparison).
  void removeNode(Node* node) noexcept;
  // Forgets every node (without freeing them) and frees the arrays.
  void reset() noexcept;

  // Calls f(Node*) once for every node.
  template <typename F>
  void forEach(F&& f) const {
    for (const Slots* s : {&cur_, &old_}) {
      for (std::size_t i = 0; i < s->capacity(); ++i) {
        Node* n = s->at[i];
        if (n != nullptr && n != tombstone()) f(n);
      }
    }
  }
  std::size_t size() const noexcept { return size_; }
  // Bytes of the slot arrays (both while a grow is under way).
  std::size_t slotBytes() const noexcept {
    return (cur_.capacity() + old_.capacity()) * sizeof(Node*);
  }
  ProbeStats probeStats() const noexcept;

 private:
  struct Slots {
    Node** at = nullptr;
    std::size_t mask = 0;
    std::size_t capacity() const noexcept {
      return at == nullptr ? 0 : mask + 1;
    }
  };
  static Node* tombstone() noexcept { return &tombstone_; }
  static Node* probe(const Slots& s, std::string_view key,
                     std::uint32_t hash) noexcept {
    if (s.at == nullptr) return nullptr;
    for (std::size_t i = hash & s.mask;; i = (i + 1) & s.mask) {
      Node* n = s.at[i];
      if (n == nullptr) return nullptr;
      if (n->hash == hash && n != tombstone() && n->key() == key) return n;
    }
  }
  static inline Node tombstone_{};

  void grow();
  void migrate(std::size_t max_slots) noexcept;
  template <typename Match>
  Node* removeIf(std::uint32_t hash, Match&& match) noexcept;

  Slots cur_;
  Slots old_;              // during a grow: entries not moved yet
  std::size_t moved_ = 0;  // slots of old_ already moved
  std::size_t size_ = 0;
};

// A table of V values keyed by byte strings (keys shorter than 4 GiB).
// Value addresses are stable until the key is erased.
template <typename V>
class KeyTable {
  static_assert(sizeof(V) % alignof(Node) == 0);

 public:
  KeyTable() = default;
  ~KeyTable() { clear(); }
  KeyTable(const KeyTable&) = delete;
  KeyTable& operator=(const KeyTable&) = delete;
  KeyTable(KeyTable&& other) noexcept
      : table_(std::move(other.table_)),
        node_bytes_(std::exchange(other.node_bytes_, 0)) {}
  KeyTable& operator=(KeyTable&& other) noexcept {
    if (this != &other) {
      clear();
      table_ = std::move(other.table_);
      node_bytes_ = std::exchange(other.node_bytes_, 0);
    }
    return *this;
  }

  // The hash every KeyTable uses for `key`: callers that look one key up
  // in several tables compute it once and pass it to the overloads below.
  static std::uint32_t hashOf(std::string_view key) noexcept {
    return static_cast<std::uint32_t>(keyedHash(key));
  }

  V* find(std::string_view key) const noexcept {
    return table_.size() == 0 ? nullptr : find(key, hashOf(key));
  }
  // `hash` must be hashOf(key).
  V* find(std::string_view key, std::uint32_t hash) const noexcept {
    if (table_.size() == 0) return nullptr;
    Node* n = table_.find(key, hash);
    return n == nullptr ? nullptr : valueOf(n);
  }
  void prefetch(std::uint32_t hash) const noexcept { table_.prefetch(hash); }
  // The value of `key`, value-initialized if it was missing (second: true
  // if it was created).
  std::pair<V*, bool> findOrInsert(std::string_view key) {
    return findOrInsert(key, hashOf(key));
  }
  // `hash` must be hashOf(key).
  std::pair<V*, bool> findOrInsert(std::string_view key, std::uint32_t h) {
    if (Node* n = table_.find(key, h)) return {valueOf(n), false};
    const std::size_t bytes = blockBytes(key.size());
    void* mem = ::operator new(bytes);
    V* v = ::new (mem) V();
    auto* n = ::new (static_cast<char*>(mem) + sizeof(V))
        Node{h, static_cast<std::uint32_t>(key.size())};
    if (!key.empty()) {
      std::memcpy(reinterpret_cast<char*>(n + 1), key.data(), key.size());
    }
    try {
      table_.insert(n);
    } catch (...) {
      v->~V();
      ::operator delete(mem);
      throw;
    }
    node_bytes_ += bytes;
    return {v, true};
  }
  // Erases the entry of `v`, a value stored in this table (cheaper than
  // erase(key): no hashing, no key comparison).
  void eraseValue(V* v) noexcept {
    Node* n = nodeOf(v);
    table_.removeNode(n);
    node_bytes_ -= blockBytes(n->key_size);
    destroy(n);
  }
  // Hints the CPU to fetch the first slot a removal of `v` reads.
  void prefetchValue(const V* v) const noexcept {
    table_.prefetch(nodeOf(const_cast<V*>(v))->hash);
  }
  bool erase(std::string_view key) noexcept {
    Node* n = table_.remove(key, hashOf(key));
    if (n == nullptr) return false;
    node_bytes_ -= blockBytes(n->key_size);
    destroy(n);
    return true;
  }
  void clear() noexcept {
    table_.forEach([](Node* n) { destroy(n); });
    table_.reset();
    node_bytes_ = 0;
  }
  // The key of a value stored in this table.
  static std::string_view keyOf(const V* v) noexcept {
    return reinterpret_cast<const Node*>(reinterpret_cast<const char*>(v) +
                                         sizeof(V))
        ->key();
  }
  // Calls f(key, V&) for every entry, in no particular order.
  template <typename F>
  void forEach(F&& f) const {
    table_.forEach([&f](Node* n) { f(n->key(), *valueOf(n)); });
  }
  std::size_t size() const noexcept { return table_.size(); }
  bool empty() const noexcept { return table_.size() == 0; }
  // Bytes held by the table itself: slot arrays and entry blocks (value
  // objects, headers, keys), not what the values own elsewhere.
  std::size_t memoryBytes() const noexcept {
    return table_.slotBytes() + node_bytes_;
  }
  ProbeStats probeStats() const noexcept { return table_.probeStats(); }

  // Bytes of the heap block of an entry with a key of `key_size` bytes.
  static std::size_t blockBytes(std::size_t key_size) noexcept {
    return sizeof(V) + sizeof(Node) + key_size;
  }

 private:
  static Node* nodeOf(V* v) noexcept {
    return std::launder(
        reinterpret_cast<Node*>(reinterpret_cast<char*>(v) + sizeof(V)));
  }
  static V* valueOf(Node* n) noexcept {
    return std::launder(
        reinterpret_cast<V*>(reinterpret_cast<char*>(n) - sizeof(V)));
  }
  static void destroy(Node* n) noexcept {
    V* v = valueOf(n);
    v->~V();
    ::operator delete(static_cast<void*>(v));
  }

  NodeTable table_;
  std::size_t node_bytes_ = 0;
};

}  // namespace tcpstore::store::keyspace
