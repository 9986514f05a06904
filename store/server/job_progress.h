// JobProgress: the join progress of tcpstore:// jobs (issue #10), read from
// the SET and COMPARE_SET requests the dispatcher decodes (never from the
// backend's state). The Python side writes, under "<job>/" (on the wire
// "/<job>/tcpstore/..."; the job id may itself contain '/'):
//   tcpstore/world_size  "N"          tcpstore/rank/<r>  "<host> <pid>"
//   tcpstore/ready       "1"          tcpstore/failed    one line
// Lines, per job:
//   job J: joined K/N                 K = distinct ranks registered; at most
//                                     once a second, the latest count when
//                                     the second ends (never stale)
//   job J: all N ranks joined         on ready (the job is then forgotten)
//   job J: join failed: <msg>         error, once (the job is forgotten)
//   job J: joined K/N; missing ranks: 3, 7, ... and M more
//                                     after stall_ms without progress, then
//                                     every repeat_ms while incomplete
// Bounded: at most max_jobs jobs (the oldest dropped, with a debug line);
// a job of more than max_world ranks is tracked by count only.
//
// Pure and loop-free: it takes the time as an argument and tells the caller
// when to call onTimer() (one timer serves every job). Loop thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "protocol/message.h"
#include "store/server/log.h"

namespace tcpstore::server {

class JobProgress {
 public:
  struct Limits {
    std::uint64_t every_ms = 1000;    // at most one "joined" line per job
    std::uint64_t stall_ms = 10000;   // first "missing ranks" line
    std::uint64_t repeat_ms = 30000;  // the next ones
    std::size_t max_jobs = 64;
    std::int64_t max_world = 1 << 20;  // beyond: counts only
    std::size_t max_listed = 32;       // missing ranks named per line
  };
  // Receives every line (level, text); must not throw.
  using Sink = std::function<void(LogLevel, std::string_view)>;

  JobProgress(Sink sink, Limits limits);

  // Cheap filter for the hot path: may this request concern a job?
  static bool concerns(const protocol::Request& req) noexcept {
    return (req.command == protocol::Command::kSet ||
            req.command == protocol::Command::kCompareSet) &&
           req.key.find(kMarker) != std::string_view::npos;
  }

  // A SET or COMPARE_SET for which concerns() holds, seen at `now` (ms).
  // Returns the ms after which the caller must call onTimer() (0: the timer
  // already armed, if any, is early enough, or nothing is due). Never throws
  // (out of memory drops the event).
  std::uint64_t note(std::uint64_t now, const protocol::Request& req) noexcept;
  // The timer fired: writes what is due. Returns the ms until the next call
  // (0: nothing due).
  std::uint64_t onTimer(std::uint64_t now) noexcept;

  std::size_t jobs() const noexcept { return jobs_.size(); }

  static constexpr std::string_view kMarker = "/tcpstore/";

 private:
  struct Job {
    std::string name;
    std::int64_t world = -1;  // unknown until world_size
    std::int64_t joined = 0;  // distinct ranks seen
    std::int64_t logged = -1;
    std::uint64_t logged_ms = 0;
    std::uint64_t progress_ms = 0;  // last new rank (or creation)
    std::uint64_t stall_due = 0;    // next "missing ranks" line
    bool deferred = false;          // a count waits for its second
    std::vector<bool> seen;         // by rank, world <= max_world only
  };

  void apply(std::uint64_t now, std::string_view job, std::string_view field,
             std::string_view value);
  Job* find(std::string_view name) noexcept;
  Job& track(std::uint64_t now, std::string_view name);
  void forget(const Job& j) noexcept;
  void rank(std::uint64_t now, Job& j, std::string_view digits);
  void logCount(std::uint64_t now, Job& j);
  void logStall(std::uint64_t now, Job& j);
  std::uint64_t due(std::uint64_t now) const noexcept;  // earliest, 0 none
  std::uint64_t arm(std::uint64_t now) noexcept;
  void emit(LogLevel l, std::string_view line) noexcept;

  Sink sink_;
  Limits limits_;
  std::vector<Job> jobs_;            // oldest first
  std::vector<std::string> failed_;  // recently failed jobs (logged once)
  std::uint64_t armed_at_ = 0;       // absolute due time of the caller's timer
};

}  // namespace tcpstore::server
