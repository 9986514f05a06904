// Crafted hash collisions against libstdc++'s std::hash<std::string_view>
// on 64-bit targets: _Hash_bytes (libsupc++ hash_bytes.cc), a MurmurHash64A
// variant with multiplier 0xc6a4a7935bd1e995, shift 47 and seed 0xc70f6907.
//
// Its state after each 8-byte block w is (state ^ mix(w)) * kMul, where
// mix(w) = shift47(w * kMul) * kMul, and every step is invertible (kMul is
// odd; x ^ (x >> 47) is its own inverse). So for keys of one length that
// end in two free blocks [c][x], pick any c, then solve x so that the
// state after x is one fixed target: all such keys share the full 64-bit
// hash, because the rest of the function (final mixing) sees only that
// state and the length. This is what a client could send to a server that
// indexes keys with an unkeyed std::hash.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace tcpstore::store::testing {

namespace murmur {

static_assert(std::endian::native == std::endian::little,
              "the blocks below are laid out for a little-endian load");

constexpr std::uint64_t kMul = 0xc6a4a7935bd1e995ULL;
constexpr std::uint64_t kSeed = 0xc70f6907ULL;

constexpr std::uint64_t shift47(std::uint64_t v) { return v ^ (v >> 47); }

// The inverse of an odd number modulo 2^64 (Newton: each step doubles the
// correct low bits; 3 correct bits to start, 6 steps give 192).
constexpr std::uint64_t inverseOf(std::uint64_t a) {
  std::uint64_t x = a;
  for (int i = 0; i < 6; ++i) x *= 2 - a * x;
  return x;
}
constexpr std::uint64_t kMulInv = inverseOf(kMul);
static_assert(kMul * kMulInv == 1);

constexpr std::uint64_t mix(std::uint64_t w) {
  return shift47(w * kMul) * kMul;
}
constexpr std::uint64_t unmix(std::uint64_t m) {
  return shift47(m * kMulInv) * kMulInv;
}
static_assert(unmix(mix(0x0123456789abcdefULL)) == 0x0123456789abcdefULL);

inline std::uint64_t load(const char* p) {
  std::uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store(char* p, std::uint64_t v) { std::memcpy(p, &v, sizeof v); }

}  // namespace murmur

// `n` distinct keys, all of length prefix.size() + 16, with one std::hash
// value. `prefix` must be a multiple of 8 bytes long. The last 16 bytes of
// each key are binary.
inline std::vector<std::string> collidingKeys(std::size_t n,
                                              std::string_view prefix) {
  using namespace murmur;
  std::vector<std::string> keys;
  if (prefix.size() % 8 != 0) return keys;
  const std::size_t len = prefix.size() + 16;
  std::uint64_t state = kSeed ^ (static_cast<std::uint64_t>(len) * kMul);
  for (std::size_t i = 0; i < prefix.size(); i += 8) {
    state = (state ^ mix(load(prefix.data() + i))) * kMul;
  }
  const std::uint64_t target = 0x5eed5eed5eed5eedULL;  // any state will do
  keys.reserve(n);
  for (std::uint64_t c = 0; c < n; ++c) {
    const std::uint64_t after_c = (state ^ mix(c)) * kMul;
    // want (after_c ^ mix(x)) * kMul == target
    const std::uint64_t x = unmix((target * kMulInv) ^ after_c);
    std::string key(prefix);
    key.resize(len);
    store(key.data() + prefix.size(), c);
    store(key.data() + prefix.size() + 8, x);
    keys.push_back(std::move(key));
  }
  return keys;
}

// `n` distinct keys of the same shape and length, with random-looking tails
// (a fixed-seed generator: the same keys every run).
inline std::vector<std::string> randomKeys(std::size_t n,
                                           std::string_view prefix) {
  std::vector<std::string> keys;
  keys.reserve(n);
  std::uint64_t s = 0x9e3779b97f4a7c15ULL;
  auto next = [&s] {  // splitmix64
    std::uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  for (std::uint64_t c = 0; c < n; ++c) {
    std::string key(prefix);
    key.resize(prefix.size() + 16);
    murmur::store(key.data() + prefix.size(), c);
    murmur::store(key.data() + prefix.size() + 8, next());
    keys.push_back(std::move(key));
  }
  return keys;
}

}  // namespace tcpstore::store::testing
