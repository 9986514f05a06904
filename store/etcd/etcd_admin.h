// Blocking one-shot calls to etcd for the server's command line (never from a
// loop thread): a reachability check at start, and the end of a job's state.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "store/etcd/etcd_options.h"
#include "tcpstore/status.h"

namespace tcpstore::store {

// Asks the members in turn for a linearizable read of one key under the
// prefix (so a member without a leader does not count). OK as soon as one
// answers; otherwise kIoError naming the last failure, after at most
// options.op_timeout. Blocks the calling thread.
Status checkEtcd(const EtcdOptions& options);

// Deletes every key of the job (options.prefix + any key), its queues and the
// marker keys EtcdBackend keeps for it, in one Txn (atomic; deleting is
// idempotent, so it is retried on other members until options.op_timeout).
// Returns the number of keys deleted (0 if the job had none). Errors: kIoError
// if no member answered in time. Run it once the job's ranks are gone: a
// gateway still serving the prefix would see its keys vanish (as if deleted).
// Blocks the calling thread.
Result<std::int64_t> deleteJobKeys(const EtcdOptions& options);

// Deletes the marker keys of one gateway (EtcdBackend's id `gateway_id`),
// trying the members for at most min(options.op_timeout, 2 s); for a
// gateway's orderly shutdown. Blocks the calling thread. Errors: kIoError.
Status deleteGatewayMarkers(const EtcdOptions& options,
                            std::string_view gateway_id);

// The first key of the range holding the marker keys of options.prefix.
std::string markerRangeStart(const EtcdOptions& options);
// The first key of the range holding the queue items of options.prefix
// (EtcdBackend's queues, etcd_backend_queue.cc).
std::string queueRangeStart(const EtcdOptions& options);

}  // namespace tcpstore::store
