// EtcdBackend's queues: QUEUE_PUSH, QUEUE_POP and QUEUE_LEN. See
// etcd_backend.h.
//
// A queue is a range of item keys outside the job's range (so GETNUMKEYS and
// LIST_KEYS do not count them, as the Keyspace's do not):
//   "<prefix without '/'>\0q/" + 8-byte big-endian length of K + K + item id
// where K is the queue's key as the client names it and the item id (this
// gateway's id and a sequence number, fixed length) makes every push a new
// key. The length makes one queue's range hold no other queue's items. The
// order of a queue is etcd's: its items sorted by create revision.
//   QUEUE_PUSH -> a Put of a new item;
//   QUEUE_POP  -> a Range for the oldest item, then a Txn that deletes it if
//                 it is still there (and counts the queue first, for the
//                 reply); another popper took it: again, until op_timeout;
//   QUEUE_LEN  -> a count-only Range.
// Items are only ever added with higher create revisions than all before, so
// the oldest item seen by the Range is still the oldest when the Txn
// deletes it. A PUSH or a POP whose outcome is unknown (the connection to
// etcd was lost with the call in flight) is an error for the connection,
// never sent again (a second Put could bring back an item popped in between;
// a second delete could pop twice).
//
// Waiting: CHECK and WAIT count a non-empty queue as an existing key; the
// items' own watch (etcd_backend_wait.cc) releases the oldest plain wait on
// the queue's key per pushed item. Across gateways each gateway releases one
// of its own waiters per item, so a blocking pop may find the queue emptied
// by a pop through another gateway (its reply says empty), as with the
// Keyspace when a non-blocking pop races a blocking one.
#include <fmt/format.h>

#include "store/etcd/etcd_backend.h"
#include "store/etcd/etcd_rpc.h"

namespace tcpstore::store {

namespace {

using protocol::appendI64;
using protocol::appendStr;

// Length of an item id: the gateway id (24 hex digits) and 16 hex digits.
constexpr std::size_t kItemIdBytes = 24 + 16;

Status etcdError(std::string_view what, const grpc::Status& s) {
  return Status::ioError(
      fmt::format("etcd {} failed: {}", what, etcd::describe(s)));
}

}  // namespace

std::pair<std::string, std::string> EtcdBackend::queueRange(
    std::string_view full_key) const {
  const std::string_view k = full_key.substr(options_.prefix.size());
  std::string start = queue_prefix_;
  std::uint64_t n = k.size();
  for (int shift = 56; shift >= 0; shift -= 8)
    start.push_back(static_cast<char>((n >> shift) & 0xff));
  start.append(k);
  std::string end = prefixRangeEnd(start);
  return {std::move(start), std::move(end)};
}

std::string EtcdBackend::queueOfItem(std::string_view item) const {
  if (item.size() < queue_prefix_.size() + 8 + kItemIdBytes ||
      item.substr(0, queue_prefix_.size()) != queue_prefix_) {
    return {};
  }
  std::uint64_t n = 0;
  for (std::size_t i = 0; i < 8; ++i) {
    n = (n << 8) | static_cast<unsigned char>(item[queue_prefix_.size() + i]);
  }
  const std::size_t at = queue_prefix_.size() + 8;
  if (n != item.size() - at - kItemIdBytes) return {};
  return full(item.substr(at, n));
}

void EtcdBackend::doQueuePush(ConnId conn, std::string_view key,
                              std::string_view value) {
  std::string item = queueRange(full(key)).first;
  item += gateway_id_;
  item += fmt::format("{:016x}", ++queue_seq_);
  etcdserverpb::TxnRequest txn;
  auto* put = txn.add_success()->mutable_request_put();
  put->set_key(std::move(item));
  put->set_value(std::string(value));
  rpc_->txn(std::move(txn), false,
            [this, conn](const grpc::Status& s, etcdserverpb::TxnResponse&) {
              if (!s.ok()) return fail(conn, etcdError("QUEUE_PUSH", s));
              if (!closed_) host_->complete(conn, Status::ok(), Effects());
            });
}

void EtcdBackend::doQueuePop(ConnId conn, std::string key,
                             std::chrono::steady_clock::time_point deadline) {
  auto [start, end] = queueRange(full(key));
  etcdserverpb::RangeRequest oldest;
  oldest.set_key(start);
  oldest.set_range_end(end);
  oldest.set_limit(1);
  oldest.set_sort_target(etcdserverpb::RangeRequest::CREATE);
  oldest.set_sort_order(etcdserverpb::RangeRequest::ASCEND);
  rpc_->range(
      std::move(oldest),
      [this, conn, key = std::move(key), start = std::move(start),
       end = std::move(end),
       deadline](const grpc::Status& s, etcdserverpb::RangeResponse& resp) {
        if (!s.ok()) return fail(conn, etcdError("QUEUE_POP", s));
        if (resp.kvs_size() == 0) {
          std::string b;
          appendI64(b, 0);
          return reply(conn, std::move(b));
        }
        const auto& kv = resp.kvs(0);
        etcdserverpb::TxnRequest txn;
        auto* cmp = txn.add_compare();
        cmp->set_target(etcdserverpb::Compare::MOD);
        cmp->set_result(etcdserverpb::Compare::EQUAL);
        cmp->set_key(kv.key());
        cmp->set_mod_revision(kv.mod_revision());
        auto* count = txn.add_success()->mutable_request_range();
        count->set_key(start);
        count->set_range_end(end);
        count->set_count_only(true);
        txn.add_success()->mutable_request_delete_range()->set_key(kv.key());
        rpc_->txn(
            std::move(txn), false,
            [this, conn, key, deadline, value = kv.value()](
                const grpc::Status& ts, etcdserverpb::TxnResponse& tr) {
              if (!ts.ok()) return fail(conn, etcdError("QUEUE_POP", ts));
              if (!tr.succeeded()) {
                // Another popper took it: the next oldest.
                if (std::chrono::steady_clock::now() > deadline) {
                  return fail(conn, Status::timeout(
                                        "etcd QUEUE_POP: no item won before "
                                        "the deadline"));
                }
                return doQueuePop(conn, key, deadline);
              }
              if (value.size() > options_.max_value_bytes) {
                return fail(conn, Status::limitExceeded(
                                      "QUEUE_POP value over the value limit"));
              }
              std::string b;
              appendI64(b, tr.responses(0).response_range().count());
              appendStr(b, value);
              reply(conn, std::move(b));
            });
      });
}

void EtcdBackend::doQueueLen(ConnId conn, std::string_view key) {
  auto [start, end] = queueRange(full(key));
  etcdserverpb::RangeRequest r;
  r.set_key(std::move(start));
  r.set_range_end(std::move(end));
  r.set_count_only(true);
  rpc_->range(std::move(r), [this, conn](const grpc::Status& s,
                                         etcdserverpb::RangeResponse& resp) {
    if (!s.ok()) return fail(conn, etcdError("QUEUE_LEN", s));
    std::string b;
    appendI64(b, resp.count());
    reply(conn, std::move(b));
  });
}

}  // namespace tcpstore::store
