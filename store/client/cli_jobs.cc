// tcpstore-cli status / wait-for-workers --watch / release (see cli_jobs.h).
#include "store/client/cli_jobs.h"

#include <fmt/format.h>

#include <cstdio>
#include <optional>
#include <string_view>
#include <thread>
#include <vector>

#include "store/client/raw_read.h"

namespace tcpstore::cli {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::string_view kNs = "tcpstore/";
constexpr std::int64_t kListRanksUpTo = 64;  // per-rank lines up to this N
// The rank that gives up a join subtracts this from joined (jobs.py).
constexpr std::int64_t kFailedOffset = std::int64_t{1} << 40;

// Value of key, or nullopt if absent (CHECK first: a GET would block).
Result<std::optional<std::string>> peek(const Client& c,
                                        const std::string& key) {
  auto has = c.check({key});
  if (!has) return has.error();
  if (!*has) return std::optional<std::string>();
  auto v = c.get(key);
  if (!v) return v.error();
  return std::optional<std::string>(std::move(*v));
}

std::int64_t toInt(const std::optional<std::string>& v) {
  if (!v) return 0;
  try {
    return std::stoll(*v);
  } catch (...) {
    return -1;
  }
}

// Ranks joined, from the joined counter (a failed join's count is offset).
std::int64_t joinedCount(const std::optional<std::string>& v) {
  const std::int64_t k = toInt(v);
  return k < -1 ? k + kFailedOffset : k;
}

std::string ranges(const std::vector<std::int64_t>& rs) {
  std::string out;
  for (std::size_t i = 0; i < rs.size();) {
    std::size_t j = i;
    while (j + 1 < rs.size() && rs[j + 1] == rs[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out +=
        i == j ? fmt::format("{}", rs[i]) : fmt::format("{}-{}", rs[i], rs[j]);
    i = j + 1;
  }
  return out.empty() ? "none" : out;
}

}  // namespace

int printJobStatus(const Client& c, const std::string& job) {
  const Client j = c.withPrefix(job);
  auto ws = peek(j, std::string(kNs) + "world_size");
  if (!ws)
    return fmt::print(stderr, "tcpstore-cli: {}\n", ws.error().toString()), 5;
  if (!*ws) {
    fmt::print("job {}: unknown (no {}/{}world_size key)\n", job, job, kNs);
    return 1;
  }
  const std::int64_t n = toInt(*ws);
  auto joined = peek(j, std::string(kNs) + "joined");
  auto ready = j.check({std::string(kNs) + "ready"});
  auto failed = peek(j, std::string(kNs) + "failed");
  if (!joined || !ready || !failed) {
    fmt::print(stderr, "tcpstore-cli: status of job {}: read failed\n", job);
    return 5;
  }
  std::vector<std::int64_t> present, missing;
  std::vector<std::string> holders;
  for (std::int64_t r = 0; r < n; ++r) {
    auto v = peek(j, fmt::format("{}rank/{}", kNs, r));
    if (!v)
      return fmt::print(stderr, "tcpstore-cli: {}\n", v.error().toString()), 5;
    if (*v) {
      present.push_back(r);
      holders.push_back(**v);
    } else {
      missing.push_back(r);
    }
  }
  const bool is_ready = *ready;
  const std::optional<std::string>& why = *failed;
  fmt::print("job {}: joined {}/{}{}\n", job, joinedCount(*joined), n,
             why ? " (failed)" : (is_ready ? " (complete)" : ""));
  fmt::print("registered: {}\n", ranges(present));
  if (n <= kListRanksUpTo) {
    for (std::size_t i = 0; i < present.size(); ++i)
      fmt::print("  rank {}: {}\n", present[i], holders[i]);
  }
  fmt::print("missing: {}\n", ranges(missing));
  if (why) fmt::print("failed: {}\n", *why);
  return is_ready && !why ? 0 : 1;
}

int printServerStatus(const Client& c, const ClientOptions& o) {
  auto init = readRawKey(o.host, o.port, o.dialect, "init/", o.timeout);
  if (!init)
    return fmt::print(stderr, "tcpstore-cli: {}\n", init.error().toString()), 5;
  fmt::print("init/: {} (torch wait_for_workers counter)\n",
             *init ? **init : std::string("absent"));
  auto keys = c.listKeys();
  if (!keys) {
    fmt::print("jobs: unknown ({}); name one: status JOB\n",
               keys.error().toString());
    return 0;
  }
  const std::string tail = std::string(kNs) + "world_size";
  for (const auto& k : *keys) {
    if (k.size() > tail.size() + 1 && k.ends_with("/" + tail)) {
      std::string job = k.substr(0, k.size() - tail.size() - 1);
      fmt::print("--\n");
      (void)printJobStatus(c, job);
    }
  }
  return 0;
}

Status watchWorkers(const Client& c, const ClientOptions& o,
                    const std::string& job, std::int64_t n,
                    std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  std::int64_t last = -1;
  const Client j = c.withPrefix(job);
  for (;;) {
    std::int64_t count = 0;
    if (!job.empty()) {
      auto joined = peek(j, std::string(kNs) + "joined");
      if (!joined) return joined.error();
      if (toInt(*joined) < -1) {
        auto why = peek(j, std::string(kNs) + "failed");
        return Status(  // a failed job never completes: exit 5, not a timeout
            StatusCode::kNotFound,
            fmt::format("job {}: join failed: {}", job,
                        why && *why ? **why : std::string("(no reason)")));
      }
      count = toInt(*joined);
    } else {
      auto v = readRawKey(o.host, o.port, o.dialect, "init/",
                          std::chrono::milliseconds(5000));
      if (!v) return v.error();
      count = toInt(*v);
    }
    if (count != last) {
      fmt::print("joined {}/{}\n", count, n);
      std::fflush(stdout);
      last = count;
    }
    if (count >= n) return Status::ok();
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - Clock::now());
    if (left.count() <= 0)
      return Status::timeout(
          fmt::format("{}/{} joined when the timeout passed", count, n));
    if (!job.empty()) {
      // Server-side wait for completion; wake at least once a second for
      // progress.
      Status s = j.wait({std::string(kNs) + "ready"},
                        std::min(left, std::chrono::milliseconds(1000)));
      if (!s && s.code() != StatusCode::kTimeout) return s;
    } else {
      std::this_thread::sleep_for(
          std::min(left, std::chrono::milliseconds(200)));
    }
  }
}

Result<std::int64_t> releaseJob(const Client& c, const std::string& job) {
  const Client j = c.withPrefix(job);
  auto keys = j.listKeys();
  if (!keys) return keys.error();
  std::int64_t n = 0;
  const std::string claim = std::string(kNs) + "world_size";
  bool has_claim = false;
  for (const auto& k : *keys) {
    if (k == claim) {
      has_claim = true;
      continue;
    }
    auto d = j.deleteKey(k);
    if (!d) return d.error();
    n += *d ? 1 : 0;
  }
  if (has_claim) {
    auto d = j.deleteKey(claim);
    if (!d) return d.error();
    n += *d ? 1 : 0;
  }
  return n;
}

}  // namespace tcpstore::cli
