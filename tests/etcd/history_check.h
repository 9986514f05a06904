// Doctest checks of recorded per-key histories, for the etcd tests (backend
// and gateway processes): each key's history must be linearizable, and the
// same history with one read answered wrongly must not be (so the check is
// not vacuous). On a failure the history is printed in start order.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "linearizability.h"

namespace tcpstore::test {

// per_key[k]: the operations on key k; every key starts at "0".
inline void checkLinearizableHistories(
    const std::vector<std::vector<LinOp>>& per_key) {
  for (std::size_t k = 0; k < per_key.size(); ++k) {
    CAPTURE(k);
    MESSAGE("key ", k, ": ", per_key[k].size(), " operations");
    const bool ok =
        LinearizabilityChecker(per_key[k], std::string("0")).check();
    CHECK(ok);
    if (!ok && !per_key[k].empty()) {
      auto ops = per_key[k];
      std::sort(ops.begin(), ops.end(), [](const LinOp& x, const LinOp& y) {
        return x.start < y.start;
      });
      const std::int64_t t0 = ops.front().start;
      for (const auto& o : ops) {
        MESSAGE("kind ", int(o.kind), " value '", o.value, "' desired '",
                o.desired, "' result '", o.result, "' known ", o.known, " [",
                (o.start - t0) / 1000, "us, ",
                o.end == INT64_MAX ? -1 : (o.end - t0) / 1000, "us]");
      }
    }
    auto bad = per_key[k];
    for (auto& o : bad) {
      if (o.kind == LinOp::kGet && o.known) {
        o.result = "never written";
        CHECK_FALSE(LinearizabilityChecker(bad, std::string("0")).check());
        break;
      }
    }
  }
}

}  // namespace tcpstore::test
