// A linearizability checker for the history of one key (test code).
//
// Wing & Gong's search with memoisation (as in Lowe's "Testing for
// linearizability"): pick, among the operations not yet placed, one that no
// other unplaced operation finished before it started; apply it to the model
// if its recorded result agrees; backtrack on failure. (placed set, model
// state) pairs already explored are not explored again. Linearizability is
// local, so a multi-key history is checked key by key.
//
// Model: one c10d key (missing or a byte string) under SET, GET, ADD and
// COMPARE_SET with PyTorch's semantics. An operation with an unknown outcome
// (its connection was closed) may take effect at any point after its start,
// or never; its result is not checked.
#pragma once

#include <charconv>
#include <cstdint>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace tcpstore::test {

struct LinOp {
  enum Kind { kSet, kGet, kAdd, kCompareSet } kind = kGet;
  std::string value;    // SET: the value; COMPARE_SET: expected
  std::string desired;  // COMPARE_SET
  std::int64_t delta = 0;
  std::string result;  // GET / COMPARE_SET: the value; ADD: the decimal sum
  bool known = true;   // false: outcome unknown
  std::int64_t start = 0, end = 0;  // any monotonic clock; end > start
};

class LinearizabilityChecker {
 public:
  // At most 64 operations (one key's history of a test run).
  LinearizabilityChecker(std::vector<LinOp> ops,
                         std::optional<std::string> initial)
      : ops_(std::move(ops)), initial_(std::move(initial)) {
    if (ops_.size() > 64) throw std::invalid_argument("history over 64 ops");
  }

  bool check() {
    seen_.clear();
    return search(0, initial_);
  }

 private:
  using State = std::optional<std::string>;

  // The model's step: the new state, or nullopt if `op` cannot have
  // returned its recorded result from `s`.
  static std::optional<State> apply(const LinOp& op, const State& s) {
    switch (op.kind) {
      case LinOp::kSet:
        return State(op.value);
      case LinOp::kGet:
        if (op.known && (!s || *s != op.result)) return std::nullopt;
        return s;
      case LinOp::kAdd: {
        std::int64_t cur = 0;
        if (s) {
          auto [p, ec] = std::from_chars(s->data(), s->data() + s->size(), cur);
          if (ec != std::errc() || p != s->data() + s->size())
            return std::nullopt;
        }
        const std::string next = std::to_string(cur + op.delta);
        if (op.known && next != op.result) return std::nullopt;
        return State(next);
      }
      case LinOp::kCompareSet: {
        const bool stores = s ? *s == op.value : op.value.empty();
        const std::string reply = stores ? op.desired : (s ? *s : op.value);
        if (op.known && reply != op.result) return std::nullopt;
        return stores ? State(op.desired) : s;
      }
    }
    return std::nullopt;
  }

  bool done(std::uint64_t placed) const {
    for (std::size_t i = 0; i < ops_.size(); ++i)
      if (ops_[i].known && !(placed >> i & 1)) return false;
    return true;
  }

  bool search(std::uint64_t placed, const State& s) {
    if (done(placed)) return true;
    if (!seen_.emplace(placed, s).second) return false;
    // The earliest end among unplaced known ops: nothing that starts after
    // it can go first.
    std::int64_t horizon = INT64_MAX;
    for (std::size_t i = 0; i < ops_.size(); ++i) {
      if (!(placed >> i & 1) && ops_[i].known && ops_[i].end < horizon)
        horizon = ops_[i].end;
    }
    for (std::size_t i = 0; i < ops_.size(); ++i) {
      if (placed >> i & 1) continue;
      if (ops_[i].start > horizon) continue;
      const std::uint64_t next = placed | (std::uint64_t{1} << i);
      if (auto t = apply(ops_[i], s); t && search(next, *t)) return true;
      // An unknown outcome may also never have taken effect.
      if (!ops_[i].known && search(next, s)) return true;
    }
    return false;
  }

  std::vector<LinOp> ops_;
  State initial_;
  std::set<std::pair<std::uint64_t, State>> seen_;
};

}  // namespace tcpstore::test
