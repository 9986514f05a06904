// What each profile requires of a check: the table profiles read their
// column of Check::expect; the gateway profile is derived from tcpstore's
// column minus the exceptions listed here (the one place they are kept;
// conform/README.md documents them).
#include <cstring>

#include "conform/check.h"

namespace tcpstore::conform {
namespace {

struct Exception {
  const char* id;
  const char* reason;
};

// Checks tcpstore requires but the etcd gateway (tcpstore-server --backend
// etcd://) does not: it refuses these requests by closing the connection
// with a log line.
// clang-format off
constexpr Exception kGatewayExceptions[] = {
    {"ext.queue",                "no queues (QUEUE_PUSH/POP/LEN) in the etcd backend"},
    {"sem.check.queue",          "no queues (QUEUE_PUSH/POP/LEN) in the etcd backend"},
    {"wire.v1.watch",            "no 1.13 WATCH_KEY in the etcd backend"},
    {"sem.watch.closed_watcher", "no 1.13 WATCH_KEY in the etcd backend"},
};
// clang-format on

template <std::size_t N>
const char* find(const Exception (&list)[N], const char* id) noexcept {
  for (const Exception& e : list) {
    if (std::strcmp(e.id, id) == 0) return e.reason;
  }
  return nullptr;
}

}  // namespace

const char* exceptionReason(const Check& c, Profile p) noexcept {
  if (p == Profile::kTcpstoreGateway) return find(kGatewayExceptions, c.id);
  return nullptr;
}

const char* expected(const Check& c, Profile p) noexcept {
  if (p == Profile::kTcpstoreGateway) {
    if (exceptionReason(c, p) != nullptr) return nullptr;
    p = Profile::kTcpstore;
  }
  return c.expect[static_cast<std::size_t>(p)];
}

}  // namespace tcpstore::conform
