#include "tcpstore/client.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <map>
#include <mutex>

#include "store/client/connection.h"

namespace tcpstore {

using client_detail::Clock;
using client_detail::ConnectConfig;
using client_detail::Connection;
using client_detail::Deadline;
using client_detail::deadlineAfter;
using client_detail::OwnedReply;
using protocol::Command;
using protocol::Request;

namespace {

// Capability of the server for an optional 2.x command, learnt on first use.
enum Capability : std::uint8_t { kUnknown = 0, kYes = 1, kNo = 2 };

protocol::Dialect toProtocol(Dialect d) {
  return d == Dialect::kV113 ? protocol::Dialect::kV113
                             : protocol::Dialect::kV2;
}

std::string stripBrackets(std::string host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    return host.substr(1, host.size() - 2);
  }
  return host;
}

std::string registryKey(const ConnectConfig& c) {
  return fmt::format("{}|{}|{}", c.host, c.port, static_cast<int>(c.dialect));
}

Status notIn113(std::string_view what) {
  return Status::notSupported(
      fmt::format("{} is not available in the 1.13 dialect", what));
}

std::string joinKeys(const std::vector<std::string>& keys) {
  std::string s;
  for (const auto& k : keys) {
    if (!s.empty()) s += ", ";
    s += k;
  }
  return s;
}

}  // namespace

struct Client::Shared {
  ConnectConfig config;
  std::chrono::milliseconds connect_timeout{};
  std::size_t max_idle = 4;
  std::string key;
  bool registered = false;

  std::mutex primary_mu;
  std::unique_ptr<Connection> primary;  // guarded by primary_mu
  bool dirty = false;  // reply-less writes not yet confirmed (primary_mu)
  std::atomic<bool> dirty_hint{false};

  std::mutex pool_mu;
  std::vector<std::unique_ptr<Connection>> idle;  // guarded by pool_mu
  std::size_t borrowed = 0;                       // guarded by pool_mu

  std::atomic<std::uint8_t> barrier_cap{kUnknown};
  std::atomic<std::uint8_t> list_cap{kUnknown};
  std::atomic<std::uint8_t> queue_cap{kUnknown};

  ~Shared();

  bool v2() const { return config.dialect == protocol::Dialect::kV2; }

  // A (re)connect made for a call is bounded by the call's deadline, but
  // gets at least min(connect_timeout, 1 s), so a short wait on a client that
  // must first reconnect reports the wait's outcome, not a connect failure.
  Deadline connectDeadline(Deadline call) const {
    Deadline floor = deadlineAfter(std::min<std::chrono::milliseconds>(
        connect_timeout, std::chrono::seconds(1)));
    return std::min(std::max(call, floor), deadlineAfter(connect_timeout));
  }

  // Runs f(Connection&) on the primary connection (reconnecting it first if
  // needed) under the primary mutex. A connection f leaves broken is dropped.
  template <typename F>
  auto withPrimary(Deadline deadline, F&& f)
      -> decltype(f(std::declval<Connection&>())) {
    std::lock_guard<std::mutex> lock(primary_mu);
    if (primary && !primary->idleHealthy()) primary.reset();
    if (!primary) {
      auto c = Connection::open(config, connectDeadline(deadline));
      if (!c) return c.error();
      primary = std::move(*c);
      dirty =
          false;  // the old connection's writes were flushed or lost with it
      dirty_hint = false;
    }
    auto result = f(*primary);
    if (primary->broken()) primary.reset();
    return result;
  }

  // Makes reply-less writes sent on the primary visible to reads on other
  // connections: the server handles one connection's requests in order, so
  // one round trip after them proves they were applied.
  Status syncWrites(Deadline deadline) {
    if (!dirty_hint.load()) return Status::ok();
    return withPrimary(deadline, [&](Connection& c) -> Status {
      if (!dirty) return Status::ok();
      Request req;
      if (v2()) {
        req.command = Command::kPing;
        req.u32 = static_cast<std::uint32_t>(::getpid());
      } else {
        req.command = Command::kCheck;  // CHECK [] -> READY, no side effects
      }
      auto r = c.roundTrip(req, deadline);
      if (!r) return r.error();
      dirty = false;
      dirty_hint = false;
      return Status::ok();
    });
  }

  void markDirty() {  // caller holds primary_mu
    dirty = true;
    dirty_hint = true;
  }

  // A connection for one blocking operation; returned to the pool when the
  // lease ends if still healthy.
  class Lease {
   public:
    Lease(Shared* s, std::unique_ptr<Connection> c) : s_(s), c_(std::move(c)) {}
    Lease(Lease&& o) noexcept : s_(o.s_), c_(std::move(o.c_)) {
      o.s_ = nullptr;
    }
    Lease& operator=(Lease&&) = delete;
    ~Lease() {
      if (s_ != nullptr) s_->giveBack(std::move(c_));
    }
    Connection& operator*() { return *c_; }
    Connection* operator->() { return c_.get(); }

   private:
    Shared* s_;
    std::unique_ptr<Connection> c_;
  };

  Result<Lease> borrow(Deadline deadline) {
    {
      std::lock_guard<std::mutex> lock(pool_mu);
      while (!idle.empty()) {
        auto c = std::move(idle.back());
        idle.pop_back();
        if (c->idleHealthy()) {
          ++borrowed;
          return Lease(this, std::move(c));
        }
      }
      ++borrowed;  // counted while connecting, so openConnections() sees it
    }
    auto c = Connection::open(config, connectDeadline(deadline));
    if (!c) {
      std::lock_guard<std::mutex> lock(pool_mu);
      --borrowed;
      return c.error();
    }
    return Lease(this, std::move(*c));
  }

  void giveBack(std::unique_ptr<Connection> c) {
    std::unique_ptr<Connection> drop;  // closed outside the lock
    std::lock_guard<std::mutex> lock(pool_mu);
    --borrowed;
    if (c && !c->broken() && idle.size() < max_idle) {
      idle.push_back(std::move(c));
    } else {
      drop = std::move(c);
    }
  }

  // Short request on the primary connection.
  Result<OwnedReply> shortOp(const Request& req, Deadline deadline,
                             std::uint64_t count = 0) {
    return withPrimary(deadline, [&](Connection& c) -> Result<OwnedReply> {
      auto r = c.roundTrip(req, deadline, count);
      if (r) {
        if (protocol::replyShapeOf(req.command) ==
            protocol::ReplyShape::kNone) {
          markDirty();
        } else {
          // A reply proves every earlier request on this connection was
          // applied.
          dirty = false;
          dirty_hint = false;
        }
      }
      return r;
    });
  }

  // Sends a WAIT-like request (WAIT or BARRIER) and reads its STOP_WAITING.
  // On timeout: 2.x cancels (CANCEL_WAIT, absorbing "01" or "00 01"; in the
  // latter case the wait did complete and OK is returned); 1.13 cannot cancel,
  // so the connection is dropped (a stale "00" would follow).
  Status blockingWait(Connection& c, const Request& req, Deadline deadline,
                      std::string_view what) {
    Status s = c.send(req, deadline);
    if (!s) return s;
    OwnedReply reply;
    s = c.receive(protocol::ReplyShape::kByte, 0, deadline, reply);
    if (s) {
      if (reply.byte != protocol::kStopWaiting) {
        c.markBroken();
        return Status::protocolError(fmt::format(
            "{}: unexpected reply byte 0x{:02x}", what, reply.byte));
      }
      return Status::ok();
    }
    if (!s.isTimeout() || c.broken()) return s;
    Status timeout = Status::timeout(fmt::format("{} timed out", what));
    if (!v2()) {
      c.markBroken();  // 1.13: no cancel; drop the connection
      return timeout;
    }
    Request cancel;
    cancel.command = Command::kCancelWait;
    // The cancel round trip gets its own short grace period: the server
    // answers it at once unless it is stalled.
    Deadline grace = deadlineAfter(std::chrono::seconds(5));
    Status cs = c.send(cancel, grace);
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

  // After the server closed a connection in answer to an optional command:
  // if a fresh connection works, the server lacks the command.
  bool serverStillUp(Deadline deadline) {
    auto l = borrow(deadline);
    return l.has_value();
  }

  Status waitKeys(const std::vector<std::string>& wire, Deadline deadline,
                  std::string what) {
    Status s = syncWrites(deadline);
    if (!s) return s;
    auto lease = borrow(deadline);
    if (!lease) return lease.error();
    Request req;
    req.command = Command::kWait;
    for (const auto& k : wire) req.keys.emplace_back(k);
    return blockingWait(**lease, req, deadline, what);
  }
};

namespace {

// Both leak on purpose: a Client destroyed during static destruction (a
// global handle) must still find them.
std::mutex& registryMutex() {
  static auto* m = new std::mutex();
  return *m;
}
std::map<std::string, std::weak_ptr<Client::Shared>>& registry() {
  static auto* r = new std::map<std::string, std::weak_ptr<Client::Shared>>();
  return *r;
}

}  // namespace

Client::Shared::~Shared() {
  if (!registered) return;
  std::lock_guard<std::mutex> lock(registryMutex());
  auto it = registry().find(key);
  if (it != registry().end() && it->second.expired()) registry().erase(it);
}

Result<Client> Client::connect(const ClientOptions& options) {
  if (options.port == 0)
    return Status::invalidArgument("port 0 cannot be dialled");
  if (options.timeout.count() < 0 || options.connect_timeout.count() < 0) {
    return Status::invalidArgument("negative timeout");
  }
  ConnectConfig cfg;
  cfg.host = stripBrackets(options.host.empty() ? "127.0.0.1" : options.host);
  cfg.port = options.port;
  cfg.dialect = toProtocol(options.dialect);
  cfg.retry = options.retry;
  cfg.limits.max_value_bytes = options.max_value_bytes;
  cfg.limits.max_key_bytes =
      std::max<std::uint64_t>(options.max_value_bytes, 8 * 1024);
  cfg.limits.max_keys_per_request = options.max_reply_keys;
  const std::string key = registryKey(cfg);
  const Deadline deadline = deadlineAfter(options.connect_timeout);

  auto makeClient = [&](std::shared_ptr<Shared> s) {
    Client c(std::move(s), "", options.timeout);
    return options.prefix.empty() ? c : c.withPrefix(options.prefix);
  };

  if (options.share_connections) {
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
      return makeClient(std::move(existing));
    }
  }

  auto shared = std::make_shared<Shared>();
  shared->config = cfg;
  shared->connect_timeout = options.connect_timeout;
  shared->max_idle = options.max_idle_wait_connections;
  shared->key = key;
  auto conn = Connection::open(cfg, deadline);
  if (!conn) return conn.error();
  shared->primary = std::move(*conn);

  if (options.share_connections) {
    std::shared_ptr<Shared> winner;
    {
      std::lock_guard<std::mutex> lock(registryMutex());
      auto& slot = registry()[key];
      winner = slot.lock();
      if (!winner) {
        slot = shared;
        shared->registered = true;
      }
    }
    if (winner)
      return makeClient(std::move(winner));  // lost a race: use theirs
  }
  return makeClient(std::move(shared));
}

Client Client::withPrefix(std::string_view prefix) const {
  // PrefixStore(p, parent) sends p + "/" + key to parent, which adds its own
  // prefix in front: a view's prefix goes after its parent's.
  std::string p = prefix_;
  p.append(prefix);
  p.push_back('/');
  return Client(shared_, std::move(p), timeout_);
}

Dialect Client::dialect() const noexcept {
  return shared_->v2() ? Dialect::kV2 : Dialect::kV113;
}

std::string Client::wireKey(std::string_view key) const {
  std::string k;
  k.reserve(1 + prefix_.size() + key.size());
  k.push_back('/');
  k.append(prefix_);
  k.append(key);
  return k;
}

Status Client::set(std::string_view key, std::string_view value) const {
  std::string k = wireKey(key);
  Request req;
  req.command = Command::kSet;
  req.key = k;
  req.value = value;
  auto r = shared_->shortOp(req, deadlineAfter(timeout_));
  return r.error();
}

Result<std::string> Client::get(std::string_view key) const {
  return get(key, timeout_);
}

Result<std::string> Client::get(std::string_view key, Millis timeout) const {
  const Deadline deadline = deadlineAfter(timeout);
  std::string k = wireKey(key);
  Status s = shared_->syncWrites(deadline);
  if (!s) return s;
  auto lease = shared_->borrow(deadline);
  if (!lease) return lease.error();
  Request req;
  req.command = Command::kWait;
  req.keys.emplace_back(k);
  s = shared_->blockingWait(
      **lease, req, deadline,
      fmt::format("get: wait for key {}", std::string(key)));
  if (!s) return s;
  req.clear();
  req.command = Command::kGet;
  req.key = k;
  auto r = (*lease)->roundTrip(req, deadline);
  if (!r) return r.error();
  return std::move(r->value);
}

Result<std::int64_t> Client::add(std::string_view key,
                                 std::int64_t delta) const {
  std::string k = wireKey(key);
  Request req;
  req.command = Command::kAdd;
  req.key = k;
  req.number = delta;
  auto r = shared_->shortOp(req, deadlineAfter(timeout_));
  if (!r) return r.error();
  return r->number;
}

Result<std::string> Client::compareSet(std::string_view key,
                                       std::string_view expected,
                                       std::string_view desired) const {
  std::string k = wireKey(key);
  Request req;
  req.command = Command::kCompareSet;
  req.key = k;
  req.value = expected;
  req.desired = desired;
  auto r = shared_->shortOp(req, deadlineAfter(timeout_));
  if (!r) return r.error();
  return std::move(r->value);
}

Result<bool> Client::check(const std::vector<std::string>& keys) const {
  std::vector<std::string> wire;
  wire.reserve(keys.size());
  for (const auto& k : keys) wire.push_back(wireKey(k));
  Request req;
  req.command = Command::kCheck;
  for (const auto& k : wire) req.keys.emplace_back(k);
  auto r = shared_->shortOp(req, deadlineAfter(timeout_));
  if (!r) return r.error();
  if (r->byte == protocol::kCheckReady) return true;
  if (r->byte == protocol::kCheckNotReady) return false;
  return Status::protocolError(
      fmt::format("CHECK reply byte 0x{:02x}", r->byte));
}

Status Client::wait(const std::vector<std::string>& keys) const {
  return wait(keys, timeout_);
}

Status Client::wait(const std::vector<std::string>& keys,
                    Millis timeout) const {
  const Deadline deadline = deadlineAfter(timeout);
  std::vector<std::string> wire;
  wire.reserve(keys.size());
  for (const auto& k : keys) wire.push_back(wireKey(k));
  return shared_->waitKeys(wire, deadline,
                           fmt::format("wait for keys [{}] ({} ms)",
                                       joinKeys(keys), timeout.count()));
}

Result<bool> Client::deleteKey(std::string_view key) const {
  std::string k = wireKey(key);
  Request req;
  req.command = Command::kDeleteKey;
  req.key = k;
  auto r = shared_->shortOp(req, deadlineAfter(timeout_));
  if (!r) return r.error();
  return r->number == 1;
}

Result<std::int64_t> Client::numKeys() const {
  Request req;
  req.command = Command::kGetNumKeys;
  auto r = shared_->shortOp(req, deadlineAfter(timeout_));
  if (!r) return r.error();
  return r->number;
}

Status Client::append(std::string_view key, std::string_view value) const {
  if (!shared_->v2()) return notIn113("append");
  std::string k = wireKey(key);
  Request req;
  req.command = Command::kAppend;
  req.key = k;
  req.value = value;
  return shared_->shortOp(req, deadlineAfter(timeout_)).error();
}

Result<std::vector<std::string>> Client::multiGet(
    const std::vector<std::string>& keys) const {
  if (!shared_->v2()) return notIn113("multiGet");
  const Deadline deadline = deadlineAfter(timeout_);
  std::vector<std::string> wire;
  wire.reserve(keys.size());
  for (const auto& k : keys) wire.push_back(wireKey(k));
  Status s = shared_->syncWrites(deadline);
  if (!s) return s;
  auto lease = shared_->borrow(deadline);
  if (!lease) return lease.error();
  Request req;
  req.command = Command::kWait;
  for (const auto& k : wire) req.keys.emplace_back(k);
  s = shared_->blockingWait(
      **lease, req, deadline,
      fmt::format("multiGet: wait for keys [{}]", joinKeys(keys)));
  if (!s) return s;
  req.command = Command::kMultiGet;
  auto r = (*lease)->roundTrip(req, deadline, wire.size());
  if (!r) return r.error();
  return std::move(r->values);
}

Status Client::multiSet(const std::vector<std::string>& keys,
                        const std::vector<std::string>& values) const {
  if (!shared_->v2()) return notIn113("multiSet");
  if (keys.size() != values.size()) {
    return Status::invalidArgument(fmt::format(
        "multiSet: {} keys but {} values", keys.size(), values.size()));
  }
  std::vector<std::string> wire;
  wire.reserve(keys.size());
  for (const auto& k : keys) wire.push_back(wireKey(k));
  Request req;
  req.command = Command::kMultiSet;
  for (const auto& k : wire) req.keys.emplace_back(k);
  for (const auto& v : values) req.values.emplace_back(v);
  return shared_->shortOp(req, deadlineAfter(timeout_)).error();
}

// ---- optional commands: probe once, remember per endpoint ------------------

namespace {

Status lacks(std::string_view cmd, std::string_view which) {
  return Status::notSupported(fmt::format(
      "the server does not implement {} (it closed the connection on it; {})",
      cmd, which));
}

}  // namespace

Status Client::queuePush(std::string_view key, std::string_view value) const {
  if (!shared_->v2()) return notIn113("queuePush");
  if (shared_->queue_cap == kNo)
    return lacks("QUEUE_PUSH", "torch's classic servers");
  const Deadline deadline = deadlineAfter(timeout_);
  std::string k = wireKey(key);
  Request req;
  req.command = Command::kQueuePush;
  req.key = k;
  req.value = value;
  if (shared_->queue_cap == kYes)
    return shared_->shortOp(req, deadline).error();
  // Unknown: push and PING in one write; the echo proves the push was taken.
  Status s = shared_->withPrimary(deadline, [&](Connection& c) -> Status {
    std::string out;
    protocol::encodeRequest(protocol::Dialect::kV2, req, out);
    Request ping;
    ping.command = Command::kPing;
    ping.u32 = 0x51554555;  // "UEUQ"
    protocol::encodeRequest(protocol::Dialect::kV2, ping, out);
    Status st = c.sendBytes(out, deadline);
    if (!st) return st;
    OwnedReply r;
    st = c.receive(protocol::ReplyShape::kU32, 0, deadline, r);
    if (!st) {
      c.markBroken();
      return st;
    }
    if (r.u32 != ping.u32) {
      c.markBroken();
      return Status::protocolError("PING echo mismatch after QUEUE_PUSH");
    }
    return Status::ok();
  });
  if (s) {
    shared_->queue_cap = kYes;
    return s;
  }
  if (s.isClosed() && shared_->serverStillUp(deadline)) {
    shared_->queue_cap = kNo;
    return lacks("QUEUE_PUSH", "torch's classic servers");
  }
  return s;
}

Result<std::int64_t> Client::queueLen(std::string_view key) const {
  if (!shared_->v2()) return notIn113("queueLen");
  if (shared_->queue_cap == kNo)
    return lacks("QUEUE_LEN", "torch's classic servers");
  const Deadline deadline = deadlineAfter(timeout_);
  std::string k = wireKey(key);
  Request req;
  req.command = Command::kQueueLen;
  req.key = k;
  auto r = shared_->shortOp(req, deadline);
  if (r) {
    shared_->queue_cap = kYes;
    return r->number;
  }
  Status s = r.error();
  if (s.isClosed() && shared_->queue_cap == kUnknown &&
      shared_->serverStillUp(deadline)) {
    shared_->queue_cap = kNo;
    return lacks("QUEUE_LEN", "torch's classic servers");
  }
  return s;
}

Result<std::string> Client::queuePop(std::string_view key, bool block) const {
  if (!shared_->v2()) return notIn113("queuePop");
  if (shared_->queue_cap == kUnknown) {
    auto probe = queueLen(key);  // learn support before blocking on a WAIT
    if (!probe) return probe.error();
  }
  if (shared_->queue_cap == kNo)
    return lacks("QUEUE_POP", "torch's classic servers");
  const Deadline deadline = deadlineAfter(timeout_);
  std::string k = wireKey(key);
  Request req;
  req.key = k;
  Result<OwnedReply> r = Status::ioError("unreached");
  if (block) {
    Status s = shared_->syncWrites(deadline);
    if (!s) return s;
    auto lease = shared_->borrow(deadline);
    if (!lease) return lease.error();
    req.command = Command::kWait;
    req.keys.emplace_back(k);
    s = shared_->blockingWait(
        **lease, req, deadline,
        fmt::format("queuePop: wait for queue {}", std::string(key)));
    if (!s) return s;
    req.keys.clear();
    req.command = Command::kQueuePop;
    r = (*lease)->roundTrip(req, deadline);
  } else {
    req.command = Command::kQueuePop;
    r = shared_->shortOp(req, deadline);
  }
  if (!r) return r.error();
  if (r->number <= 0) {
    return Status::notFound(fmt::format("queue {} is empty", std::string(key)));
  }
  return std::move(r->value);
}

Result<std::vector<std::string>> Client::listKeys() const {
  if (!shared_->v2()) return notIn113("listKeys");
  if (shared_->list_cap == kNo) return lacks("LIST_KEYS", "torch < 2.14");
  const Deadline deadline = deadlineAfter(timeout_);
  Request req;
  req.command = Command::kListKeys;
  auto r = shared_->shortOp(req, deadline);
  if (!r) {
    Status s = r.error();
    if (s.isClosed() && shared_->list_cap == kUnknown &&
        shared_->serverStillUp(deadline)) {
      shared_->list_cap = kNo;
      return lacks("LIST_KEYS", "torch < 2.14");
    }
    return s;
  }
  shared_->list_cap = kYes;
  const std::string want = "/" + prefix_;
  std::vector<std::string> keys;
  for (auto& k : r->values) {
    if (k.size() >= want.size() && k.compare(0, want.size(), want) == 0) {
      keys.push_back(k.substr(want.size()));
    }
  }
  std::sort(keys.begin(), keys.end());
  return keys;
}

Status Client::ping() const {
  if (!shared_->v2()) return notIn113("ping");
  Request req;
  req.command = Command::kPing;
  req.u32 = static_cast<std::uint32_t>(::getpid()) ^ 0x5a5a5a5au;
  auto r = shared_->shortOp(req, deadlineAfter(timeout_));
  if (!r) return r.error();
  if (r->u32 != req.u32) {
    return Status::protocolError(
        fmt::format("PING echo {} != {}", r->u32, req.u32));
  }
  return Status::ok();
}

// ---- barrier and waitForWorkers ---------------------------------------------

namespace {

// Fallback barrier on servers without BARRIER: count with ADD; the last
// arrival sets the done key; everyone else waits on it (no polling).
Status countThenWait(Client::Shared& s, const std::string& counter_key,
                     const std::string& done_key, std::int64_t world_size,
                     Deadline deadline, const std::string& what) {
  Request req;
  req.command = Command::kAdd;
  req.key = counter_key;
  req.number = 1;
  auto r = s.shortOp(req, deadline);
  if (!r) return r.error();
  if (r->number >= world_size) {
    Request set;
    set.command = Command::kSet;
    set.key = done_key;
    set.value = "1";
    return s.shortOp(set, deadline).error();
  }
  return s.waitKeys({done_key}, deadline,
                    fmt::format("{} ({} of {} arrived when this one did)", what,
                                r->number, world_size));
}

// BARRIER key n where the server has it. Returns nullopt if the server
// turned out not to have it (caller falls back).
// After BARRIER returned on a key that others write with plain ADDs (torch
// ranks' `ADD init/ 1`): torch >= 2.14 wakes BARRIER waiters on any write of
// the key, i.e. possibly before the count is reached (verified on 2.14). Read
// the counter (GET does not wake anyone): if it is complete, SET the done key
// for anyone released early; otherwise this caller was released early and
// waits for the done key.
Status verifyCount(Client::Shared& s, Connection& c, const std::string& key,
                   const std::string& done_key, std::int64_t world_size,
                   Deadline deadline, const std::string& what) {
  Request get;
  get.command = Command::kGet;
  get.key = key;
  auto r = c.roundTrip(get, deadline);
  if (!r) return r.error();
  std::int64_t count = 0;
  const std::string& v = r->value;
  auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), count);
  if (ec != std::errc() || ptr != v.data() + v.size()) {
    c.markBroken();
    return Status::protocolError(
        fmt::format("{}: counter {} holds non-numeric '{}'", what, key, v));
  }
  if (count >= world_size) {
    Request set;
    set.command = Command::kSet;
    set.key = done_key;
    set.value = "1";
    return c.send(set, deadline);
  }
  Request wait;
  wait.command = Command::kWait;
  wait.keys.emplace_back(done_key);
  return s.blockingWait(c, wait, deadline, what);
}

std::optional<Status> tryBarrierCommand(
    Client::Shared& s, const std::string& key, std::int64_t world_size,
    Deadline deadline, const std::string& what, const std::string* done_key) {
  if (!s.v2() || s.barrier_cap == kNo) return std::nullopt;
  Status st = s.syncWrites(deadline);
  if (!st) return st;
  auto lease = s.borrow(deadline);
  if (!lease) return lease.error();
  Request req;
  req.command = Command::kBarrier;
  req.key = key;
  req.number = world_size;
  st = s.blockingWait(**lease, req, deadline, what);
  if (st && done_key != nullptr) {
    s.barrier_cap = kYes;
    return verifyCount(s, **lease, key, *done_key, world_size, deadline, what);
  }
  if (st || st.isTimeout()) {
    s.barrier_cap = kYes;
    return st;
  }
  if (st.isClosed() && s.barrier_cap == kUnknown && s.serverStillUp(deadline)) {
    // e.g. torch 2.6: closes on the unknown command byte before counting.
    s.barrier_cap = kNo;
    return std::nullopt;
  }
  return st;
}

}  // namespace

Status Client::barrier(std::string_view name, std::int64_t world_size) const {
  return barrier(name, world_size, timeout_);
}

Status Client::barrier(std::string_view name, std::int64_t world_size,
                       Millis timeout) const {
  if (world_size < 1)
    return Status::invalidArgument("barrier: world_size must be >= 1");
  const Deadline deadline = deadlineAfter(timeout);
  const std::string key = wireKey(name);
  const std::string what =
      fmt::format("barrier {} (world size {}, {} ms)", std::string(name),
                  world_size, timeout.count());
  if (auto r =
          tryBarrierCommand(*shared_, key, world_size, deadline, what, nullptr))
    return *r;
  return countThenWait(*shared_, key, key + ":done", world_size, deadline,
                       what);
}

Status Client::waitForWorkers(std::int64_t world_size) const {
  return waitForWorkers(world_size, timeout_);
}

Status Client::waitForWorkers(std::int64_t world_size, Millis timeout) const {
  if (world_size < 1)
    return Status::invalidArgument("waitForWorkers: world_size must be >= 1");
  const Deadline deadline = deadlineAfter(timeout);
  const std::string what = fmt::format("waitForWorkers (world size {}, {} ms)",
                                       world_size, timeout.count());
  const std::string done = "init/done";
  if (auto r = tryBarrierCommand(*shared_, "init/", world_size, deadline, what,
                                 &done))
    return *r;
  return countThenWait(*shared_, "init/", "init/done", world_size, deadline,
                       what);
}

std::size_t Client::openConnections() const {
  std::size_t n = 0;
  {
    std::lock_guard<std::mutex> lock(shared_->primary_mu);
    n += shared_->primary ? 1 : 0;
  }
  std::lock_guard<std::mutex> lock(shared_->pool_mu);
  return n + shared_->idle.size() + shared_->borrowed;
}

}  // namespace tcpstore
