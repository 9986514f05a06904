// The hash of every table indexed by client-chosen bytes (keys, queue
// names, wait and watch registrations).
//
// Keyed: SipHash-2-4 (libsodium's crypto_shorthash) under a random 128-bit
// key drawn once per process, at first use. A client that can pick keys
// cannot predict which keys collide, so crafted keys are no better than
// random ones (an unkeyed hash such as libstdc++'s std::hash lets a client
// send thousands of keys with one hash and turn each lookup into a scan).
// Thread-safe. The key comes from the kernel's generator (getrandom via
// libsodium); if that is unusable the process aborts with a message, as
// libsodium itself would.
#pragma once

#include <cstdint>
#include <string_view>

namespace tcpstore::store::keyspace {

std::uint64_t keyedHash(std::string_view bytes) noexcept;

}  // namespace tcpstore::store::keyspace
