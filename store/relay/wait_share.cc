#include "store/relay/wait_share.h"

#include <utility>

#include "store/relay/relay_backend.h"

namespace tcpstore::store::relay {

using protocol::Command;
using protocol::Dialect;

WaitShare::WaitShare(RelayBackend& relay) : relay_(relay) {}
WaitShare::~WaitShare() = default;

bool WaitShare::offer(ConnId conn, const protocol::Request& req) {
  if (req.command != Command::kWait || members_.count(conn) > 0) return false;
  const std::string_view wire = encodedV2(req, scratch_);
  if (wire.empty()) return false;
  auto it = groups_.find(wire);
  if (it == groups_.end()) {
    auto g = std::make_unique<Group>();
    g->request = wire;
    it = groups_.emplace(std::string(wire), std::move(g)).first;
    bytes_ += groupBytes(*it->second);
  }
  Group& g = *it->second;
  const std::uint64_t ticket = next_ticket_++;
  g.next.push_back(Caller{conn, ticket});
  ++g.live_next;
  members_[conn] = Member{&g, ticket, false};
  if (!g.in_flight) markDirty(g);
  bumpRelay(relay_.countersMut().shared_waits);
  return true;
}

bool WaitShare::live(const Caller& c, const Group* g) const {
  auto it = members_.find(c.conn);
  return it != members_.end() && it->second.ticket == c.ticket &&
         it->second.group == g;
}

void WaitShare::markDirty(Group& g) {
  if (g.dirty) return;
  g.dirty = true;
  dirty_.push_back(g.request);
}

void WaitShare::closeChannel(Group& g) {
  if (g.channel == 0) return;
  channels_.erase(g.channel);
  relay_.closeChannel(g.channel);
  g.channel = 0;
  g.in_flight = false;
}

void WaitShare::maybeErase(Group& g) {
  if (g.in_flight || g.live_sent > 0 || g.live_next > 0) return;
  closeChannel(g);
  bytes_ -= groupBytes(g);
  const std::string key = g.request;
  groups_.erase(key);  // `g` is gone
}

WaitShare::Group* WaitShare::byChannel(std::uint32_t channel) {
  auto it = channels_.find(channel);
  return it == channels_.end() ? nullptr : it->second;
}

std::string WaitShare::leave(ConnId conn) {
  auto it = members_.find(conn);
  if (it == members_.end()) return {};
  const Member m = it->second;
  members_.erase(it);
  Group& g = *m.group;
  std::string request = g.request;
  if (m.in_sent) {
    if (--g.live_sent == 0 && g.in_flight) {
      // Its last caller left: the upstream forgets the WAIT with the
      // channel (any STOP_WAITING already on the way is dropped).
      closeChannel(g);
      g.sent.clear();
      if (g.live_next > 0) markDirty(g);
    }
  } else {
    --g.live_next;
  }
  maybeErase(g);
  return request;
}

void WaitShare::flush() {
  if (dirty_.empty()) return;
  std::vector<std::string> keys = std::move(dirty_);
  dirty_.clear();
  for (const std::string& key : keys) {
    auto it = groups_.find(key);
    if (it == groups_.end()) continue;
    Group& g = *it->second;
    g.dirty = false;
    if (g.in_flight || g.live_next == 0) continue;
    if (g.channel == 0) {
      g.channel = relay_.openChannel(Dialect::kV2, RelayBackend::kSharedWait);
      channels_[g.channel] = &g;
    }
    relay_.writeEncoded(g.channel, g.request);
    g.in_flight = true;
    g.sent = std::move(g.next);
    g.next.clear();
    g.live_sent = g.live_next;
    g.live_next = 0;
    for (const Caller& c : g.sent) {
      auto m = members_.find(c.conn);
      if (m != members_.end() && m->second.ticket == c.ticket) {
        m->second.in_sent = true;
      }
    }
    bumpRelay(relay_.countersMut().upstream_waits);
  }
}

void WaitShare::onData(std::uint32_t channel, std::string_view payload) {
  Group* g = byChannel(channel);
  if (g == nullptr) return;
  if (!g->in_flight || payload.size() != 1 ||
      static_cast<unsigned char>(payload[0]) != protocol::kStopWaiting) {
    relay_.dropLink(Status::protocolError(
        "a shared WAIT's reply from the upstream is not one STOP_WAITING"));
    return;  // every group is gone with the link
  }
  relay_.flushDeliveries();
  g->in_flight = false;
  std::vector<Caller> sent = std::move(g->sent);
  g->sent.clear();
  g->live_sent = 0;
  Effects fx;
  const char stop = static_cast<char>(protocol::kStopWaiting);
  for (const Caller& c : sent) {
    if (!live(c, g)) continue;
    members_.erase(c.conn);
    if (fx.empty()) {
      fx.send(c.conn, std::string_view(&stop, 1));
    } else {
      const Effects::Send first = fx.sends().front();
      fx.repeat(c.conn, first);  // one byte for all, never copied
    }
  }
  if (g->live_next > 0) {
    markDirty(*g);  // late joiners: their own WAIT, on the same channel
  } else {
    g->next.clear();
    maybeErase(*g);
  }
  relay_.host().deliver(fx);
}

void WaitShare::onClosed(std::uint32_t channel, std::string_view reason) {
  // The upstream closed the channel (the WAIT broke a rule there, e.g. the
  // memory budget): its callers are closed with the reason, as a server
  // closes a client whose request it refuses. Late joiners get a new WAIT.
  Group* g = byChannel(channel);
  if (g == nullptr) return;
  channels_.erase(channel);
  g->channel = 0;
  g->in_flight = false;
  std::vector<ConnId> victims;
  for (const Caller& c : g->sent) {
    if (!live(c, g)) continue;
    members_.erase(c.conn);
    victims.push_back(c.conn);
  }
  g->sent.clear();
  g->live_sent = 0;
  if (g->live_next > 0) {
    markDirty(*g);
  } else {
    maybeErase(*g);
  }
  const Status st =
      Status::closed("upstream closed the channel: " + std::string(reason));
  for (ConnId conn : victims) relay_.host().close(conn, st);
}

std::vector<ConnId> WaitShare::onLinkDown() {
  std::vector<ConnId> callers;
  callers.reserve(members_.size());
  for (const auto& [conn, m] : members_) callers.push_back(conn);
  members_.clear();
  channels_.clear();
  groups_.clear();
  bytes_ = 0;
  dirty_.clear();
  return callers;
}

}  // namespace tcpstore::store::relay
