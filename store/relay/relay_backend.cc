#include "store/relay/relay_backend.h"

#include <algorithm>
#include <new>
#include <unordered_set>

#include "store/relay/combiner.h"
#include "store/relay/upstream_connect.h"
#include "store/relay/wait_share.h"

namespace tcpstore::store::relay {

using protocol::Command;
using protocol::Dialect;
namespace mux = protocol::mux;

RelayBackend::RelayBackend(RelayOptions options)
    : options_(std::move(options)),
      link_(options_, *this, counters_),
      combiner_(std::make_unique<Combiner>(*this)),
      waits_(std::make_unique<WaitShare>(*this)) {}

RelayBackend::~RelayBackend() = default;

Status RelayBackend::open(BackendHost& host, uv_loop_s* loop) {
  host_ = &host;
  loop_ = loop;
  auto fd = connectUpstream(options_.host, options_.port,
                            options_.connect_timeout_ms);
  if (!fd) return fd.error();
  check_ = new uv_check_t;
  uv_check_init(loop_, check_);
  check_->data = this;
  uv_check_start(check_, &RelayBackend::onCheck);
  prepare_ = new uv_prepare_t;
  uv_prepare_init(loop_, prepare_);
  prepare_->data = this;
  uv_prepare_start(prepare_, &RelayBackend::onPrepare);
  close_timer_ = new uv_timer_t;
  uv_timer_init(loop_, close_timer_);
  close_timer_->data = this;
  Status st = link_.open(loop_, *fd);
  if (!st.isOk()) return st;
  if (options_.log) {
    options_.log(RelayLog::kInfo, "relaying to upstream " + link_.name());
  }
  return Status::ok();
}

void RelayBackend::close() {
  if (closed_) return;
  closed_ = true;
  link_.close();
  if (check_ != nullptr) {
    uv_close(reinterpret_cast<uv_handle_t*>(check_), &onHandleClosed);
    check_ = nullptr;
  }
  if (prepare_ != nullptr) {
    uv_close(reinterpret_cast<uv_handle_t*>(prepare_), &onHandleClosed);
    prepare_ = nullptr;
  }
  if (close_timer_ != nullptr) {
    uv_close(reinterpret_cast<uv_handle_t*>(close_timer_), &onHandleClosed);
    close_timer_ = nullptr;
  }
}

void RelayBackend::onHandleClosed(uv_handle_t* h) noexcept {
  if (h->type == UV_CHECK) {
    delete reinterpret_cast<uv_check_t*>(h);
  } else if (h->type == UV_PREPARE) {
    delete reinterpret_cast<uv_prepare_t*>(h);
  } else {
    delete reinterpret_cast<uv_timer_t*>(h);
  }
}

Status RelayBackend::downError() const {
  return Status::closed("upstream " + link_.name() +
                        " is not connected (the relay is reconnecting)");
}

// ---- requests -------------------------------------------------------------

Result<Backend::Outcome> RelayBackend::submit(ConnId conn,
                                              const protocol::Request& req,
                                              Effects& fx) {
  if (req.command == Command::kValidate) return Outcome::kDone;
  auto it = clients_.find(conn);
  if (it == clients_.end()) {
    it =
        clients_.emplace(conn, std::make_unique<Client>(options_.limits)).first;
  }
  Client& c = *it->second;
  if (c.doomed) {
    return Status::closed("the upstream closed this client's channel");
  }
  if (!link_.up()) {
    bumpRelay(counters_.refused);
    return downError();
  }
  if (waits_->waiting(conn)) {
    // In a shared WAIT and sending more (a CANCEL_WAIT after its timeout,
    // anything else): the WAIT moves to the client's own channel, ahead of
    // the request, and both go upstream as if tunneled from the start, so
    // the client reads what a server sends (a CANCEL_WAIT: `01` if the
    // keys are missing upstream then, `00 01` if they exist).
    const std::string wait = waits_->leave(conn);
    tunnelEncoded(conn, Command::kWait, 0, wait);
  }
  const bool idle =
      c.channel == 0 || (c.tracker.idle() && c.dialect == Dialect::kV2);
  if (req.command == Command::kPing && idle) {
    protocol::appendU32(fx.begin(conn), req.u32);
    fx.end();
    return Outcome::kDone;
  }
  if (options_.combine && options_.share_waits && idle &&
      waits_->offer(conn, req)) {
    return Outcome::kDone;  // STOP_WAITING follows from the shared WAIT
  }
  if (options_.combine && idle && combiner_->offer(conn, req)) {
    ensureChannel(conn, c, Dialect::kV2);  // a lone request goes out on it
    return Outcome::kPending;
  }
  const std::size_t backlog_before = link_.backlog();
  if (Status st = tunnel(conn, req); !st.isOk()) return st;
  const bool large = link_.backlog() - backlog_before >= kLargeFrameBytes;
  return holdAfterTunnel(conn, c, large) ? Outcome::kPending : Outcome::kDone;
}

bool RelayBackend::holdAfterTunnel(ConnId conn, const Client& c, bool large) {
  if (overOutput(conn, c)) {
    // Its next request waits until it has read enough and the replies in
    // flight have come back (onPrepare), as a server pauses its connection.
    held_.push_back(conn);
    return true;
  }
  if (link_.backlog() > kMaxBacklogBytes ||
      (large && link_.backlog() > kLargeBacklogBytes)) {
    // The upstream takes less than the clients send (or this client sends
    // large requests, which others' requests would queue behind): its next
    // request waits until the backlog has drained (onCheck).
    stalled_.push_back(conn);
    return true;
  }
  return false;
}

void RelayBackend::continueAfterTunnel(ConnId conn) {
  auto it = clients_.find(conn);
  if (it != clients_.end() && holdAfterTunnel(conn, *it->second, false)) {
    return;
  }
  host_->complete(conn, Status::ok(), Effects());
}

std::size_t RelayBackend::memoryBytes() const noexcept {
  // A client: its record, its tracker, two hash table entries.
  constexpr std::size_t kClientBytes = sizeof(Client) + 128;
  return waits_->memoryBytes() + combiner_->memoryBytes() +
         clients_.size() * kClientBytes + link_.backlog();
}

bool RelayBackend::overOutput(ConnId conn, const Client& c) const noexcept {
  if (c.tracker.lost()) return false;  // it knows nothing of the replies
  const std::uint64_t cap = options_.limits.max_buffered_output_bytes;
  // Replies owed or not, a client that has not read what it was sent goes
  // no further: nothing may be put in flight on top of a full outbox
  // (resuming it there let its next replies pass twice the cap).
  const std::uint64_t unsent = host_->unsentBytes(conn);
  if (unsent >= cap) return true;
  // WAIT/BARRIER bytes are not counted: one byte each, and they may wait
  // for a later request of this client (holding it could deadlock).
  // Replies of a fixed size (PING, ADD, CHECK, ...) count as that size;
  // the others at the expected size: the largest recent reply of a
  // variable size (halved by each smaller one); none seen yet: half the
  // cap each.
  const std::size_t sized = c.tracker.sizedOutstanding();
  const std::uint64_t est = c.reply_est > 0 ? c.reply_est : cap / 2 + 1;
  const std::uint64_t fixed = c.tracker.fixedBytesOutstanding();
  if (sized > 0 && est > (UINT64_MAX - fixed) / sized) return true;
  return fixed + est * sized >= cap - unsent;
}

bool RelayBackend::peerHalfClosed(ConnId conn) {
  auto it = clients_.find(conn);
  if (it == clients_.end()) return false;
  Client& c = *it->second;
  // Nothing owed and every write known applied upstream: close as a server
  // would (the disconnect's CLOSE forgets nothing the client is owed).
  if (c.channel == 0 || c.doomed || !link_.up() || c.tracker.idle())
    return false;
  mux::appendFrame(link_.out(), mux::FrameType::kShutdown, c.channel, {});
  c.half_closed = true;
  return true;
}

// Which dialect a channel speaks: the keyspace's semantics and reply bytes
// do not depend on the dialect, only which commands exist does. Channels
// speak 2.x (every command but WATCH_KEY), a client's first WATCH_KEY
// (1.13 only) moves it to a 1.13 channel. The client's own dialect is not
// known here in general (a relay behind a relay sees channels, not
// VALIDATEs), and is not needed.
RelayBackend::Client& RelayBackend::ensureChannel(ConnId conn, Client& c,
                                                  Dialect want) {
  if (c.channel == 0) {
    c.channel = openChannel(want, conn);
    c.dialect = want;
  }
  return c;
}

std::uint32_t RelayBackend::openChannel(Dialect dialect, ConnId owner) {
  const std::uint32_t id = next_channel_++;
  const char d = static_cast<char>(dialect == Dialect::kV2 ? 1 : 0);
  mux::appendFrame(link_.out(), mux::FrameType::kOpen, id,
                   std::string_view(&d, 1));
  routes_[id] = owner;
  return id;
}

std::string_view encodedV2(const protocol::Request& req, std::string& scratch) {
  if (!req.wire.empty()) return req.wire;
  scratch.clear();
  if (!protocol::encodeRequest(Dialect::kV2, req, scratch)) return {};
  return scratch;
}

Status RelayBackend::tunnel(ConnId conn, const protocol::Request& req) {
  auto it = clients_.find(conn);
  if (it == clients_.end()) return Status::ok();
  Client& c = *it->second;
  const Dialect want = protocol::commandCode(Dialect::kV2, req.command)
                           ? Dialect::kV2
                           : Dialect::kV113;
  if (c.channel != 0 && c.dialect != want &&
      !protocol::commandCode(c.dialect, req.command)) {
    // Move to a channel of the other dialect. Safe only while the channel
    // holds nothing upstream: no reply owed (so no wait registered) and its
    // writes applied; otherwise the command cannot be relayed.
    if (!c.tracker.idle()) {
      return Status::notSupported(
          std::string(protocol::commandName(req.command)) +
          " through a relay on a connection with requests in flight");
    }
    if (routes_.erase(c.channel) > 0) {
      mux::appendFrame(link_.out(), mux::FrameType::kClose, c.channel, {});
    }
    c.channel = 0;
  }
  ensureChannel(conn, c, want);
  std::string& out = link_.out();
  const std::size_t at = out.size();
  mux::appendFrameHeader(out, mux::FrameType::kRequest, c.channel, 0);
  if (!protocol::encodeRequest(c.dialect, req, out)) {
    out.resize(at);
    return Status::notSupported(
        std::string(protocol::commandName(req.command)) + " is not relayed");
  }
  mux::patchFrameLength(out, at);
  c.tracker.expect(req.command, req.keys.size(), 0);
  bumpRelay(counters_.tunneled);
  return Status::ok();
}

void RelayBackend::closeChannel(std::uint32_t channel) {
  if (routes_.erase(channel) > 0 && link_.up()) {
    mux::appendFrame(link_.out(), mux::FrameType::kClose, channel, {});
  }
}

void RelayBackend::writeEncoded(std::uint32_t channel,
                                std::string_view request) {
  mux::appendFrame(link_.out(), mux::FrameType::kRequest, channel, request);
}

void RelayBackend::tunnelEncoded(ConnId conn, Command cmd, std::uint64_t count,
                                 std::string_view request) {
  auto it = clients_.find(conn);
  if (it == clients_.end()) return;
  Client& c = ensureChannel(conn, *it->second, Dialect::kV2);
  writeEncoded(c.channel, request);
  c.tracker.expect(cmd, count, 0);
  bumpRelay(counters_.tunneled);
}

void RelayBackend::disconnect(ConnId conn) {
  waits_->leave(conn);
  auto it = clients_.find(conn);
  if (it == clients_.end()) return;
  const std::uint32_t ch = it->second->channel;
  if (ch != 0 && routes_.erase(ch) > 0 && link_.up()) {
    mux::appendFrame(link_.out(), mux::FrameType::kClose, ch, {});
  }
  clients_.erase(it);
}

// ---- the loop turn ----------------------------------------------------------

void RelayBackend::onCheck(uv_check_t* check) noexcept {
  auto* b = static_cast<RelayBackend*>(check->data);
  if (b->next_channel_ > UINT32_MAX - (1u << 24)) {
    // Ids are never reused on one connection: start a new one (its clients
    // are closed like on any loss) well before they run out.
    b->link_.drop(
        Status::ioError("channel ids nearly exhausted; reconnecting"));
    return;
  }
  b->sendBatches();
  if (!b->stalled_.empty() && b->link_.backlog() <= kLargeBacklogBytes / 2) {
    std::vector<ConnId> resume = std::move(b->stalled_);
    b->stalled_.clear();
    for (ConnId conn : resume)
      b->host_->complete(conn, Status::ok(), Effects());
    b->link_.flush();  // what they sent
  }
}

// Before the loop waits for events, after this turn's output was written:
// a held client's unsent bytes are known then, and what it sends once
// resumed is written before the loop blocks.
void RelayBackend::onPrepare(uv_prepare_t* prepare) noexcept {
  auto* b = static_cast<RelayBackend*>(prepare->data);
  if (b->held_.empty()) return;
  b->resumeHeld();
  b->sendBatches();
}

// The combined and shared requests of this turn go out, then every frame.
void RelayBackend::sendBatches() noexcept {
  try {
    combiner_->flush();
    waits_->flush();
  } catch (...) {
    link_.drop(Status::ioError("out of memory while combining"));
  }
  link_.flush();
}

void RelayBackend::resumeHeld() noexcept {
  if (held_.empty()) return;
  std::vector<ConnId> held = std::move(held_);
  held_.clear();
  std::vector<ConnId> resume;
  try {
    for (ConnId conn : held) {
      auto it = clients_.find(conn);
      if (it == clients_.end()) continue;  // gone
      (overOutput(conn, *it->second) ? held_ : resume).push_back(conn);
    }
  } catch (...) {  // out of memory: let them all go on
    resume = std::move(held);
    held_.clear();
  }
  for (ConnId conn : resume) host_->complete(conn, Status::ok(), Effects());
}

void RelayBackend::onCloseTimer(uv_timer_t* timer) noexcept {
  auto* b = static_cast<RelayBackend*>(timer->data);
  auto victims = std::move(b->to_close_);
  b->to_close_.clear();
  for (auto& [conn, why] : victims) {
    b->host_->close(conn,
                    Status::closed("upstream closed the channel: " + why));
  }
}

// ---- frames from the upstream ---------------------------------------------

bool RelayBackend::onFrame(const mux::Frame& f) {
  auto it = routes_.find(f.channel);
  if (it == routes_.end()) {
    // A channel we closed (its DATA crossed our CLOSE) or never opened.
    return f.channel < next_channel_;
  }
  if (it->second == kSharedWait) {
    if (f.type == mux::FrameType::kData) {
      waits_->onData(f.channel, f.payload);
    } else {
      routes_.erase(it);
      waits_->onClosed(f.channel, f.payload);
    }
    return true;
  }
  if (it->second == kShared) {
    if (f.type == mux::FrameType::kData) {
      combiner_->onData(f.channel, f.payload);
    } else {
      routes_.erase(it);
      combiner_->onClosed(f.channel, f.payload);
    }
    return true;
  }
  const ConnId conn = it->second;
  auto cit = clients_.find(conn);
  if (cit == clients_.end()) return true;
  Client& c = *cit->second;
  if (f.type == mux::FrameType::kData) {
    try {
      deliveries_.send(conn, f.payload);
    } catch (...) {
      link_.drop(Status::ioError("out of memory relaying replies"));
      return true;
    }
    c.tracker.feed(f.payload, [&c](const ReplyTracker::Done& d) {
      // Only replies whose size the data decides: a PING's 4 bytes say
      // nothing about the next MULTI_GET's.
      if (!d.sized) return;
      c.reply_est = std::max<std::size_t>(
          {d.bytes.size(), c.reply_est / 2, std::size_t{1}});
    });
    return true;
  }
  routes_.erase(it);
  if (c.half_closed && f.payload.empty()) {
    // The end of a half-closed client's channel: its DATA is all here.
    // Deliver it, then let the server close the client once it is written.
    c.channel = 0;
    c.half_closed = false;
    flushDeliveries();
    host_->complete(conn, Status::ok(), Effects());
    return true;
  }
  // CLOSED: the client's request broke a rule upstream.
  c.channel = 0;
  c.doomed = true;
  c.tracker.markLost();
  to_close_.emplace_back(conn, std::string(f.payload));
  uv_timer_start(close_timer_, &RelayBackend::onCloseTimer, 0, 0);
  return true;
}

void RelayBackend::onReadDone() { flushDeliveries(); }

void RelayBackend::flushDeliveries() noexcept {
  if (deliveries_.empty()) return;
  host_->deliver(deliveries_);
  deliveries_.clear();
}

void RelayBackend::onLinkDown(const Status& why) {
  deliveries_.clear();
  routes_.clear();
  next_channel_ = 1;
  combiner_->onLinkDown(why);
  // Shared waiters (whether or not they own a channel) and clients with a
  // channel, each once.
  std::vector<ConnId> victims = waits_->onLinkDown();
  const std::unordered_set<ConnId> waiters(victims.begin(), victims.end());
  for (auto& [conn, c] : clients_) {
    if ((c->channel != 0 || c->doomed) && waiters.count(conn) == 0) {
      victims.push_back(conn);
    }
    c->channel = 0;
  }
  to_close_.clear();
  stalled_.clear();  // they have channels: closed below
  held_.clear();
  const Status st = Status::closed("lost the upstream " + link_.name() + ": " +
                                   why.message());
  for (ConnId conn : victims) host_->close(conn, st);
}

void RelayBackend::onLinkUp() {}

}  // namespace tcpstore::store::relay
