// EtcdOptions: where the etcd backend keeps a job's state, and how it talks
// to etcd. parseEtcdUrl() reads them from the server's --backend argument.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "tcpstore/status.h"

namespace tcpstore::store {

struct EtcdOptions {
  // "HOST:PORT" of each etcd member (client URLs, plain HTTP/2). Calls go to
  // one of them at a time; on a transport error the next one is tried.
  std::vector<std::string> endpoints;
  // Every store key K is kept in etcd as prefix + K. Jobs sharing one etcd
  // use different prefixes; GETNUMKEYS counts the keys under this prefix.
  // Ends with '/'.
  std::string prefix = "/tcpstore/";
  // Deadline of one gRPC call (one attempt on one endpoint).
  std::chrono::milliseconds rpc_timeout{2000};
  // Deadline of one store operation over all its attempts and endpoints;
  // past it the connection that asked is closed with an error.
  std::chrono::milliseconds op_timeout{20000};
  // Pause before retrying after a transport error (doubles up to 8x).
  std::chrono::milliseconds retry_backoff{50};
  // Combine concurrent ADDs to one key into one Txn (etcd_backend_cas.cc).
  // Off only to measure what combining buys (bench/README.md): each ADD is
  // then its own Txn.
  bool combine_adds = true;
  // TLS to etcd (etcd's --cert-file / --trusted-ca-file): PEM text, read by
  // parseEtcdUrl from the files its parameters name. A non-empty ca_pem
  // turns TLS on (server verified against it; its certificate must name the
  // endpoint's host); cert_pem and key_pem together are the client
  // certificate (for etcd's --client-cert-auth). Empty: plain HTTP/2.
  std::string ca_pem;
  std::string cert_pem;
  std::string key_pem;
  bool tls() const noexcept { return !ca_pem.empty(); }
  // Same meaning as the KeyspaceOptions fields of the same names.
  bool get_missing_returns_empty = false;
  std::uint64_t max_value_bytes = UINT64_MAX;
  std::uint64_t max_reply_bytes = UINT64_MAX;
  // Where the backend writes its log lines (one line, no newline). Default:
  // stderr. Called on the server's loop thread.
  std::function<void(std::string_view)> log;
};

// Parses "etcd://HOST:PORT[,HOST:PORT...][/PREFIX][?NAME=VALUE[&...]]".
// PREFIX (any bytes but '?'; empty segments are kept as given) becomes
// "/PREFIX/"; without it the prefix is "/tcpstore/". Parameters:
//   op-timeout-ms=N   op_timeout (1..3600000)
//   rpc-timeout-ms=N  rpc_timeout (1..3600000)
//   combine-adds=0|1  combine_adds
//   cacert=PATH       TLS: the CA that signed the members' certificates
//   cert=PATH, key=PATH  TLS: this client's certificate and key (both or
//                     neither; only with cacert)
// (a PATH may contain '/', not '&'). Other fields keep their defaults.
// Errors (kInvalidArgument): another scheme, no endpoint, an endpoint without
// a port or with a port outside 1..65535, an unknown parameter or a bad
// value, a PEM file that cannot be read or is empty. Reads the PEM files
// (blocking; at start).
Result<EtcdOptions> parseEtcdUrl(std::string_view url);

// The exclusive end of the etcd range holding every key that starts with
// `prefix` ("\0" = to the end of the keyspace if no such end exists).
std::string prefixRangeEnd(std::string_view prefix);

}  // namespace tcpstore::store
