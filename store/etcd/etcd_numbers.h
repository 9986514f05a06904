// Decimal counters as the Keyspace keeps them (ADD, BARRIER): the same
// parsing and wrap-around as the in-memory backend (store/keyspace/numeric.h),
// so both backends answer byte for byte alike.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "store/keyspace/numeric.h"

namespace tcpstore::store::etcd {

using keyspace::parseLikeStoll;
using keyspace::wrappingAdd;

inline std::string decimal(std::int64_t v) {
  std::string out;
  keyspace::assignDecimal(out, v);
  return out;
}

// True if `value` parses as a number >= `at_least`.
inline bool parsesAtLeast(std::string_view value, std::int64_t at_least) {
  std::int64_t v = 0;
  return parseLikeStoll(value, v) && v >= at_least;
}

}  // namespace tcpstore::store::etcd
