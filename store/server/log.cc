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

}  // namespace tcpstore::server
