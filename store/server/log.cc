#include "store/server/log.h"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <ctime>
#include <string>

namespace tcpstore::server {

std::optional<LogLevel> parseLogLevel(std::string_view name) noexcept {
  if (name == "error") return LogLevel::kError;
  if (name == "warn" || name == "warning") return LogLevel::kWarn;
  if (name == "info") return LogLevel::kInfo;
  if (name == "debug") return LogLevel::kDebug;
  return std::nullopt;
}

void logLine(LogLevel level, std::string_view msg) noexcept {
  try {
    using std::chrono::system_clock;
    auto now = system_clock::now();
    std::time_t secs = system_clock::to_time_t(now);
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                  now.time_since_epoch())
                  .count() %
              1000;
    std::tm tm{};
    gmtime_r(&secs, &tm);
    char stamp[32];
    std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &tm);
    static constexpr char kLetters[] = {'E', 'W', 'I', 'D'};
    std::string line =
        fmt::format("{}.{:03d}Z {} tcpstore-server: {}\n", stamp, ms,
                    kLetters[static_cast<int>(level) & 3], msg);
    std::string_view rest = line;
    while (!rest.empty()) {
      ssize_t n = ::write(STDERR_FILENO, rest.data(), rest.size());
      if (n <= 0) break;
      rest.remove_prefix(static_cast<std::size_t>(n));
    }
  } catch (...) {
    // Logging must never take the server down.
  }
}

std::uint64_t RateLimitedLog::add(std::uint64_t now,
                                  std::string_view line) noexcept {
  if (now - window_ms_ >= kWindowMs) endWindow(now);
  if (lines_ < per_window_) {
    ++lines_;
    logLine(LogLevel::kWarn, line);
    return 0;
  }
  if (suppressed_++ == 0) return window_ms_ + kWindowMs - now;
  return 0;
}

void RateLimitedLog::endWindow(std::uint64_t now) noexcept {
  summarize();
  window_ms_ = now;
  lines_ = 0;
}

void RateLimitedLog::summarize() noexcept {
  if (suppressed_ == 0) return;
  try {
    logLine(LogLevel::kWarn,
            fmt::format("suppressed {} similar message(s)", suppressed_));
  } catch (...) {
  }
  suppressed_ = 0;
}

std::uint64_t JoinProgress::note(std::uint64_t now, std::int64_t n) noexcept {
  if (complete_) return 0;
  latest_ = n;
  if (n >= world_) {
    complete_ = true;
    write(now, n);
    return 0;
  }
  if (n == logged_) return 0;
  if (logged_ < 0 || now - logged_ms_ >= kEveryMs) {
    write(now, n);
    return 0;
  }
  if (armed_) return 0;
  armed_ = true;
  return logged_ms_ + kEveryMs - now;
}

void JoinProgress::onTimer(std::uint64_t now) noexcept {
  armed_ = false;
  if (!complete_ && latest_ != logged_) write(now, latest_);
}

void JoinProgress::write(std::uint64_t now, std::int64_t n) noexcept {
  logged_ = n;
  logged_ms_ = now;
  try {
    log_.log(LogLevel::kInfo, fmt::format("joined {}/{}", n, world_));
  } catch (...) {
  }
}

}  // namespace tcpstore::server
