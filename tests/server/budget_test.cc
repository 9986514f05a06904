// The memory budget's policy (store/server/budget.h), without sockets.
#include "store/server/budget.h"

#include <doctest/doctest.h>

#include <string>

using tcpstore::protocol::Command;
using tcpstore::protocol::Request;
using namespace tcpstore::server;

namespace {
constexpr std::uint64_t kMax = 16 * 1024 * 1024;
MemoryUse use(std::uint64_t backend, std::uint64_t output = 0,
              std::uint64_t input = 0) {
  return MemoryUse{input, output, backend};
}
}  // namespace

TEST_CASE("budget: the total covers input, output and the backend") {
  CHECK(use(1, 2, 3).total() == 6);
}

TEST_CASE("budget: large requests are refused past the soft line") {
  MemoryBudget b(kMax);
  CHECK(b.softLine() == kMax - kMax / 16);
  const std::uint64_t large = kLargeRequestBytes + 1;
  CHECK_FALSE(b.refuse(use(0), large));
  CHECK_FALSE(b.refuse(use(b.softLine() - large), large));
  CHECK(b.refuse(use(b.softLine() - large + 1), large));
  // Spread over input and output too.
  CHECK(b.refuse(use(0, b.softLine() / 2, b.softLine() / 2), large));
}

TEST_CASE("budget: requests of normal size get the last sixteenth") {
  MemoryBudget b(kMax);
  const std::uint64_t small = 100;
  CHECK_FALSE(b.refuse(use(b.softLine() + 10), small));
  CHECK_FALSE(b.refuse(use(kMax - small), small));
  CHECK(b.refuse(use(kMax - small + 1), small));
  CHECK(b.refuse(use(kMax + 5), small));    // never wraps
  CHECK_FALSE(b.refuse(use(kMax + 5), 0));  // adds nothing: always fine
}

TEST_CASE("budget: huge figures do not wrap") {
  MemoryBudget b(kMax);
  CHECK(b.refuse(use(0), UINT64_MAX));
  CHECK(b.refuse(use(UINT64_MAX / 2), 1));
}

TEST_CASE("budget: 0 means no budget") {
  MemoryBudget b(0);
  CHECK_FALSE(b.refuse(use(UINT64_MAX / 2), UINT64_MAX / 4));
  CHECK_FALSE(b.pauseInput(use(UINT64_MAX / 2), SIZE_MAX, SIZE_MAX));
  CHECK(b.mayResumeInput(use(UINT64_MAX / 2)));
  CHECK_FALSE(b.overBudget(use(UINT64_MAX / 2)));
}

TEST_CASE("budget: large partial inputs pause past the soft line") {
  MemoryBudget b(kMax);
  const std::size_t big = 10 * kLargeRequestBytes;
  CHECK_FALSE(b.pauseInput(use(b.softLine() - 1), big, 1));
  CHECK(b.pauseInput(use(b.softLine() - 1), big, 2));  // the growth counts
  CHECK(b.pauseInput(use(b.softLine()), big, 0));
  CHECK_FALSE(b.pauseInput(use(kMax * 2), kLargeRequestBytes, 1));  // small
  CHECK_FALSE(b.mayResumeInput(use(b.resumeLine())));
  CHECK(b.mayResumeInput(use(b.resumeLine() - 1)));
  CHECK(b.overBudget(use(kMax + 1)));
  CHECK_FALSE(b.overBudget(use(kMax)));
}

TEST_CASE("budget: estimates from the decoded request") {
  Request r;
  r.command = Command::kSet;
  r.key = "k";
  r.value = std::string_view("12345");
  CHECK(estimateBytes(r) == kEntryOverhead + 6);
  r.command = Command::kWait;
  r.keys = {"a", "bb"};
  CHECK(estimateBytes(r) == 2 * kWaitKeyOverhead + 3);
  r.command = Command::kMultiSet;
  r.values = {"x", "yyy"};
  CHECK(estimateBytes(r) == 2 * kEntryOverhead + 3 + 4);
  r.command = Command::kGet;
  CHECK(estimateBytes(r) == 0);
  r.command = Command::kAdd;
  CHECK(estimateBytes(r) == 0);
}
