// Combiner: a relay's request combining. Requests offered in one loop turn
// are batched and sent at the end of the turn (flush(), from the relay's
// uv_check):
// The combiner's channel speaks 2.x (reply bytes do not depend on the
// dialect, and 2.x has every command combined here).
//  - ADD: all ADDs of one key in a batch become one upstream
//    ADD of the sum on a relay-owned channel; the reply V is handed out as
//    V - sum + d1, V - sum + d1 + d2, ..., V: the values the callers would
//    get if their ADDs ran one after another, in the batch's order, at the
//    instant the upstream applied the sum. ADDs that arrive while that key's
//    combined ADD is in flight wait for the next batch. A sum that would
//    overflow int64 is not combined.
//  - GET, CHECK, MULTI_GET: identical requests (same bytes)
//    in one batch are sent once and every caller gets the reply. A request
//    is never attached to an upstream request sent before it arrived, so
//    each caller's read happens inside its own request-reply interval
//    (linearizable). The reply is one shared buffer (store/shared_bytes.h)
//    that every caller's outbox references, never copied per caller.
// A batch of one request goes out on the caller's own channel instead.
//
// Only requests of a client that owes no tunneled reply are offered (the
// relay checks), and an offered request leaves its client pending, so a
// locally completed reply never overtakes an earlier one of the same client.
// Loop thread only.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "protocol/codec.h"
#include "store/relay/reply_tracker.h"
#include "tcpstore/status.h"

namespace tcpstore::store::relay {

class RelayBackend;
using ConnId = std::uint64_t;

class Combiner {
 public:
  explicit Combiner(RelayBackend& relay);
  ~Combiner();

  // Takes `req` of `conn` into this turn's batch if its command combines
  // (the caller answers kPending and waits for host().complete()).
  bool offer(ConnId conn, const protocol::Request& req);
  // Sends this turn's batches.
  void flush();
  // Frames of the combiner's own channels.
  void onData(std::uint32_t channel, std::string_view payload);
  void onClosed(std::uint32_t channel, std::string_view reason);
  // The link is gone: every caller waiting here gets `why`.
  void onLinkDown(const Status& why);
  // Heap bytes of the ops in flight (requests, callers), an estimate,
  // O(1), charged to the server's memory budget through the relay.
  std::size_t memoryBytes() const noexcept { return bytes_; }

 private:
  struct Caller {
    ConnId conn;
    std::int64_t delta;
  };
  // One request sent (or to send) upstream on behalf of several callers.
  struct Op {
    protocol::Command command = protocol::Command::kGet;
    std::uint64_t count = 0;  // MULTI_GET keys
    std::string key;          // ADD: the key (its group)
    std::string request;      // the encoded request (for a re-send)
    std::int64_t sum = 0;
    std::vector<Caller> callers;
    std::size_t charged = 0;  // added to bytes_ while in in_flight_
  };
  struct AddGroup {
    std::vector<Caller> next;
    bool in_flight = false;
  };
  struct Shared {
    std::uint32_t channel = 0;
    std::unique_ptr<ReplyTracker> tracker;
    std::deque<std::uint64_t> ops;  // op ids in send order
  };

  void send(std::uint64_t id);
  void finish(std::uint64_t id, std::string reply);
  void fail(const Op& op, const Status& st);
  // A channel of the pool for the next op: one with nothing in flight, a
  // new one while the pool is under kMaxShared, else the least busy.
  Shared& pick();
  Shared* find(std::uint32_t channel);
  void sendAlone(ConnId conn, const Op& op, std::int64_t delta);
  // The combined ADD of `key` is answered (or failed): its next batch may go.
  void addDone(const std::string& key);
  // Puts `op` in flight as op `n` (charged to bytes_) and sends it.
  void launch(std::uint64_t n, Op op);
  // Takes op `it` out of in_flight_ (uncharged).
  Op retire(std::unordered_map<std::uint64_t, Op>::iterator it);

  RelayBackend& relay_;
  // Batches of this turn, by identity: the encoded request (reads) or the
  // key (ADD).
  std::map<std::string, Op, std::less<>> reads_;
  std::unordered_map<std::string, AddGroup> adds_;
  std::vector<std::string> dirty_adds_;  // groups with a `next` batch
  std::unordered_map<std::uint64_t, Op> in_flight_;
  std::uint64_t next_op_ = 1;
  // The relay's own channels. Several, so that a relay behind this one
  // (which may leave one of these channels' requests pending while it
  // combines them) never holds one op behind another.
  static constexpr std::size_t kMaxShared = 64;
  std::vector<Shared> shared_;
  std::string scratch_;
  std::size_t bytes_ = 0;  // ops in in_flight_
};

}  // namespace tcpstore::store::relay
