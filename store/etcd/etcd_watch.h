// PrefixWatch: one etcd Watch stream over a key range, resumed from the next
// unseen revision after any stream failure (on the next endpoint), so no
// event is lost across a member's death.
//
// Loop thread only (callbacks too). Created with new, never deleted by its
// user: it lives until EtcdRpc::close(), which cancels and frees it.
#pragma once

#include <grpcpp/alarm.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "store/etcd/etcd_rpc.h"

namespace tcpstore::store::etcd {

class PrefixWatch final : public Tag {
 public:
  // Called with each response that carries events (in revision order).
  using OnEvents = std::function<void(const etcdserverpb::WatchResponse&)>;
  // Called once if the watch cannot go on (its start revision was compacted,
  // or no endpoint accepted it for options().op_timeout); no event follows.
  using OnLost = std::function<void(const Status&)>;

  PrefixWatch(EtcdRpc& rpc, std::string key, std::string range_end,
              std::int64_t start_revision, OnEvents on_events, OnLost on_lost);

  // Replaces the lost callback (before start()).
  void setOnLost(OnLost on_lost) { on_lost_ = std::move(on_lost); }
  // Asks etcd for each event's previous key-value, and for deletions too
  // (without it, puts only). Before start().
  void setPrevKvAndDeletes(bool on) {
    prev_kv_ = on;
    with_deletes_ = on;
  }
  // Opens the stream. Call once.
  void start();
  // Revisions below this have all been delivered.
  std::int64_t nextRevision() const noexcept { return next_rev_; }

  void onLoop(bool ok) override;
  void cancel() noexcept override;
  ~PrefixWatch() override;

  // Liveness (called by the watch's ticker every options().rpc_timeout): a
  // stream stays silent both when nothing is written and when its member
  // froze or lost the cluster; so the member is probed with a linearizable
  // read, and the stream moved to another endpoint if that fails.
  void onTick();

 private:
  class Ticker;
  enum class Phase { kStart, kWrite, kRead, kFinish, kBackoff, kLost };
  void finish();
  void retry(const std::string& why);

  EtcdRpc& rpc_;
  std::string key_;
  std::string range_end_;
  std::int64_t next_rev_;
  OnEvents on_events_;
  OnLost on_lost_;
  Phase phase_ = Phase::kStart;
  std::size_t endpoint_ = 0;
  std::unique_ptr<grpc::ClientContext> ctx_;
  std::unique_ptr<grpc::ClientAsyncReaderWriter<etcdserverpb::WatchRequest,
                                                etcdserverpb::WatchResponse>>
      stream_;
  std::unique_ptr<grpc::Alarm> alarm_;
  etcdserverpb::WatchRequest req_;
  etcdserverpb::WatchResponse resp_;
  grpc::Status status_;
  std::chrono::system_clock::time_point failing_since_{};
  std::chrono::milliseconds backoff_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
  bool ticking_ = false;
  bool probing_ = false;
  bool prev_kv_ = false;
  bool with_deletes_ = false;
};

}  // namespace tcpstore::store::etcd
