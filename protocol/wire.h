// The c10d TCPStore wire vocabulary: dialects, command codes, reply codes.
//
// Grammar (both dialects; integers little-endian, see docs/protocol.md §1):
// clang-format off
//   str     := u64 n, n bytes
//   keys    := u64 count, count * str
//   request := u8 code, fields        (no framing, no length, no request id)
//
//   command      1.13  2.x   fields after the code               reply
//   VALIDATE      -    0x00  u32 magic (0x3C85F7CE)              none
//   SET          0x00  0x01  str key, str value                  none
//   COMPARE_SET  0x01  0x02  str key, str expected, str desired  str
//   GET          0x02  0x03  str key                             str
//   ADD          0x03  0x04  str key, i64 delta                  i64
//   CHECK        0x04  0x05  keys                                u8 (0 ready, 1 not)
//   WAIT         0x05  0x06  keys                                u8 0 (when all exist)
//   GETNUMKEYS   0x06  0x07  -                                   i64
//   WATCH_KEY    0x07   -    str key                             u8 3, then notifications
//   DELETE_KEY   0x08  0x08  str key                             i64 (0/1)
//   APPEND        -    0x09  str key, str bytes                  none
//   MULTI_GET     -    0x0A  keys                                count * str
//   MULTI_SET     -    0x0B  i64 count, count * (str, str)       none
//   CANCEL_WAIT   -    0x0C  -                                   [u8 0] u8 1
//   PING          -    0x0D  u32 nonce                           u32 nonce
//   QUEUE_PUSH    -    0x0E  str key, str value                  none
//   QUEUE_POP     -    0x0F  str key                             i64 n, str if n > 0
//   QUEUE_LEN     -    0x10  str key                             i64
//   LIST_KEYS     -    0x11  -                                   i64 n, n * str
//   BARRIER       -    0x12  str key, i64 world_size             u8 0 (when complete)
//
//   1.13 watch notification (server push): u8 type, str key, str old, str new
// clang-format on
//
// The numeric codes belong to PyTorch's wire format: never renumber them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

namespace tcpstore::protocol {

enum class Dialect : std::uint8_t {
  kV113 = 0,  // PyTorch 1.13 (docs/protocol.md Dialect A)
  kV2 = 1,    // PyTorch 2.x (Dialect B)
};
std::string_view dialectName(Dialect d) noexcept;  // "1.13" / "2.x"

// Dialect-neutral command identity. Not a wire value.
enum class Command : std::uint8_t {
  kValidate,
  kSet,
  kCompareSet,
  kGet,
  kAdd,
  kCheck,
  kWait,
  kGetNumKeys,
  kWatchKey,
  kDeleteKey,
  kAppend,
  kMultiGet,
  kMultiSet,
  kCancelWait,
  kPing,
  kQueuePush,
  kQueuePop,
  kQueueLen,
  kListKeys,
  kBarrier,
};
inline constexpr std::size_t kCommandCount = 20;
std::string_view commandName(Command c) noexcept;  // "SET", "MULTI_GET", ...

// Wire code of `c` in dialect `d`, or nullopt if the dialect lacks it.
std::optional<std::uint8_t> commandCode(Dialect d, Command c) noexcept;
// Command of wire code `code` in dialect `d`, or nullopt if unknown.
std::optional<Command> commandFromCode(Dialect d, std::uint8_t code) noexcept;

inline constexpr std::uint32_t kValidateMagic = 0x3C85F7CE;

// Reply bytes. Never renumber.
inline constexpr std::uint8_t kCheckReady = 0x00;
inline constexpr std::uint8_t kCheckNotReady = 0x01;
inline constexpr std::uint8_t kStopWaiting = 0x00;
inline constexpr std::uint8_t kWaitCanceled = 0x01;

// 1.13 WATCH_KEY notification types.
enum class WatchEvent : std::uint8_t {
  kUpdated = 0x00,
  kCreated = 0x01,
  kDeleted = 0x02,
  kRegistered = 0x03,  // the reply to WATCH_KEY itself
};

// ---- little-endian primitives (defined on any host) ----------------------
inline std::uint64_t loadU64(const unsigned char* p) noexcept {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
inline std::uint32_t loadU32(const unsigned char* p) noexcept {
  std::uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
inline void appendU8(std::string& out, std::uint8_t v) {
  out.push_back(static_cast<char>(v));
}
inline void appendU32(std::string& out, std::uint32_t v) {
  char b[4];
  for (int i = 0; i < 4; ++i) b[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  out.append(b, 4);
}
inline void appendU64(std::string& out, std::uint64_t v) {
  char b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  out.append(b, 8);
}
inline void appendI64(std::string& out, std::int64_t v) {
  appendU64(out, static_cast<std::uint64_t>(v));
}
inline void appendStr(std::string& out, std::string_view s) {
  appendU64(out, s.size());
  out.append(s.data(), s.size());
}

}  // namespace tcpstore::protocol
