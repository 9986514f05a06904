// Server logging: leveled lines to stderr, a rate limiter for lines a peer
// can trigger at will, and the "joined K/N" progress line.
//
// One line per call, written with a single write so lines from different
// threads do not interleave. Each line starts with a UTC timestamp. The
// classes below are loop-thread only and know no loop: they take the time
// as an argument and tell the caller when to call them back (a timer).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace tcpstore::server {

enum class LogLevel : int { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

// "error", "warn", "info", "debug" (nullopt for anything else).
std::optional<LogLevel> parseLogLevel(std::string_view name) noexcept;

// Writes "2026-12-01T09:30:00.123Z W tcpstore-server: <msg>\n" to stderr.
void logLine(LogLevel level, std::string_view msg) noexcept;

// A level filter in front of logLine().
class Logger {
 public:
  void setLevel(LogLevel l) noexcept { level_ = l; }
  bool enabled(LogLevel l) const noexcept {
    return static_cast<int>(l) <= static_cast<int>(level_);
  }
  void log(LogLevel l, std::string_view msg) const noexcept {
    if (enabled(l)) logLine(l, msg);
  }

 private:
  LogLevel level_ = LogLevel::kInfo;
};

// Warn lines a peer can trigger at will (rejections): at most `per_window`
// per one-second window; the rest are counted and summarized as
// "suppressed N similar message(s)" when the window ends.
class RateLimitedLog {
 public:
  static constexpr std::uint64_t kWindowMs = 1000;
  explicit RateLimitedLog(int per_window) noexcept : per_window_(per_window) {}

  // Writes `line` at `now` unless this window's quota is spent. Returns the
  // ms until the window ends if this call suppressed the window's first line
  // (the caller calls endWindow() then, so the summary appears even if the
  // flood stops), else 0.
  std::uint64_t add(std::uint64_t now, std::string_view line) noexcept;
  // Writes the summary, if any, and starts a new window at `now`.
  void endWindow(std::uint64_t now) noexcept;

 private:
  void summarize() noexcept;
  int per_window_;
  std::uint64_t window_ms_ = 0;
  int lines_ = 0;
  std::uint64_t suppressed_ = 0;
};

// "joined K/N" for a job of N ranks counting up torch's "init/" key: a line
// at most once per second, the latest count once the second is over (never
// stale), and the complete line always.
class JoinProgress {
 public:
  static constexpr std::uint64_t kEveryMs = 1000;
  JoinProgress(const Logger& log, std::int64_t world_size) noexcept
      : log_(log), world_(world_size) {}

  // The counter is `n` at `now`. Logs it now, or returns the ms after which
  // the caller must call onTimer() (0: nothing to arm).
  std::uint64_t note(std::uint64_t now, std::int64_t n) noexcept;
  // The deferred count, if it still differs from the last line.
  void onTimer(std::uint64_t now) noexcept;

 private:
  void write(std::uint64_t now, std::int64_t n) noexcept;
  const Logger& log_;
  std::int64_t world_;
  std::int64_t logged_ = -1;  // last count written
  std::int64_t latest_ = -1;  // last count seen
  std::uint64_t logged_ms_ = 0;
  bool armed_ = false;
  bool complete_ = false;
};

}  // namespace tcpstore::server
