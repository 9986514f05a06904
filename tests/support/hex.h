// Hex text <-> bytes for the tests: the vectors file, captures and failure
// messages. Header-only; no dependency beyond the standard library.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace tcpstore::test {

// "0a ff 10" or "0aff10" -> bytes. Spaces are skipped; any other non-hex
// character, or an odd number of digits, throws std::invalid_argument (a
// broken vector must fail loudly, never decode to something else).
inline std::string fromHex(std::string_view hex) {
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  int hi = -1;
  for (char c : hex) {
    if (c == ' ') continue;
    const int n = nibble(c);
    if (n < 0) throw std::invalid_argument("bad hex digit");
    if (hi < 0) {
      hi = n;
    } else {
      out.push_back(static_cast<char>((hi << 4) | n));
      hi = -1;
    }
  }
  if (hi >= 0) throw std::invalid_argument("odd hex length");
  return out;
}

// bytes -> lower-case hex, with `sep` between bytes ("" or " ").
inline std::string toHex(std::string_view bytes, std::string_view sep = "") {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    if (!out.empty()) out.append(sep);
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 0xf]);
  }
  return out;
}

}  // namespace tcpstore::test
