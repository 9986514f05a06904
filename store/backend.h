// Backend: the seam between the server's dispatch and the state it serves.
//
// The dispatcher decodes requests, hands each one to a Backend, and routes
// the Effects it gets back to the connections' outboxes. It never knows
// which backend it talks to. Three kinds are planned:
//  - in memory: the Keyspace; answers every request inside submit();
//  - relay: forwards to an upstream tcpstore-server and answers after a
//    network round trip; waiters are released by upstream events;
//  - etcd: keeps the state in etcd v3; answers after a round trip; waiters
//    are released by a watch.
//
// Threads: every call, both ways, happens on the server's loop thread.
// Nothing here blocks: a backend that needs the network uses the loop it is
// given in open() and answers later through its BackendHost.
#pragma once

#include <cstddef>
#include <cstdint>

#include "protocol/message.h"
#include "store/effects.h"
#include "tcpstore/status.h"

struct uv_loop_s;

namespace tcpstore::store {

// The dispatcher's side of the seam: what a backend may call back into.
// Loop thread only. Bytes for connections that have closed are dropped.
class BackendHost {
 public:
  // Routes bytes produced outside a submit() call (a waiter released by an
  // upstream event, a watch notification), in the order of fx.sends().
  virtual void deliver(const Effects& fx) = 0;

  // Finishes the request that submit() left pending for `conn`. On OK: routes
  // `fx` (the reply to `conn` first) and resumes decoding `conn`'s buffered
  // requests, possibly re-entering submit() before this returns. On error:
  // closes `conn` with the status' message as the reason (other connections'
  // sends in `fx` are still routed). Must be called exactly once per pending
  // request, unless `conn` was disconnected first (then it is ignored).
  virtual void complete(ConnId conn, const Status& status,
                        const Effects& fx) = 0;

  // Closes `conn` (e.g. the upstream that held its wait is gone), logging
  // `why`. Its disconnect() follows as for any close. What the close writes
  // (a relay channel's CLOSED frame) leaves on this loop turn, also when
  // called from the backend's own timer.
  virtual void close(ConnId conn, const Status& why) = 0;

  // Bytes queued for `conn` and not yet written to it (0 if it is closed, or
  // if its bytes go to a connection shared with others: a relay's channel).
  // How far behind its reader is: a backend that answers later uses it to
  // stop taking requests that would produce more than the connection's
  // output cap (a relay with replies in flight).
  virtual std::size_t unsentBytes(ConnId /*conn*/) const noexcept { return 0; }

 protected:
  ~BackendHost() = default;
};

class Backend {
 public:
  // What submit() did with the request.
  enum class Outcome {
    kDone,     // fx holds everything the request produced, routed now
    kPending,  // the answer comes later through BackendHost::complete()
  };

  virtual ~Backend() = default;

  // Called once, on the loop thread, before the first submit(). `loop` and
  // `host` outlive the backend's use of them (until close() has returned and
  // the handles it closed have run their close callbacks). An error fails
  // the server's start.
  virtual Status open(BackendHost& host, uv_loop_s* loop) = 0;

  // Applies `req` from connection `conn`. The views inside `req` are valid
  // only during this call: a backend that answers later copies what it needs.
  //  - OK, kDone: `fx` holds the request's sends (its reply, if the command
  //    has one, to `conn` first; STOP_WAITING to released waiters; watch
  //    notifications). A request that only registers a wait adds nothing.
  //  - OK, kPending: nothing is sent now; the backend calls host.complete()
  //    once. The dispatcher decodes no later request of `conn` until then,
  //    so each connection's requests are applied in order.
  //  - error: a protocol or limit error for `conn` (ADD on a non-numeric
  //    value, GET of a missing key, a reply over its cap, ...). No state
  //    changed and nothing was added for `conn`; the dispatcher closes `conn`
  //    with the message (kLimitExceeded is counted as a limit rejection).
  // VALIDATE and PING are passed too (PING is answered, VALIDATE ignored).
  virtual Result<Outcome> submit(ConnId conn, const protocol::Request& req,
                                 Effects& fx) = 0;

  // `conn` closed: forget its waits and watches. A pending request of it
  // may still complete; the host ignores that completion.
  virtual void disconnect(ConnId conn) = 0;

  // The peer of `conn` will be read no more: it half-closed (its EOF was
  // read) after its last request, or its input broke a rule and the server
  // closes it once the replies owed for its earlier requests are out. Every
  // request it sent that will be served has been submitted; none is pending.
  //  - false: the backend owes `conn` nothing more (every reply it will ever
  //    send has been routed); the server closes `conn` once its output is
  //    written. Backends that answer inside submit() always return false.
  //  - true: replies are still owed (a relay's replies in flight upstream).
  //    `conn` is then pending: the backend calls host.complete(conn, OK, fx)
  //    exactly once when it has delivered them all (the server then asks
  //    again), or closes `conn` (e.g. its upstream is lost). The wait must be
  //    bounded by something the backend watches, never by the peer.
  virtual bool peerHalfClosed(ConnId /*conn*/) { return false; }

  // Starts shutdown on the loop thread: cancel outstanding work and close
  // the backend's own loop handles. No submit() follows.
  virtual void close() = 0;

  // Stored keys (for logs and counters); 0 if the backend cannot tell cheaply.
  virtual std::size_t numKeys() const noexcept { return 0; }

  // Bytes this backend holds on the server's heap for stored keys, values,
  // queues and registrations (an estimate, O(1)), charged to the server's
  // memory budget; 0 for a backend that keeps its state elsewhere.
  virtual std::size_t memoryBytes() const noexcept { return 0; }
};

}  // namespace tcpstore::store
