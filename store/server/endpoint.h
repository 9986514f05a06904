// Endpoint: one client as the dispatcher sees it: an ordered stream of
// requests with its own never-reused ConnId, somewhere to send its replies,
// and a way to close it. A Connection (one socket) is an Endpoint; so is
// each channel of a mux connection (mux_session.h), many of which share one
// socket. RequestHandler: where an endpoint's decoded requests go (the
// dispatcher). Loop thread only.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "protocol/message.h"
#include "store/effects.h"
#include "store/server/counters.h"

namespace tcpstore::server {

using store::ConnId;

class Endpoint {
 public:
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  ConnId id() const noexcept { return id_; }
  // Closed (or closing): nothing more is sent or decoded.
  bool closing() const noexcept { return closing_; }
  // While pending, nothing more of this endpoint is decoded.
  // setPending(false) does not decode: call resume() once the reply is routed.
  void setPending(bool pending) noexcept { pending_ = pending; }
  bool pending() const noexcept { return pending_; }

  // For log lines: the peer's address, and the dialect ("1.13", "2.x", ...).
  virtual std::string peerName() const = 0;
  virtual std::string_view dialectName() const noexcept = 0;
  // Queues `bytes` for the client. `requested`: a reply to this endpoint's
  // own request (false: a push it did not ask for, which the output policy
  // may refuse by dropping a client that is behind). Throws std::bad_alloc.
  virtual void send(std::string_view bytes, bool requested) = 0;
  // A reply to this endpoint's own request, as send(bytes, true), handing
  // the buffer over (a large reply is then not copied again). Throws
  // std::bad_alloc.
  virtual void sendOwned(std::string bytes) { send(bytes, true); }
  // As send(), for `length` bytes of the shared buffer `buf` from `offset`:
  // a connection queues a reference to them, not a copy (the same buffer may
  // go to many endpoints). This default copies (a mux channel prepends its
  // frame header anyway). Throws std::bad_alloc.
  virtual void sendShared(const store::SharedBytes& buf, std::size_t offset,
                          std::size_t length, bool requested) {
    send(buf.view().substr(offset, length), requested);
  }
  // Bytes queued for this client and not yet written: how far behind its
  // reader is (the budget judges replies to clients far behind strictly).
  virtual std::size_t unsentBytes() const noexcept = 0;
  // Decodes the requests buffered while pending (no-op while closing, or
  // while its decoding is on the stack). Throws std::bad_alloc.
  virtual void resume() = 0;
  // Counts `counter`, logs the reason (rate-limited) and closes at once.
  virtual void reject(Counter& counter, std::string_view reason) noexcept = 0;
  // An error in this endpoint's requests: counts, logs, decodes nothing
  // more and closes once the replies owed for earlier requests are out.
  virtual void fail(Counter& counter, std::string_view reason) noexcept = 0;
  // Logs the reason (rate-limited) and closes at once; counts nothing.
  virtual void drop(std::string_view reason) noexcept = 0;

 protected:
  explicit Endpoint(ConnId id) noexcept : id_(id) {}
  ~Endpoint() = default;

  const ConnId id_;
  bool pending_ = false;  // a request awaits the backend: no decoding
  bool closing_ = false;
};

// Where endpoints' decoded requests go (the dispatcher).
class RequestHandler {
 public:
  // One decoded request of `e`; its views are valid during the call only.
  // May send to any endpoint, close any (also `e`), or mark `e` pending.
  // Throws std::bad_alloc only.
  virtual void onRequest(Endpoint& e, const protocol::Request& req) = 0;
  // `e` is closing (called once): forget it. Nothing more is sent to it.
  virtual void onClosing(Endpoint& e) noexcept = 0;
  // `e`'s peer half-closed after its last request, or `e` failed (its input
  // broke a rule) and will decode nothing more (none pending). true: replies
  // are still owed and `e` is now pending; its resume() follows once they are
  // routed, and it asks again. false: close `e` once its output is written.
  // Throws std::bad_alloc only.
  virtual bool onPeerEof(Endpoint& /*e*/) { return false; }

 protected:
  ~RequestHandler() = default;
};

}  // namespace tcpstore::server
