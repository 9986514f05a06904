// The keyspace's small reply and message helpers: one send per call to a
// connection's Effects, and a printable, bounded rendering of a key for
// error messages.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "protocol/wire.h"
#include "store/effects.h"
#include "tcpstore/status.h"

namespace tcpstore::store::keyspace {

inline std::string quoted(std::string_view key) {
  // Keys are arbitrary bytes: keep the message printable and bounded.
  constexpr std::size_t kMax = 64;
  std::string s = "'";
  for (std::size_t i = 0; i < key.size() && i < kMax; ++i) {
    auto c = static_cast<unsigned char>(key[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') {
      s.push_back(static_cast<char>(c));
    } else {
      static constexpr char kHex[] = "0123456789abcdef";
      s += "\\x";
      s.push_back(kHex[c >> 4]);
      s.push_back(kHex[c & 0xf]);
    }
  }
  if (key.size() > kMax) s += "...";
  s += "'";
  return s;
}

inline Status replyTooLarge(std::uint64_t bytes, std::uint64_t limit) {
  return Status::limitExceeded("reply of " + std::to_string(bytes) +
                               " bytes over the reply limit " +
                               std::to_string(limit));
}

inline void sendByte(Effects& fx, ConnId conn, std::uint8_t b) {
  protocol::appendU8(fx.begin(conn), b);
  fx.end();
}

inline void sendI64(Effects& fx, ConnId conn, std::int64_t v) {
  protocol::appendI64(fx.begin(conn), v);
  fx.end();
}

inline void sendStr(Effects& fx, ConnId conn, std::string_view s) {
  protocol::appendStr(fx.begin(conn), s);
  fx.end();
}

}  // namespace tcpstore::store::keyspace
