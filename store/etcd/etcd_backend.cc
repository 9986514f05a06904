// EtcdBackend: dispatch and the commands that map to one etcd call. See
// etcd_backend.h. CAS commands: etcd_backend_cas.cc; waits:
// etcd_backend_wait.cc.
#include "store/etcd/etcd_backend.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <random>

#include "store/etcd/etcd_admin.h"
#include "store/etcd/etcd_rpc.h"
#include "store/etcd/etcd_watch.h"

namespace tcpstore::store {

namespace {

using protocol::appendI64;
using protocol::appendStr;
using protocol::appendU32;
using protocol::appendU8;
using protocol::Command;

// etcd's default --max-txn-ops.
constexpr std::size_t kMaxTxnOps = 128;

std::string quoted(std::string_view key) {
  std::string s = "'";
  for (std::size_t i = 0; i < key.size() && i < 64; ++i) {
    auto c = static_cast<unsigned char>(key[i]);
    if (c >= 0x20 && c < 0x7f) {
      s.push_back(static_cast<char>(c));
    } else {
      s += fmt::format("\\x{:02x}", c);
    }
  }
  return s + (key.size() > 64 ? "...'" : "'");
}

Status etcdError(std::string_view what, const grpc::Status& s) {
  return Status::ioError(
      fmt::format("etcd {} failed: {}", what, etcd::describe(s)));
}

}  // namespace

EtcdBackend::EtcdBackend(EtcdOptions options)
    : options_(std::move(options)),
      range_end_(prefixRangeEnd(options_.prefix)),
      queue_prefix_(queueRangeStart(options_)) {
  // Names this backend's marker keys: unique among the gateways of a job.
  std::random_device rd;
  gateway_id_ = fmt::format("{:08x}{:08x}{:08x}", rd(), rd(), rd());
}

EtcdBackend::~EtcdBackend() = default;

Status EtcdBackend::open(BackendHost& host, uv_loop_s* loop) {
  host_ = &host;
  rpc_ = std::make_unique<etcd::EtcdRpc>(options_);
  return rpc_->open(loop);
}

void EtcdBackend::close() {
  if (closed_) return;
  closed_ = true;
  if (rpc_) rpc_->close();
  // This gateway's marker keys serve only its own retries: gone with it
  // (an orderly shutdown; a killed gateway's stay until --delete-prefix).
  // Blocks the loop for at most 2 s, once, at shutdown.
  if (cas_seq_ > 0) {
    Status st = deleteGatewayMarkers(options_, gateway_id_);
    if (!st.isOk() && options_.log) {
      options_.log("etcd: marker keys left behind: " + st.message());
    }
  }
  watch_ = nullptr;  // freed by rpc_->close()
  queue_watch_ = nullptr;
  key_watch_ = nullptr;
  key_watchers_.clear();
  conn_watches_.clear();
  key_watch_pending_.clear();
  waits_.clear();
  waiters_.clear();
  barrier_waits_.clear();
  barrier_waiters_.clear();
  cas_.clear();
}

std::string EtcdBackend::full(std::string_view key) const {
  std::string k;
  k.reserve(options_.prefix.size() + key.size());
  k.append(options_.prefix).append(key);
  return k;
}

void EtcdBackend::fail(ConnId conn, const Status& why) {
  if (closed_) return;
  host_->complete(conn, why, Effects());
}

void EtcdBackend::reply(ConnId conn, std::string bytes) {
  if (closed_) return;
  Effects fx;
  fx.send(conn, bytes);
  host_->complete(conn, Status::ok(), fx);
}

Result<Backend::Outcome> EtcdBackend::submit(ConnId conn,
                                             const protocol::Request& req,
                                             Effects& fx) {
  switch (req.command) {
    case Command::kValidate:
      return Outcome::kDone;
    case Command::kPing:
      appendU32(fx.begin(conn), req.u32);
      fx.end();
      return Outcome::kDone;
    case Command::kCancelWait:
      dropWait(conn);
      dropBarrier(conn);
      appendU8(fx.begin(conn), protocol::kWaitCanceled);
      fx.end();
      return Outcome::kDone;

    case Command::kGet:
      doGet(conn, req.key);
      return Outcome::kPending;
    case Command::kDeleteKey:
      doDelete(conn, req.key);
      return Outcome::kPending;
    case Command::kGetNumKeys:
      doNumKeys(conn);
      return Outcome::kPending;
    case Command::kListKeys:
      doListKeys(conn);
      return Outcome::kPending;
    case Command::kCheck:
      doCheck(conn, req.keys);
      return Outcome::kPending;
    case Command::kMultiGet:
      doMultiGet(conn, req.keys);
      return Outcome::kPending;
    case Command::kMultiSet:
      if (req.keys.size() != req.values.size()) {
        return Status::protocolError(
            fmt::format("MULTI_SET with {} keys but {} values", req.keys.size(),
                        req.values.size()));
      }
      doMultiSet(conn, req);
      return Outcome::kPending;
    case Command::kWait:
      doWait(conn, req.keys);
      return Outcome::kPending;
    case Command::kSet:
    case Command::kAdd:
    case Command::kBarrier:
    case Command::kAppend:
    case Command::kCompareSet: {
      auto op = std::make_unique<CasOp>();
      op->conn = conn;
      op->command = req.command;
      op->key = full(req.key);
      op->value.assign(req.value);
      op->desired.assign(req.desired);
      op->delta = req.command == Command::kBarrier ? 1 : req.number;
      op->world_size = req.number;
      enqueueCas(std::move(op));
      return Outcome::kPending;
    }
    case Command::kQueuePush:
      doQueuePush(conn, req.key, req.value);
      return Outcome::kPending;
    case Command::kQueuePop:
      doQueuePop(conn, std::string(req.key),
                 std::chrono::steady_clock::now() + options_.op_timeout);
      return Outcome::kPending;
    case Command::kQueueLen:
      doQueueLen(conn, req.key);
      return Outcome::kPending;
    case Command::kWatchKey:
      doWatchKey(conn, req.key);
      return Outcome::kPending;
  }
  return Status::protocolError("unknown command");
}

void EtcdBackend::readKeys(std::vector<std::string> keys,
                           std::function<void(const Status&, std::int64_t,
                                              std::vector<const std::string*>)>
                               done,
                           bool with_queues) {
  // Reads `keys` in Txns of at most kMaxTxnOps Ranges; the later Txns read
  // at the first one's revision, so the result is one snapshot. With queues,
  // each key takes two Ranges: its value, and the count of its queue.
  static const std::string kQueued;  // what a key with a queue reads as
  const std::size_t per_txn = with_queues ? kMaxTxnOps / 2 : kMaxTxnOps;
  struct State {
    std::vector<std::string> keys;
    std::vector<std::optional<std::string>> values;
    std::size_t next = 0;
    std::int64_t revision = 0;
    std::function<void(const Status&, std::int64_t,
                       std::vector<const std::string*>)>
        done;
  };
  auto st = std::make_shared<State>();
  st->values.resize(keys.size());
  st->keys = std::move(keys);
  st->done = std::move(done);
  auto step = std::make_shared<std::function<void()>>();
  *step = [this, st, step, with_queues, per_txn] {
    if (st->next >= st->keys.size()) {
      std::vector<const std::string*> out;
      out.reserve(st->values.size());
      for (auto& v : st->values) out.push_back(v ? &*v : nullptr);
      // Runs inside *step: keep what is needed before freeing it.
      auto keep_st = st;  // `out` points into it
      auto done_fn = std::move(keep_st->done);
      const std::int64_t revision = keep_st->revision;
      auto self = step;
      *self = nullptr;  // breaks the cycle; the captures are gone from here
      done_fn(Status::ok(), revision, std::move(out));
      return;
    }
    etcdserverpb::TxnRequest txn;
    const std::size_t first = st->next;
    const std::size_t last = std::min(st->keys.size(), first + per_txn);
    const std::size_t width = with_queues ? 2 : 1;
    for (std::size_t i = first; i < last; ++i) {
      auto* r = txn.add_success()->mutable_request_range();
      r->set_key(st->keys[i]);
      r->set_revision(st->revision);
      if (with_queues) {
        auto [qb, qe] = queueRange(st->keys[i]);
        auto* q = txn.add_success()->mutable_request_range();
        q->set_key(std::move(qb));
        q->set_range_end(std::move(qe));
        q->set_count_only(true);
        q->set_revision(st->revision);
      }
    }
    rpc_->txn(
        std::move(txn), true,
        [st, step, first, last, width](const grpc::Status& s,
                                       etcdserverpb::TxnResponse& resp) {
          if (!s.ok() || resp.responses_size() !=
                             static_cast<int>((last - first) * width)) {
            auto done_fn = std::move(st->done);
            *step = nullptr;
            done_fn(s.ok() ? Status::ioError("etcd read: short Txn")
                           : etcdError("read", s),
                    0, {});
            return;
          }
          if (st->revision == 0) st->revision = resp.header().revision();
          for (std::size_t i = first; i < last; ++i) {
            const int at = static_cast<int>((i - first) * width);
            const auto& rr = resp.responses(at).response_range();
            if (rr.kvs_size() > 0) {
              st->values[i] = rr.kvs(0).value();
            } else if (width == 2 &&
                       resp.responses(at + 1).response_range().count() > 0) {
              st->values[i] = kQueued;
            }
          }
          st->next = last;
          (*step)();
        });
  };
  (*step)();
}

void EtcdBackend::doGet(ConnId conn, std::string_view key) {
  readKeys({full(key)}, [this, conn, k = std::string(key)](
                            const Status& st, std::int64_t,
                            std::vector<const std::string*> values) {
    if (!st.isOk()) return fail(conn, st);
    if (values[0] == nullptr && !options_.get_missing_returns_empty)
      return fail(conn,
                  Status::protocolError("GET of missing key " + quoted(k)));
    std::string b;
    appendStr(b, values[0] == nullptr ? std::string_view() : *values[0]);
    reply(conn, std::move(b));
  });
}

void EtcdBackend::doDelete(ConnId conn, std::string_view key) {
  etcdserverpb::DeleteRangeRequest del;
  del.set_key(full(key));
  rpc_->deleteRange(std::move(del),
                    [this, conn](const grpc::Status& s,
                                 etcdserverpb::DeleteRangeResponse& r) {
                      if (!s.ok())
                        return fail(conn, etcdError("DELETE_KEY", s));
                      std::string b;
                      appendI64(b, r.deleted() > 0 ? 1 : 0);
                      reply(conn, std::move(b));
                    });
}

void EtcdBackend::doNumKeys(ConnId conn) {
  etcdserverpb::RangeRequest r;
  r.set_key(options_.prefix);
  r.set_range_end(range_end_);
  r.set_count_only(true);
  rpc_->range(std::move(r), [this, conn](const grpc::Status& s,
                                         etcdserverpb::RangeResponse& resp) {
    if (!s.ok()) return fail(conn, etcdError("GETNUMKEYS", s));
    std::string b;
    appendI64(b, resp.count());
    reply(conn, std::move(b));
  });
}

void EtcdBackend::doListKeys(ConnId conn) {
  etcdserverpb::RangeRequest r;
  r.set_key(options_.prefix);
  r.set_range_end(range_end_);
  r.set_keys_only(true);
  rpc_->range(std::move(r), [this, conn](const grpc::Status& s,
                                         etcdserverpb::RangeResponse& resp) {
    if (!s.ok()) return fail(conn, etcdError("LIST_KEYS", s));
    const std::size_t strip = options_.prefix.size();
    std::uint64_t total = 8;
    for (const auto& kv : resp.kvs()) total += 8 + kv.key().size() - strip;
    if (total > options_.max_reply_bytes) {
      return fail(conn, Status::limitExceeded(fmt::format(
                            "LIST_KEYS reply of {} bytes is over the limit {}",
                            total, options_.max_reply_bytes)));
    }
    std::string b;
    appendI64(b, resp.kvs_size());
    for (const auto& kv : resp.kvs())
      appendStr(b, std::string_view(kv.key()).substr(strip));
    reply(conn, std::move(b));
  });
}

void EtcdBackend::doCheck(ConnId conn,
                          const std::vector<std::string_view>& keys) {
  std::vector<std::string> full_keys;
  for (auto k : keys) full_keys.push_back(full(k));
  readKeys(
      std::move(full_keys),
      [this, conn](const Status& st, std::int64_t,
                   std::vector<const std::string*> values) {
        if (!st.isOk()) return fail(conn, st);
        const bool all =
            std::all_of(values.begin(), values.end(),
                        [](const std::string* v) { return v != nullptr; });
        std::string b;
        appendU8(b, all ? protocol::kCheckReady : protocol::kCheckNotReady);
        reply(conn, std::move(b));
      },
      /*with_queues=*/true);
}

void EtcdBackend::doMultiGet(ConnId conn,
                             const std::vector<std::string_view>& keys) {
  std::vector<std::string> full_keys;
  for (auto k : keys) full_keys.push_back(full(k));
  readKeys(
      std::move(full_keys),
      [this, conn, names = std::vector<std::string>(keys.begin(), keys.end())](
          const Status& st, std::int64_t,
          std::vector<const std::string*> values) {
        if (!st.isOk()) return fail(conn, st);
        std::uint64_t total = 0;
        for (std::size_t i = 0; i < values.size(); ++i) {
          if (values[i] == nullptr && !options_.get_missing_returns_empty) {
            return fail(conn,
                        Status::protocolError("MULTI_GET of missing key " +
                                              quoted(names[i])));
          }
          total += 8 + (values[i] == nullptr ? 0 : values[i]->size());
        }
        if (total > options_.max_reply_bytes) {
          return fail(conn, Status::limitExceeded(fmt::format(
                                "MULTI_GET reply of {} bytes is over the "
                                "limit {}",
                                total, options_.max_reply_bytes)));
        }
        std::string b;
        b.reserve(total);
        for (const std::string* v : values)
          appendStr(b, v == nullptr ? std::string_view() : *v);
        reply(conn, std::move(b));
      });
}

void EtcdBackend::doMultiSet(ConnId conn, const protocol::Request& req) {
  // One Put per distinct key, the last value winning (etcd refuses a Txn
  // that names a key twice), in Txns of at most kMaxTxnOps Puts.
  std::unordered_map<std::string_view, std::size_t> last;
  for (std::size_t i = 0; i < req.keys.size(); ++i) last[req.keys[i]] = i;
  auto txns = std::make_shared<std::vector<etcdserverpb::TxnRequest>>();
  for (std::size_t i = 0; i < req.keys.size(); ++i) {
    if (last[req.keys[i]] != i) continue;
    if (txns->empty() ||
        static_cast<std::size_t>(txns->back().success_size()) >= kMaxTxnOps)
      txns->emplace_back();
    auto* p = txns->back().add_success()->mutable_request_put();
    p->set_key(full(req.keys[i]));
    p->set_value(std::string(req.values[i]));
  }
  auto step = std::make_shared<std::function<void(std::size_t)>>();
  *step = [this, conn, txns, step](std::size_t i) {
    if (i >= txns->size()) {
      // Runs inside *step: copy the captures before freeing it.
      auto* self = this;
      const ConnId c = conn;
      auto keep = step;
      *keep = nullptr;
      if (!self->closed_) self->host_->complete(c, Status::ok(), Effects());
      return;
    }
    // Not retried after an unknown outcome (a blind Put retry could apply
    // after later writes): the connection gets an error instead.
    rpc_->txn(std::move((*txns)[i]), false,
              [this, conn, step, i](const grpc::Status& s,
                                    etcdserverpb::TxnResponse&) {
                if (!s.ok()) {
                  *step = nullptr;
                  return fail(conn, etcdError("MULTI_SET", s));
                }
                (*step)(i + 1);
              });
  };
  (*step)(0);
}

}  // namespace tcpstore::store
