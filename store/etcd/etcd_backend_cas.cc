// EtcdBackend's compare-and-swap commands: ADD (combined), APPEND and
// COMPARE_SET. See etcd_backend.h.
//
// Every decision is taken on the state this gateway last saw of the key and
// committed by a Txn that compares the key's mod_revision with it: on a
// match the decision stands (its Put, if any, is applied atomically); on a
// mismatch the Txn's failure branch returns the real state and the decision
// is taken again. Decisions that write nothing (ADD on a non-numeric value,
// a COMPARE_SET mismatch, an APPEND over the limit) are confirmed the same
// way, so no answer rests on a stale cache.
#include <fmt/format.h>

#include <charconv>

#include "store/etcd/etcd_backend.h"
#include "store/etcd/etcd_rpc.h"

namespace tcpstore::store {

namespace {

using protocol::appendI64;
using protocol::appendStr;
using protocol::Command;

bool isCSpace(char c) noexcept {
  return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' ||
         c == '\r';
}

// std::stoll in the C locale, without exceptions (as the Keyspace parses).
bool parseLikeStoll(std::string_view s, std::int64_t& out) noexcept {
  std::size_t i = 0;
  while (i < s.size() && isCSpace(s[i])) ++i;
  bool negative = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) {
    negative = s[i] == '-';
    ++i;
  }
  const std::uint64_t limit =
      negative ? (std::uint64_t{1} << 63) : (std::uint64_t{1} << 63) - 1;
  const std::size_t first_digit = i;
  std::uint64_t magnitude = 0;
  bool overflow = false;
  for (; i < s.size() && s[i] >= '0' && s[i] <= '9'; ++i) {
    auto d = static_cast<std::uint64_t>(s[i] - '0');
    if (overflow || magnitude > (limit - d) / 10) {
      overflow = true;
    } else {
      magnitude = magnitude * 10 + d;
    }
  }
  if (i == first_digit || overflow) return false;
  out = static_cast<std::int64_t>(negative ? std::uint64_t{0} - magnitude
                                           : magnitude);
  return true;
}

std::int64_t wrappingAdd(std::int64_t a, std::int64_t b) noexcept {
  return static_cast<std::int64_t>(static_cast<std::uint64_t>(a) +
                                   static_cast<std::uint64_t>(b));
}

std::string decimal(std::int64_t v) {
  char buf[24];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  (void)ec;
  return std::string(buf, static_cast<std::size_t>(end - buf));
}

// Idle per-key states kept as a cache before they are dropped.
constexpr std::size_t kMaxIdleKeys = 4096;

}  // namespace

void EtcdBackend::enqueueCas(std::unique_ptr<CasOp> op) {
  const std::string key = op->key;
  auto& ks = cas_[key];
  if (!ks) ks = std::make_unique<KeyCas>();
  ks->queue.push_back(std::move(op));
  runCas(key);
}

void EtcdBackend::runCas(const std::string& key) {
  auto it = cas_.find(key);
  if (it == cas_.end()) return;
  KeyCas& ks = *it->second;
  if (ks.running) return;
  if (ks.queue.empty()) {
    if (cas_.size() > kMaxIdleKeys) cas_.erase(it);
    return;
  }
  ks.running = true;
  auto batch = std::make_shared<CasBatch>();
  batch->push_back(std::move(ks.queue.front()));
  ks.queue.pop_front();
  if (batch->front()->command == Command::kAdd) {
    while (!ks.queue.empty() && ks.queue.front()->command == Command::kAdd) {
      batch->push_back(std::move(ks.queue.front()));
      ks.queue.pop_front();
    }
  }
  attemptCas(key, std::move(batch),
             std::chrono::steady_clock::now() + options_.op_timeout);
}

void EtcdBackend::finishCas(const std::string& key) {
  auto it = cas_.find(key);
  if (it == cas_.end()) return;
  it->second->running = false;
  runCas(key);
}

void EtcdBackend::attemptCas(const std::string& key,
                             std::shared_ptr<CasBatch> batch,
                             std::chrono::steady_clock::time_point deadline) {
  KeyCas& ks = *cas_.at(key);
  const CasOp& first = *batch->front();
  const std::string_view name = protocol::commandName(first.command);
  const std::string_view short_key =
      std::string_view(key).substr(options_.prefix.size());

  // The decision on the state last seen.
  Status refusal;                  // non-OK: every op of the batch fails
  std::optional<std::string> put;  // the value to store, if any
  std::vector<std::string> replies(batch->size());
  switch (first.command) {
    case Command::kAdd: {
      std::int64_t cur = 0;
      if (ks.exists && !parseLikeStoll(ks.value, cur)) {
        refusal = Status::protocolError(
            fmt::format("ADD on non-numeric value of key '{}'", short_key));
        break;
      }
      for (std::size_t i = 0; i < batch->size(); ++i) {
        cur = wrappingAdd(cur, (*batch)[i]->delta);
        appendI64(replies[i], cur);
      }
      put = decimal(cur);
      break;
    }
    case Command::kAppend: {
      const std::uint64_t grown =
          (ks.exists ? ks.value.size() : 0) + first.value.size();
      if (grown > options_.max_value_bytes) {
        refusal = Status::limitExceeded(fmt::format(
            "APPEND would grow the value of key '{}' to {} bytes, over the "
            "value limit {}",
            short_key, grown, options_.max_value_bytes));
        break;
      }
      put = (ks.exists ? ks.value : std::string()) + first.value;
      break;
    }
    default: {  // COMPARE_SET
      const bool stores =
          ks.exists ? ks.value == first.value : first.value.empty();
      if (stores) {
        put = first.desired;
        appendStr(replies[0], first.desired);
      } else {
        appendStr(replies[0], ks.exists ? ks.value : first.value);
      }
      break;
    }
  }

  etcdserverpb::TxnRequest txn;
  auto* cmp = txn.add_compare();
  cmp->set_key(key);
  cmp->set_target(etcdserverpb::Compare::MOD);
  cmp->set_result(etcdserverpb::Compare::EQUAL);
  cmp->set_mod_revision(ks.mod_revision);
  if (put) {
    auto* p = txn.add_success()->mutable_request_put();
    p->set_key(key);
    p->set_value(*put);
  }
  txn.add_failure()->mutable_request_range()->set_key(key);
  if (first.command == Command::kAdd) ++add_txns_;

  rpc_->txn(
      std::move(txn), false,
      [this, key, batch, deadline, refusal, put = std::move(put),
       replies = std::move(replies),
       name](const grpc::Status& s, etcdserverpb::TxnResponse& resp) {
        auto it = cas_.find(key);
        if (it == cas_.end()) return;  // closed
        KeyCas& st = *it->second;
        if (!s.ok()) {
          // Applied or not: unknown. Never guess; forget the state.
          st.exists = false;
          st.mod_revision = 0;
          const Status why = Status::ioError(fmt::format(
              "etcd {} failed, outcome unknown: {}", name, etcd::describe(s)));
          for (auto& op : *batch) fail(op->conn, why);
          return finishCas(key);
        }
        if (!resp.succeeded()) {
          const auto& rr = resp.responses(0).response_range();
          st.exists = rr.kvs_size() > 0;
          st.value = st.exists ? rr.kvs(0).value() : std::string();
          st.mod_revision = st.exists ? rr.kvs(0).mod_revision() : 0;
          if (std::chrono::steady_clock::now() > deadline) {
            const Status why = Status::timeout(fmt::format(
                "etcd {}: key kept changing until the deadline", name));
            for (auto& op : *batch) fail(op->conn, why);
            return finishCas(key);
          }
          return attemptCas(key, batch, deadline);
        }
        if (put) {
          st.exists = true;
          st.value = *put;
          st.mod_revision = resp.header().revision();
        }
        for (std::size_t i = 0; i < batch->size(); ++i) {
          if (!refusal.isOk()) {
            fail((*batch)[i]->conn, refusal);
          } else if (closed_) {
            break;
          } else {
            Effects fx;
            if (!replies[i].empty()) fx.send((*batch)[i]->conn, replies[i]);
            host_->complete((*batch)[i]->conn, Status::ok(), fx);
          }
        }
        finishCas(key);
      });
}

}  // namespace tcpstore::store
