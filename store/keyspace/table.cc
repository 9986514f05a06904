#include "store/keyspace/table.h"

#include <algorithm>
#include <cstdlib>

namespace tcpstore::store::keyspace {

namespace {

// Old-array slots moved per insert or remove while a grow is under way. A
// grow happens at load 3/4 of the old capacity C and the next one after
// 3/4 C more inserts, so moving 4 slots per insert ends the move after C/4.
constexpr std::size_t kMoveStep = 4;

bool matches(const Node* n, std::string_view key, std::uint32_t hash) noexcept {
  return n->hash == hash && n->key() == key;
}

}  // namespace

NodeTable::~NodeTable() { reset(); }

NodeTable::NodeTable(NodeTable&& other) noexcept
    : cur_(std::exchange(other.cur_, {})),
      old_(std::exchange(other.old_, {})),
      moved_(std::exchange(other.moved_, 0)),
      size_(std::exchange(other.size_, 0)) {}

NodeTable& NodeTable::operator=(NodeTable&& other) noexcept {
  if (this != &other) {
    reset();
    cur_ = std::exchange(other.cur_, {});
    old_ = std::exchange(other.old_, {});
    moved_ = std::exchange(other.moved_, 0);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void NodeTable::reset() noexcept {
  std::free(cur_.at);
  std::free(old_.at);
  cur_ = {};
  old_ = {};
  moved_ = 0;
  size_ = 0;
}

void NodeTable::insert(Node* node) {
  if (cur_.at == nullptr || (size_ + 1) * 4 > cur_.capacity() * 3) {
    grow();
  } else {
    migrate(kMoveStep);
  }
  std::size_t i = node->hash & cur_.mask;
  while (cur_.at[i] != nullptr) i = (i + 1) & cur_.mask;
  cur_.at[i] = node;
  ++size_;
}

void NodeTable::grow() {
  const std::size_t new_cap = cur_.at == nullptr ? 16 : cur_.capacity() * 2;
  auto** fresh = static_cast<Node**>(std::calloc(new_cap, sizeof(Node*)));
  if (fresh == nullptr) throw std::bad_alloc();
  // The previous move is always over by now (it ends after C/4 inserts,
  // this grow needs 3C/4 more keys); finishing it here only keeps the
  // table correct if that ever changed.
  migrate(SIZE_MAX);
  old_ = cur_;
  moved_ = 0;
  cur_ = Slots{fresh, new_cap - 1};
  migrate(kMoveStep);
}

void NodeTable::migrate(std::size_t max_slots) noexcept {
  if (old_.at == nullptr) return;
  const std::size_t cap = old_.capacity();
  const std::size_t end = cap - moved_ <= max_slots ? cap : moved_ + max_slots;
  for (; moved_ < end; ++moved_) {
    Node* n = old_.at[moved_];
    if (n == nullptr || n == tombstone()) continue;
    std::size_t i = n->hash & cur_.mask;
    while (cur_.at[i] != nullptr) i = (i + 1) & cur_.mask;
    cur_.at[i] = n;
    old_.at[moved_] = tombstone();
  }
  if (moved_ == cap) {
    std::free(old_.at);
    old_ = {};
    moved_ = 0;
  }
}

template <typename Match>
Node* NodeTable::removeIf(std::uint32_t hash, Match&& match) noexcept {
  Node* found = nullptr;
  if (cur_.at != nullptr) {
    std::size_t i = hash & cur_.mask;
    for (;; i = (i + 1) & cur_.mask) {
      Node* n = cur_.at[i];
      if (n == nullptr) break;
      if (match(n)) {
        found = n;
        break;
      }
    }
    if (found != nullptr) {
      // Backward-shift deletion: move later members of the probe run into
      // the hole unless their home slot lies cyclically in (hole, j].
      std::size_t j = i;
      for (;;) {
        j = (j + 1) & cur_.mask;
        Node* n = cur_.at[j];
        if (n == nullptr) break;
        const std::size_t home = n->hash & cur_.mask;
        const bool stays =
            i <= j ? (i < home && home <= j) : (i < home || home <= j);
        if (stays) continue;
        cur_.at[i] = n;
        i = j;
      }
      cur_.at[i] = nullptr;
    }
  }
  if (found == nullptr && old_.at != nullptr) {
    for (std::size_t i = hash & old_.mask;; i = (i + 1) & old_.mask) {
      Node* n = old_.at[i];
      if (n == nullptr) break;
      if (n != tombstone() && match(n)) {
        found = n;
        old_.at[i] = tombstone();
        break;
      }
    }
  }
  if (found == nullptr) return nullptr;
  if (--size_ == 0) {
    reset();  // an emptied table gives its arrays back
  } else {
    migrate(kMoveStep);
  }
  return found;
}

Node* NodeTable::remove(std::string_view key, std::uint32_t hash) noexcept {
  return removeIf(hash, [&](const Node* n) { return matches(n, key, hash); });
}

void NodeTable::removeNode(Node* node) noexcept {
  // Slots compare by address: no node but the moved ones is read.
  removeIf(node->hash, [node](const Node* n) { return n == node; });
}

ProbeStats NodeTable::probeStats() const noexcept {
  ProbeStats st;
  for (const Slots* s : {&cur_, &old_}) {
    for (std::size_t i = 0; i < s->capacity(); ++i) {
      const Node* n = s->at[i];
      if (n == nullptr || n == tombstone()) continue;
      const std::size_t probes = ((i - (n->hash & s->mask)) & s->mask) + 1;
      st.longest = std::max(st.longest, probes);
      st.total += probes;
    }
  }
  return st;
}

}  // namespace tcpstore::store::keyspace
