#include "store/server/dispatcher.h"

#include <fmt/format.h>

#include <charconv>

namespace tcpstore::server {

using protocol::Command;
using store::Backend;
using store::ConnId;
using store::Effects;

namespace {
// One huge MULTI_GET/LIST_KEYS reply must not pin its buffer for good.
constexpr std::size_t kKeepEffectsBytes = 64 * 1024;
}  // namespace

Dispatcher::Dispatcher(Connections& conns, Backend& backend, Counters& ctr,
                       const Logger& log, std::int64_t world_size,
                       std::uint64_t job_stall_ms)
    : conns_(conns),
      backend_(backend),
      ctr_(ctr),
      log_(log),
      jobs_([&log](LogLevel l, std::string_view line) { log.log(l, line); },
            [job_stall_ms] {
              JobProgress::Limits l;
              l.stall_ms = job_stall_ms;
              return l;
            }()) {
  if (world_size > 0) join_.emplace(log, world_size);
}

Status Dispatcher::open(LoopHandles& handles) {
  loop_ = handles.loop();
  if (join_) {
    auto t = handles.addTimer(this);
    if (!t) return t.error();
    join_timer_ = *t;
  }
  auto t = handles.addTimer(this);
  if (!t) return t.error();
  job_timer_ = *t;
  return backend_.open(*this, loop_);
}

void Dispatcher::onRequest(Endpoint& c, const protocol::Request& req) {
  ctr_.countRequest(req.command);
  if (refusedForBudget(c, req, estimateBytes(req))) return;
  const std::int64_t join = join_ ? joinCount(req) : kNoCount;
  fx_.clear();
  c.setPending(true);  // a completion during submit() sees it pending
  ++depth_;
  struct Leave {
    Dispatcher* d;
    ~Leave() { d->leaveDispatch(); }
  } leave{this};
  // Values freed by this request count as work of the turn (runs before
  // leave: only this request's frees).
  const std::size_t held = backend_.memoryBytes();
  struct ChargeFreed {
    Dispatcher* d;
    std::size_t held;
    ~ChargeFreed() {
      const std::size_t now = d->backend_.memoryBytes();
      if (now < held) d->conns_.chargeTurn(held - now);
    }
  } charge_freed{this, held};
  Result<Backend::Outcome> r = [&] {
    try {
      return backend_.submit(c.id(), req, fx_);
    } catch (...) {
      c.setPending(false);
      throw;
    }
  }();
  if (!r) {
    c.setPending(false);
    rejectRequest(c, req.command, r.error());
    return;
  }
  if (JobProgress::concerns(req)) noteJob(req);
  if (*r == Backend::Outcome::kPending) {
    // Not pending any more: the backend completed it inside submit().
    if (c.pending()) pending_[c.id()] = Pending{req.command, join};
    return;
  }
  c.setPending(false);
  // A reply of normal size to a client that reads is always sent; a large
  // one, or any reply to a client already behind by a large amount (one
  // that does not read), must fit under the soft line.
  if (isReadOnly(req.command) &&
      (fx_.sentBytes() > kLargeRequestBytes ||
       c.unsentBytes() > kLargeRequestBytes) &&
      refusedForBudget(c, req, fx_.sentBytes(), true))
    return;  // the reply would cross the budget: nothing changed
  if (join != kNoCount) noteJoin(join, fx_, c.id());
  if (isWholeLargeReply(fx_, c.id())) {
    c.sendOwned(fx_.takeBytes());  // no second copy of a large reply
    fx_ = Effects();
    return;
  }
  route(fx_, &c);
  if (fx_.bytes().capacity() > kKeepEffectsBytes) fx_ = Effects();
}

bool Dispatcher::isWholeLargeReply(const Effects& fx, ConnId self) noexcept {
  if (fx.sends().size() != 1 || fx.bytes().size() <= kKeepEffectsBytes)
    return false;
  const Effects::Send& s = fx.sends().front();
  return s.conn == self && s.shared == 0 && s.offset == 0 &&
         s.length == fx.bytes().size();
}

void Dispatcher::leaveDispatch() noexcept {
  if (--depth_ > 0 || to_resume_.empty()) return;
  // Index loop: a resumed connection's requests may complete others.
  for (std::size_t i = 0; i < to_resume_.size(); ++i) {
    Endpoint* c = conns_.findEndpoint(to_resume_[i]);
    if (c == nullptr) continue;
    ++depth_;
    try {
      c->resume();
    } catch (...) {
      c->reject(ctr_.rejected_limit,
                "out of memory while serving the connection");
    }
    --depth_;
  }
  to_resume_.clear();
}

void Dispatcher::onClosing(Endpoint& c) noexcept {
  backend_.disconnect(c.id());
  if (!pending_.empty()) pending_.erase(c.id());
}

bool Dispatcher::onPeerEof(Endpoint& c) {
  if (!backend_.peerHalfClosed(c.id())) return false;
  c.setPending(true);  // complete() resumes it once the owed replies are out
  return true;
}

std::size_t Dispatcher::unsentBytes(ConnId conn) const noexcept {
  const Endpoint* c = conns_.findEndpoint(conn);
  return c == nullptr ? 0 : c->unsentBytes();
}

void Dispatcher::route(const Effects& fx, Endpoint* self) {
  for (const Effects::Send& send : fx.sends()) {
    Endpoint* t = self != nullptr && send.conn == self->id()
                      ? self
                      : conns_.findEndpoint(send.conn);
    if (t == nullptr) continue;
    if (const store::SharedBytes* buf = fx.sharedOf(send)) {
      t->sendShared(*buf, send.offset, send.length, t == self);
    } else {
      t->send(fx.bytesOf(send), t == self);
    }
  }
}

bool Dispatcher::isReadOnly(Command cmd) noexcept {
  return cmd == Command::kGet || cmd == Command::kMultiGet ||
         cmd == Command::kListKeys;
}

bool Dispatcher::refusedForBudget(Endpoint& c, const protocol::Request& req,
                                  std::uint64_t extra, bool large) {
  const MemoryUse use = conns_.memoryUse();
  if (!conns_.budget().refuse(use, extra, large)) return false;
  c.fail(ctr_.budget_refused,
         fmt::format("{} refused: it needs {} bytes and the server holds {} of "
                     "its {} byte memory budget",
                     protocol::commandName(req.command), extra, use.total(),
                     conns_.budget().max()));
  return true;
}

void Dispatcher::rejectRequest(Endpoint& c, Command cmd, const Status& st) {
  c.fail(
      ctr_.forRejectedRequest(st),
      fmt::format("{} rejected: {}", protocol::commandName(cmd), st.message()));
}

void Dispatcher::deliver(const Effects& fx) {
  try {
    route(fx, nullptr);
  } catch (...) {
    log_.log(LogLevel::kError, "out of memory while routing a notification");
  }
  conns_.flushSoon();
}

void Dispatcher::complete(ConnId conn, const Status& status,
                          const Effects& fx) {
  Endpoint* c = conns_.findEndpoint(conn);
  if (c == nullptr || !c->pending()) {
    // Closed meanwhile (its bytes are dropped), or a stray completion.
    deliver(fx);
    return;
  }
  Pending p{Command::kGetNumKeys, kNoCount};
  if (auto it = pending_.find(conn); it != pending_.end()) {
    p = it->second;
    pending_.erase(it);
  }
  c->setPending(false);
  struct FlushSoon {
    Connections& conns;
    ~FlushSoon() { conns.flushSoon(); }
  } flush_soon{conns_};
  try {
    if (!status.isOk()) {
      rejectRequest(*c, p.command, status);
      route(fx, nullptr);
      return;
    }
    if (p.join_count != kNoCount) noteJoin(p.join_count, fx, conn);
    route(fx, c);
    if (depth_ > 0) {
      to_resume_.push_back(conn);  // after the dispatch on the stack
    } else {
      c->resume();
    }
  } catch (...) {
    c->reject(ctr_.rejected_limit,
              "out of memory while serving the connection");
  }
}

void Dispatcher::close(ConnId conn, const Status& why) {
  Endpoint* c = conns_.findEndpoint(conn);
  if (c == nullptr) return;
  c->drop(why.message());
  // A channel's CLOSED is output: written on this loop turn even when the
  // backend closes from a timer (the poll phase must not block first).
  conns_.flushSoon();
}

// ---- join progress ---------------------------------------------------------

// torch's ranks count up "init/" with ADD (the new count is in the reply);
// a SET carries the count as decimal text.
std::int64_t Dispatcher::joinCount(
    const protocol::Request& req) const noexcept {
  if (req.key != "init/") return kNoCount;
  if (req.command == Command::kAdd) return kFromReply;
  if (req.command != Command::kSet) return kNoCount;
  std::int64_t n = 0;
  const char* end = req.value.data() + req.value.size();
  auto [p, ec] = std::from_chars(req.value.data(), end, n);
  if (ec != std::errc() || p != end || n < 0) return kNoCount;
  return n;
}

void Dispatcher::noteJoin(std::int64_t count, const Effects& fx,
                          ConnId conn) noexcept {
  if (count == kFromReply) {
    count = kNoCount;
    for (const Effects::Send& s : fx.sends()) {
      if (s.conn != conn) continue;
      std::string_view b = fx.bytesOf(s);
      if (b.size() != 8) break;
      std::uint64_t v = 0;
      for (int i = 7; i >= 0; --i)
        v = (v << 8) | static_cast<unsigned char>(b[i]);
      count = static_cast<std::int64_t>(v);
      break;
    }
    if (count < 0) return;
  }
  const std::uint64_t wait = join_->note(uv_now(loop_), count);
  if (wait > 0) uv_timer_start(join_timer_, &Dispatcher::onJoinTimer, wait, 0);
}

void Dispatcher::onJoinTimer(uv_timer_t* timer) noexcept {
  auto* d = static_cast<Dispatcher*>(timer->data);
  d->join_->onTimer(uv_now(d->loop_));
}

// ---- tcpstore:// jobs ------------------------------------------------------

void Dispatcher::noteJob(const protocol::Request& req) noexcept {
  const std::uint64_t wait = jobs_.note(uv_now(loop_), req);
  if (wait > 0) uv_timer_start(job_timer_, &Dispatcher::onJobTimer, wait, 0);
}

void Dispatcher::onJobTimer(uv_timer_t* timer) noexcept {
  auto* d = static_cast<Dispatcher*>(timer->data);
  const std::uint64_t wait = d->jobs_.onTimer(uv_now(d->loop_));
  if (wait > 0) uv_timer_start(timer, &Dispatcher::onJobTimer, wait, 0);
}

}  // namespace tcpstore::server
