// The captured test vectors (tests/data/tcpstore_vectors.json, embedded at
// build time) and their re-keying: a vector's request with each key moved
// under a run-unique prefix, so the tool can replay it on a shared server and
// still compare the reply byte for byte.
#pragma once

#include <string>
#include <vector>

#include "protocol/wire.h"

namespace tcpstore::conform {

struct Vector {
  std::string op;
  std::string request;                        // raw bytes
  std::string reply;                          // raw bytes ("" = no reply)
  bool after_handshake = false;               // closes entries, 2.x
  std::vector<std::string> verified_against;  // torch versions, or "derived"
};

// `number` is the row number of docs/protocol.md §9.1 (1-based) in the
// request/reply table, or in the "closes" table for closeVector. Throws
// CheckFailure if there is no such row.
const Vector& replyVector(protocol::Dialect d, int number);
const Vector& closeVector(protocol::Dialect d, int number);

// `request` with every key k replaced by prefix + k (prefix + "/" + k if k
// does not start with '/'). Fails the check if the project's codec does not
// re-encode the unmodified request to exactly the same bytes. Requests the
// codec cannot decode (absurd lengths) are returned unchanged.
std::string rekey(protocol::Dialect d, const std::string& request,
                  const std::string& prefix);

}  // namespace tcpstore::conform
