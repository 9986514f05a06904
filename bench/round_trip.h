// What the generator's rank scripts share (init_scenarios, job_slice,
// rendezvous): one round trip of pipelined requests, sent for real or, under
// the echo floor, as one sized-echo message of the same request bytes; and
// torch 2.x's connect retry backoff.
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "bench/loadgen.h"
#include "bench/sized_echo.h"
#include "protocol/codec.h"
#include "protocol/message.h"

namespace tcpstore::bench {

// The requests of one round trip, reused from trip to trip (no allocation
// once warm). Not thread-safe; one per generator loop.
class RoundTrip {
 public:
  // A cleared request appended to the trip.
  protocol::Request& add() {
    if (used_ == reqs_.size()) reqs_.emplace_back();
    protocol::Request& r = reqs_[used_++];
    r.clear();
    return r;
  }

  // Sends the trip on `c` and empties it. Real: each request through
  // loop.send (the last one tagged tag_end, the others tag_part; a
  // MULTI_GET expects one value per key). Echo floor: one message of the
  // same encoded bytes, answered with reply_bytes bytes, tagged tag_end.
  void send(Loop& loop, Conn& c, protocol::Dialect d, bool echo_floor,
            std::uint32_t reply_bytes, std::uint32_t tag_part,
            std::uint32_t tag_end) {
    if (echo_floor) {
      scratch_.clear();
      for (std::size_t k = 0; k < used_; ++k) {
        protocol::encodeRequest(d, reqs_[k], scratch_);
      }
      msg_.clear();
      appendSizedEcho(msg_, static_cast<std::uint32_t>(scratch_.size()),
                      reply_bytes);
      loop.sendRaw(c, msg_, reply_bytes, tag_end);
    } else {
      for (std::size_t k = 0; k < used_; ++k) {
        const protocol::Request& r = reqs_[k];
        loop.send(
            c, d, r, k + 1 == used_ ? tag_end : tag_part,
            r.command == protocol::Command::kMultiGet ? r.keys.size() : 0);
      }
    }
    used_ = 0;
  }

 private:
  std::vector<protocol::Request> reqs_;
  std::size_t used_ = 0;
  std::string scratch_, msg_;
};

// torch 2.x's client retry delay: backoff_s x a jitter in [0.5, 1.5), then
// backoff_s grows 1.5x up to cap_s. Returns the delay in ns.
inline std::int64_t nextRetryDelayNs(double& backoff_s, double cap_s,
                                     std::mt19937_64& rng) {
  std::uniform_real_distribution<double> jitter(0.5, 1.5);
  const double delay = backoff_s * jitter(rng);
  backoff_s = std::min(cap_s, backoff_s * 1.5);
  return static_cast<std::int64_t>(delay * 1e9);
}

}  // namespace tcpstore::bench
