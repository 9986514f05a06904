#include "store/relay/combiner.h"

#include <utility>

#include "store/relay/relay_backend.h"

namespace tcpstore::store::relay {

using protocol::Command;
using protocol::Dialect;

Combiner::Combiner(RelayBackend& relay) : relay_(relay) {}
Combiner::~Combiner() = default;

bool Combiner::offer(ConnId conn, Dialect dialect,
                     const protocol::Request& req) {
  const char d = static_cast<char>(dialect == Dialect::kV2 ? 1 : 0);
  switch (req.command) {
    case Command::kAdd: {
      std::string id(1, d);
      id.append(req.key);
      auto [it, fresh] = adds_.try_emplace(id);
      if (it->second.next.empty()) dirty_adds_.push_back(id);
      it->second.next.push_back(Caller{conn, req.number});
      (void)fresh;
      return true;
    }
    case Command::kGet:
    case Command::kCheck:
    case Command::kMultiGet: {
      scratch_.assign(1, d);
      if (!protocol::encodeRequest(dialect, req, scratch_)) return false;
      auto it = reads_.find(scratch_);
      if (it == reads_.end()) {
        Op op{dialect, req.command, req.keys.size(), {}, scratch_.substr(1),
              0,       {}};
        it = reads_.emplace(scratch_, std::move(op)).first;
      }
      it->second.callers.push_back(Caller{conn, 0});
      return true;
    }
    default:
      return false;
  }
}

Combiner::Shared& Combiner::shared(Dialect d) {
  Shared& s = shared_[d == Dialect::kV2 ? 1 : 0];
  if (s.channel == 0) {
    s.channel = relay_.openChannel(d, RelayBackend::kShared);
    s.tracker = std::make_unique<ReplyTracker>(relay_.options().limits);
    s.ops.clear();
  }
  return s;
}

void Combiner::sendAlone(ConnId conn, const Op& op, std::int64_t delta) {
  if (op.command == Command::kAdd) {
    protocol::Request r;
    r.command = Command::kAdd;
    r.key = op.key;
    r.number = delta;
    relay_.tunnel(conn, r);
  } else {
    relay_.tunnelEncoded(conn, op.command, op.count, op.request);
  }
  relay_.host().complete(conn, Status::ok(), Effects());
}

void Combiner::flush() {
  if (reads_.empty() && dirty_adds_.empty()) return;
  // Completions below may re-enter offer(): take this turn's batches first.
  std::map<std::string, Op> reads = std::move(reads_);
  reads_.clear();
  std::vector<std::string> dirty = std::move(dirty_adds_);
  dirty_adds_.clear();
  std::vector<std::pair<ConnId, Op*>> alone;
  for (auto& [id, op] : reads) {
    if (op.callers.size() == 1) {
      alone.emplace_back(op.callers.front().conn, &op);
      continue;
    }
    const std::uint64_t n = next_op_++;
    bumpRelay(relay_.countersMut().upstream_reads);
    bumpRelay(relay_.countersMut().coalesced, op.callers.size());
    in_flight_.emplace(n, std::move(op));
    send(n);
  }
  std::vector<std::pair<ConnId, Op>> alone_adds;
  for (const std::string& id : dirty) {
    auto it = adds_.find(id);
    if (it == adds_.end() || it->second.in_flight) continue;
    AddGroup& g = it->second;
    std::vector<Caller> batch = std::move(g.next);
    g.next.clear();
    if (batch.empty()) continue;
    Op op{id[0] == 1 ? Dialect::kV2 : Dialect::kV113,
          Command::kAdd,
          0,
          id.substr(1),
          {},
          0,
          {}};
    bool overflow = false;
    for (const Caller& c : batch) {
      if (__builtin_add_overflow(op.sum, c.delta, &op.sum)) overflow = true;
    }
    if (batch.size() == 1 || overflow) {
      for (const Caller& c : batch) alone_adds.emplace_back(c.conn, Op{op});
      for (std::size_t i = 0; i < batch.size(); ++i)
        alone_adds[alone_adds.size() - batch.size() + i].second.sum =
            batch[i].delta;
      adds_.erase(it);
      continue;
    }
    g.in_flight = true;
    op.callers = std::move(batch);
    protocol::Request r;
    r.command = Command::kAdd;
    r.key = op.key;
    r.number = op.sum;
    protocol::encodeRequest(op.dialect, r, op.request);
    const std::uint64_t n = next_op_++;
    bumpRelay(relay_.countersMut().upstream_adds);
    bumpRelay(relay_.countersMut().combined, op.callers.size());
    in_flight_.emplace(n, std::move(op));
    send(n);
  }
  // Lone requests last: their completions may re-enter offer().
  for (auto& [conn, op] : alone) sendAlone(conn, *op, 0);
  for (auto& [conn, op] : alone_adds) sendAlone(conn, op, op.sum);
}

void Combiner::send(std::uint64_t id) {
  Op& op = in_flight_.at(id);
  Shared& s = shared(op.dialect);
  relay_.writeEncoded(s.channel, op.request);
  s.tracker->expect(op.command, op.count, id);
  s.ops.push_back(id);
}

void Combiner::onData(std::uint32_t channel, std::string_view payload) {
  for (Shared& s : shared_) {
    if (s.channel != channel) continue;
    std::vector<std::pair<std::uint64_t, std::string>> done;
    const bool ok = s.tracker->feed(payload, [&](const ReplyTracker::Done& d) {
      done.emplace_back(d.tag, std::string(d.bytes));
    });
    for (auto& [id, bytes] : done) {
      if (!s.ops.empty() && s.ops.front() == id) s.ops.pop_front();
      finish(id, bytes);
    }
    if (!ok) {
      relay_.dropLink(Status::protocolError(
          "a shared reply from the upstream could not be decoded"));
    }
    return;
  }
}

void Combiner::finish(std::uint64_t id, std::string_view reply) {
  auto it = in_flight_.find(id);
  if (it == in_flight_.end()) return;
  Op op = std::move(it->second);
  in_flight_.erase(it);
  relay_.flushDeliveries();
  Effects fx;
  if (op.command == Command::kAdd) {
    auto g =
        adds_.find(std::string(1, op.dialect == Dialect::kV2 ? 1 : 0) + op.key);
    if (g != adds_.end()) {
      g->second.in_flight = false;
      if (g->second.next.empty()) {
        adds_.erase(g);
      } else {
        dirty_adds_.push_back(g->first);
      }
    }
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
  for (const Caller& c : op.callers) {
    fx.clear();
    fx.send(c.conn, reply);
    relay_.host().complete(c.conn, Status::ok(), fx);
  }
}

void Combiner::fail(const Op& op, const Status& st) {
  Effects none;
  for (const Caller& c : op.callers) relay_.host().complete(c.conn, st, none);
}

void Combiner::onClosed(std::uint32_t channel, std::string_view reason) {
  for (Shared& s : shared_) {
    if (s.channel != channel) continue;
    std::deque<std::uint64_t> ops = std::move(s.ops);
    s.channel = 0;
    s.tracker.reset();
    if (ops.empty()) return;
    // The upstream stopped at the first unanswered request: it broke a rule
    // (an ADD on a non-numeric value, a GET of a missing key). Its callers
    // get the reason; the requests behind it were not applied: resend them.
    const std::uint64_t bad = ops.front();
    ops.pop_front();
    auto it = in_flight_.find(bad);
    if (it != in_flight_.end()) {
      Op op = std::move(it->second);
      in_flight_.erase(it);
      if (op.command == Command::kAdd) {
        auto g = adds_.find(std::string(1, op.dialect == Dialect::kV2 ? 1 : 0) +
                            op.key);
        if (g != adds_.end()) {
          g->second.in_flight = false;
          if (!g->second.next.empty()) dirty_adds_.push_back(g->first);
        }
      }
      fail(op, Status::closed(std::string(reason)));
    }
    for (std::uint64_t id : ops) {
      if (in_flight_.count(id) > 0) send(id);
    }
    return;
  }
}

void Combiner::onLinkDown(const Status& why) {
  const Status st = Status::closed("lost the upstream: " + why.message());
  std::vector<Op> victims;
  for (auto& [id, op] : in_flight_) victims.push_back(std::move(op));
  in_flight_.clear();
  for (auto& [id, op] : reads_) victims.push_back(std::move(op));
  reads_.clear();
  for (auto& [id, g] : adds_) {
    Op op;
    for (const Caller& c : g.next) op.callers.push_back(c);
    victims.push_back(std::move(op));
  }
  adds_.clear();
  dirty_adds_.clear();
  for (Shared& s : shared_) {
    s.channel = 0;
    s.tracker.reset();
    s.ops.clear();
  }
  for (const Op& op : victims) fail(op, st);
}

}  // namespace tcpstore::store::relay
