#include "store/relay/combiner.h"

#include <utility>

#include "store/relay/relay_backend.h"

namespace tcpstore::store::relay {

using protocol::Command;
using protocol::Dialect;

Combiner::Combiner(RelayBackend& relay) : relay_(relay) {}
Combiner::~Combiner() = default;

bool Combiner::offer(ConnId conn, const protocol::Request& req) {
  switch (req.command) {
    case Command::kAdd: {
      std::string id(req.key);
      AddGroup& g = adds_[id];
      if (g.next.empty()) dirty_adds_.push_back(std::move(id));
      g.next.push_back(Caller{conn, req.number});
      return true;
    }
    case Command::kGet:
    case Command::kCheck:
    case Command::kMultiGet: {
      const std::string_view wire = encodedV2(req, scratch_);
      if (wire.empty()) return false;
      auto it = reads_.find(wire);
      if (it == reads_.end()) {
        Op op;
        op.command = req.command;
        op.count = req.keys.size();
        op.request = wire;
        it = reads_.emplace(std::string(wire), std::move(op)).first;
      }
      it->second.callers.push_back(Caller{conn, 0});
      return true;
    }
    default:
      return false;
  }
}

Combiner::Shared& Combiner::pick() {
  Shared* best = nullptr;
  for (Shared& sh : shared_) {
    if (sh.ops.empty()) return sh;
    if (best == nullptr || sh.ops.size() < best->ops.size()) best = &sh;
  }
  if (best != nullptr && shared_.size() >= kMaxShared) return *best;
  Shared& sh = shared_.emplace_back();
  sh.channel = relay_.openChannel(Dialect::kV2, RelayBackend::kShared);
  sh.tracker = std::make_unique<ReplyTracker>(relay_.options().limits);
  return sh;
}

Combiner::Shared* Combiner::find(std::uint32_t channel) {
  for (Shared& sh : shared_) {
    if (sh.channel == channel) return &sh;
  }
  return nullptr;
}

void Combiner::sendAlone(ConnId conn, const Op& op, std::int64_t delta) {
  if (op.command == Command::kAdd) {
    protocol::Request r;
    r.command = Command::kAdd;
    r.key = op.key;
    r.number = delta;
    (void)relay_.tunnel(conn, r);  // ADD exists in 2.x: cannot fail
  } else {
    relay_.tunnelEncoded(conn, op.command, op.count, op.request);
  }
  relay_.continueAfterTunnel(conn);  // held here if its output is full
}

void Combiner::flush() {
  if (reads_.empty() && dirty_adds_.empty()) return;
  // Completions below may re-enter offer(): take this turn's batches first.
  std::map<std::string, Op, std::less<>> reads = std::move(reads_);
  reads_.clear();
  std::vector<std::string> dirty = std::move(dirty_adds_);
  dirty_adds_.clear();
  RelayCounters& ctr = relay_.countersMut();
  std::vector<std::pair<ConnId, Op>> alone;
  for (auto& [id, op] : reads) {
    if (op.callers.size() == 1) {
      const ConnId conn = op.callers.front().conn;
      alone.emplace_back(conn, std::move(op));
      continue;
    }
    const std::uint64_t n = next_op_++;
    bumpRelay(ctr.upstream_reads);
    bumpRelay(ctr.coalesced, op.callers.size());
    launch(n, std::move(op));
  }
  for (std::string& id : dirty) {
    auto it = adds_.find(id);
    if (it == adds_.end() || it->second.in_flight) continue;
    std::vector<Caller> batch = std::move(it->second.next);
    it->second.next.clear();
    if (batch.empty()) continue;
    Op op;
    op.command = Command::kAdd;
    op.key = id;
    bool overflow = false;
    for (const Caller& c : batch) {
      if (__builtin_add_overflow(op.sum, c.delta, &op.sum)) overflow = true;
    }
    if (batch.size() == 1 || overflow) {
      // Alone (or a sum past int64): each ADD on its caller's channel.
      for (const Caller& c : batch) {
        Op one;
        one.command = Command::kAdd;
        one.key = id;
        one.sum = c.delta;
        alone.emplace_back(c.conn, std::move(one));
      }
      adds_.erase(it);
      continue;
    }
    it->second.in_flight = true;
    op.callers = std::move(batch);
    protocol::Request r;
    r.command = Command::kAdd;
    r.key = op.key;
    r.number = op.sum;
    protocol::encodeRequest(Dialect::kV2, r, op.request);
    const std::uint64_t n = next_op_++;
    bumpRelay(ctr.upstream_adds);
    bumpRelay(ctr.combined, op.callers.size());
    launch(n, std::move(op));
  }
  // Lone requests last: their completions may re-enter offer().
  for (auto& [conn, op] : alone) sendAlone(conn, op, op.sum);
}

void Combiner::send(std::uint64_t id) {
  Op& op = in_flight_.at(id);
  Shared& s = pick();
  relay_.writeEncoded(s.channel, op.request);
  s.tracker->expect(op.command, op.count, id);
  s.ops.push_back(id);
}

void Combiner::onData(std::uint32_t channel, std::string_view payload) {
  Shared* s = find(channel);
  if (s == nullptr) return;
  std::vector<std::pair<std::uint64_t, std::string>> done;
  const bool ok = s->tracker->feed(payload, [&](const ReplyTracker::Done& d) {
    done.emplace_back(d.tag, std::string(d.bytes));
  });
  for (const auto& [id, bytes] : done) {
    if (!s->ops.empty() && s->ops.front() == id) s->ops.pop_front();
  }
  // `s` may move from here on (finish() can re-enter offer() and send()).
  for (auto& [id, bytes] : done) finish(id, std::move(bytes));
  if (!ok) {
    relay_.dropLink(Status::protocolError(
        "a shared reply from the upstream could not be decoded"));
  }
}

void Combiner::addDone(const std::string& key) {
  auto g = adds_.find(key);
  if (g == adds_.end()) return;
  g->second.in_flight = false;
  if (g->second.next.empty()) {
    adds_.erase(g);
  } else {
    dirty_adds_.push_back(key);  // the next batch goes out this turn
  }
}

void Combiner::launch(std::uint64_t n, Op op) {
  op.charged = sizeof(Op) + 64 + op.request.capacity() + op.key.capacity() +
               op.callers.capacity() * sizeof(Caller);
  bytes_ += op.charged;
  in_flight_.emplace(n, std::move(op));
  send(n);
}

Combiner::Op Combiner::retire(
    std::unordered_map<std::uint64_t, Op>::iterator it) {
  Op op = std::move(it->second);
  in_flight_.erase(it);
  bytes_ -= op.charged;
  return op;
}

void Combiner::finish(std::uint64_t id, std::string reply) {
  auto it = in_flight_.find(id);
  if (it == in_flight_.end()) return;
  Op op = retire(it);
  relay_.flushDeliveries();
  Effects fx;
  if (op.command == Command::kAdd) {
    addDone(op.key);
    const auto v = static_cast<std::int64_t>(protocol::loadU64(
        reinterpret_cast<const unsigned char*>(reply.data())));
    // The callers' values in one serial order: V - sum + d1 + ... + di.
    std::int64_t running = 0;
    for (const Caller& c : op.callers) {
      running += c.delta;
      fx.clear();
      protocol::appendI64(fx.begin(c.conn), v - op.sum + running);
      fx.end();
      relay_.host().complete(c.conn, Status::ok(), fx);
    }
    return;
  }
  // Built once: every caller's outbox references the same bytes.
  const SharedBytes shared = SharedBytes::adopt(std::move(reply));
  for (const Caller& c : op.callers) {
    fx.clear();
    fx.sendShared(c.conn, shared);
    relay_.host().complete(c.conn, Status::ok(), fx);
  }
}

void Combiner::fail(const Op& op, const Status& st) {
  Effects none;
  for (const Caller& c : op.callers) relay_.host().complete(c.conn, st, none);
}

void Combiner::onClosed(std::uint32_t channel, std::string_view reason) {
  Shared* s = find(channel);
  if (s == nullptr) return;
  std::deque<std::uint64_t> ops = std::move(s->ops);
  shared_.erase(shared_.begin() + (s - shared_.data()));
  if (ops.empty()) return;
  // The upstream stopped at the first unanswered request: it broke a rule
  // (an ADD on a non-numeric value, a GET of a missing key). Its callers get
  // the reason; the requests behind it were not applied: send them again.
  const std::uint64_t bad = ops.front();
  ops.pop_front();
  for (std::uint64_t id : ops) {
    if (in_flight_.count(id) > 0) send(id);
  }
  auto it = in_flight_.find(bad);
  if (it != in_flight_.end()) {
    Op op = retire(it);
    if (op.command == Command::kAdd) addDone(op.key);
    fail(op, Status::closed(std::string(reason)));
  }
}

void Combiner::onLinkDown(const Status& why) {
  const Status st = Status::closed("lost the upstream: " + why.message());
  std::vector<Op> victims;
  for (auto& [id, op] : in_flight_) victims.push_back(std::move(op));
  in_flight_.clear();
  bytes_ = 0;
  for (auto& [id, op] : reads_) victims.push_back(std::move(op));
  reads_.clear();
  for (auto& [id, g] : adds_) {
    Op op;
    op.callers = std::move(g.next);
    victims.push_back(std::move(op));
  }
  adds_.clear();
  dirty_adds_.clear();
  shared_.clear();
  for (const Op& op : victims) fail(op, st);
}

}  // namespace tcpstore::store::relay
