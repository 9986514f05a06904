// Embedding API of tcpstore-server: run the store server inside a process.
//
// A Server owns one libuv loop thread, which runs every connection and the
// store's state (kept in memory). start() binds and listens before it
// returns (so port() is valid at once); stop() may be called from any thread;
// the destructor stops and joins. Thread-safety: every method is safe from
// any thread except stop() and the destructor from the loop thread itself.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "tcpstore/status.h"

namespace tcpstore {

struct ServerLimits {
  std::uint64_t max_key_bytes = 8 * 1024;           // libuv: 8 KiB
  std::uint64_t max_value_bytes = 8 * 1024 * 1024;  // libuv: 8 MiB
  std::uint64_t max_keys_per_request = 128 * 1024;  // libuv: 128 Ki
  // One request, all fields.
  std::uint64_t max_request_bytes = 256ull * 1024 * 1024;
  // Unsent replies of one connection before it is paused (dropped at twice).
  std::uint64_t max_buffered_output_bytes = 64ull * 1024 * 1024;
  // All connections together: a push the receiver did not ask for (a watch
  // notification, a STOP_WAITING) that would take the server's unsent output
  // past this drops the receiver instead, if it is behind (would hold over
  // 4 KiB unsent). One SET of an 8 MiB value watched by thousands of
  // connections must not queue thousands of copies, nor a flood of small
  // SETs queue notifications for watchers that never read.
  std::uint64_t max_total_output_bytes = 1024ull * 1024 * 1024;
  // A connection paused for output over max_buffered_output_bytes whose
  // replies then make no progress for this long is dropped (0: never).
  // PyTorch clients never get paused: they read every reply.
  std::uint64_t stalled_reader_ms = 30000;
  // A connection holding part of a request (bytes that do not yet make a
  // whole request) that receives no further byte for this long is closed
  // (0: never). A connection with nothing buffered is never closed for being
  // idle (PyTorch clients hold idle connections for hours), nor is one that
  // waits for its own replies to be read. Also bounds how long a connection
  // closed for a protocol error lingers to deliver the replies it was owed.
  std::uint64_t partial_request_ms = 60000;
  // Server-wide memory budget (0: none): input buffers of partial requests,
  // unsent output (replies and pushes), wait/watch registrations and stored
  // keys and values together. Near it (past 15/16) the server stops reading
  // large partial requests, drops the clients that stopped reading and hold
  // the most unsent output, and refuses large requests whose result would
  // cross the line; at the budget itself it refuses every request that would
  // store or register more. A refusal closes the connection with a log line
  // naming peer and reason. Size it as the stored data (keys + values, with
  // ~64 bytes per key) plus ~100 bytes per waited key plus the largest replies
  // in flight, with room to spare: a 100K-rank rendezvous needs tens of MB.
  std::uint64_t max_memory_bytes = 1024ull * 1024 * 1024;
  // Channels open at once on one relay (mux) connection; an OPEN past it is
  // answered CLOSED (counted in ServerCounters::mux_channels_refused).
  std::uint64_t max_mux_channels = std::uint64_t{1} << 20;
};

struct ServerOptions {
  // Address to bind. Empty: dual-stack "::" (falling back to "0.0.0.0").
  std::string host;
  // Port to bind; 0 picks a free one (read it back with port()).
  std::uint16_t port = 29500;
  // Adopt this already-bound socket instead of binding (-1: bind ourselves).
  int listen_fd = -1;
  // If > 0, log join progress of torch's wait_for_workers key "init/".
  std::int64_t world_size = 0;
  // Reuse a running server of this process on the same port (torch's
  // multi_tenant). port 0 never matches.
  bool multi_tenant = false;
  // tcpstore:// jobs: no new rank for this long (ms) logs the job's missing
  // ranks (then every 30 s while it is incomplete).
  std::uint64_t job_stall_ms = 10000;
  ServerLimits limits;
  // COMPARE_SET that stores a value wakes that key's waiters (libuv backend
  // behaviour). false reproduces the classic servers, which leave them hanging.
  bool compare_set_wakes = true;
  // "error", "warn", "info" (default), "debug".
  std::string log_level = "info";
  // Relay mode: "HOST:PORT" ("[ADDR]:PORT" for IPv6) of an upstream
  // tcpstore-server (or relay) that keeps the state; empty: serve from memory.
  // Clients talk to this server exactly as to the upstream (docs/relay.md).
  // start() then blocks until the upstream is connected and has echoed the
  // relay preamble, at most upstream_connect_ms: kRefused or kTimeout if it
  // cannot be reached, kProtocolError if it does not speak the relay
  // extension (a torch server), kInvalidArgument for a malformed address.
  // Later losses close the clients that had requests upstream and reconnect
  // with backoff (50 ms doubling to 2 s, jittered).
  std::string upstream;
  std::uint64_t upstream_connect_ms = 5000;
  // Relay mode: combine concurrent ADDs of one key and coalesce identical
  // concurrent GET/CHECK/MULTI_GET (false: tunnel every request as sent).
  bool upstream_combine = true;
};

// Counters, readable at any time. Per-command counts are indexed by
// protocol::Command (dialect-neutral); see commandName() for names.
struct ServerCounters {
  static constexpr int kCommands = 20;
  std::uint64_t requests[kCommands] = {};
  std::uint64_t requests_total = 0;
  std::uint64_t connections_accepted = 0;
  std::uint64_t connections_closed = 0;
  std::uint64_t connections_open = 0;
  std::uint64_t connections_v113 = 0;  // connections decided as 1.13
  std::uint64_t connections_v2 = 0;    // connections decided as 2.x
  // Connections closed by the server, by reason.
  // Bad bytes (unknown command, bad magic, ...).
  std::uint64_t rejected_protocol = 0;
  // A length/count over a limit, also an APPEND past the value limit or a
  // MULTI_GET/LIST_KEYS reply past the reply limit.
  std::uint64_t rejected_limit = 0;
  // ADD on non-numeric, GET of missing key, ...
  std::uint64_t rejected_semantic = 0;
  // Output cap exceeded, or a large notification past the total budget.
  std::uint64_t rejected_slow_reader = 0;
  // A partial request that made no progress for partial_request_ms.
  std::uint64_t rejected_partial_timeout = 0;
  // A connection paused for the memory budget with part of a request
  // buffered whose peer hung up (the request can never complete).
  std::uint64_t rejected_peer_gone = 0;
  // Times a connection stopped decoding because the loop turn's output
  // budget was spent (its requests continue on a later turn).
  std::uint64_t turn_yields = 0;
  // The most CPU time (microseconds) the loop thread spent in one loop turn
  // (from one check phase to the next) since start: the longest the server
  // itself held every other client up, machine load aside (a gauge).
  std::uint64_t max_turn_cpu_us = 0;
  // Memory budget decisions: requests refused (connection closed), clients
  // dropped for unsent output, and times a connection's reading was paused.
  std::uint64_t budget_refused = 0;
  std::uint64_t budget_dropped = 0;
  std::uint64_t budget_input_paused = 0;
  // Bytes charged to the memory budget, as of the last loop turn (a gauge).
  std::uint64_t memory_bytes = 0;
  // EMFILE/ENFILE and other accept failures.
  std::uint64_t accept_errors = 0;
  // Accepted and closed at once while out of fds.
  std::uint64_t connections_shed = 0;
  std::uint64_t bytes_in = 0;
  std::uint64_t bytes_out = 0;
  // The relay extension (docs/relay.md): connections that sent the mux
  // preamble, and their channels (one per relayed client; a channel's
  // requests are counted in `requests` like a connection's). Refused: an
  // OPEN past max_mux_channels or the memory budget (answered CLOSED).
  std::uint64_t mux_connections = 0;
  std::uint64_t mux_channels_opened = 0;
  std::uint64_t mux_channels_closed = 0;
  std::uint64_t mux_channels_open = 0;
  std::uint64_t mux_channels_refused = 0;
  // Replies queued to a connection as a reference to a buffer built once
  // for many (a cached MULTI_GET/GET reply, a relay's coalesced read), not
  // copied (small ones, and replies to mux channels, are copied and not
  // counted).
  std::uint64_t shared_replies = 0;
  // Relay mode (ServerOptions::upstream; all 0 otherwise). Requests sent on
  // their client's own channel; ADDs answered from a combined upstream ADD
  // (and those upstream ADDs); reads answered from a shared upstream read
  // (and those reads); WAITs taken into a shared WAIT (and the WAITs sent
  // upstream for them); upstream connections lost and re-made; requests
  // refused while the upstream was down.
  std::uint64_t relay_tunneled = 0;
  std::uint64_t relay_combined = 0;
  std::uint64_t relay_upstream_adds = 0;
  std::uint64_t relay_coalesced = 0;
  std::uint64_t relay_upstream_reads = 0;
  std::uint64_t relay_shared_waits = 0;
  std::uint64_t relay_upstream_waits = 0;
  std::uint64_t relay_losses = 0;
  std::uint64_t relay_reconnects = 0;
  std::uint64_t relay_refused = 0;
};

class Server {
 public:
  // Binds, listens and starts the loop thread; blocks only for that. With
  // options.multi_tenant and a live (not stopping) server of this process on
  // options.port, returns that one instead. Errors: kInvalidArgument (an
  // unknown log level, max_buffered_output_bytes 0, a listen_fd that is not
  // a bound TCP socket or is bound to another port), kIoError (cannot
  // resolve, bind or listen: "port P is already in use ..." first; cannot
  // start the thread). On error nothing is left running and an adopted
  // listen_fd is closed only if it had been taken over.
  static Result<std::shared_ptr<Server>> start(const ServerOptions& options);

  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // The bound port (the one picked, for options.port 0). Never blocks.
  std::uint16_t port() const noexcept;
  // "[::]:29500" or "127.0.0.1:29500": the bound address, as printed by the
  // tcpstore-server "listening on" line.
  std::string address() const;

  // Stops accepting, flushes pending replies, closes every connection and
  // ends the loop thread. Idempotent; callable from any thread (not from a
  // loop callback). Returns once the loop has exited and uv_loop_close
  // succeeded (a non-OK status names a leaked handle).
  Status stop();
  // Blocks until the server has stopped (by stop() from another thread).
  void wait();

  // A snapshot of the counters; each is exact, the set is not atomic (a
  // request may be counted in one field and not yet in another). Never blocks.
  ServerCounters counters() const;
  // One-line summary of counters ("requests set=3 get=5 ... conns ...").
  std::string countersLine() const;

  struct Impl;

 private:
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tcpstore
