// Limits on what a peer may make us allocate. Each is checked at the length
// field that announces it, before anything is allocated or buffered for it.
#pragma once

#include <cstdint>

namespace tcpstore::protocol {

struct Limits {
  // Bytes in one key. PyTorch's libuv server: 8 KiB (MAX_STRING_LEN).
  std::uint64_t max_key_bytes = 8 * 1024;
  // Bytes in one value (SET, COMPARE_SET expected/desired, APPEND, QUEUE_PUSH,
  // MULTI_SET values). PyTorch's libuv server: 8 MiB (MAX_PAYLOAD_LEN).
  std::uint64_t max_value_bytes = 8 * 1024 * 1024;
  // Keys in one CHECK/WAIT/MULTI_GET, pairs in one MULTI_SET. libuv: 128 Ki.
  std::uint64_t max_keys_per_request = 128 * 1024;
  // Bytes one request may occupy in total (all its fields). Bounds what an
  // incomplete request can make a connection buffer. PyTorch has no such cap;
  // ours is generous (a 1.13 or 2.x client never comes close) but finite.
  std::uint64_t max_request_bytes = 256ull * 1024 * 1024;
  // Server: bytes of unsent replies a connection may accumulate before it is
  // paused (reads stop) and, at twice this, dropped.
  std::uint64_t max_buffered_output_bytes = 64ull * 1024 * 1024;
};

}  // namespace tcpstore::protocol
