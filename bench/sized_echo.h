// The floor server of the init scenarios: a raw loopback server in a forked
// child that answers each framed message with a reply of the size the message
// asks for, so the floor moves exactly the bytes a store would (a 30-byte
// MULTI_GET that returns 17 KiB costs the floor 30 bytes in and 17 KiB out),
// with one recv/send per message and no protocol work.
//
// A message: u32 total_len (little-endian, >= 8, the header included),
// u32 reply_len (little-endian), then total_len - 8 bytes of padding. The
// reply is reply_len zero bytes (none for 0).
#pragma once

#include <cstdint>
#include <string>

#include "bench/loadgen.h"

namespace tcpstore::bench {

inline constexpr std::uint32_t kSizedEchoHeader = 8;

// Appends one message of `total_len` bytes (raised to the header's 8 if
// smaller) asking for `reply_len` bytes back.
void appendSizedEcho(std::string& out, std::uint32_t total_len,
                     std::uint32_t reply_len);

// Starts the server in a forked child; returns its pid (-1 on failure) and
// sets `ep` to its address. Stop it with stopChild() (bench/scenarios.h).
int startSizedEchoServer(Endpoint& ep);

// Serves sized-echo messages on the listening socket `listen_fd` in this
// process, forever (exits when its parent does). `sndbuf` > 0: SO_SNDBUF of
// every accepted socket (the replies not yet sent are only a count here, so
// this bounds the kernel memory the floor pins, as a server's own output
// queue would).
[[noreturn]] void serveSizedEcho(int listen_fd, int sndbuf);

}  // namespace tcpstore::bench
