// A small poll-based c10d store server for testing tcpstore-conform: it
// serves with the project's Keyspace (correct behaviour, both dialects) and
// can be told to break in one specific way, so each check group can be shown
// to fail on the matching fault.
//
// Runs its own thread from the constructor until the destructor (which stops
// and joins it). Listens on 127.0.0.1, port 0.
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>

namespace tcpstore::conform::test {

enum class Fault {
  kNone,
  kDropGetReply,     // GET is applied but never answered
  kWrongCompareSet,  // a mismatching COMPARE_SET stores desired anyway
  kNoWake,           // writes never release waiters on other connections
  kStallOnPartial,   // a partial request blocks the whole server (like torch)
  kIgnoreLimits,     // no length limits: absurd lengths are buffered
  kBrokenListKeys,   // LIST_KEYS always answers an empty list
};

class FaultServer {
 public:
  explicit FaultServer(Fault fault);
  ~FaultServer();
  FaultServer(const FaultServer&) = delete;
  FaultServer& operator=(const FaultServer&) = delete;

  std::uint16_t port() const noexcept { return port_; }

 private:
  void run();

  Fault fault_;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  std::uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace tcpstore::conform::test
