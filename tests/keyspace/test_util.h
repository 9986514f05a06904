// Helpers shared by the keyspace tests: request builders and a readable
// rendering of Effects ("conn:hexbytes" per send) for exact comparisons.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "protocol/message.h"
#include "protocol/requests.h"
#include "protocol/wire.h"
#include "store/keyspace.h"
#include "tests/support/hex.h"

namespace tcpstore::store::testing {

using protocol::Command;
using protocol::Request;

// Hex text comes from tests/support/hex.h.
using tcpstore::test::fromHex;
// prefix0, prefix1, ... prefix(n-1).
inline std::vector<std::string> keysNamed(const char* prefix, std::size_t n) {
  std::vector<std::string> keys;
  for (std::size_t i = 0; i < n; ++i)
    keys.push_back(prefix + std::to_string(i));
  return keys;
}

// Views of `keys` (which must outlive them).
inline std::vector<std::string_view> views(
    const std::vector<std::string>& keys) {
  return {keys.begin(), keys.end()};
}

inline std::string hex(std::string_view bytes) {
  return tcpstore::test::toHex(bytes);
}

// Wire fragments.
inline std::string u8(std::uint8_t v) {
  std::string s;
  protocol::appendU8(s, v);
  return s;
}
inline std::string u32(std::uint32_t v) {
  std::string s;
  protocol::appendU32(s, v);
  return s;
}
inline std::string i64(std::int64_t v) {
  std::string s;
  protocol::appendI64(s, v);
  return s;
}
inline std::string str(std::string_view v) {
  std::string s;
  protocol::appendStr(s, v);
  return s;
}
// A 1.13 watch notification.
inline std::string note(protocol::WatchEvent type, std::string_view key,
                        std::string_view old_v, std::string_view new_v) {
  return u8(static_cast<std::uint8_t>(type)) + str(key) + str(old_v) +
         str(new_v);
}

// "1:00 2:0500000000000000" - one entry per send, in order.
inline std::string render(const Effects& fx) {
  std::string out;
  for (const auto& s : fx.sends()) {
    if (!out.empty()) out += ' ';
    out += std::to_string(s.conn) + ":" + hex(fx.bytesOf(s));
  }
  return out;
}
inline std::string expect(
    std::initializer_list<std::pair<ConnId, std::string>> sends) {
  std::string out;
  for (const auto& [conn, bytes] : sends) {
    if (!out.empty()) out += ' ';
    out += std::to_string(conn) + ":" + hex(bytes);
  }
  return out;
}

// ---- request builders (views must outlive the apply call) ------------------
// The single-key builders are the library's own (protocol/requests.h); the
// key-list ones below take views, so a test can build them from literals.
inline Request req(Command c) { return protocol::requests::of(c); }
inline Request keyReq(Command c, std::string_view key) {
  return protocol::requests::keyed(c, key);
}
using protocol::requests::add;
using protocol::requests::get;
using protocol::requests::set;
inline Request cas(std::string_view k, std::string_view expected,
                   std::string_view desired) {
  return protocol::requests::compareSet(k, expected, desired);
}
inline Request keysReq(Command c, std::vector<std::string_view> keys) {
  Request r = req(c);
  r.keys = std::move(keys);
  return r;
}
inline Request check(std::vector<std::string_view> keys) {
  return keysReq(Command::kCheck, std::move(keys));
}
inline Request waitKeys(std::vector<std::string_view> keys) {
  return keysReq(Command::kWait, std::move(keys));
}
inline Request multiGet(std::vector<std::string_view> keys) {
  return keysReq(Command::kMultiGet, std::move(keys));
}
inline Request multiSet(std::vector<std::string_view> keys,
                        std::vector<std::string_view> values) {
  Request r = keysReq(Command::kMultiSet, std::move(keys));
  r.values = std::move(values);
  return r;
}
inline Request del(std::string_view k) {
  return keyReq(Command::kDeleteKey, k);
}
inline Request append(std::string_view k, std::string_view v) {
  Request r = keyReq(Command::kAppend, k);
  r.value = v;
  return r;
}
inline Request push(std::string_view k, std::string_view v) {
  Request r = keyReq(Command::kQueuePush, k);
  r.value = v;
  return r;
}
inline Request pop(std::string_view k) { return keyReq(Command::kQueuePop, k); }
inline Request qlen(std::string_view k) {
  return keyReq(Command::kQueueLen, k);
}
inline Request barrier(std::string_view k, std::int64_t world_size) {
  Request r = keyReq(Command::kBarrier, k);
  r.number = world_size;
  return r;
}
inline Request watch(std::string_view k) {
  return keyReq(Command::kWatchKey, k);
}

// A keyspace plus one reused Effects.
struct Harness {
  explicit Harness(KeyspaceOptions o = {}) : ks(o) {}
  // Applies a request that must succeed; returns the rendered sends.
  std::string run(ConnId conn, const Request& r) {
    fx.clear();
    Status s = ks.apply(conn, r, fx);
    if (!s.isOk()) return "ERROR: " + s.toString();
    return render(fx);
  }
  // Applies a request that may fail; the sends stay in fx.
  Status apply(ConnId conn, const Request& r) {
    fx.clear();
    return ks.apply(conn, r, fx);
  }
  std::string value(std::string_view key) const {
    const std::string* v = ks.find(key);
    return v == nullptr ? "<missing>" : *v;
  }

  Keyspace ks;
  Effects fx;
};

}  // namespace tcpstore::store::testing
