// The output policy (backpressure.h) as pure functions, without sockets.
#include "store/server/backpressure.h"

#include <doctest/doctest.h>

using namespace tcpstore::server;

namespace {
OutputLimits limits() {
  OutputLimits l;
  l.cap = 1000;
  l.total_budget = 10000;
  l.stall_ms = 400;
  return l;
}
}  // namespace

TEST_CASE("backpressure: pause above the cap, drop above twice while writing") {
  const OutputLimits l = limits();
  CHECK(judgeOutput(l, 1000, false, false) == CapAction::kNone);
  CHECK(judgeOutput(l, 1001, false, false) == CapAction::kPause);
  CHECK(judgeOutput(l, 1001, false, true) == CapAction::kNone);  // already
  // Over twice the cap but the kernel was not asked yet: one large reply to
  // a reading client is not a slow reader.
  CHECK(judgeOutput(l, 5000, false, false) == CapAction::kPause);
  CHECK(judgeOutput(l, 5000, false, true) == CapAction::kNone);
  CHECK(judgeOutput(l, 2000, true, true) == CapAction::kNone);
  CHECK(judgeOutput(l, 2001, true, true) == CapAction::kDrop);
  CHECK(judgeOutput(l, 2001, true, false) == CapAction::kDrop);
}

TEST_CASE("backpressure: resume at half the cap") {
  const OutputLimits l = limits();
  CHECK(mayResume(l, 0));
  CHECK(mayResume(l, 500));
  CHECK_FALSE(mayResume(l, 501));
}

TEST_CASE("backpressure: a huge cap does not overflow twice the cap") {
  OutputLimits l = limits();
  l.cap = UINT64_MAX - 1;
  CHECK(judgeOutput(l, SIZE_MAX, true, true) == CapAction::kNone);
}

TEST_CASE("backpressure: unrequested pushes past the server-wide budget") {
  const OutputLimits l = limits();
  // Under the budget: always delivered, however far behind.
  CHECK_FALSE(dropUnrequestedPush(l, 0, 100000, 10));
  CHECK_FALSE(dropUnrequestedPush(l, 9990, 100000, 10));
  // Past it: an idle waiter still gets its byte...
  CHECK_FALSE(dropUnrequestedPush(l, 10000, 0, 1));
  CHECK_FALSE(dropUnrequestedPush(l, 10000, kBehindBytes - 1, 1));
  // ...a receiver that would hold more than kBehindBytes is dropped.
  CHECK(dropUnrequestedPush(l, 10000, kBehindBytes, 1));
  CHECK(dropUnrequestedPush(l, 10000, 0, kBehindBytes + 1));
}

TEST_CASE("backpressure: stall clock drops only without progress") {
  StallClock c;
  c.start(1000);
  // The first check records the queue size; no progress needed yet.
  CHECK_FALSE(c.stalled(1100, 5000, 400));
  CHECK_FALSE(c.stalled(1399, 5000, 400));
  CHECK(c.stalled(1400, 5000, 400));  // 400 ms without a byte taken
  CHECK(c.idleMs(1400) == 400);

  StallClock d;
  d.start(1000);
  CHECK_FALSE(d.stalled(1100, 5000, 400));
  CHECK_FALSE(d.stalled(1350, 4000, 400));  // the queue shrank: progress
  CHECK_FALSE(d.stalled(1700, 4000, 400));
  CHECK(d.stalled(1750, 4000, 400));
  d.progressed(1800);  // a write took bytes
  CHECK_FALSE(d.stalled(1900, 4000, 400));
}

TEST_CASE("backpressure: stall checks run a few times per stall period") {
  CHECK(stallCheckEveryMs(30000) == 1000);
  CHECK(stallCheckEveryMs(400) == 100);
  CHECK(stallCheckEveryMs(1) == 1);
}
