// Client's operations: map user keys to wire keys, pick the connection
// (primary for short operations, a borrowed one for blocking reads) and turn
// replies into results. Connections, leases and waits live in shared.cc,
// optional commands in probe.h, barrier and waitForWorkers in barrier.cc.
#include "tcpstore/client.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>

#include "store/client/shared.h"

namespace tcpstore {

using client_detail::ConnectConfig;
using client_detail::Connection;
using client_detail::Deadline;
using client_detail::deadlineAfter;
using client_detail::Feature;
using client_detail::lacks;
using client_detail::OwnedReply;
using client_detail::Shared;
using client_detail::wireKey;
using client_detail::wireKeys;
namespace requests = protocol::requests;

namespace {

std::string stripBrackets(std::string host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    return host.substr(1, host.size() - 2);
  }
  return host;
}

bool parsePort(std::string_view text, std::uint16_t& port) {
  unsigned v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || v == 0 ||
      v > 65535) {
    return false;
  }
  port = static_cast<std::uint16_t>(v);
  return true;
}

Status notIn113(std::string_view what) {
  return Status::notSupported(
      fmt::format("{} is not available in the 1.13 dialect", what));
}

}  // namespace

Result<std::vector<Endpoint>> parseEndpoints(std::string_view list) {
  std::vector<Endpoint> out;
  std::string_view rest = list;
  for (;;) {
    const auto comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    const auto colon = item.rfind(':');
    Endpoint e;
    if (colon == std::string_view::npos || colon == 0 ||
        !parsePort(item.substr(colon + 1), e.port)) {
      return Status::invalidArgument(
          fmt::format("'{}' in '{}' is not HOST:PORT with a port in 1..65535",
                      std::string(item), std::string(list)));
    }
    e.host = stripBrackets(std::string(item.substr(0, colon)));
    if (e.host.empty() ||
        (e.host.find(':') != std::string::npos && item.front() != '[')) {
      return Status::invalidArgument(
          fmt::format("'{}' in '{}': write an IPv6 address as [ADDR]:PORT",
                      std::string(item), std::string(list)));
    }
    out.push_back(std::move(e));
    if (comma == std::string_view::npos) return out;
    rest = rest.substr(comma + 1);
  }
}

Client::Client(std::shared_ptr<Shared> shared, std::string prefix,
               Millis timeout)
    : shared_(std::move(shared)),
      prefix_(std::move(prefix)),
      timeout_(timeout) {}

Result<Client> Client::connect(const ClientOptions& options) {
  ConnectConfig cfg;
  if (options.endpoints.empty()) {
    cfg.endpoints.push_back(
        {stripBrackets(options.host.empty() ? "127.0.0.1" : options.host),
         options.port});
  } else {
    for (const auto& e : options.endpoints) {
      cfg.endpoints.push_back(
          {stripBrackets(e.host.empty() ? "127.0.0.1" : e.host), e.port});
    }
  }
  for (const auto& e : cfg.endpoints) {
    if (e.port == 0) {
      return Status::invalidArgument("port 0 cannot be dialled");
    }
  }
  if (options.timeout.count() < 0 || options.connect_timeout.count() < 0) {
    return Status::invalidArgument("negative timeout");
  }
  cfg.dialect = client_detail::toProtocol(options.dialect);
  cfg.retry = options.retry;
  cfg.limits.max_value_bytes = options.max_value_bytes;
  cfg.limits.max_key_bytes =
      std::max<std::uint64_t>(options.max_value_bytes, 8 * 1024);
  cfg.limits.max_keys_per_request = options.max_reply_keys;
  auto shared = Shared::attach(cfg, options.connect_timeout,
                               options.max_idle_wait_connections,
                               options.share_connections);
  if (!shared) return shared.error();
  Client c(std::move(*shared), "", options.timeout);
  return options.prefix.empty() ? c : c.withPrefix(options.prefix);
}

Client Client::withPrefix(std::string_view prefix) const {
  // PrefixStore(p, parent) sends p + "/" + key to parent, which adds its own
  // prefix in front: a view's prefix goes after its parent's.
  std::string p = prefix_;
  p.append(prefix);
  p.push_back('/');
  return Client(shared_, std::move(p), timeout_);
}

Dialect Client::dialect() const noexcept { return shared_->dialect(); }

std::size_t Client::openConnections() const {
  return shared_->openConnections();
}

// ---- both dialects
// -----------------------------------------------------------

Status Client::set(std::string_view key, std::string_view value) const {
  const std::string k = wireKey(prefix_, key);
  return shared_->shortOp(requests::set(k, value), deadlineAfter(timeout_))
      .error();
}

Result<std::string> Client::get(std::string_view key) const {
  return get(key, timeout_);
}

Result<std::string> Client::get(std::string_view key, Millis timeout) const {
  const Deadline deadline = deadlineAfter(timeout);
  const std::string k = wireKey(prefix_, key);
  return shared_->reissuing(deadline, [&] {
    return shared_->waitThen(
        {k}, deadline, fmt::format("get: wait for key {}", std::string(key)),
        [&](Connection& c) -> Result<std::string> {
          auto r = c.roundTrip(requests::get(k), deadline);
          if (!r) return r.error();
          return std::move(r->value);
        });
  });
}

Result<std::int64_t> Client::add(std::string_view key,
                                 std::int64_t delta) const {
  const std::string k = wireKey(prefix_, key);
  auto r = shared_->shortOp(requests::add(k, delta), deadlineAfter(timeout_));
  if (!r) return r.error();
  return r->number;
}

Result<std::string> Client::compareSet(std::string_view key,
                                       std::string_view expected,
                                       std::string_view desired) const {
  const std::string k = wireKey(prefix_, key);
  auto r = shared_->shortOp(requests::compareSet(k, expected, desired),
                            deadlineAfter(timeout_));
  if (!r) return r.error();
  return std::move(r->value);
}

Result<bool> Client::check(const std::vector<std::string>& keys) const {
  const Deadline deadline = deadlineAfter(timeout_);
  const std::vector<std::string> wire = wireKeys(prefix_, keys);
  const protocol::Request req = requests::check(wire);  // views into `wire`
  auto r = shared_->reissuing(deadline,
                              [&] { return shared_->shortOp(req, deadline); });
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
  return shared_->waitKeys(
      wireKeys(prefix_, keys), deadlineAfter(timeout),
      fmt::format("wait for keys [{}] ({} ms)", client_detail::joinKeys(keys),
                  timeout.count()));
}

Result<bool> Client::deleteKey(std::string_view key) const {
  const std::string k = wireKey(prefix_, key);
  auto r = shared_->shortOp(requests::deleteKey(k), deadlineAfter(timeout_));
  if (!r) return r.error();
  return r->number == 1;
}

Result<std::int64_t> Client::numKeys() const {
  const Deadline deadline = deadlineAfter(timeout_);
  auto r = shared_->reissuing(deadline, [&] {
    return shared_->shortOp(requests::numKeys(), deadline);
  });
  if (!r) return r.error();
  return r->number;
}

// ---- 2.x only
// ----------------------------------------------------------------

Status Client::append(std::string_view key, std::string_view value) const {
  if (!shared_->v2()) return notIn113("append");
  const std::string k = wireKey(prefix_, key);
  return shared_->shortOp(requests::append(k, value), deadlineAfter(timeout_))
      .error();
}

Result<std::vector<std::string>> Client::multiGet(
    const std::vector<std::string>& keys) const {
  if (!shared_->v2()) return notIn113("multiGet");
  const Deadline deadline = deadlineAfter(timeout_);
  const std::vector<std::string> wire = wireKeys(prefix_, keys);
  return shared_->reissuing(deadline, [&] {
    return shared_->waitThen(
        wire, deadline,
        fmt::format("multiGet: wait for keys [{}]",
                    client_detail::joinKeys(keys)),
        [&](Connection& c) -> Result<std::vector<std::string>> {
          auto r = c.roundTrip(requests::multiGet(wire), deadline, wire.size());
          if (!r) return r.error();
          return std::move(r->values);
        });
  });
}

Status Client::multiSet(const std::vector<std::string>& keys,
                        const std::vector<std::string>& values) const {
  if (!shared_->v2()) return notIn113("multiSet");
  if (keys.size() != values.size()) {
    return Status::invalidArgument(fmt::format(
        "multiSet: {} keys but {} values", keys.size(), values.size()));
  }
  return shared_
      ->shortOp(requests::multiSet(wireKeys(prefix_, keys), values),
                deadlineAfter(timeout_))
      .error();
}

Status Client::ping() const {
  if (!shared_->v2()) return notIn113("ping");
  const auto nonce = static_cast<std::uint32_t>(::getpid()) ^ 0x5a5a5a5au;
  const Deadline deadline = deadlineAfter(timeout_);
  auto r = shared_->reissuing(deadline, [&] {
    return shared_->shortOp(requests::ping(nonce), deadline);
  });
  if (!r) return r.error();
  if (r->u32 != nonce) {
    return Status::protocolError(
        fmt::format("PING echo {} != {}", r->u32, nonce));
  }
  return Status::ok();
}

// ---- optional commands (probe.h)
// ---------------------------------------------

Status Client::queuePush(std::string_view key, std::string_view value) const {
  if (!shared_->v2()) return notIn113("queuePush");
  const Deadline deadline = deadlineAfter(timeout_);
  const std::string k = wireKey(prefix_, key);
  const protocol::Request push = requests::queuePush(k, value);
  auto s = shared_->probed(Feature::kQueues, deadline, [&](bool probing) {
    if (!probing) return shared_->shortOp(push, deadline).error();
    // Support unknown: push and PING in one write; the echo proves the push
    // was taken (a server without queues closes instead).
    return shared_->withPrimary(deadline, [&](Connection& c) -> Status {
      const protocol::Request ping = requests::ping(0x51554555);  // "UEUQ"
      std::string out;
      protocol::encodeRequest(protocol::Dialect::kV2, push, out);
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
  });
  if (!s) return lacks(Feature::kQueues, "QUEUE_PUSH");
  return *s;
}

Result<std::int64_t> Client::queueLen(std::string_view key) const {
  if (!shared_->v2()) return notIn113("queueLen");
  const Deadline deadline = deadlineAfter(timeout_);
  const std::string k = wireKey(prefix_, key);
  auto r = shared_->probed(Feature::kQueues, deadline, [&](bool) {
    return shared_->reissuing(deadline, [&] {
      return shared_->shortOp(requests::queueLen(k), deadline);
    });
  });
  if (!r) return lacks(Feature::kQueues, "QUEUE_LEN");
  if (!*r) return r->error();
  return (*r)->number;
}

Result<std::string> Client::queuePop(std::string_view key, bool block) const {
  if (!shared_->v2()) return notIn113("queuePop");
  if (shared_->support(Feature::kQueues) ==
      client_detail::Capabilities::kUnknown) {
    // Learn support before blocking on a WAIT.
    auto probe = queueLen(key);
    if (!probe) return probe.error();
  }
  const Deadline deadline = deadlineAfter(timeout_);
  const std::string k = wireKey(prefix_, key);
  auto r = shared_->probed(
      Feature::kQueues, deadline, [&](bool) -> Result<OwnedReply> {
        if (!block) return shared_->shortOp(requests::queuePop(k), deadline);
        return shared_->waitThen(
            {k}, deadline,
            fmt::format("queuePop: wait for queue {}", std::string(key)),
            [&](Connection& c) {
              return c.roundTrip(requests::queuePop(k), deadline);
            });
      });
  if (!r) return lacks(Feature::kQueues, "QUEUE_POP");
  if (!*r) return r->error();
  if ((*r)->number <= 0) {
    return Status::notFound(fmt::format("queue {} is empty", std::string(key)));
  }
  return std::move((*r)->value);
}

Result<std::vector<std::string>> Client::listKeys() const {
  if (!shared_->v2()) return notIn113("listKeys");
  const Deadline deadline = deadlineAfter(timeout_);
  auto r = shared_->probed(Feature::kListKeys, deadline, [&](bool) {
    return shared_->reissuing(deadline, [&] {
      return shared_->shortOp(requests::listKeys(), deadline);
    });
  });
  if (!r) return lacks(Feature::kListKeys, "LIST_KEYS");
  if (!*r) return r->error();
  // Only this view's keys, as its user names them.
  const std::string want = "/" + prefix_;
  std::vector<std::string> keys;
  for (auto& k : (*r)->values) {
    if (k.size() >= want.size() && k.compare(0, want.size(), want) == 0) {
      keys.push_back(k.substr(want.size()));
    }
  }
  std::sort(keys.begin(), keys.end());
  return keys;
}

}  // namespace tcpstore
