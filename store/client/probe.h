// Optional server commands, learnt on first use and remembered per endpoint.
//
// torch's servers differ in which 2.x commands they implement (docs/protocol.md
// §2): the classic servers lack the queues, torch 2.6 lacks LIST_KEYS and
// BARRIER. A server that does not know a command byte closes the connection.
// So a command whose support is unknown is simply sent; if the connection is
// closed in answer while a fresh connection still works, the server lacks it.
// Internal to tcpstore::client.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "tcpstore/status.h"

namespace tcpstore::client_detail {

enum class Feature : std::uint8_t { kQueues, kListKeys, kBarrier };
inline constexpr std::size_t kFeatureCount = 3;

struct FeatureInfo {
  Feature feature;
  // Which servers lack it, for the kNotSupported message.
  std::string_view lacking;
  // A blocking command (BARRIER) that ran into its deadline was accepted by
  // the server (one lacking it closes at once), so a timeout proves support.
  bool timeout_proves;
};

// Indexed by Feature.
// clang-format off
inline constexpr std::array<FeatureInfo, kFeatureCount> kFeatures = {{
  // feature           servers that lack it        timeout proves support
  {Feature::kQueues,   "torch's classic servers",  false},
  {Feature::kListKeys, "torch < 2.14",             false},
  {Feature::kBarrier,  "torch < 2.14",             true},
}};
// clang-format on
static_assert(kFeatures[0].feature == Feature::kQueues &&
              kFeatures[1].feature == Feature::kListKeys &&
              kFeatures[2].feature == Feature::kBarrier);

// kNotSupported for `command` of a feature the server lacks.
Status lacks(Feature f, std::string_view command);

// The Status inside an operation's outcome.
inline Status statusOf(const Status& s) { return s; }
template <typename T>
Status statusOf(const Result<T>& r) {
  return r.error();
}

// What one endpoint is known to support. Thread-safe; concurrent probes of
// the same feature may both run (each learns the same answer).
class Capabilities {
 public:
  enum Support : std::uint8_t { kUnknown = 0, kPresent = 1, kAbsent = 2 };

  Support support(Feature f) const noexcept {
    return static_cast<Support>(slot(f).load());
  }

  // Runs op(probing) unless the feature is known absent; probing is true while
  // support is unknown (queuePush then adds a PING to learn the outcome).
  // Returns nullopt if the server lacks the feature: known before, or learnt
  // now because op failed with kClosed while support was unknown and
  // still_up() (a fresh connection works), or because a concurrent probe
  // learnt it while this op ran. Otherwise op's outcome; success
  // (or, for BARRIER, a timeout) records the feature as present.
  template <typename Op, typename StillUp>
  auto probed(Feature f, Op&& op, StillUp&& still_up)
      -> std::optional<decltype(op(true))> {
    auto& state = slot(f);
    const auto before = static_cast<Support>(state.load());
    if (before == kAbsent) return std::nullopt;
    auto outcome = op(before == kUnknown);
    const Status s = statusOf(outcome);
    if (s || (s.isTimeout() && info(f).timeout_proves)) {
      state = kPresent;
    } else if (s.isClosed() && before == kUnknown) {
      // Concurrent probes: another one may have learnt the answer while this
      // one ran; a close then means the same thing for this one.
      const auto now = static_cast<Support>(state.load());
      if (now == kAbsent || (now == kUnknown && still_up())) {
        state = kAbsent;
        return std::nullopt;
      }
    }
    return outcome;
  }

  static const FeatureInfo& info(Feature f) {
    return kFeatures[static_cast<std::size_t>(f)];
  }

 private:
  std::atomic<std::uint8_t>& slot(Feature f) noexcept {
    return state_[static_cast<std::size_t>(f)];
  }
  const std::atomic<std::uint8_t>& slot(Feature f) const noexcept {
    return state_[static_cast<std::size_t>(f)];
  }

  std::array<std::atomic<std::uint8_t>, kFeatureCount> state_{};
};

}  // namespace tcpstore::client_detail
