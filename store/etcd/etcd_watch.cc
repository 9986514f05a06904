// PrefixWatch's stream state machine. See etcd_watch.h.
#include "store/etcd/etcd_watch.h"

#include <fmt/format.h>
#include <grpcpp/alarm.h>

#include <algorithm>

namespace tcpstore::store::etcd {

using Clock = std::chrono::system_clock;

PrefixWatch::PrefixWatch(EtcdRpc& rpc, std::string key, std::string range_end,
                         std::int64_t start_revision, OnEvents on_events,
                         OnLost on_lost)
    : rpc_(rpc),
      key_(std::move(key)),
      range_end_(std::move(range_end)),
      next_rev_(start_revision),
      on_events_(std::move(on_events)),
      on_lost_(std::move(on_lost)),
      backoff_(rpc.options().retry_backoff) {}

// Re-arms an alarm every rpc_timeout and calls onTick() while the watch
// lives; frees itself once the watch is gone (or at EtcdRpc::close()).
class PrefixWatch::Ticker final : public Tag {
 public:
  Ticker(EtcdRpc& rpc, PrefixWatch* watch, std::shared_ptr<bool> alive)
      : rpc_(rpc), watch_(watch), alive_(std::move(alive)) {}
  void arm() {
    rpc_.track(this);
    alarm_.Set(rpc_.cq(), Clock::now() + rpc_.options().rpc_timeout, this);
  }
  void onLoop(bool ok) override {
    rpc_.untrack(this);
    if (!ok || !*alive_) {
      delete this;
      return;
    }
    watch_->onTick();
    arm();
  }
  void cancel() noexcept override { alarm_.Cancel(); }

 private:
  EtcdRpc& rpc_;
  PrefixWatch* watch_;
  std::shared_ptr<bool> alive_;
  grpc::Alarm alarm_;
};

PrefixWatch::~PrefixWatch() { *alive_ = false; }

void PrefixWatch::onTick() {
  if (phase_ != Phase::kRead || probing_) return;
  probing_ = true;
  etcdserverpb::RangeRequest r;
  r.set_key(key_);
  r.set_limit(1);
  r.set_keys_only(true);
  const std::size_t probed = endpoint_;
  rpc_.probe(probed, std::move(r),
             [this, alive = alive_, probed](const grpc::Status& s,
                                            etcdserverpb::RangeResponse&) {
               if (!*alive) return;
               probing_ = false;
               if (s.ok() || phase_ != Phase::kRead || endpoint_ != probed)
                 return;
               rpc_.log(fmt::format(
                   "etcd: watch member {} does not answer ({}); moving",
                   rpc_.endpoint(probed), describe(s)));
               rpc_.failover(probed, s);
               ctx_->TryCancel();  // the Read fails, then Finish, then retry
             });
}

void PrefixWatch::start() {
  if (!ticking_) {
    ticking_ = true;
    (new Ticker(rpc_, this, alive_))->arm();
  }
  endpoint_ = rpc_.current();
  ctx_ = std::make_unique<grpc::ClientContext>();
  // A member cut off from the leader cancels the stream instead of going
  // silent (etcd's WithRequireLeader).
  ctx_->AddMetadata("hasleader", "true");
  stream_ = rpc_.watch(endpoint_).PrepareAsyncWatch(ctx_.get(), rpc_.cq());
  phase_ = Phase::kStart;
  rpc_.track(this);
  stream_->StartCall(this);
}

void PrefixWatch::cancel() noexcept {
  if (phase_ == Phase::kBackoff) {
    if (alarm_) alarm_->Cancel();
  } else if (ctx_) {
    ctx_->TryCancel();
  }
}

void PrefixWatch::finish() {
  phase_ = Phase::kFinish;
  rpc_.track(this);
  stream_->Finish(&status_, this);
}

void PrefixWatch::retry(const std::string& why) {
  const auto now = Clock::now();
  if (failing_since_ == Clock::time_point{}) failing_since_ = now;
  if (now - failing_since_ > rpc_.options().op_timeout) {
    phase_ = Phase::kLost;
    on_lost_(Status::ioError("etcd watch lost: " + why));
    delete this;  // no operation outstanding
    return;
  }
  rpc_.log(
      fmt::format("etcd: watch on {} from revision {} broke ({}); "
                  "resuming",
                  rpc_.endpoint(endpoint_), next_rev_, why));
  stream_.reset();
  ctx_.reset();
  phase_ = Phase::kBackoff;
  alarm_ = std::make_unique<grpc::Alarm>();
  rpc_.track(this);
  alarm_->Set(rpc_.cq(), now + backoff_, this);
  backoff_ = std::min(backoff_ * 2, rpc_.options().retry_backoff * 8);
}

void PrefixWatch::onLoop(bool ok) {
  rpc_.untrack(this);
  switch (phase_) {
    case Phase::kStart: {
      if (!ok) return finish();
      req_.Clear();
      auto* c = req_.mutable_create_request();
      c->set_key(key_);
      c->set_range_end(range_end_);
      c->set_start_revision(next_rev_);
      c->set_prev_kv(prev_kv_);
      if (!with_deletes_) {
        c->add_filters(etcdserverpb::WatchCreateRequest::NODELETE);
      }
      phase_ = Phase::kWrite;
      rpc_.track(this);
      stream_->Write(req_, this);
      return;
    }
    case Phase::kWrite:
    case Phase::kRead: {
      if (!ok) return finish();
      if (phase_ == Phase::kRead) {
        if (resp_.canceled()) {
          if (resp_.compact_revision() > 0) {
            phase_ = Phase::kLost;
            ctx_->TryCancel();
            on_lost_(Status::ioError(
                fmt::format("etcd watch from revision {} lost: compacted at {}",
                            next_rev_, resp_.compact_revision())));
            delete this;  // no operation outstanding
            return;
          }
          ctx_->TryCancel();
          return finish();
        }
        if (resp_.created()) {
          failing_since_ = {};
          backoff_ = rpc_.options().retry_backoff;
        }
        if (resp_.events_size() > 0) {
          for (const auto& ev : resp_.events())
            next_rev_ = std::max(next_rev_, ev.kv().mod_revision() + 1);
          on_events_(resp_);
        }
      }
      phase_ = Phase::kRead;
      resp_.Clear();
      rpc_.track(this);
      stream_->Read(&resp_, this);
      return;
    }
    case Phase::kFinish:
      rpc_.failover(endpoint_, status_);
      return retry(describe(status_));
    case Phase::kBackoff:
      alarm_.reset();
      if (ok) start();
      return;
    case Phase::kLost:
      return;
  }
}

}  // namespace tcpstore::store::etcd
