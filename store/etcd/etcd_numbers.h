// Decimal counters as the Keyspace keeps them (ADD, BARRIER): parsed like
// std::stoll in the C locale, added with two's-complement wrap-around,
// stored as plain decimal text.
#pragma once

#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>

namespace tcpstore::store::etcd {

inline bool isCSpace(char c) noexcept {
  return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' ||
         c == '\r';
}

// std::stoll in the C locale, without exceptions (as the Keyspace parses).
inline bool parseLikeStoll(std::string_view s, std::int64_t& out) noexcept {
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
  out = static_cast<std::int64_t>(negative ? std::uint64_t{0} - magnitude
                                           : magnitude);
  return true;
}

inline std::int64_t wrappingAdd(std::int64_t a, std::int64_t b) noexcept {
  return static_cast<std::int64_t>(static_cast<std::uint64_t>(a) +
                                   static_cast<std::uint64_t>(b));
}

inline std::string decimal(std::int64_t v) {
  char buf[24];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  (void)ec;
  return std::string(buf, static_cast<std::size_t>(end - buf));
}

// True if `value` parses as a number >= `at_least`.
inline bool parsesAtLeast(std::string_view value, std::int64_t at_least) {
  std::int64_t v = 0;
  return parseLikeStoll(value, v) && v >= at_least;
}

}  // namespace tcpstore::store::etcd
