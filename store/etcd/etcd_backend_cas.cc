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
//
// SET goes through the same queue (consecutive SETs become one Put of the
// last value) but its Txn compares the marker key's mod_revision instead of
// the key's: a Put retried blindly after an unknown outcome could apply
// twice, the second time after later writes of other clients.
//
// Unknown outcomes (a deadline or a dropped connection while a Txn was in
// flight): every writing Txn also writes a marker key owned by this gateway
// and this key, "<prefix>\0cas/<gateway id>/<key>", with a value unique to
// the attempt, and every failure branch reads it back. After an unknown
// outcome the decision is sent again (still comparing the same
// mod_revision): if an earlier attempt had been applied the compare fails
// and the marker names that attempt, whose answers are then given; if not,
// at most one of the attempts can win the compare. Either way each caller
// is answered once, from the attempt that was applied. Marker keys lie
// outside the job's range (not counted, not watched); a gateway deletes its
// own at close() (a killed one's stay until --delete-prefix).
#include <fmt/format.h>

#include "store/etcd/etcd_backend.h"
#include "store/etcd/etcd_numbers.h"
#include "store/etcd/etcd_rpc.h"

namespace tcpstore::store {

namespace {

using etcd::decimal;
using etcd::parseLikeStoll;
using etcd::wrappingAdd;

using protocol::appendI64;
using protocol::appendStr;
using protocol::Command;

// Idle per-key states kept as a cache before they are dropped.
constexpr std::size_t kMaxIdleKeys = 4096;

}  // namespace

std::string EtcdBackend::markerKey(std::string_view full_key) const {
  std::string m(options_.prefix, 0, options_.prefix.size() - 1);
  m.push_back('\0');
  m.append("cas/").append(gateway_id_).push_back('/');
  m.append(full_key.substr(options_.prefix.size()));
  return m;
}

void EtcdBackend::replyCas(CasBatch& batch, const Status& refusal,
                           const std::vector<std::string>& replies) {
  for (std::size_t i = 0; i < batch.ops.size(); ++i) {
    const CasOp& op = *batch.ops[i];
    if (!refusal.isOk()) {
      fail(op.conn, refusal);
    } else if (op.command == Command::kBarrier) {
      if (closed_) continue;
      const auto count = static_cast<std::int64_t>(protocol::loadU64(
          reinterpret_cast<const unsigned char*>(replies[i].data())));
      Effects fx;
      if (count >= op.world_size) {
        fx.send(op.conn,
                std::string(1, static_cast<char>(protocol::kStopWaiting)));
        host_->complete(op.conn, Status::ok(), fx);
      } else {
        // Registered before complete(): that may already submit the
        // connection's next request (a CANCEL_WAIT).
        registerBarrier(op.conn, op.key, op.world_size);
        host_->complete(op.conn, Status::ok(), fx);
      }
    } else if (!closed_) {
      Effects fx;
      if (!replies[i].empty()) fx.send(batch.ops[i]->conn, replies[i]);
      host_->complete(batch.ops[i]->conn, Status::ok(), fx);
    }
  }
}

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
  batch->ops.push_back(std::move(ks.queue.front()));
  ks.queue.pop_front();
  auto increments = [](Command c) {
    return c == Command::kAdd || c == Command::kBarrier;
  };
  if (increments(batch->ops.front()->command) && options_.combine_adds) {
    while (!ks.queue.empty() && increments(ks.queue.front()->command)) {
      batch->ops.push_back(std::move(ks.queue.front()));
      ks.queue.pop_front();
    }
  } else if (batch->ops.front()->command == Command::kSet) {
    // Concurrent SETs: one Put of the last value (the others were
    // overwritten at once, in this order).
    while (!ks.queue.empty() && ks.queue.front()->command == Command::kSet) {
      batch->ops.push_back(std::move(ks.queue.front()));
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
  const CasOp& first = *batch->ops.front();
  const std::string_view name = protocol::commandName(first.command);
  const std::string_view short_key =
      std::string_view(key).substr(options_.prefix.size());

  // The decision on the state last seen.
  Status refusal;                  // non-OK: every op of the batch fails
  std::optional<std::string> put;  // the value to store, if any
  std::vector<std::string> replies(batch->ops.size());
  switch (first.command) {
    case Command::kAdd:
    case Command::kBarrier: {
      std::int64_t cur = 0;
      if (ks.exists && !parseLikeStoll(ks.value, cur)) {
        refusal = Status::protocolError(fmt::format(
            "{} on non-numeric value of key '{}'", name, short_key));
        break;
      }
      for (std::size_t i = 0; i < batch->ops.size(); ++i) {
        cur = wrappingAdd(cur, batch->ops[i]->delta);
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
    case Command::kSet:
      put = batch->ops.back()->value;
      break;
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

  const std::string marker = markerKey(key);
  etcdserverpb::TxnRequest txn;
  auto* cmp = txn.add_compare();
  cmp->set_target(etcdserverpb::Compare::MOD);
  cmp->set_result(etcdserverpb::Compare::EQUAL);
  if (first.command == Command::kSet) {
    // A SET does not depend on the value: it is fenced by the marker alone,
    // so no other gateway's writes make it retry, and an attempt whose
    // outcome was unknown can never apply after a later one.
    cmp->set_key(marker);
    cmp->set_mod_revision(ks.marker_revision);
  } else {
    cmp->set_key(key);
    cmp->set_mod_revision(ks.mod_revision);
  }
  if (put) {
    CasBatch::Attempt att;
    att.marker = std::to_string(++cas_seq_);
    att.put = *put;
    att.replies = replies;
    auto* p = txn.add_success()->mutable_request_put();
    p->set_key(key);
    p->set_value(*put);
    auto* m = txn.add_success()->mutable_request_put();
    m->set_key(marker);
    m->set_value(att.marker);
    batch->attempts.push_back(std::move(att));
  }
  txn.add_failure()->mutable_request_range()->set_key(key);
  txn.add_failure()->mutable_request_range()->set_key(marker);
  if (first.command == Command::kAdd || first.command == Command::kBarrier)
    ++add_txns_;

  rpc_->txn(std::move(txn), false,
            [this, key, batch, deadline, refusal, put = std::move(put),
             replies = std::move(replies),
             name](const grpc::Status& s, etcdserverpb::TxnResponse& resp) {
              auto it = cas_.find(key);
              if (it == cas_.end()) return;  // closed
              KeyCas& st = *it->second;
              const bool late = std::chrono::steady_clock::now() > deadline;
              if (!s.ok()) {
                if (etcd::isTransportError(s) && !late) {
                  // Outcome unknown: decide again on the same state; the marker
                  // tells which attempt, if any, was applied.
                  return attemptCas(key, batch, deadline);
                }
                st.exists = false;
                st.mod_revision = 0;
                const Status why = Status::ioError(
                    fmt::format("etcd {} failed: {}", name, etcd::describe(s)));
                for (auto& op : batch->ops) fail(op->conn, why);
                return finishCas(key);
              }
              if (!resp.succeeded()) {
                const auto& rr = resp.responses(0).response_range();
                st.exists = rr.kvs_size() > 0;
                st.value = st.exists ? rr.kvs(0).value() : std::string();
                st.mod_revision = st.exists ? rr.kvs(0).mod_revision() : 0;
                const auto& mr = resp.responses(1).response_range();
                st.marker_revision =
                    mr.kvs_size() > 0 ? mr.kvs(0).mod_revision() : 0;
                if (mr.kvs_size() > 0) {
                  for (const auto& att : batch->attempts) {
                    if (att.marker != mr.kvs(0).value()) continue;
                    // An earlier attempt of this batch was applied.
                    replyCas(*batch, Status::ok(), att.replies);
                    return finishCas(key);
                  }
                }
                if (late) {
                  const Status why = Status::timeout(fmt::format(
                      "etcd {}: no answer before the deadline", name));
                  for (auto& op : batch->ops) fail(op->conn, why);
                  return finishCas(key);
                }
                return attemptCas(key, batch, deadline);
              }
              if (put) {
                st.exists = true;
                st.value = *put;
                st.mod_revision = resp.header().revision();
                st.marker_revision = resp.header().revision();
              }
              replyCas(*batch, refusal, replies);
              finishCas(key);
            });
}

}  // namespace tcpstore::store
