// EtcdBackend's WAIT: a snapshot read, then one prefix watch per backend
// that releases local waiters. See etcd_backend.h.
//
// Why no write is missed: a wait reads its keys at revision R (linearizable,
// so R covers every write the watch had delivered when the read was sent).
// Writes after R reach the wait either through the watch (it covers every
// revision from its start, which is at most R + 1, else the read is redone),
// or, if the watch delivered them while the read was in flight, through
// put_rev_.
#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "store/etcd/etcd_backend.h"
#include "store/etcd/etcd_numbers.h"
#include "store/etcd/etcd_rpc.h"
#include "store/etcd/etcd_watch.h"

namespace tcpstore::store {

void EtcdBackend::doWait(ConnId conn,
                         const std::vector<std::string_view>& keys) {
  // One pending plain wait per connection, as the Keyspace: a new WAIT
  // replaces the previous one silently.
  dropWait(conn);
  const std::uint64_t id = next_wait_id_++;
  waits_[conn].id = id;  // keys filled in once the read says what is missing
  std::vector<std::string> full_keys;
  full_keys.reserve(keys.size());
  for (auto k : keys) full_keys.push_back(full(k));
  std::sort(full_keys.begin(), full_keys.end());
  full_keys.erase(std::unique(full_keys.begin(), full_keys.end()),
                  full_keys.end());
  readForWait(conn, id, std::move(full_keys));
}

void EtcdBackend::readForWait(ConnId conn, std::uint64_t id,
                              std::vector<std::string> keys) {
  ++wait_reads_;
  auto names = std::make_shared<std::vector<std::string>>(keys);
  readKeys(
      std::move(keys),
      [this, conn, id, names](const Status& st, std::int64_t rev,
                              std::vector<const std::string*> values) {
        auto it = waits_.find(conn);
        const bool live = it != waits_.end() && it->second.id == id;
        // put_rev_ is consulted before it may be cleared: a Put the
        // watch delivered while this read was in flight counts.
        std::vector<std::string> missing;
        if (live && st.isOk()) {
          for (std::size_t i = 0; i < values.size(); ++i) {
            if (values[i] != nullptr) continue;
            auto seen = put_rev_.find((*names)[i]);
            if (seen != put_rev_.end() && seen->second > rev) continue;
            missing.push_back((*names)[i]);
          }
        }
        if (--wait_reads_ == 0) put_rev_.clear();
        if (!live) return;  // dropped
        if (!st.isOk()) {
          waits_.erase(it);
          return fail(conn, st);
        }
        if (missing.empty()) {
          waits_.erase(it);
          std::string b(1, static_cast<char>(protocol::kStopWaiting));
          return reply(conn, std::move(b));
        }
        if (!ensureWatch(rev)) {
          // Read before the watch began: writes in between were never
          // seen.
          return readForWait(conn, id, std::move(missing));
        }
        for (const std::string& k : missing) waiters_[k].insert(conn);
        it->second.keys.insert(missing.begin(), missing.end());
        if (!closed_) host_->complete(conn, Status::ok(), Effects());
      },
      /*with_queues=*/true);
}

bool EtcdBackend::ensureWatch(std::int64_t revision) {
  // Two streams, the job's keys and its queue items, each covering every
  // revision from its start on; a read at `revision` is covered if both
  // start at most one revision after it. A missing one starts right after.
  bool covered = true;
  if (watch_ != nullptr) {
    covered = revision + 1 >= watch_start_;
  } else {
    watch_start_ = revision + 1;
    watch_ = startWatch(options_.prefix, range_end_, watch_start_, false);
  }
  if (queue_watch_ != nullptr) {
    covered = covered && revision + 1 >= queue_watch_start_;
  } else {
    queue_watch_start_ = revision + 1;
    queue_watch_ = startWatch(queue_prefix_, prefixRangeEnd(queue_prefix_),
                              queue_watch_start_, true);
  }
  return covered;
}

etcd::PrefixWatch* EtcdBackend::startWatch(std::string key,
                                           std::string range_end,
                                           std::int64_t start, bool queues) {
  auto* w = new etcd::PrefixWatch(
      *rpc_, std::move(key), std::move(range_end), start,
      [this, queues](const etcdserverpb::WatchResponse& resp) {
        std::vector<WatchPut> puts;
        for (const auto& ev : resp.events()) {
          if (ev.type() != mvccpb::Event::PUT) continue;
          WatchPut p;
          p.revision = ev.kv().mod_revision();
          if (queues) {
            p.key = queueOfItem(ev.kv().key());
            if (p.key.empty()) continue;
            p.queue_push = true;
          } else {
            p.key = ev.kv().key();
            if (barrier_waiters_.count(p.key) != 0) p.value = ev.kv().value();
          }
          puts.push_back(std::move(p));
        }
        onWatchPuts(puts);
      },
      nullptr);
  // The lost callback names its watch, so a lost stream is told apart from
  // its replacement.
  w->setOnLost([this, w](const Status& why) { onWatchLost(w, why); });
  w->start();
  return w;
}

void EtcdBackend::registerBarrier(ConnId conn, const std::string& key,
                                  std::int64_t world_size) {
  dropBarrier(conn);
  const std::uint64_t id = next_wait_id_++;
  barrier_waits_[conn] = BarrierWait{id, key, world_size};
  barrier_waiters_[key].insert(conn);
  // Registered first, then read: a later write is either in the read or
  // delivered by the watch afterwards (once the watch covers the read's
  // revision onwards).
  checkBarrier(conn, id, key);
}

void EtcdBackend::checkBarrier(ConnId conn, std::uint64_t id, std::string key) {
  readKeys({key}, [this, conn, id, key](
                      const Status& st, std::int64_t rev,
                      std::vector<const std::string*> values) {
    auto it = barrier_waits_.find(conn);
    if (it == barrier_waits_.end() || it->second.id != id) return;
    if (!st.isOk()) {
      dropBarrier(conn);
      if (!closed_) host_->close(conn, st);
      return;
    }
    if (values[0] != nullptr &&
        etcd::parsesAtLeast(*values[0], it->second.world_size)) {
      dropBarrier(conn);
      Effects fx;
      fx.send(conn, std::string(1, static_cast<char>(protocol::kStopWaiting)));
      if (!closed_) host_->deliver(fx);
      return;
    }
    if (!ensureWatch(rev)) checkBarrier(conn, id, key);
  });
}

void EtcdBackend::dropBarrier(ConnId conn) {
  auto it = barrier_waits_.find(conn);
  if (it == barrier_waits_.end()) return;
  auto w = barrier_waiters_.find(it->second.key);
  if (w != barrier_waiters_.end()) {
    w->second.erase(conn);
    if (w->second.empty()) barrier_waiters_.erase(w);
  }
  barrier_waits_.erase(it);
}

void EtcdBackend::onWatchPuts(const std::vector<WatchPut>& puts) {
  Effects fx;
  for (const auto& [key, rev, value, queue_push] : puts) {
    auto bw = barrier_waiters_.find(key);
    if (bw != barrier_waiters_.end() && !queue_push) {
      std::vector<ConnId> released;
      for (ConnId conn : bw->second) {
        auto it = barrier_waits_.find(conn);
        if (it != barrier_waits_.end() &&
            etcd::parsesAtLeast(value, it->second.world_size))
          released.push_back(conn);
      }
      for (ConnId conn : released) {
        dropBarrier(conn);
        fx.send(conn,
                std::string(1, static_cast<char>(protocol::kStopWaiting)));
      }
    }
    if (wait_reads_ > 0) {
      auto& r = put_rev_[key];
      r = std::max(r, rev);
    }
    auto w = waiters_.find(key);
    if (w == waiters_.end()) continue;
    if (queue_push) {
      // The oldest plain wait on the key (smallest id) takes the item.
      ConnId oldest = 0;
      std::uint64_t oldest_id = UINT64_MAX;
      for (ConnId conn : w->second) {
        auto it = waits_.find(conn);
        if (it != waits_.end() && it->second.id < oldest_id) {
          oldest = conn;
          oldest_id = it->second.id;
        }
      }
      w->second.erase(oldest);
      auto it = waits_.find(oldest);
      if (it != waits_.end()) {
        it->second.keys.erase(key);
        if (it->second.keys.empty()) {
          waits_.erase(it);
          fx.send(oldest,
                  std::string(1, static_cast<char>(protocol::kStopWaiting)));
        }
      }
      if (w->second.empty()) waiters_.erase(w);
      continue;
    }
    for (ConnId conn : w->second) {
      auto it = waits_.find(conn);
      if (it == waits_.end()) continue;
      it->second.keys.erase(key);
      if (it->second.keys.empty()) {
        waits_.erase(it);
        fx.send(conn,
                std::string(1, static_cast<char>(protocol::kStopWaiting)));
      }
    }
    waiters_.erase(w);
  }
  if (!fx.empty() && !closed_) host_->deliver(fx);
}

void EtcdBackend::onWatchLost(etcd::PrefixWatch* which, const Status& why) {
  // It frees itself.
  if (which == watch_) watch_ = nullptr;
  if (which == queue_watch_) queue_watch_ = nullptr;
  rpc_->log(why.message());
  std::set<ConnId> conns;
  for (auto& [conn, w] : waits_) {
    if (!w.keys.empty()) conns.insert(conn);
  }
  for (auto& [conn, w] : barrier_waits_) conns.insert(conn);
  for (ConnId conn : conns) {
    dropWait(conn);
    dropBarrier(conn);
    if (!closed_) host_->close(conn, why);
  }
}

void EtcdBackend::dropWait(ConnId conn) {
  auto it = waits_.find(conn);
  if (it == waits_.end()) return;
  for (const std::string& k : it->second.keys) {
    auto w = waiters_.find(k);
    if (w == waiters_.end()) continue;
    w->second.erase(conn);
    if (w->second.empty()) waiters_.erase(w);
  }
  waits_.erase(it);
}

void EtcdBackend::disconnect(ConnId conn) {
  dropWait(conn);
  dropBarrier(conn);
  dropWatches(conn);
}

}  // namespace tcpstore::store
