#include "store/client/shared.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <map>

namespace tcpstore::client_detail {

namespace requests = protocol::requests;

std::string wireKey(std::string_view prefix, std::string_view key) {
  std::string k;
  k.reserve(1 + prefix.size() + key.size());
  k.push_back('/');
  k.append(prefix);
  k.append(key);
  return k;
}

std::vector<std::string> wireKeys(std::string_view prefix,
                                  const std::vector<std::string>& keys) {
  std::vector<std::string> wire;
  wire.reserve(keys.size());
  for (const auto& k : keys) wire.push_back(wireKey(prefix, k));
  return wire;
}

std::string joinKeys(const std::vector<std::string>& keys) {
  std::string s;
  for (const auto& k : keys) {
    if (!s.empty()) s += ", ";
    s += k;
  }
  return s;
}

bool idempotent(protocol::Command c) noexcept {
  using protocol::Command;
  switch (c) {
    case Command::kValidate:
    case Command::kGet:
    case Command::kCheck:
    case Command::kWait:
    case Command::kGetNumKeys:
    case Command::kMultiGet:
    case Command::kPing:
    case Command::kQueueLen:
    case Command::kListKeys:
      return true;
    default:
      return false;
  }
}

Status lacks(Feature f, std::string_view command) {
  return Status::notSupported(fmt::format(
      "the server does not implement {} (it closed the connection on it; {})",
      command, Capabilities::info(f).lacking));
}

// ---- the process-wide registry ---------------------------------------------

namespace {

std::string registryKey(const ConnectConfig& c) {
  std::string key;
  for (const auto& e : c.endpoints)
    key += fmt::format("{}|{}|", e.host, e.port);
  return key + std::to_string(static_cast<int>(c.dialect));
}

// Both leak on purpose: a Client destroyed during static destruction (a
// global handle) must still find them.
std::mutex& registryMutex() {
  static auto* m = new std::mutex();
  return *m;
}
std::map<std::string, std::weak_ptr<Shared>>& registry() {
  static auto* r = new std::map<std::string, std::weak_ptr<Shared>>();
  return *r;
}

}  // namespace

Result<std::shared_ptr<Shared>> Shared::attach(
    const ConnectConfig& config, std::chrono::milliseconds connect_timeout,
    std::size_t max_idle, bool share) {
  const std::string key = registryKey(config);
  const Deadline deadline = deadlineAfter(connect_timeout);

  if (share) {
    std::shared_ptr<Shared> existing;
    {
      std::lock_guard<std::mutex> lock(registryMutex());
      auto it = registry().find(key);
      if (it != registry().end()) existing = it->second.lock();
    }
    if (existing) {
      // Make sure the shared primary connection is (still) up.
      Status s = existing->withPrimary(
          deadline, [](Connection&) { return Status::ok(); });
      if (!s) return s;
      return existing;
    }
  }

  auto shared = std::make_shared<Shared>(config, connect_timeout, max_idle);
  shared->registry_key_ = key;
  auto conn = Connection::open(config, deadline);
  if (!conn) return conn.error();
  shared->current_ = (*conn)->endpoint();
  shared->primary_ = std::move(*conn);

  if (share) {
    std::shared_ptr<Shared> winner;
    {
      std::lock_guard<std::mutex> lock(registryMutex());
      auto& slot = registry()[key];
      winner = slot.lock();
      if (!winner) {
        slot = shared;
        shared->registered_ = true;
      }
    }
    // Lost a race with another connect: use theirs.
    if (winner) return winner;
  }
  return shared;
}

Shared::~Shared() {
  if (!registered_) return;
  std::lock_guard<std::mutex> lock(registryMutex());
  auto it = registry().find(registry_key_);
  if (it != registry().end() && it->second.expired()) registry().erase(it);
}

// ---- primary connection ----------------------------------------------------

Deadline Shared::connectDeadline(Deadline call) const {
  Deadline floor = deadlineAfter(std::min<std::chrono::milliseconds>(
      connect_timeout_, std::chrono::seconds(1)));
  return std::min(std::max(call, floor), deadlineAfter(connect_timeout_));
}

Result<std::unique_ptr<Connection>> Shared::open(Deadline deadline) {
  auto c = Connection::open(config_, connectDeadline(deadline),
                            current_.load(std::memory_order_relaxed));
  if (c) current_.store((*c)->endpoint(), std::memory_order_relaxed);
  return c;
}

void Shared::noteDropped(const Connection& c) {
  if (!failover() || !c.lost()) return;
  // Only the first of several connections lost on one endpoint moves on.
  std::size_t from = c.endpoint();
  current_.compare_exchange_strong(from, (from + 1) % config_.endpoints.size());
}

Status Shared::outcomeUnknown(const Status& s,
                              protocol::Command command) const {
  if (!failover() || !lostConnection(s) || idempotent(command)) return s;
  return Status(s.code(),
                fmt::format("{}: outcome unknown ({} may or may not have "
                            "been applied; not re-sent; the next call uses "
                            "the next endpoint)",
                            s.message(), protocol::commandName(command)));
}

Result<OwnedReply> Shared::confirmedWrite(Connection& c,
                                          const protocol::Request& req,
                                          Deadline deadline) {
  const std::uint32_t nonce = static_cast<std::uint32_t>(::getpid()) ^ 0xc0f1u;
  const protocol::Request confirm =
      v2() ? requests::ping(nonce) : requests::check({});
  std::string out;
  if (!protocol::encodeRequest(config_.dialect, req, out)) {
    return Status::notSupported(fmt::format(
        "{} is not part of the {} dialect", protocol::commandName(req.command),
        protocol::dialectName(config_.dialect)));
  }
  (void)protocol::encodeRequest(config_.dialect, confirm, out);
  Status s = c.sendBytes(out, deadline);
  if (!s) return s;
  OwnedReply reply;
  s = c.receive(protocol::replyShapeOf(confirm.command), 0, deadline, reply);
  if (!s) {
    c.markBroken();  // a late answer would desynchronize the stream
    return s;
  }
  const bool ok =
      v2() ? reply.u32 == nonce : reply.byte == protocol::kCheckReady;
  if (!ok) {
    c.markBroken();
    return Status::protocolError(fmt::format(
        "{}: the confirming {} got a wrong answer",
        protocol::commandName(req.command), v2() ? "PING" : "CHECK"));
  }
  return OwnedReply{};
}

Result<OwnedReply> Shared::shortOp(const protocol::Request& req,
                                   Deadline deadline, std::uint64_t count) {
  const bool no_reply =
      protocol::replyShapeOf(req.command) == protocol::ReplyShape::kNone;
  return withPrimary(deadline, [&](Connection& c) -> Result<OwnedReply> {
    auto r = no_reply && failover() ? confirmedWrite(c, req, deadline)
                                    : c.roundTrip(req, deadline, count);
    if (!r) return outcomeUnknown(r.error(), req.command);
    if (no_reply && !failover()) {
      markDirty();
    } else {
      clean();
    }
    return r;
  });
}

Status Shared::syncWrites(Deadline deadline) {
  if (!dirty_hint_.load()) return Status::ok();
  return withPrimary(deadline, [&](Connection& c) -> Status {
    if (!dirty_) return Status::ok();
    // 2.x: PING; 1.13: CHECK [] (READY, no side effects).
    auto r = c.roundTrip(
        v2() ? requests::ping(static_cast<std::uint32_t>(::getpid()))
             : requests::check({}),
        deadline);
    if (!r) return r.error();
    clean();
    return Status::ok();
  });
}

// ---- the pool --------------------------------------------------------------

Result<Shared::Lease> Shared::borrow(Deadline deadline) {
  {
    std::lock_guard<std::mutex> lock(pool_mu_);
    while (!idle_.empty()) {
      auto c = std::move(idle_.back());
      idle_.pop_back();
      if (c->idleHealthy()) {
        ++borrowed_;
        return Lease(this, std::move(c));
      }
      noteDropped(*c);
    }
    // Counted while connecting, so openConnections() sees it.
    ++borrowed_;
  }
  auto c = open(deadline);
  if (!c) {
    std::lock_guard<std::mutex> lock(pool_mu_);
    --borrowed_;
    return c.error();
  }
  return Lease(this, std::move(*c));
}

void Shared::giveBack(std::unique_ptr<Connection> c) {
  // Closed outside the lock.
  std::unique_ptr<Connection> drop;
  std::lock_guard<std::mutex> lock(pool_mu_);
  --borrowed_;
  if (c && c->broken()) noteDropped(*c);
  if (c && !c->broken() && idle_.size() < max_idle_) {
    idle_.push_back(std::move(c));
  } else {
    drop = std::move(c);
  }
}

std::size_t Shared::openConnections() {
  std::size_t n = 0;
  {
    std::lock_guard<std::mutex> lock(primary_mu_);
    n += primary_ ? 1 : 0;
  }
  std::lock_guard<std::mutex> lock(pool_mu_);
  return n + idle_.size() + borrowed_;
}

// ---- blocking waits
// ----------------------------------------------------------

Status Shared::blockingWait(Connection& c, const protocol::Request& req,
                            Deadline deadline, std::string_view what) {
  Status s = c.send(req, deadline);
  if (!s) return outcomeUnknown(s, req.command);
  OwnedReply reply;
  s = c.receive(protocol::ReplyShape::kByte, 0, deadline, reply);
  if (!s && !s.isTimeout()) return outcomeUnknown(s, req.command);
  if (s) {
    if (reply.byte != protocol::kStopWaiting) {
      c.markBroken();
      return Status::protocolError(
          fmt::format("{}: unexpected reply byte 0x{:02x}", what, reply.byte));
    }
    return Status::ok();
  }
  if (!s.isTimeout() || c.broken()) return s;
  Status timeout = Status::timeout(fmt::format("{} timed out", what));
  if (!v2()) {
    // 1.13: no cancel; drop the connection.
    c.markBroken();
    return timeout;
  }
  // The cancel round trip gets its own short grace period: the server
  // answers it at once unless it is stalled.
  Deadline grace = deadlineAfter(std::chrono::seconds(5));
  Status cs = c.send(requests::cancelWait(), grace);
  if (!cs) return timeout;
  cs = c.receive(protocol::ReplyShape::kByte, 0, grace, reply);
  if (!cs) {
    c.markBroken();
    return timeout;
  }
  if (reply.byte == protocol::kWaitCanceled) return timeout;
  if (reply.byte == protocol::kStopWaiting) {
    // Completed in the race; the WAIT_CANCELED follows.
    cs = c.receive(protocol::ReplyShape::kByte, 0, grace, reply);
    if (!cs || reply.byte != protocol::kWaitCanceled) {
      c.markBroken();
      return cs ? Status::protocolError(
                      fmt::format("{}: unexpected byte 0x{:02x} after cancel",
                                  what, reply.byte))
                : cs;
    }
    return Status::ok();
  }
  c.markBroken();
  return Status::protocolError(
      fmt::format("{}: unexpected cancel reply 0x{:02x}", what, reply.byte));
}

}  // namespace tcpstore::client_detail
