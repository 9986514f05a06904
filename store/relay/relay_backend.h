// RelayBackend: the Backend of a relay (tcpstore-server --upstream H:P).
// Every local client connection that sends a request gets a channel on the
// one upstream connection (UpstreamLink), opened lazily (2.x; see
// ensureChannel() for 1.13's WATCH_KEY). Requests are
// re-encoded into REQUEST frames and answer kDone at once; their replies come
// back as DATA and are delivered to the client verbatim, in order, so every
// command keeps exactly the upstream's semantics (WAIT, CANCEL_WAIT, 1.13
// WATCH_KEY, queues, BARRIER, errors). CLOSED closes the client with the
// upstream's reason; a client's disconnect sends CLOSE. VALIDATE is not
// forwarded; PING is answered here when the client owes no reply.
//
// Combining (combiner.h): concurrent ADDs to one key become one upstream ADD
// of the sum, identical GET/CHECK/MULTI_GET sent in one loop turn become
// one; replies tracked per channel (reply_tracker.h) keep every client's
// replies in its request order. Identical WAITs of idle clients share one
// upstream WAIT (wait_share.h).
//
// A client that half-closes gets every reply still in flight (SHUTDOWN, see
// peerHalfClosed()); a client whose replies in flight would overshoot its
// output cap is held (kPending) like a paused connection on a server.
//
// Upstream loss: every client with a channel is closed (its requests may or
// may not have been applied: a clean error, never a guessed reply), new
// requests are refused (closed) until the link is back; the link reconnects
// with backoff (upstream_link.h). See docs/relay.md, "Relay side".
//
// Threads: the Backend contract (loop thread only; open() on the starting
// thread before the loop runs). open() blocks up to connect_timeout_ms.
#pragma once

#include <uv.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "protocol/codec.h"
#include "store/backend.h"
#include "store/relay/relay_options.h"
#include "store/relay/reply_tracker.h"
#include "store/relay/upstream_link.h"

namespace tcpstore::store::relay {

class Combiner;
class WaitShare;

// The 2.x bytes of `req`: those its 2.x client sent (Request::wire), else
// its encoding written into `scratch`. Empty if 2.x has no such command.
// Valid while `req`'s input, or `scratch`, is.
std::string_view encodedV2(const protocol::Request& req, std::string& scratch);

class RelayBackend final : public Backend, private LinkHandler {
 public:
  explicit RelayBackend(RelayOptions options);
  ~RelayBackend() override;
  RelayBackend(const RelayBackend&) = delete;
  RelayBackend& operator=(const RelayBackend&) = delete;

  // Connects to the upstream and checks the preamble echo, blocking up to
  // options.connect_timeout_ms (fail fast: a wrong address or a server that
  // does not speak the extension fails the start with a message saying so),
  // then adds the link and the backend's handles to `loop`.
  Status open(BackendHost& host, uv_loop_s* loop) override;
  Result<Outcome> submit(ConnId conn, const protocol::Request& req,
                         Effects& fx) override;
  void disconnect(ConnId conn) override;
  // A client with replies in flight (or writes not yet known applied) gets
  // SHUTDOWN on its channel and stays pending until the upstream's empty
  // CLOSED: every reply a server would send it is delivered first. Bounded
  // by the upstream: its loss closes the client as any loss does.
  bool peerHalfClosed(ConnId conn) override;
  void close() override;
  // What the relay holds on the heap: shared WAITs' key lists, combined ops
  // in flight, its clients' records and the frames not yet written
  // upstream (an estimate, O(1)).
  std::size_t memoryBytes() const noexcept override;

  const RelayCounters& counters() const noexcept { return counters_; }
  const RelayOptions& options() const noexcept { return options_; }

  // ---- for the Combiner (loop thread) -------------------------------------
  // A new channel of `dialect` on the current link (OPEN written).
  std::uint32_t openChannel(protocol::Dialect dialect, ConnId owner);
  // Closes a relay-owned channel (CLOSE written while the link is up).
  void closeChannel(std::uint32_t channel);
  // Writes REQUEST(channel, request bytes already encoded).
  void writeEncoded(std::uint32_t channel, std::string_view request);
  // Sends `req` on the client's own channel (opened if needed). An error if
  // the command cannot be relayed on it (see ensureChannel()).
  Status tunnel(ConnId conn, const protocol::Request& req);
  // The same for a request already encoded in 2.x (an idle 2.x client).
  // Neither judges the client's output cap: after tunneling a request of a
  // pending client, call continueAfterTunnel().
  void tunnelEncoded(ConnId conn, protocol::Command cmd, std::uint64_t count,
                     std::string_view request);
  // Completes pending `conn` after one of its requests was tunneled (its
  // next request is decoded), unless its replies in flight reach its output
  // cap or the upstream backlog is full: then it stays pending until
  // onPrepare()/onCheck() resume it, as submit() holds a client.
  void continueAfterTunnel(ConnId conn);
  RelayCounters& countersMut() noexcept { return counters_; }
  void dropLink(const Status& why) noexcept { link_.drop(why); }
  BackendHost& host() noexcept { return *host_; }
  bool linkUp() const noexcept { return link_.up(); }
  // Delivers the DATA gathered so far (before a local completion).
  void flushDeliveries() noexcept;

 private:
  struct Client {
    explicit Client(const protocol::Limits& l) : tracker(l) {}
    protocol::Dialect dialect = protocol::Dialect::kV2;  // of `channel`
    bool doomed = false;       // the upstream closed its channel: closing
    bool half_closed = false;  // SHUTDOWN sent: pending until CLOSED
    // Bytes expected per reply owed whose size the data decides (GET,
    // MULTI_GET, ...; 0: none seen yet): the largest recent such reply,
    // halved by each smaller one. See overOutput().
    std::size_t reply_est = 0;
    std::uint32_t channel = 0;
    ReplyTracker tracker;
  };

  // LinkHandler
  bool onFrame(const protocol::mux::Frame& f) override;
  void onReadDone() override;
  void onLinkDown(const Status& why) override;
  void onLinkUp() override;

  static void onCheck(uv_check_t* check) noexcept;
  static void onPrepare(uv_prepare_t* prepare) noexcept;
  // Sends this turn's combined and shared requests, then every frame.
  void sendBatches() noexcept;
  // Completes the held_ clients no longer overOutput().
  void resumeHeld() noexcept;
  static void onCloseTimer(uv_timer_t* timer) noexcept;
  static void onHandleClosed(uv_handle_t* h) noexcept;
  Client& ensureChannel(ConnId conn, Client& c, protocol::Dialect want);
  // Whether `c`'s replies in flight (fixed-size ones at their size, the
  // others at reply_est), plus what the client has not read yet, reach its
  // output cap, or its unsent bytes alone do: a server would have paused it
  // (stopped decoding) before producing more.
  bool overOutput(ConnId conn, const Client& c) const noexcept;
  // After tunneling a request of `c`: holds it (held_ if overOutput(),
  // stalled_ if the upstream backlog is over its bound; `large`: the
  // request's frame was kLargeFrameBytes or more). True if held.
  bool holdAfterTunnel(ConnId conn, const Client& c, bool large);
  Status downError() const;

  RelayOptions options_;
  RelayCounters counters_;
  UpstreamLink link_;
  BackendHost* host_ = nullptr;
  uv_loop_t* loop_ = nullptr;
  uv_check_t* check_ = nullptr;
  uv_prepare_t* prepare_ = nullptr;
  uv_timer_t* close_timer_ = nullptr;
  std::unordered_map<ConnId, std::unique_ptr<Client>> clients_;
  // Channel -> the client that owns it (kShared: the combiner's).
  std::unordered_map<std::uint32_t, ConnId> routes_;
  std::uint32_t next_channel_ = 1;
  Effects deliveries_;
  // Clients whose channel the upstream closed, closed on the next loop turn
  // (after their last DATA has been flushed).
  std::vector<std::pair<ConnId, std::string>> to_close_;
  // Clients left pending because the upstream write backlog was over
  // kMaxBacklogBytes (or kLargeBacklogBytes after a large request of
  // theirs); completed once it has drained to kLargeBacklogBytes / 2.
  std::vector<ConnId> stalled_;
  // Clients left pending because overOutput(); completed by onPrepare once
  // their output and replies in flight are back under the cap.
  std::vector<ConnId> held_;
  std::unique_ptr<Combiner> combiner_;
  std::unique_ptr<WaitShare> waits_;
  bool closed_ = false;

 public:
  static constexpr ConnId kShared = ~ConnId{0};
  static constexpr ConnId kSharedWait = ~ConnId{1};  // WaitShare's channels
  // Bytes queued for the upstream past which a client that sends another
  // request is held (kPending) until they drain: bounds the relay's memory
  // when clients send faster than the upstream takes.
  static constexpr std::size_t kMaxBacklogBytes = 64u << 20;
  // A request whose frame is this large holds its client while the backlog
  // is over kLargeBacklogBytes: one client storing large values cannot put
  // tens of MiB ahead of every other client's small requests (they share
  // the one upstream connection, in order).
  static constexpr std::size_t kLargeFrameBytes = 1u << 20;
  static constexpr std::size_t kLargeBacklogBytes = 4u << 20;
};

}  // namespace tcpstore::store::relay
