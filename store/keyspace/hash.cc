#include "store/keyspace/hash.h"

#include <functional>

namespace tcpstore::store::keyspace {

// Unkeyed for now (the behaviour before keyed hashing, kept for one commit).
std::uint64_t keyedHash(std::string_view bytes) noexcept {
  return std::hash<std::string_view>{}(bytes);
}

}  // namespace tcpstore::store::keyspace
