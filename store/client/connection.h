// One client connection to a TCPStore server: connect with retry/backoff,
// 2.x handshake, deadline-bounded send and reply decoding. Internal to
// tcpstore::client. Not thread-safe: the owner serializes use.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "protocol/codec.h"
#include "tcpstore/client.h"
#include "tcpstore/status.h"

namespace tcpstore::client_detail {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

// now + d, saturating (a huge timeout means "practically never").
Deadline deadlineAfter(std::chrono::milliseconds d) noexcept;

struct ConnectConfig {
  // At least one; hosts with brackets already stripped. Two or more: the
  // failover mode of client.h ("Several endpoints").
  std::vector<Endpoint> endpoints;
  protocol::Dialect dialect = protocol::Dialect::kV2;
  RetryPolicy retry;
  protocol::Limits limits;
};

// A reply with owned data (the codec's views point into the receive buffer).
struct OwnedReply {
  std::uint8_t byte = 0;
  std::uint32_t u32 = 0;
  std::int64_t number = 0;
  std::string value;
  std::vector<std::string> values;
};

// One connect attempt on one endpoint of several gets at most this long, so
// a frozen server (a stopped process, a host that drops packets) does not
// hold up the others.
inline constexpr std::chrono::milliseconds kEndpointAttempt{2000};

class Connection {
 public:
  // Connects, retrying retryable failures (refused, reset, unreachable, name
  // resolution, failed handshake) with backoff until `deadline`, which it
  // never sleeps past. Several endpoints: one attempt on each per round
  // (at most kEndpointAttempt each), starting with endpoints[first]; the
  // backoff comes after a round that found none.
  static Result<std::unique_ptr<Connection>> open(const ConnectConfig& config,
                                                  Deadline deadline,
                                                  std::size_t first = 0);

  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  protocol::Dialect dialect() const noexcept { return config_.dialect; }

  // Encodes and sends requests (concatenated into one write). Any failure
  // marks the connection broken.
  Status send(const protocol::Request& req, Deadline deadline);
  Status sendBytes(std::string_view bytes, Deadline deadline);
  // Reads one reply. On kTimeout the connection stays intact (nothing
  // consumed beyond whole bytes already buffered) so that the caller can
  // cancel a wait; every other failure marks it broken.
  Status receive(protocol::ReplyShape shape, std::uint64_t count,
                 Deadline deadline, OwnedReply& out);
  // send + receive; any failure (timeouts included) marks it broken.
  Result<OwnedReply> roundTrip(const protocol::Request& req, Deadline deadline,
                               std::uint64_t count = 0);

  bool broken() const noexcept { return broken_; }
  void markBroken() noexcept { broken_ = true; }
  // Broken because the server went away (closed, reset, a socket error),
  // not by a timeout or a bad reply.
  bool lost() const noexcept { return lost_; }
  // Index of its endpoint in ConnectConfig::endpoints.
  std::size_t endpoint() const noexcept { return endpoint_; }
  // True if the connection looks reusable: not broken, nothing unexpected
  // buffered, no EOF/error pending on the socket (a poll(0) check).
  bool idleHealthy();

  std::string peer() const;  // "host:port"

 private:
  Connection(int fd, const ConnectConfig& config, std::size_t endpoint)
      : fd_(fd), config_(config), endpoint_(endpoint) {}
  static Result<std::unique_ptr<Connection>> openOnce(
      const ConnectConfig& config, std::size_t endpoint, Deadline deadline,
      bool& retryable);
  Status handshake(Deadline deadline);
  // Receives at least one more byte into rx_ (poll + recv).
  Status fill(Deadline deadline);
  Status fail(Status s) {
    broken_ = true;
    if (s.isClosed() || s.code() == StatusCode::kIoError) lost_ = true;
    return s;
  }

  int fd_ = -1;
  ConnectConfig config_;
  std::string rx_;
  std::size_t rx_off_ = 0;
  std::size_t endpoint_ = 0;
  bool broken_ = false;
  bool lost_ = false;
};

}  // namespace tcpstore::client_detail
