// EtcdRpc: channels, the polling thread, the loop bridge and unary calls with
// failover. See etcd_rpc.h.
#include "store/etcd/etcd_rpc.h"

#include <fmt/format.h>
#include <grpcpp/alarm.h>
#include <uv.h>

#include <algorithm>
#include <cstdio>

namespace tcpstore::store::etcd {

namespace {

using Clock = std::chrono::system_clock;

// Errors after which the request certainly did not reach etcd's state
// machine: safe to resend even if it is not idempotent.
bool neverApplied(const grpc::Status& s) noexcept {
  if (s.error_code() != grpc::StatusCode::UNAVAILABLE) return false;
  const std::string& m = s.error_message();
  return m.find("failed to connect") != std::string::npos ||
         m.find("Connection refused") != std::string::npos ||
         m.find("etcdserver: no leader") != std::string::npos ||
         m.find("etcdserver: not capable") != std::string::npos;
}

}  // namespace

bool isTransportError(const grpc::Status& s) noexcept {
  switch (s.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::ABORTED:
      return true;
    default:
      return false;
  }
}

std::string describe(const grpc::Status& s) {
  return fmt::format("gRPC status {}: {}", static_cast<int>(s.error_code()),
                     s.error_message());
}

// One unary KV call: its attempts, endpoints and backoff alarms.
template <typename Req, typename Resp>
class UnaryCall final : public Tag {
 public:
  using Prepare = std::unique_ptr<grpc::ClientAsyncResponseReader<Resp>> (
      etcdserverpb::KV::Stub::*)(grpc::ClientContext*, const Req&,
                                 grpc::CompletionQueue*);

  UnaryCall(EtcdRpc& rpc, Prepare prepare, Req req, bool idempotent,
            EtcdRpc::Done<Resp> done, int pinned = -1)
      : rpc_(rpc),
        pinned_(pinned),
        prepare_(prepare),
        req_(std::move(req)),
        idempotent_(idempotent),
        done_(std::move(done)),
        deadline_(Clock::now() + rpc.options().op_timeout),
        backoff_(rpc.options().retry_backoff) {}

  void start() {
    in_backoff_ = false;
    endpoint_ =
        pinned_ >= 0 ? static_cast<std::size_t>(pinned_) : rpc_.current();
    ctx_ = std::make_unique<grpc::ClientContext>();
    ctx_->set_deadline(
        std::min(Clock::now() + rpc_.options().rpc_timeout, deadline_));
    status_ = grpc::Status();
    resp_.Clear();
    reader_ = (rpc_.kv(endpoint_).*prepare_)(ctx_.get(), req_, rpc_.cq());
    reader_->StartCall();
    rpc_.track(this);
    reader_->Finish(&resp_, &status_, this);
  }

  void onLoop(bool ok) override {
    rpc_.untrack(this);
    if (in_backoff_) {
      alarm_.reset();
      if (ok) {
        start();
        return;
      }
      status_ = grpc::Status(grpc::StatusCode::CANCELLED, "retry cancelled");
    } else if (isTransportError(status_) && pinned_ < 0) {
      rpc_.failover(endpoint_, status_);
      const auto now = Clock::now();
      if ((idempotent_ || neverApplied(status_)) &&
          now + backoff_ < deadline_) {
        in_backoff_ = true;
        alarm_ = std::make_unique<grpc::Alarm>();
        rpc_.track(this);
        alarm_->Set(rpc_.cq(), now + backoff_, this);
        backoff_ = std::min(backoff_ * 2, rpc_.options().retry_backoff * 8);
        return;
      }
    }
    done_(status_, resp_);
    delete this;
  }

  void cancel() noexcept override {
    if (in_backoff_) {
      if (alarm_) alarm_->Cancel();
    } else if (ctx_) {
      ctx_->TryCancel();
    }
  }

 private:
  EtcdRpc& rpc_;
  int pinned_;  // >= 0: one attempt on this endpoint only (a probe)
  Prepare prepare_;
  Req req_;
  bool idempotent_;
  EtcdRpc::Done<Resp> done_;
  Clock::time_point deadline_;
  std::chrono::milliseconds backoff_;
  bool in_backoff_ = false;
  std::size_t endpoint_ = 0;
  std::unique_ptr<grpc::ClientContext> ctx_;
  std::unique_ptr<grpc::ClientAsyncResponseReader<Resp>> reader_;
  std::unique_ptr<grpc::Alarm> alarm_;
  Resp resp_;
  grpc::Status status_;
};

std::shared_ptr<grpc::ChannelCredentials> channelCredentials(
    const EtcdOptions& options) {
  if (!options.tls()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = options.ca_pem;
  ssl.pem_private_key = options.key_pem;
  ssl.pem_cert_chain = options.cert_pem;
  return grpc::SslCredentials(ssl);
}

EtcdRpc::EtcdRpc(const EtcdOptions& options) : options_(options) {
  for (const std::string& ep : options_.endpoints) {
    grpc::ChannelArguments args;
    // Reconnect quickly to a member that comes back.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    args.SetInt(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, -1);
    auto ch = grpc::CreateCustomChannel(ep, channelCredentials(options_), args);
    endpoints_.push_back(ep);
    kv_.push_back(etcdserverpb::KV::NewStub(ch));
    watch_.push_back(etcdserverpb::Watch::NewStub(ch));
  }
}

EtcdRpc::~EtcdRpc() {
  if (poller_.joinable()) {
    // close() was not called (a contract breach): stop the thread rather
    // than std::terminate; the uv_async_t is leaked with the loop.
    log("etcd: client destroyed without close()");
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (Tag* t : tracked_) t->cancel();
    }
    closing_ = true;
    cq_.Shutdown();
    poller_.join();
    for (Tag* t : ready_) delete t;
    ready_.clear();
  } else if (!open_) {  // never polled: shut the queue down here
    cq_.Shutdown();
    void* tag = nullptr;
    bool ok = false;
    while (cq_.Next(&tag, &ok)) delete static_cast<Tag*>(tag);
  }
}

Status EtcdRpc::open(uv_loop_s* loop) {
  if (endpoints_.empty()) return Status::invalidArgument("no etcd endpoint");
  auto* a = new uv_async_t;
  int rc = uv_async_init(loop, a, [](uv_async_t* h) noexcept {
    static_cast<EtcdRpc*>(h->data)->drain();
  });
  if (rc != 0) {
    delete a;
    return Status::ioError(std::string("uv_async_init: ") + uv_strerror(rc));
  }
  a->data = this;
  async_ = a;
  open_ = true;
  poller_ = std::thread([this] { poll(); });
  return Status::ok();
}

void EtcdRpc::close() {
  if (closing_) return;
  closing_ = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (Tag* t : tracked_) t->cancel();
  }
  cq_.Shutdown();
  if (poller_.joinable()) poller_.join();
  std::vector<Tag*> left;
  {
    std::lock_guard<std::mutex> lock(mu_);
    left.swap(ready_);
    tracked_.clear();
  }
  for (Tag* t : left) delete t;
  if (async_ != nullptr) {
    uv_close(reinterpret_cast<uv_handle_t*>(async_),
             [](uv_handle_t* h) noexcept {
               delete reinterpret_cast<uv_async_t*>(h);
             });
    async_ = nullptr;
  }
}

void EtcdRpc::poll() noexcept {
  void* tag = nullptr;
  bool ok = false;
  while (cq_.Next(&tag, &ok)) {
    auto* t = static_cast<Tag*>(tag);
    t->cq_ok = ok;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ready_.push_back(t);
    }
    uv_async_send(async_);
  }
}

void EtcdRpc::drain() noexcept {
  std::vector<Tag*> batch;
  {
    std::lock_guard<std::mutex> lock(mu_);
    batch.swap(ready_);
  }
  for (std::size_t i = 0; i < batch.size(); ++i) {
    if (closing_) {
      delete batch[i];
      continue;
    }
    try {
      batch[i]->onLoop(batch[i]->cq_ok);
    } catch (const std::exception& e) {
      log(std::string("etcd: callback failed: ") + e.what());
    }
  }
}

void EtcdRpc::track(Tag* t) {
  std::lock_guard<std::mutex> lock(mu_);
  tracked_.insert(t);
}

void EtcdRpc::untrack(Tag* t) {
  std::lock_guard<std::mutex> lock(mu_);
  tracked_.erase(t);
}

void EtcdRpc::failover(std::size_t i, const grpc::Status& why) {
  if (i != current_ || endpoints_.size() < 2) return;
  current_ = (current_ + 1) % endpoints_.size();
  log(fmt::format("etcd: endpoint {} failed ({}); now using {}", endpoints_[i],
                  describe(why), endpoints_[current_]));
}

void EtcdRpc::log(const std::string& line) const {
  if (options_.log) {
    options_.log(line);
  } else {
    std::fprintf(stderr, "tcpstore etcd: %s\n", line.c_str());
  }
}

void EtcdRpc::range(etcdserverpb::RangeRequest req,
                    Done<etcdserverpb::RangeResponse> done) {
  (new UnaryCall<etcdserverpb::RangeRequest, etcdserverpb::RangeResponse>(
       *this, &etcdserverpb::KV::Stub::PrepareAsyncRange, std::move(req), true,
       std::move(done)))
      ->start();
}

void EtcdRpc::probe(std::size_t endpoint, etcdserverpb::RangeRequest req,
                    Done<etcdserverpb::RangeResponse> done) {
  (new UnaryCall<etcdserverpb::RangeRequest, etcdserverpb::RangeResponse>(
       *this, &etcdserverpb::KV::Stub::PrepareAsyncRange, std::move(req), false,
       std::move(done), static_cast<int>(endpoint)))
      ->start();
}

void EtcdRpc::put(etcdserverpb::PutRequest req,
                  Done<etcdserverpb::PutResponse> done) {
  (new UnaryCall<etcdserverpb::PutRequest, etcdserverpb::PutResponse>(
       *this, &etcdserverpb::KV::Stub::PrepareAsyncPut, std::move(req), true,
       std::move(done)))
      ->start();
}

void EtcdRpc::deleteRange(etcdserverpb::DeleteRangeRequest req,
                          Done<etcdserverpb::DeleteRangeResponse> done) {
  // Not idempotent in its reply (the count of deleted keys).
  (new UnaryCall<etcdserverpb::DeleteRangeRequest,
                 etcdserverpb::DeleteRangeResponse>(
       *this, &etcdserverpb::KV::Stub::PrepareAsyncDeleteRange, std::move(req),
       false, std::move(done)))
      ->start();
}

void EtcdRpc::txn(etcdserverpb::TxnRequest req, bool idempotent,
                  Done<etcdserverpb::TxnResponse> done) {
  (new UnaryCall<etcdserverpb::TxnRequest, etcdserverpb::TxnResponse>(
       *this, &etcdserverpb::KV::Stub::PrepareAsyncTxn, std::move(req),
       idempotent, std::move(done)))
      ->start();
}

}  // namespace tcpstore::store::etcd
