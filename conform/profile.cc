// What each profile requires of a check: the table profiles read their
// column of Check::expect; the gateway profile is tcpstore's column minus
// the exceptions of exceptionReason() (the one place they are kept;
// conform/README.md documents them).
#include "conform/check.h"

namespace tcpstore::conform {

// The etcd gateway serves every command the in-memory server does (queues and
// 1.13 WATCH_KEY included), so it has no exceptions today: its profile is
// tcpstore's. A check a backend cannot serve would be listed here with the
// reason, and reported UNSUPPORTED for that profile.
const char* exceptionReason(const Check&, Profile) noexcept { return nullptr; }

const char* expected(const Check& c, Profile p) noexcept {
  if (p == Profile::kTcpstoreGateway) {
    if (exceptionReason(c, p) != nullptr) return nullptr;
    p = Profile::kTcpstore;
  }
  return c.expect[static_cast<std::size_t>(p)];
}

}  // namespace tcpstore::conform
