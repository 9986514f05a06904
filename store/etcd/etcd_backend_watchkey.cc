// EtcdBackend's 1.13 WATCH_KEY. See etcd_backend.h.
//
// A registration is kept by this gateway (per full key, in order; several
// registrations of one connection on one key each get a copy, as in 1.13)
// and dropped when its connection goes. Notifications come from one more
// prefix watch over the job's keys, asked for previous values (so only jobs
// that use WATCH_KEY pay for them), started at the first WATCH_KEY from the
// revision right after a read made for it; registrations that arrive while
// it starts wait for it, so every change after a registration is notified:
//   Put of a new key (version 1) -> KEY_CREATED, old value empty;
//   Put of an existing key       -> KEY_UPDATED, old value from etcd;
//   Delete                       -> KEY_DELETED, new value empty.
// As the Keyspace does for SET, ADD, COMPARE_SET (when it stores), APPEND,
// MULTI_SET, BARRIER and DELETE_KEY; writes this gateway combines into one
// Put (concurrent SETs of one key) give one notification. If the watch is
// lost, every watching connection is closed with the reason.
#include <fmt/format.h>

#include <algorithm>

#include "store/etcd/etcd_backend.h"
#include "store/etcd/etcd_rpc.h"
#include "store/etcd/etcd_watch.h"

namespace tcpstore::store {

void EtcdBackend::doWatchKey(ConnId conn, std::string_view key) {
  const std::string fk = full(key);
  key_watchers_[fk].push_back(conn);
  conn_watches_[conn].push_back(fk);
  if (key_watch_ != nullptr) {
    Effects fx;
    fx.send(conn, std::string(
                      1, static_cast<char>(protocol::WatchEvent::kRegistered)));
    if (!closed_) host_->complete(conn, Status::ok(), fx);
    return;
  }
  key_watch_pending_.push_back(conn);
  if (key_watch_starting_) return;
  key_watch_starting_ = true;
  // Any read gives the revision to start from.
  etcdserverpb::RangeRequest r;
  r.set_key(options_.prefix);
  r.set_range_end(range_end_);
  r.set_count_only(true);
  rpc_->range(std::move(r), [this](const grpc::Status& s,
                                   etcdserverpb::RangeResponse& resp) {
    key_watch_starting_ = false;
    std::vector<ConnId> pending;
    pending.swap(key_watch_pending_);
    if (!s.ok()) {
      const Status why = Status::ioError(
          fmt::format("etcd WATCH_KEY failed: {}", etcd::describe(s)));
      for (ConnId c : pending) {
        dropWatches(c);
        fail(c, why);
      }
      return;
    }
    key_watch_ = new etcd::PrefixWatch(
        *rpc_, options_.prefix, range_end_, resp.header().revision() + 1,
        [this](const etcdserverpb::WatchResponse& wr) { onKeyEvents(wr); },
        [this](const Status& why) { onKeyWatchLost(why); });
    key_watch_->setPrevKvAndDeletes(true);
    key_watch_->start();
    for (ConnId c : pending) {
      Effects fx;
      fx.send(c, std::string(
                     1, static_cast<char>(protocol::WatchEvent::kRegistered)));
      if (!closed_) host_->complete(c, Status::ok(), fx);
    }
  });
}

void EtcdBackend::onKeyEvents(const etcdserverpb::WatchResponse& resp) {
  Effects fx;
  for (const auto& ev : resp.events()) {
    auto it = key_watchers_.find(ev.kv().key());
    if (it == key_watchers_.end()) continue;
    protocol::WatchEvent type;
    std::string_view old_value;
    std::string_view new_value;
    if (ev.type() == mvccpb::Event::DELETE) {
      type = protocol::WatchEvent::kDeleted;
      old_value = ev.prev_kv().value();
    } else {
      const bool created = ev.kv().version() == 1;
      type = created ? protocol::WatchEvent::kCreated
                     : protocol::WatchEvent::kUpdated;
      if (!created) old_value = ev.prev_kv().value();
      new_value = ev.kv().value();
    }
    std::string b;
    protocol::appendU8(b, static_cast<std::uint8_t>(type));
    protocol::appendStr(
        b, std::string_view(ev.kv().key()).substr(options_.prefix.size()));
    protocol::appendStr(b, old_value);
    protocol::appendStr(b, new_value);
    for (ConnId c : it->second) fx.send(c, b);
  }
  if (!fx.empty() && !closed_) host_->deliver(fx);
}

void EtcdBackend::onKeyWatchLost(const Status& why) {
  key_watch_ = nullptr;  // it frees itself
  rpc_->log(why.message());
  std::vector<ConnId> conns;
  for (const auto& [conn, keys] : conn_watches_) conns.push_back(conn);
  for (ConnId conn : conns) {
    dropWatches(conn);
    if (!closed_) host_->close(conn, why);
  }
}

void EtcdBackend::dropWatches(ConnId conn) {
  key_watch_pending_.erase(
      std::remove(key_watch_pending_.begin(), key_watch_pending_.end(), conn),
      key_watch_pending_.end());
  auto it = conn_watches_.find(conn);
  if (it == conn_watches_.end()) return;
  for (const std::string& k : it->second) {
    auto w = key_watchers_.find(k);
    if (w == key_watchers_.end()) continue;
    auto& v = w->second;
    v.erase(std::remove(v.begin(), v.end(), conn), v.end());
    if (v.empty()) key_watchers_.erase(w);
  }
  conn_watches_.erase(it);
}

}  // namespace tcpstore::store
