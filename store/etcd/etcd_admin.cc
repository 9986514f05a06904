#include "store/etcd/etcd_admin.h"

#include <fmt/format.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"
#include "store/etcd/etcd_rpc.h"

namespace tcpstore::store {
namespace {

using Clock = std::chrono::steady_clock;

// Calls `call(stub, ctx)` on each member in turn until one returns OK or the
// operation deadline passes. Only for idempotent calls.
template <typename Call>
Status eachMember(const EtcdOptions& options, Call call) {
  std::vector<std::unique_ptr<etcdserverpb::KV::Stub>> stubs;
  for (const std::string& ep : options.endpoints) {
    stubs.push_back(etcdserverpb::KV::NewStub(
        grpc::CreateChannel(ep, etcd::channelCredentials(options))));
  }
  const auto until = Clock::now() + options.op_timeout;
  std::string last = "no endpoint";
  auto backoff = options.retry_backoff;
  for (std::size_t i = 0;; ++i) {
    const std::size_t ep = i % stubs.size();
    grpc::ClientContext ctx;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        until - Clock::now());
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::max(std::chrono::milliseconds(1),
                              std::min(options.rpc_timeout, left)));
    grpc::Status st = call(*stubs[ep], ctx);
    if (st.ok()) return Status::ok();
    last = fmt::format("{}: {}", options.endpoints[ep], st.error_message());
    if (Clock::now() >= until) break;
    if (ep + 1 == stubs.size()) {  // every member failed once: pause
      std::this_thread::sleep_for(backoff);
      backoff = std::min(backoff * 2, options.retry_backoff * 8);
    }
  }
  return Status::ioError(fmt::format("etcd not reachable: {}", last));
}

}  // namespace

std::string markerRangeStart(const EtcdOptions& options) {
  // EtcdBackend::markerKey(): the prefix without its '/', then "\0cas/".
  std::string m(options.prefix, 0, options.prefix.size() - 1);
  m.push_back('\0');
  m.append("cas/");
  return m;
}

std::string queueRangeStart(const EtcdOptions& options) {
  std::string q(options.prefix, 0, options.prefix.size() - 1);
  q.push_back('\0');
  q.append("q/");
  return q;
}

Status checkEtcd(const EtcdOptions& options) {
  return eachMember(options,
                    [&](etcdserverpb::KV::Stub& kv, grpc::ClientContext& ctx) {
                      etcdserverpb::RangeRequest req;
                      req.set_key(options.prefix);
                      req.set_count_only(true);
                      etcdserverpb::RangeResponse resp;
                      return kv.Range(&ctx, req, &resp);
                    });
}

Result<std::int64_t> deleteJobKeys(const EtcdOptions& options) {
  std::int64_t deleted = 0;
  const std::string markers = markerRangeStart(options);
  const std::string queues = queueRangeStart(options);
  Status st = eachMember(
      options, [&](etcdserverpb::KV::Stub& kv, grpc::ClientContext& ctx) {
        etcdserverpb::TxnRequest txn;
        for (const std::string& start : {options.prefix, markers, queues}) {
          auto* del = txn.add_success()->mutable_request_delete_range();
          del->set_key(start);
          del->set_range_end(prefixRangeEnd(start));
        }
        etcdserverpb::TxnResponse resp;
        grpc::Status s = kv.Txn(&ctx, txn, &resp);
        if (s.ok()) {
          deleted = 0;
          for (const auto& r : resp.responses()) {
            deleted += r.response_delete_range().deleted();
          }
        }
        return s;
      });
  if (!st.isOk()) return st;
  return deleted;
}

Status deleteGatewayMarkers(const EtcdOptions& options,
                            std::string_view gateway_id) {
  EtcdOptions bounded = options;
  bounded.op_timeout = std::min<std::chrono::milliseconds>(
      options.op_timeout, std::chrono::seconds(2));
  std::string start = markerRangeStart(options);
  start.append(gateway_id).push_back('/');
  return eachMember(bounded,
                    [&](etcdserverpb::KV::Stub& kv, grpc::ClientContext& ctx) {
                      etcdserverpb::DeleteRangeRequest del;
                      del.set_key(start);
                      del.set_range_end(prefixRangeEnd(start));
                      etcdserverpb::DeleteRangeResponse resp;
                      return kv.DeleteRange(&ctx, del, &resp);
                    });
}

}  // namespace tcpstore::store
