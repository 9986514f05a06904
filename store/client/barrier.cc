// Client::barrier and Client::waitForWorkers.
//
// barrier(name, n): keys (name mapped like any user key, "/<prefix>name"):
//   - server with BARRIER (ours, torch >= 2.14): one request BARRIER
//     "/<prefix>name" n; the counter at "/<prefix>name" holds the number of
//     arrivals as decimal text;
//   - otherwise (dialect 1.13, or a 2.x server that closed the connection on
//     BARRIER, e.g. torch 2.6; remembered per endpoint): ADD "/<prefix>name" 1
//     -> c; if c >= n, SET "/<prefix>name:done" = "1" and return; else WAIT
//     ["/<prefix>name:done"]. One round of a given name per job: reuse of a
//     name after completion returns at once (as torch 2.14's barrier does).
//     A timed-out barrier leaves its arrival counted (also as torch does).
//     All participants of one barrier must take the same path: on our server
//     a 1.13-dialect participant (fallback) and a 2.x one (BARRIER) do not
//     meet, since BARRIER does not set ":done". (waitForWorkers does mix.)
//
// waitForWorkers(n): counts on torch's raw, unprefixed key "init/" (the key
// every torch TCPStore with world_size sends `ADD init/ 1` to), so tcpstore
// processes and torch ranks of one job count together:
//   - server with BARRIER: BARRIER "init/" n (it increments the same decimal
//     counter exactly as `ADD init/ 1` does and returns once it is >= n);
//     then GET "init/" to verify the count, because torch >= 2.14 wakes
//     BARRIER waiters on any write of the key, i.e. also on a torch rank's
//     ADD before the count is complete (verified on 2.14; our server
//     releases only at >= n). Count complete: SET raw "init/done" = "1";
//     released early: WAIT ["init/done"].
//   - otherwise: ADD "init/" 1 -> c; if c >= n, SET raw "init/done" = "1"
//     (no leading '/', so torch users never see it; numKeys() counts it);
//     else WAIT ["init/done"].
// Mixed jobs (torch ranks only send `ADD init/ 1`; they never set
// "init/done"):
//   - our server re-evaluates BARRIER waiters on every write of their key and
//     releases them once the counter is >= n, so a torch rank may be the last
//     arrival (tested);
//   - torch 2.14: a tcpstore process released early waits for "init/done",
//     which a tcpstore process that later sees the complete count sets; if a
//     torch rank completes the count while no tcpstore process is still in
//     its BARRIER, the early-released ones time out (kTimeout);
//   - on a server without BARRIER, if a torch rank is the last arrival nobody
//     sets "init/done" and the tcpstore waiters time out (kTimeout). If a
//     tcpstore process is last, everyone is released.
//
// Request cost per participant (no polling, independent of wait time):
//   BARRIER servers: barrier 1 (BARRIER), waitForWorkers 3 (BARRIER, GET,
//   SET; a WAIT instead of the SET if released early);
//   fallback: 2 (ADD + WAIT, or ADD + SET for the last arrival).
#include <fmt/format.h>

#include <charconv>
#include <optional>
#include <string>

#include "store/client/shared.h"
#include "tcpstore/client.h"

namespace tcpstore {

using client_detail::Connection;
using client_detail::Deadline;
using client_detail::deadlineAfter;
using client_detail::Feature;
using client_detail::Shared;
namespace requests = protocol::requests;

namespace {

// Fallback barrier on servers without BARRIER: count with ADD; the last
// arrival sets the done key; everyone else waits on it (no polling).
Status countThenWait(Shared& s, const std::string& counter_key,
                     const std::string& done_key, std::int64_t world_size,
                     Deadline deadline, const std::string& what) {
  auto r = s.shortOp(requests::add(counter_key, 1), deadline);
  if (!r) return r.error();
  if (r->number >= world_size) {
    return s.shortOp(requests::set(done_key, "1"), deadline).error();
  }
  return s.waitKeys({done_key}, deadline,
                    fmt::format("{} ({} of {} arrived when this one did)", what,
                                r->number, world_size));
}

// After BARRIER returned on a key that others write with plain ADDs (torch
// ranks' `ADD init/ 1`): torch >= 2.14 wakes BARRIER waiters on any write of
// the key, i.e. possibly before the count is reached (verified on 2.14). Read
// the counter (GET does not wake anyone): if it is complete, SET the done key
// for anyone released early; otherwise this caller was released early and
// waits for the done key.
Status verifyCount(Shared& s, Connection& c, const std::string& key,
                   const std::string& done_key, std::int64_t world_size,
                   Deadline deadline, const std::string& what) {
  auto r = c.roundTrip(requests::get(key), deadline);
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
    return c.send(requests::set(done_key, "1"), deadline);
  }
  return s.blockingWait(c, requests::wait({done_key}), deadline, what);
}

// BARRIER key n where the server has it (then verifyCount if `done_key`).
// Returns nullopt if the server lacks BARRIER (the caller falls back).
std::optional<Status> tryBarrierCommand(Shared& s, const std::string& key,
                                        std::int64_t world_size,
                                        Deadline deadline,
                                        const std::string& what,
                                        const std::string* done_key) {
  if (!s.v2() ||
      s.support(Feature::kBarrier) == client_detail::Capabilities::kAbsent) {
    return std::nullopt;
  }
  return s.withLease(deadline, [&](Connection& c) -> std::optional<Status> {
    // e.g. torch 2.6 closes on the unknown command byte before counting.
    auto st = s.probed(Feature::kBarrier, deadline, [&](bool) {
      return s.blockingWait(c, requests::barrier(key, world_size), deadline,
                            what);
    });
    if (!st) return std::nullopt;
    if (*st && done_key != nullptr) {
      return verifyCount(s, c, key, *done_key, world_size, deadline, what);
    }
    return *st;
  });
}

}  // namespace

Status Client::barrier(std::string_view name, std::int64_t world_size) const {
  return barrier(name, world_size, timeout_);
}

Status Client::barrier(std::string_view name, std::int64_t world_size,
                       Millis timeout) const {
  if (world_size < 1) {
    return Status::invalidArgument("barrier: world_size must be >= 1");
  }
  const Deadline deadline = deadlineAfter(timeout);
  const std::string key = client_detail::wireKey(prefix_, name);
  const std::string what =
      fmt::format("barrier {} (world size {}, {} ms)", std::string(name),
                  world_size, timeout.count());
  if (auto r = tryBarrierCommand(*shared_, key, world_size, deadline, what,
                                 nullptr)) {
    return *r;
  }
  return countThenWait(*shared_, key, key + ":done", world_size, deadline,
                       what);
}

Status Client::waitForWorkers(std::int64_t world_size) const {
  return waitForWorkers(world_size, timeout_);
}

Status Client::waitForWorkers(std::int64_t world_size, Millis timeout) const {
  if (world_size < 1) {
    return Status::invalidArgument("waitForWorkers: world_size must be >= 1");
  }
  const Deadline deadline = deadlineAfter(timeout);
  const std::string what = fmt::format("waitForWorkers (world size {}, {} ms)",
                                       world_size, timeout.count());
  const std::string counter = "init/";
  const std::string done = "init/done";
  if (auto r = tryBarrierCommand(*shared_, counter, world_size, deadline, what,
                                 &done)) {
    return *r;
  }
  return countThenWait(*shared_, counter, done, world_size, deadline, what);
}

}  // namespace tcpstore
