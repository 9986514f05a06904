// Numbers in values: how ADD, BARRIER and barrier waiters read a counter
// stored as decimal text, and how they write it back.
#pragma once

#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>

namespace tcpstore::store::keyspace {

inline bool isCSpace(char c) noexcept {
  return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' ||
         c == '\r';
}

// Parses `s` the way std::stoll(s) does in the C locale: optional leading
// white space, optional sign, decimal digits up to the first non-digit.
// Returns false where stoll throws (no digits, or out of int64 range).
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
  // Two's-complement conversion is defined in C++20 (2^63 -> INT64_MIN).
  out = static_cast<std::int64_t>(negative ? std::uint64_t{0} - magnitude
                                           : magnitude);
  return true;
}

// a + b with two's-complement wrap-around, without signed overflow.
inline std::int64_t wrappingAdd(std::int64_t a, std::int64_t b) noexcept {
  return static_cast<std::int64_t>(static_cast<std::uint64_t>(a) +
                                   static_cast<std::uint64_t>(b));
}

// Replaces `out` by the decimal text of `v` (reusing its capacity).
inline void assignDecimal(std::string& out, std::int64_t v) {
  char buf[24];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  (void)ec;  // 24 bytes always suffice for an int64
  out.assign(buf, static_cast<std::size_t>(end - buf));
}

}  // namespace tcpstore::store::keyspace
