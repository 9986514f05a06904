// The store's state machine: keys, values, queues, waiters and watchers.
//
// Pure: no I/O, no clocks, no threads. The server feeds it decoded requests
// (with the connection they came from) and writes the bytes it returns. One
// keyspace serves both dialects; the reply bytes are dialect-independent,
// except that only 1.13 connections may register watches.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "protocol/message.h"
#include "tcpstore/status.h"

namespace tcpstore::store {

using ConnId = std::uint64_t;

// What applying one request produced: bytes for connections, in order.
// Reuse one Effects across calls; clear() keeps capacity.
class Effects {
 public:
  struct Send {
    ConnId conn;
    std::uint32_t offset;  // into bytes()
    std::uint32_t length;
  };

  void clear() noexcept {
    bytes_.clear();
    sends_.clear();
  }
  const std::vector<Send>& sends() const noexcept { return sends_; }
  std::string_view bytesOf(const Send& s) const noexcept {
    return std::string_view(bytes_).substr(s.offset, s.length);
  }
  const std::string& bytes() const noexcept { return bytes_; }

  // Builder used by the keyspace: start a send to `conn`, append its bytes
  // to buffer(), then end it.
  std::string& begin(ConnId conn) {
    open_conn_ = conn;
    open_offset_ = bytes_.size();
    return bytes_;
  }
  void end() {
    auto len = bytes_.size() - open_offset_;
    if (len > 0) {
      sends_.push_back(Send{open_conn_, static_cast<std::uint32_t>(open_offset_),
                            static_cast<std::uint32_t>(len)});
    }
  }

 private:
  std::string bytes_;
  std::vector<Send> sends_;
  ConnId open_conn_ = 0;
  std::size_t open_offset_ = 0;
};

struct KeyspaceOptions {
  // COMPARE_SET wakes the key's waiters when it stores a value (what the libuv
  // backend does, and what a waiting client needs). The classic servers do not;
  // false reproduces them.
  bool compare_set_wakes = true;
  // GET (and MULTI_GET) of a missing key: false closes the connection like
  // every verified server; true answers an empty value like the libuv backend.
  bool get_missing_returns_empty = false;
};

class Keyspace {
 public:
  explicit Keyspace(KeyspaceOptions options = {});

  // Applies `req` from connection `conn` and appends the resulting bytes to
  // `fx` (the reply to `conn`, STOP_WAITING bytes to woken waiters, 1.13 watch
  // notifications). A non-OK Status means the request is a protocol error for
  // that connection (ADD on a non-numeric value, GET of a missing key, ...):
  // the caller logs it and closes `conn` (and then calls disconnect). No state
  // was changed in that case and no bytes were added for `conn`.
  //
  // VALIDATE and PING are handshake commands; apply() answers PING (echo) and
  // ignores VALIDATE, so the caller may pass every decoded request.
  Status apply(ConnId conn, const protocol::Request& req, Effects& fx);

  // Forgets every wait and watch registration of `conn`. O(its registrations).
  void disconnect(ConnId conn);

  // Read-only views (for the server's progress log and for tests).
  const std::string* find(std::string_view key) const;
  std::size_t numKeys() const noexcept { return map_.size(); }
  std::size_t numWaitingConnections() const noexcept;
  std::size_t numWatchers() const noexcept;

 private:
  // Implementation detail chosen by the implementer; kept here so the class is
  // a value type with no pimpl indirection.
  struct Impl;
  KeyspaceOptions options_;
  std::unordered_map<std::string, std::string> map_;
  // further members are defined by the implementation (see keyspace.cc)
};

}  // namespace tcpstore::store
