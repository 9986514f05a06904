// Minimal leveled logging to stderr for the server and its CLI.
//
// One line per call, written with a single write so lines from different
// threads do not interleave. Each line starts with a UTC timestamp.
#pragma once

#include <optional>
#include <string_view>

namespace tcpstore::server {

enum class LogLevel : int { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

// "error", "warn", "info", "debug" (nullopt for anything else).
std::optional<LogLevel> parseLogLevel(std::string_view name) noexcept;

// Writes "2026-12-01T09:30:00.123Z W tcpstore-server: <msg>\n" to stderr.
void logLine(LogLevel level, std::string_view msg) noexcept;

}  // namespace tcpstore::server
