// EtcdRpc: a small etcd v3 client for one libuv loop.
//
// gRPC runs its async calls on a CompletionQueue polled by one thread owned
// here; every completion is handed to the loop thread through a mutex-guarded
// list and a uv_async_t, and all callbacks run on the loop thread. Nothing in
// this class blocks the loop except close(), which cancels every call and
// joins the polling thread (bounded: cancelled calls complete at once).
//
// Failover: one channel per endpoint; a call that fails with a transport
// error (UNAVAILABLE, DEADLINE_EXCEEDED, ...) moves the client to the next
// endpoint. Idempotent calls are retried there, with backoff, until the
// operation deadline; the caller of a non-idempotent call gets the error
// (it may or may not have been applied: never retried blindly).
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"
#include "store/etcd/etcd_options.h"

struct uv_loop_s;
struct uv_async_s;

namespace tcpstore::store::etcd {

// Something the polling thread hands to the loop thread.
class Tag {
 public:
  virtual ~Tag() = default;
  // Loop thread. `ok` is the CompletionQueue's flag. Deletes `this` when the
  // tag is finished with (the client never touches it afterwards).
  virtual void onLoop(bool ok) = 0;
  // Any thread, under the client's lock: cancel the call behind the tag.
  virtual void cancel() noexcept = 0;
  bool cq_ok = false;
};

class EtcdRpc {
 public:
  explicit EtcdRpc(const EtcdOptions& options);
  ~EtcdRpc();
  EtcdRpc(const EtcdRpc&) = delete;
  EtcdRpc& operator=(const EtcdRpc&) = delete;

  // Loop thread. Creates the uv_async_t on `loop` and starts polling.
  Status open(uv_loop_s* loop);
  // Loop thread. Cancels all calls, joins the polling thread, drops pending
  // callbacks without running them, and closes the uv_async_t (freed in its
  // close callback). Idempotent.
  void close();
  bool closing() const noexcept { return closing_; }

  template <typename Resp>
  using Done = std::function<void(const grpc::Status&, Resp&)>;

  // Unary calls. `done` runs once on the loop thread (never after close()).
  void range(etcdserverpb::RangeRequest req,
             Done<etcdserverpb::RangeResponse> done);
  void put(etcdserverpb::PutRequest req, Done<etcdserverpb::PutResponse> done);
  // One Range attempt on `endpoint` only, no retry, no failover: tells
  // whether that member still answers linearizable reads (has a leader).
  void probe(std::size_t endpoint, etcdserverpb::RangeRequest req,
             Done<etcdserverpb::RangeResponse> done);
  void deleteRange(etcdserverpb::DeleteRangeRequest req,
                   Done<etcdserverpb::DeleteRangeResponse> done);
  // `idempotent`: true if the Txn may be applied twice with the same effect
  // (a read-only or put-only Txn); compare-and-swap Txns pass false.
  void txn(etcdserverpb::TxnRequest req, bool idempotent,
           Done<etcdserverpb::TxnResponse> done);

  // ---- for the call and watch objects (etcd_rpc.cc, etcd_watch.cc) -------
  const EtcdOptions& options() const noexcept { return options_; }
  grpc::CompletionQueue* cq() noexcept { return &cq_; }
  // The endpoint calls currently go to, and its stubs.
  std::size_t current() const noexcept { return current_; }
  etcdserverpb::KV::Stub& kv(std::size_t i) { return *kv_[i]; }
  etcdserverpb::Watch::Stub& watch(std::size_t i) { return *watch_[i]; }
  const std::string& endpoint(std::size_t i) const { return endpoints_[i]; }
  // A transport error on endpoint `i`: move on to the next one (once).
  void failover(std::size_t i, const grpc::Status& why);
  // Tracks a tag that has an operation outstanding on the queue (cancelled by
  // close()). Loop thread.
  void track(Tag* t);
  void untrack(Tag* t);
  void log(const std::string& line) const;

 private:
  template <typename Req, typename Resp>
  friend class UnaryCall;
  void poll() noexcept;
  void drain() noexcept;

  EtcdOptions options_;
  std::vector<std::string> endpoints_;
  std::vector<std::unique_ptr<etcdserverpb::KV::Stub>> kv_;
  std::vector<std::unique_ptr<etcdserverpb::Watch::Stub>> watch_;
  std::size_t current_ = 0;
  grpc::CompletionQueue cq_;
  std::thread poller_;
  uv_async_s* async_ = nullptr;
  bool closing_ = false;
  bool open_ = false;

  std::mutex mu_;
  std::vector<Tag*> ready_;           // guarded by mu_
  std::unordered_set<Tag*> tracked_;  // guarded by mu_
};

// The channel credentials for `options`: TLS (etcd_options.h) or insecure.
std::shared_ptr<grpc::ChannelCredentials> channelCredentials(
    const EtcdOptions& options);

// True for errors after which the same call may succeed on another endpoint
// or later (the request may or may not have been applied).
bool isTransportError(const grpc::Status& s) noexcept;
// One line describing a failed call.
std::string describe(const grpc::Status& s);

}  // namespace tcpstore::store::etcd
