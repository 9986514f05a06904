#include "store/keyspace/hash.h"

#include <sodium.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace tcpstore::store::keyspace {

namespace {

// The per-process SipHash key, drawn from the kernel's generator at first
// use (a function-local static: initialized once, thread-safe).
struct SipKey {
  unsigned char bytes[crypto_shorthash_KEYBYTES];
  SipKey() {
    if (sodium_init() < 0) {
      // Only if the kernel's random source is unusable: no safe key.
      std::fputs("tcpstore: libsodium could not initialize\n", stderr);
      std::abort();
    }
    randombytes_buf(bytes, sizeof bytes);
  }
};

const SipKey& sipKey() {
  static const SipKey key;
  return key;
}

}  // namespace

std::uint64_t keyedHash(std::string_view bytes) noexcept {
  static_assert(crypto_shorthash_BYTES == sizeof(std::uint64_t));
  unsigned char out[crypto_shorthash_BYTES];
  crypto_shorthash(out, reinterpret_cast<const unsigned char*>(bytes.data()),
                   bytes.size(), sipKey().bytes);
  std::uint64_t h;
  std::memcpy(&h, out, sizeof h);
  return h;
}

}  // namespace tcpstore::store::keyspace
