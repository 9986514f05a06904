// Named request builders: one function per command, so callers write
// `requests::add(key, 1)` instead of filling a Request field by field.
//
// A Request holds views: every string (and every element of a key list)
// passed in must outlive the returned Request and the encode that uses it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "protocol/message.h"

namespace tcpstore::protocol::requests {

// A request with no fields (GETNUMKEYS, CANCEL_WAIT, LIST_KEYS) or the start
// of one.
inline Request of(Command c) {
  Request r;
  r.command = c;
  return r;
}

// GET, DELETE_KEY, WATCH_KEY, QUEUE_POP, QUEUE_LEN: one key.
inline Request keyed(Command c, std::string_view key) {
  Request r = of(c);
  r.key = key;
  return r;
}

// CHECK, WAIT, MULTI_GET: a key list.
inline Request keyList(Command c, const std::vector<std::string>& keys) {
  Request r = of(c);
  r.keys.reserve(keys.size());
  for (const auto& k : keys) r.keys.emplace_back(k);
  return r;
}

inline Request set(std::string_view key, std::string_view value) {
  Request r = keyed(Command::kSet, key);
  r.value = value;
  return r;
}
inline Request get(std::string_view key) { return keyed(Command::kGet, key); }
inline Request add(std::string_view key, std::int64_t delta) {
  Request r = keyed(Command::kAdd, key);
  r.number = delta;
  return r;
}
inline Request compareSet(std::string_view key, std::string_view expected,
                          std::string_view desired) {
  Request r = keyed(Command::kCompareSet, key);
  r.value = expected;
  r.desired = desired;
  return r;
}
inline Request check(const std::vector<std::string>& keys) {
  return keyList(Command::kCheck, keys);
}
inline Request wait(const std::vector<std::string>& keys) {
  return keyList(Command::kWait, keys);
}
inline Request deleteKey(std::string_view key) {
  return keyed(Command::kDeleteKey, key);
}
inline Request numKeys() { return of(Command::kGetNumKeys); }
inline Request append(std::string_view key, std::string_view value) {
  Request r = keyed(Command::kAppend, key);
  r.value = value;
  return r;
}
inline Request multiGet(const std::vector<std::string>& keys) {
  return keyList(Command::kMultiGet, keys);
}
// keys and values pair up by index; encodeRequest writes an empty value for
// a key without one.
inline Request multiSet(const std::vector<std::string>& keys,
                        const std::vector<std::string>& values) {
  Request r = keyList(Command::kMultiSet, keys);
  r.values.reserve(values.size());
  for (const auto& v : values) r.values.emplace_back(v);
  return r;
}
// The 2.x handshake's first request.
inline Request validate() {
  Request r = of(Command::kValidate);
  r.u32 = kValidateMagic;
  return r;
}
inline Request cancelWait() { return of(Command::kCancelWait); }
inline Request ping(std::uint32_t nonce) {
  Request r = of(Command::kPing);
  r.u32 = nonce;
  return r;
}
inline Request queuePush(std::string_view key, std::string_view value) {
  Request r = keyed(Command::kQueuePush, key);
  r.value = value;
  return r;
}
inline Request queuePop(std::string_view key) {
  return keyed(Command::kQueuePop, key);
}
inline Request queueLen(std::string_view key) {
  return keyed(Command::kQueueLen, key);
}
inline Request listKeys() { return of(Command::kListKeys); }
inline Request barrier(std::string_view key, std::int64_t world_size) {
  Request r = keyed(Command::kBarrier, key);
  r.number = world_size;
  return r;
}

}  // namespace tcpstore::protocol::requests
