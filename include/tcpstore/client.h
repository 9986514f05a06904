// tcpstore::Client: a blocking, thread-safe client of a c10d TCPStore server
// (ours, or PyTorch's own 1.13 / 2.x servers).
//
// Quick start:
//   tcpstore::ClientOptions o;
//   o.host = "127.0.0.1";
//   o.port = 29500;
//   auto c = tcpstore::Client::connect(o);
//   if (!c) return c.error();
//   Status s = c->set("foo", "bar");  // torch's get("foo") gives b"bar"
//   Result<std::string> v = c->get("foo");  // blocks until "foo" exists
//
// Keys on the wire. Exactly as torch's TCPStore writes them, so tcpstore
// clients and torch ranks of one job share keys:
//   - a user key "k" goes out as "/k" (torch's TCPStore key prefix);
//   - withPrefix("pg1") behaves like torch's PrefixStore("pg1", store): key
//     "k" becomes "pg1/k" and then "/pg1/k"; nested views concatenate like
//     nested PrefixStores (withPrefix("a").withPrefix("b"): "/a/b/k"; torch
//     2.x style prefixes ending in '/' give doubled slashes: "/0//k");
//   - numKeys() counts the whole server (unprefixed, like torch);
//   - listKeys() returns keys as torch users see them: raw keys without a
//     leading '/' (e.g. torch's "init/") are dropped and the '/' is stripped;
//     under a prefix view only that view's keys are listed, prefix stripped.
//
// Threads. A Client may be shared by any number of threads (all const
// methods are thread-safe; setTimeout() is the one exception). Short operations
// (set, add, check, ...) share the endpoint's primary connection, one request
// in flight at a time. Blocking operations (get, wait, multiGet, barrier,
// waitForWorkers, blocking queuePop) borrow a dedicated connection from a
// small lazy pool, so a thread blocked in wait() never delays another thread's
// set(). Writes that have no reply (set, append, multiSet, queuePush) are made
// visible to a later blocking read on a pool connection: before such a read
// the client confirms them with one round trip on the primary connection
// (PING in 2.x, an empty CHECK in 1.13), so read-your-writes holds per client.
//
// Sharing. Clients connected to the same (endpoints, dialect) in one process
// share one connection set (a process-wide registry of weak references);
// withPrefix() views share it too. Connect options of the first Client win
// for the shared connections; timeouts are per handle.
//
// Deadlines. Every call has one: `timeout` for waits and blocking reads (or
// the per-call argument), ClientOptions::timeout for replies of short
// operations too (torch has none there; a stalled server would block forever),
// ClientOptions::connect_timeout for (re)connecting. All waiting is poll() on
// the socket against a steady_clock deadline; nothing polls the server.
//
// Timed-out waits. The server does not know client deadlines (docs/protocol.md
// §4.3). In the 2.x dialect the client sends CANCEL_WAIT and absorbs the
// `01`, so the connection stays usable; `00 01` means the wait completed in
// the race, and the call then returns OK. The 1.13 dialect has no cancel: the
// server would later send a stale `00`, so the client closes that connection;
// the next call reconnects lazily. A timed-out short operation (reply not in
// time) also closes its connection. Broken connections are reconnected lazily
// on the next call; a request that may have reached the server is never re-sent
// automatically (except idempotent ones with several endpoints, below).
//
// Several endpoints (failover). ClientOptions::endpoints may list several
// servers of ONE store: tcpstore-server gateways over the same etcd prefix
// (`--backend etcd://...`), never independent in-memory servers (their states
// differ, and nothing here could tell). With two or more:
//   - Connecting tries them in list order, starting with the one that
//     answered last; each attempt is bounded by 2 s (a frozen host does not
//     hold up the others); after a round in which none answered the client
//     backs off (RetryPolicy) and tries again, until the connect deadline.
//   - A connection that is lost (the server closed or reset it, a socket
//     error) makes the next connection start at the next endpoint.
//   - Re-issued: the idempotent operations get, wait, multiGet, check,
//     numKeys, listKeys, ping and queueLen, and the WAIT of the fallback
//     barrier (barrier.cc). When their connection is lost they are sent again
//     on a connection to the next endpoint (a WAIT from the start, so no
//     wake-up is lost: the gateway reads before it watches), at most once per
//     endpoint and within the call's deadline. A get whose key was deleted
//     between its wait and its read (the server closes) waits again.
//   - Not re-issued: set, append, multiSet, queuePush, add, compareSet,
//     deleteKey, queuePop, barrier (BARRIER) and waitForWorkers' count. If
//     their connection is lost after the request went out, they return
//     kClosed with a message that says "outcome unknown": the request may or
//     may not have been applied (a request the server refused by closing,
//     e.g. ADD on a non-numeric value, looks the same). Nothing is applied
//     twice behind the caller's back; whether to retry is the caller's
//     decision. The next call goes to the next endpoint.
//   - Reply-less writes are confirmed: set, append, multiSet and queuePush go
//     out in one write with a PING (1.13: an empty CHECK) and return once its
//     answer came, so OK means applied (one round trip each, instead of none).
// A server that hangs without closing (a stopped process, a partition that
// drops packets) is not detected: calls on it run into their deadlines
// (kTimeout) and are not re-issued. With one endpoint nothing of this
// applies: nothing is re-issued and reply-less writes return once sent.
//
// Errors. Every call returns a Status or Result (status.h); none throws
// (std::bad_alloc aside). Besides the codes listed at each method, any call
// that talks to the server may return:
// clang-format off
//   kTimeout        its deadline passed (connect, reply or wait);
//   kRefused        reconnecting failed: nobody listening, retries exhausted;
//   kClosed         the server closed or reset the connection. A server
//                   closes the connection on a request it refuses (e.g. ADD
//                   on a non-numeric value, a reply over its size limit), so
//                   a refusal also arrives as kClosed; the next call
//                   reconnects;
//   kIoError        another socket error (errno text in the message);
//   kProtocolError  reply bytes that break the grammar, or a reply over
//                   max_value_bytes / max_reply_keys.
// clang-format on
// kInvalidArgument, kNotSupported and kNotFound come only from the methods
// that name them.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tcpstore/status.h"

namespace tcpstore {

namespace client_detail {
// The per-endpoint connection set (store/client/shared.h).
class Shared;
}  // namespace client_detail

// Wire dialect spoken by the server (docs/protocol.md: Dialect A / B).
enum class Dialect : std::uint8_t {
  // PyTorch 1.13 servers.
  kV113 = 0,
  // PyTorch 2.x servers and ours (the default).
  kV2 = 1,
};

// Exponential backoff between connect attempts: the n-th delay is
// min(max_backoff, initial_backoff * multiplier^n), scaled by a random factor
// in [1 - jitter, 1 + jitter]. Never sleeps past the connect deadline.
struct RetryPolicy {
  std::chrono::milliseconds initial_backoff{100};
  double multiplier = 1.5;
  std::chrono::milliseconds max_backoff{5000};
  // A fraction, 0 <= jitter <= 1.
  double jitter = 0.5;
};

// One server address.
struct Endpoint {
  // Host name or address; "[::1]" brackets are accepted and stripped.
  std::string host;
  std::uint16_t port = 0;
};

// Parses "HOST:PORT[,HOST:PORT...]" ("[::1]:PORT" for IPv6 addresses) into
// endpoints, in order. Errors: kInvalidArgument (an empty list or entry, a
// missing host, a port outside 1..65535). Never blocks.
Result<std::vector<Endpoint>> parseEndpoints(std::string_view list);

struct ClientOptions {
  // Host name or address; "[::1]" brackets are accepted and stripped.
  // Ignored if `endpoints` is non-empty.
  std::string host = "127.0.0.1";
  std::uint16_t port = 29500;
  // If non-empty, the servers to use instead of host/port: two or more turn
  // on failover ("Several endpoints" above). Every port must be non-zero.
  std::vector<Endpoint> endpoints;
  Dialect dialect = Dialect::kV2;
  // Default for waits, blocking reads and short-operation replies (torch's
  // store timeout, default 300 s).
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  // Deadline for establishing a connection (including retries and the 2.x
  // handshake).
  std::chrono::milliseconds connect_timeout{std::chrono::seconds(300)};
  RetryPolicy retry;
  // Initial key prefix, as if withPrefix(prefix) had been called ("" = none).
  std::string prefix;
  // Connections kept idle for blocking operations (more are opened on demand
  // and closed when returned).
  std::size_t max_idle_wait_connections = 4;
  // Reply limits (a value or key longer than this is a protocol error).
  std::uint64_t max_value_bytes = 256ull * 1024 * 1024;
  std::uint64_t max_reply_keys = 4ull * 1024 * 1024;
  // Share connections with other Clients of the same endpoint list (and
  // dialect) in this process.
  bool share_connections = true;
};

class Client {
 public:
  using Millis = std::chrono::milliseconds;

  // Connects (with retry, until options.connect_timeout) and returns a handle.
  // With share_connections, reuses this process's connection set for the same
  // (endpoints, dialect) if one exists, after checking its primary
  // connection. Errors: kInvalidArgument (port 0, a negative timeout);
  // kRefused (retries exhausted after a real failure, e.g. nobody listening
  // or a failed 2.x handshake with a 1.13 server); kTimeout (no attempt got
  // an answer); kIoError (a socket error that is not worth retrying). Blocks
  // at most connect_timeout.
  static Result<Client> connect(const ClientOptions& options);

  // A view like torch's PrefixStore(prefix, *this): keys become
  // prefix + "/" + key before this view's own mapping; shares the
  // connections and copies the timeout. No special case for "" (torch maps
  // it to "/" + key too). Never fails, sends nothing.
  Client withPrefix(std::string_view prefix) const;
  // What this view puts between the store's '/' and a user key: "" for none,
  // "pg1/" for withPrefix("pg1"), "b/a/" for withPrefix("b").withPrefix("a").
  const std::string& prefix() const noexcept { return prefix_; }
  Dialect dialect() const noexcept;
  // Changes this handle's default timeout (client-side only, like torch).
  // Not synchronized: do not call it while other threads use this same handle
  // (give each thread its own copy of the handle instead; copies are cheap
  // and share the connections).
  void setTimeout(Millis timeout) noexcept { timeout_ = timeout; }
  Millis timeout() const noexcept { return timeout_; }

  // ---- both dialects ----
  // Short operations: one request on the shared primary connection, waiting
  // at most timeout() for the reply.

  // Stores value at key (creating or replacing it) and wakes its waiters.
  // No reply on the wire: OK means the request was sent, and this client's
  // later reads (on any connection) see it.
  Status set(std::string_view key, std::string_view value) const;
  // Blocks until the key exists (at most timeout(), or `timeout`), then
  // returns its value. Errors: kTimeout if the key did not appear in time
  // (the connection stays usable in 2.x); kClosed if the key was deleted
  // between the wait and the read (the server closes on GET of a missing
  // key).
  Result<std::string> get(std::string_view key) const;
  Result<std::string> get(std::string_view key, Millis timeout) const;
  // Adds delta to the decimal integer stored at key (a missing key counts as
  // 0) and returns the new value (our server wraps around on overflow).
  // A value that is not an integer: the server closes the connection,
  // kClosed.
  Result<std::int64_t> add(std::string_view key, std::int64_t delta) const;
  // torch semantics (docs/protocol.md §3.6): stores `desired` if the key holds
  // `expected` (or is missing and `expected` is empty), and returns the value
  // now stored; if the key is missing and `expected` is non-empty, returns
  // `expected` and stores nothing.
  Result<std::string> compareSet(std::string_view key,
                                 std::string_view expected,
                                 std::string_view desired) const;
  // true iff every key exists now (true for no keys). Does not block.
  Result<bool> check(const std::vector<std::string>& keys) const;
  // Blocks until every key exists (at most timeout(), or `timeout`).
  // Errors: kTimeout; the connection stays usable in 2.x.
  Status wait(const std::vector<std::string>& keys) const;
  Status wait(const std::vector<std::string>& keys, Millis timeout) const;
  // Deletes the key; true iff it existed.
  Result<bool> deleteKey(std::string_view key) const;
  // Number of keys on the whole server (ignores this view's prefix, like
  // torch; includes torch's own keys such as "init/").
  Result<std::int64_t> numKeys() const;

  // ---- 2.x only ----
  // In the 1.13 dialect each of these returns kNotSupported without sending
  // anything.

  // Appends value to the key's value (creating the key). No reply on the
  // wire: as for set().
  Status append(std::string_view key, std::string_view value) const;
  // Blocks until every key exists (at most timeout()), then returns their
  // values in the order of `keys`. Errors: kTimeout.
  Result<std::vector<std::string>> multiGet(
      const std::vector<std::string>& keys) const;
  // Sets keys[i] = values[i] for every i, in one request. No reply on the
  // wire: as for set(). Errors: kInvalidArgument if the sizes differ.
  Status multiSet(const std::vector<std::string>& keys,
                  const std::vector<std::string>& values) const;
  // Round trip with a nonce. Errors: kProtocolError if the echo differs.
  Status ping() const;

  // ---- optional commands ----
  // Not every 2.x server has these. A command whose support is unknown is
  // sent; if the server closes the connection on it while it still accepts
  // connections, the call returns kNotSupported and so does every later call
  // of that command on this endpoint (in this process) without sending.

  // Queues: our server and torch's libuv backend (not torch's classic
  // servers). Appends value to the queue at key; OK means the server took it
  // (confirmed with a PING while support is unknown).
  Status queuePush(std::string_view key, std::string_view value) const;
  // Removes and returns the oldest value of the queue at key. block=true
  // waits (at most timeout()) until the queue is non-empty (kTimeout);
  // block=false returns kNotFound for an empty queue. The first queue call
  // on an endpoint probes with QUEUE_LEN before blocking.
  Result<std::string> queuePop(std::string_view key, bool block = true) const;
  // Number of values in the queue at key (0 for no queue).
  Result<std::int64_t> queueLen(std::string_view key) const;
  // Keys as torch users see them, sorted (see "Keys on the wire" above).
  // Servers without LIST_KEYS (torch 2.6): kNotSupported.
  Result<std::vector<std::string>> listKeys() const;

  // ---- rendezvous ----
  // Both count arrivals on the server and block (at most timeout(), or
  // `timeout`; kTimeout, the arrival stays counted) until world_size
  // participants arrived; world_size < 1 is kInvalidArgument. They use
  // BARRIER where the server has it and ADD + WAIT otherwise; keys, mixing
  // with torch ranks and request counts are described in barrier.cc.

  // Waits for world_size participants on torch's "init/" counter (unprefixed),
  // so tcpstore processes and torch ranks of one job count together.
  Status waitForWorkers(std::int64_t world_size) const;
  Status waitForWorkers(std::int64_t world_size, Millis timeout) const;
  // Waits for world_size arrivals at the barrier `name` (a user key of this
  // view). One round per name: a name reused after completion returns at
  // once.
  Status barrier(std::string_view name, std::int64_t world_size) const;
  Status barrier(std::string_view name, std::int64_t world_size,
                 Millis timeout) const;

  // Number of connections currently open in this handle's connection set
  // (primary + idle pooled + borrowed). For tests and diagnostics; never
  // fails, never blocks on the network.
  std::size_t openConnections() const;

 private:
  Client(std::shared_ptr<client_detail::Shared> shared, std::string prefix,
         Millis timeout);

  std::shared_ptr<client_detail::Shared> shared_;
  // PrefixStore chain, "" or "b/a/".
  std::string prefix_;
  Millis timeout_;
};

}  // namespace tcpstore
