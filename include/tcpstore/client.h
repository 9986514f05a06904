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
// Sharing. Clients connected to the same (host, port, dialect) in one process
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
// Timed-out waits. The server does not know client deadlines (protocol.md
// §4.3). In the 2.x dialect the client sends CANCEL_WAIT and absorbs the
// `01`, so the connection stays usable; `00 01` means the wait completed in
// the race, and the call then returns OK. The 1.13 dialect has no cancel: the
// server would later send a stale `00`, so the client closes that connection;
// the next call reconnects lazily. A timed-out short operation (reply not in
// time) also closes its connection. Broken connections are reconnected lazily
// on the next call; a request that may have reached the server is never re-sent
// automatically.
//
// Errors (Status codes, see status.h): kTimeout (a deadline passed), kRefused
// (connect retries exhausted), kClosed (the server closed or reset the
// connection), kIoError, kProtocolError (unexpected reply bytes),
// kInvalidArgument, kNotSupported (the dialect or server lacks the command),
// kNotFound (non-blocking pop of an empty queue).
//
// barrier(name, n) – keys (name mapped like any user key, "/<prefix>name"):
//   - server with BARRIER (ours, torch >= 2.14): one request BARRIER
//     "/<prefix>name" n; the counter at "/<prefix>name" holds the number of
//     arrivals as decimal text;
//   - otherwise (dialect 1.13, or a 2.x server that closed the connection on
//     BARRIER, e.g. torch 2.6; remembered per endpoint): ADD "/<prefix>name" 1
//     -> c; if c >= n, SET "/<prefix>name:done" = "1" and return; else WAIT
//     ["/<prefix>name:done"]. One round of a given name per job: reuse of a
//     name after completion returns at once (as torch 2.14's barrier does).
//     A timed-out barrier leaves its arrival counted (also as torch does).
//     All participants of one barrier must take the same path: on our server
//     a 1.13-dialect participant (fallback) and a 2.x one (BARRIER) do not
//     meet, since BARRIER does not set ":done". (waitForWorkers does mix.)
// waitForWorkers(n) – counts on torch's raw, unprefixed key "init/" (the key
//   every torch TCPStore with world_size sends `ADD init/ 1` to), so tcpstore
//   processes and torch ranks of one job count together:
//   - server with BARRIER: BARRIER "init/" n (it increments the same decimal
//     counter exactly as `ADD init/ 1` does and returns once it is >= n);
//     then GET "init/" to verify the count, because torch >= 2.14 wakes
//     BARRIER waiters on any write of the key, i.e. also on a torch rank's
//     ADD before the count is complete (verified on 2.14; our server
//     releases only at >= n). Count complete: SET raw "init/done" = "1";
//     released early: WAIT ["init/done"].
//   - otherwise: ADD "init/" 1 -> c; if c >= n, SET raw "init/done" = "1"
//     (no leading '/', so torch users never see it; numKeys() counts it);
//     else WAIT ["init/done"].
//   Mixed jobs (torch ranks only send `ADD init/ 1`; they never set
//   "init/done"):
//   - our server re-evaluates BARRIER waiters on every write of their key and
//     releases them once the counter is >= n, so a torch rank may be the last
//     arrival (tested);
//   - torch 2.14: a tcpstore process released early waits for "init/done",
//     which a tcpstore process that later sees the complete count sets; if a
//     torch rank completes the count while no tcpstore process is still in
//     its BARRIER, the early-released ones time out (kTimeout);
//   - on a server without BARRIER, if a torch rank is the last arrival nobody
//     sets "init/done" and the tcpstore waiters time out (kTimeout). If a
//     tcpstore process is last, everyone is released.
// Request cost per participant (no polling, independent of wait time):
//   BARRIER servers: barrier 1 (BARRIER), waitForWorkers 3 (BARRIER, GET,
//   SET; a WAIT instead of the SET if released early);
//   fallback: 2 (ADD + WAIT, or ADD + SET for the last arrival).
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

// Wire dialect spoken by the server (protocol.md: Dialect A / B).
enum class Dialect : std::uint8_t {
  kV113 = 0,  // PyTorch 1.13 servers
  kV2 = 1,    // PyTorch 2.x servers and ours (default)
};

// Exponential backoff between connect attempts: the n-th delay is
// min(max_backoff, initial_backoff * multiplier^n), scaled by a random factor
// in [1 - jitter, 1 + jitter]. Never sleeps past the connect deadline.
struct RetryPolicy {
  std::chrono::milliseconds initial_backoff{100};
  double multiplier = 1.5;
  std::chrono::milliseconds max_backoff{5000};
  double jitter = 0.5;  // fraction, 0 <= jitter <= 1
};

struct ClientOptions {
  // Host name or address; "[::1]" brackets are accepted and stripped.
  std::string host = "127.0.0.1";
  std::uint16_t port = 29500;
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
  // Share connections with other Clients of the same endpoint in this process.
  bool share_connections = true;
};

class Client {
 public:
  using Millis = std::chrono::milliseconds;

  // Connects (with retry, until options.connect_timeout) and returns a handle.
  static Result<Client> connect(const ClientOptions& options);

  // A view like torch's PrefixStore(prefix, *this): keys become
  // prefix + "/" + key before this view's own mapping; shares the
  // connections. No special case for "" (torch maps it to "/" + key too).
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

  Status set(std::string_view key, std::string_view value) const;
  // Waits until the key exists (default timeout), then reads it.
  Result<std::string> get(std::string_view key) const;
  Result<std::string> get(std::string_view key, Millis timeout) const;
  Result<std::int64_t> add(std::string_view key, std::int64_t delta) const;
  // torch semantics (protocol.md §3.6): returns the value now stored, or
  // `expected` if the key is missing and `expected` is non-empty.
  Result<std::string> compareSet(std::string_view key,
                                 std::string_view expected,
                                 std::string_view desired) const;
  // true iff every key exists.
  Result<bool> check(const std::vector<std::string>& keys) const;
  Status wait(const std::vector<std::string>& keys) const;
  Status wait(const std::vector<std::string>& keys, Millis timeout) const;
  // true iff the key existed.
  Result<bool> deleteKey(std::string_view key) const;
  // Number of keys on the server (all of them, like torch).
  Result<std::int64_t> numKeys() const;

  // 2.x only (kNotSupported in the 1.13 dialect, without sending anything).
  Status append(std::string_view key, std::string_view value) const;
  // Waits for all keys (default timeout), then reads them in order.
  Result<std::vector<std::string>> multiGet(
      const std::vector<std::string>& keys) const;
  Status multiSet(const std::vector<std::string>& keys,
                  const std::vector<std::string>& values) const;
  // Queues (our server and torch's libuv backend; torch's classic servers
  // close the connection on these: kNotSupported, remembered per endpoint).
  Status queuePush(std::string_view key, std::string_view value) const;
  // block=true waits (default timeout) until the queue is non-empty;
  // block=false returns kNotFound for an empty queue.
  Result<std::string> queuePop(std::string_view key, bool block = true) const;
  Result<std::int64_t> queueLen(std::string_view key) const;
  // Keys as torch users see them (see the top of this file). Servers without
  // LIST_KEYS (torch 2.6) give kNotSupported, remembered per endpoint.
  Result<std::vector<std::string>> listKeys() const;
  // Round trip with a nonce (2.x).
  Status ping() const;

  // See the top of this file for keys and algorithms. world_size >= 1.
  Status waitForWorkers(std::int64_t world_size) const;
  Status waitForWorkers(std::int64_t world_size, Millis timeout) const;
  Status barrier(std::string_view name, std::int64_t world_size) const;
  Status barrier(std::string_view name, std::int64_t world_size,
                 Millis timeout) const;

  // Number of connections currently open in this handle's connection set
  // (primary + idle pooled + borrowed). For tests and diagnostics.
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
