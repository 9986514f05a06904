#include "store/server/job_progress.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <utility>

namespace tcpstore::server {

namespace {

constexpr std::size_t kShownBytes = 256;  // of a job id or a failure text

// Peer-controlled text in a log line: printable ASCII, bounded.
std::string shown(std::string_view s) {
  std::string out;
  const std::size_t n = std::min(s.size(), kShownBytes);
  out.reserve(n + 3);
  for (std::size_t i = 0; i < n; ++i) {
    const char c = s[i];
    out.push_back(c >= 0x20 && c < 0x7f ? c : '?');
  }
  if (s.size() > n) out += "...";
  return out;
}

bool parseCount(std::string_view s, std::int64_t& n) noexcept {
  const char* end = s.data() + s.size();
  auto [p, ec] = std::from_chars(s.data(), end, n);
  return ec == std::errc() && p == end && n >= 0;
}

}  // namespace

JobProgress::JobProgress(Sink sink, Limits limits)
    : sink_(std::move(sink)), limits_(limits) {}

std::uint64_t JobProgress::note(std::uint64_t now,
                                const protocol::Request& req) noexcept {
  std::string_view key = req.key;
  if (!key.empty() && key.front() == '/') key.remove_prefix(1);
  const std::size_t at = key.rfind(kMarker);
  if (at == std::string_view::npos || at == 0) return 0;
  const std::string_view value =
      req.command == protocol::Command::kCompareSet ? req.desired : req.value;
  try {
    apply(now, key.substr(0, at), key.substr(at + kMarker.size()), value);
  } catch (...) {
    // Out of memory: this event is not logged.
  }
  return arm(now);
}

std::uint64_t JobProgress::onTimer(std::uint64_t now) noexcept {
  armed_at_ = 0;
  for (Job& j : jobs_) {
    if (j.deferred && now >= j.logged_ms + limits_.every_ms) logCount(now, j);
    if (j.stall_due != 0 && now >= j.stall_due) {
      logStall(now, j);
      j.stall_due = now + limits_.repeat_ms;
    }
  }
  return arm(now);
}

void JobProgress::apply(std::uint64_t now, std::string_view job,
                        std::string_view field, std::string_view value) {
  if (field == "world_size") {
    std::int64_t n = 0;
    if (!parseCount(value, n) || n == 0) return;
    Job& j = track(now, job);
    if (j.world >= 0)
      return;  // the first one counts (a conflict is the
               // ranks' business)
    j.world = n;
    if (n <= limits_.max_world) {
      j.seen.resize(static_cast<std::size_t>(n));
      j.joined = std::count(j.seen.begin(), j.seen.end(), true);
    } else {
      j.seen.clear();
      j.seen.shrink_to_fit();
    }
    j.progress_ms = now;
    j.stall_due = j.joined < n ? now + limits_.stall_ms : 0;
    if (j.joined > 0) logCount(now, j);
  } else if (field.substr(0, 5) == "rank/") {
    rank(now, track(now, job), field.substr(5));
  } else if (field == "ready") {
    Job* j = find(job);
    if (j == nullptr) return;
    emit(LogLevel::kInfo,
         fmt::format("job {}: all {} ranks joined", shown(j->name), j->world));
    forget(*j);
  } else if (field == "failed") {
    if (std::find(failed_.begin(), failed_.end(), job) != failed_.end())
      return;  // logged once
    emit(LogLevel::kError,
         fmt::format("job {}: join failed: {}", shown(job), shown(value)));
    if (failed_.size() >= limits_.max_jobs) failed_.erase(failed_.begin());
    failed_.emplace_back(job);
    if (Job* j = find(job)) forget(*j);
  }
}

JobProgress::Job* JobProgress::find(std::string_view name) noexcept {
  for (Job& j : jobs_)
    if (j.name == name) return &j;
  return nullptr;
}

JobProgress::Job& JobProgress::track(std::uint64_t now, std::string_view name) {
  if (Job* j = find(name)) return *j;
  if (jobs_.size() >= limits_.max_jobs && !jobs_.empty()) {
    emit(LogLevel::kDebug,
         fmt::format("job {}: no longer tracked (more than {} jobs joining)",
                     shown(jobs_.front().name), limits_.max_jobs));
    jobs_.erase(jobs_.begin());
  }
  Job j;
  j.name.assign(name);
  j.progress_ms = now;
  jobs_.push_back(std::move(j));
  // A job that failed before may be tried again under its id.
  if (auto it = std::find(failed_.begin(), failed_.end(), name);
      it != failed_.end())
    failed_.erase(it);
  return jobs_.back();
}

void JobProgress::forget(const Job& j) noexcept {
  jobs_.erase(jobs_.begin() + (&j - jobs_.data()));
}

void JobProgress::rank(std::uint64_t now, Job& j, std::string_view digits) {
  std::int64_t r = 0;
  if (!parseCount(digits, r)) return;
  if (j.world >= 0 && r >= j.world) return;
  if (j.world < 0 || j.world <= limits_.max_world) {
    if (r >= limits_.max_world) return;
    const auto i = static_cast<std::size_t>(r);
    if (j.seen.size() <= i) j.seen.resize(i + 1);
    if (j.seen[i]) return;  // again (a retry, or a conflict)
    j.seen[i] = true;
  } else if (j.joined >= j.world) {
    return;
  }
  ++j.joined;  // by count only beyond max_world
  j.progress_ms = now;
  if (j.world < 0) return;  // counted; logged once N is known
  j.stall_due = j.joined < j.world ? now + limits_.stall_ms : 0;
  logCount(now, j);
}

void JobProgress::logCount(std::uint64_t now, Job& j) {
  if (j.world < 0 || j.joined == j.logged) {
    j.deferred = false;
    return;
  }
  if (j.logged >= 0 && now - j.logged_ms < limits_.every_ms &&
      j.joined < j.world) {
    j.deferred = true;  // the latest count when the second ends
    return;
  }
  j.deferred = false;
  j.logged = j.joined;
  j.logged_ms = now;
  emit(LogLevel::kInfo,
       fmt::format("job {}: joined {}/{}", shown(j.name), j.joined, j.world));
}

void JobProgress::logStall(std::uint64_t now, Job& j) {
  if (j.world < 0 || j.joined >= j.world) return;
  std::string line =
      fmt::format("job {}: joined {}/{}", shown(j.name), j.joined, j.world);
  if (j.world > limits_.max_world) {
    line += fmt::format(
        "; no new rank for {} s (missing ranks are not tracked beyond {})",
        (now - j.progress_ms) / 1000, limits_.max_world);
  } else {
    line += "; missing ranks: ";
    std::size_t listed = 0;
    std::int64_t more = 0;
    for (std::size_t r = 0; r < j.seen.size(); ++r) {
      if (j.seen[r]) continue;
      if (listed == limits_.max_listed) {
        ++more;
        continue;
      }
      if (listed++ > 0) line += ", ";
      line += fmt::format("{}", r);
    }
    if (more > 0) line += fmt::format(" and {} more", more);
  }
  emit(LogLevel::kWarn, line);
  j.logged = j.joined;  // the line carries the latest count
  j.logged_ms = now;
  j.deferred = false;
}

std::uint64_t JobProgress::due(std::uint64_t /*now*/) const noexcept {
  std::uint64_t d = 0;
  auto take = [&d](std::uint64_t t) {
    if (d == 0 || t < d) d = t;
  };
  for (const Job& j : jobs_) {
    if (j.deferred) take(j.logged_ms + limits_.every_ms);
    if (j.stall_due != 0) take(j.stall_due);
  }
  return d;
}

std::uint64_t JobProgress::arm(std::uint64_t now) noexcept {
  const std::uint64_t d = due(now);
  if (d == 0 || (armed_at_ != 0 && armed_at_ <= d)) return 0;
  armed_at_ = d;
  return d > now ? d - now : 1;
}

void JobProgress::emit(LogLevel l, std::string_view line) noexcept {
  try {
    sink_(l, line);
  } catch (...) {
  }
}

}  // namespace tcpstore::server
