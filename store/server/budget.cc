#include "store/server/budget.h"

namespace tcpstore::server {

using protocol::Command;

bool MemoryBudget::refuse(const MemoryUse& use, std::uint64_t extra,
                          bool large) const noexcept {
  if (max_ == 0 || extra == 0) return false;
  const std::uint64_t line =
      large || extra > kLargeRequestBytes ? softLine() : max_;
  const std::uint64_t total = use.total();
  return total >= line || extra > line - total;
}

bool MemoryBudget::pauseInput(const MemoryUse& use, std::size_t partial,
                              std::size_t growth) const noexcept {
  if (max_ == 0 || partial <= kLargeRequestBytes) return false;
  const std::uint64_t total = use.total();
  return total >= softLine() || growth > softLine() - total;
}

bool MemoryBudget::mayResumeInput(const MemoryUse& use) const noexcept {
  return max_ == 0 || use.total() < resumeLine();
}

bool MemoryBudget::overBudget(const MemoryUse& use) const noexcept {
  return max_ != 0 && use.total() > max_;
}

std::uint64_t estimateBytes(const protocol::Request& req) noexcept {
  switch (req.command) {
    case Command::kSet:
    case Command::kAppend:
    case Command::kQueuePush:
    case Command::kCompareSet:
      return kEntryOverhead + req.key.size() + req.value.size() +
             (req.command == Command::kCompareSet ? req.desired.size() : 0);
    case Command::kMultiSet: {
      std::uint64_t n = 0;
      for (auto k : req.keys) n += kEntryOverhead + k.size();
      for (auto v : req.values) n += v.size();
      return n;
    }
    case Command::kWait: {
      std::uint64_t n = 0;
      for (auto k : req.keys) n += kWaitKeyOverhead + k.size();
      return n;
    }
    default:
      return 0;
  }
}

}  // namespace tcpstore::server
