#include "protocol/wire.h"

#include <array>

namespace tcpstore::protocol {
namespace {

constexpr std::uint8_t kNone = 0xff;

// Index: Command. Value: wire code in that dialect, kNone if absent.
constexpr std::array<std::uint8_t, kCommandCount> kCodesV113 = {
    kNone,  // VALIDATE
    0x00,   // SET
    0x01,   // COMPARE_SET
    0x02,   // GET
    0x03,   // ADD
    0x04,   // CHECK
    0x05,   // WAIT
    0x06,   // GETNUMKEYS
    0x07,   // WATCH_KEY
    0x08,   // DELETE_KEY
    kNone, kNone, kNone, kNone, kNone, kNone, kNone, kNone, kNone, kNone,
};
constexpr std::array<std::uint8_t, kCommandCount> kCodesV2 = {
    0x00,   // VALIDATE
    0x01,   // SET
    0x02,   // COMPARE_SET
    0x03,   // GET
    0x04,   // ADD
    0x05,   // CHECK
    0x06,   // WAIT
    0x07,   // GETNUMKEYS
    kNone,  // WATCH_KEY (removed in 2.x)
    0x08,   // DELETE_KEY
    0x09,   // APPEND
    0x0a,   // MULTI_GET
    0x0b,   // MULTI_SET
    0x0c,   // CANCEL_WAIT
    0x0d,   // PING
    0x0e,   // QUEUE_PUSH
    0x0f,   // QUEUE_POP
    0x10,   // QUEUE_LEN
    0x11,   // LIST_KEYS
    0x12,   // BARRIER
};

constexpr std::array<std::string_view, kCommandCount> kNames = {
    "VALIDATE",   "SET",       "COMPARE_SET", "GET",         "ADD",
    "CHECK",      "WAIT",      "GETNUMKEYS",  "WATCH_KEY",   "DELETE_KEY",
    "APPEND",     "MULTI_GET", "MULTI_SET",   "CANCEL_WAIT", "PING",
    "QUEUE_PUSH", "QUEUE_POP", "QUEUE_LEN",   "LIST_KEYS",   "BARRIER",
};

const std::array<std::uint8_t, kCommandCount>& codesOf(Dialect d) {
  return d == Dialect::kV113 ? kCodesV113 : kCodesV2;
}

}  // namespace

std::string_view dialectName(Dialect d) noexcept {
  return d == Dialect::kV113 ? "1.13" : "2.x";
}

std::string_view commandName(Command c) noexcept {
  auto i = static_cast<std::size_t>(c);
  return i < kNames.size() ? kNames[i] : "UNKNOWN";
}

std::optional<std::uint8_t> commandCode(Dialect d, Command c) noexcept {
  auto i = static_cast<std::size_t>(c);
  if (i >= kCommandCount) return std::nullopt;
  auto code = codesOf(d)[i];
  if (code == kNone) return std::nullopt;
  return code;
}

std::optional<Command> commandFromCode(Dialect d, std::uint8_t code) noexcept {
  // Codes are dense from 0 in both dialects: 1.13 0x00-0x08, 2.x 0x00-0x12.
  if (code == kNone) return std::nullopt;
  const auto& codes = codesOf(d);
  for (std::size_t i = 0; i < kCommandCount; ++i) {
    if (codes[i] == code) return static_cast<Command>(i);
  }
  return std::nullopt;
}

}  // namespace tcpstore::protocol
