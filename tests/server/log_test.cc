// The rate limiter and the join progress line (log.h), driven with explicit
// times. Lines go to stderr; what is tested is when they are due.
#include "store/server/log.h"

#include <doctest/doctest.h>

using namespace tcpstore::server;

TEST_CASE("rate-limited log: the first suppressed line arms one summary") {
  RateLimitedLog log(2);
  CHECK(log.add(10000, "a") == 0);
  CHECK(log.add(10100, "b") == 0);
  CHECK(log.add(10200, "c") == 800);  // suppressed: summary at window end
  CHECK(log.add(10300, "d") == 0);    // already armed
  log.endWindow(11000);
  CHECK(log.add(11100, "e") == 0);
  CHECK(log.add(11200, "f") == 0);
  CHECK(log.add(11300, "g") == 700);
  // A line after the window ends opens a new one (and writes the summary).
  CHECK(log.add(12500, "h") == 0);
}

TEST_CASE("join progress: a suppressed change is logged when its second ends") {
  Logger quiet;
  quiet.setLevel(LogLevel::kError);  // the lines themselves are not checked
  JoinProgress p(quiet, 3);
  CHECK(p.note(5000, 1) == 0);    // first count: at once
  CHECK(p.note(5200, 2) == 800);  // same second: deferred, timer armed
  CHECK(p.note(5300, 2) == 0);    // already armed
  p.onTimer(6000);                // logs 2 (the latest count)
  CHECK(p.note(6100, 2) == 0);    // unchanged: nothing to do
  CHECK(p.note(6200, 3) == 0);    // complete: always at once
  CHECK(p.note(6300, 4) == 0);    // nothing after the complete line
}

TEST_CASE("join progress: a change after a quiet second is logged at once") {
  Logger quiet;
  quiet.setLevel(LogLevel::kError);
  JoinProgress p(quiet, 10);
  CHECK(p.note(1000, 1) == 0);
  CHECK(p.note(2500, 2) == 0);
  CHECK(p.note(2600, 3) == 900);
  p.onTimer(3500);
  CHECK(p.note(3600, 4) == 900);
}
