// Helpers shared by the codec tests: the vectors file, captured streams,
// printable requests, and a drain loop over RequestStream (hex conversion is
// in tests/support/hex.h).
#pragma once

#include <doctest/doctest.h>

#include <cstdint>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "protocol/codec.h"
#include "tests/support/hex.h"

namespace tcpstore::test {

// The codec's names, for the helpers below and the protocol tests.
using protocol::Command;
using protocol::commandName;
using protocol::decodeErrorCodeName;
using protocol::DecodeResult;
using protocol::Dialect;
using protocol::encodeRequest;
using protocol::kCommandCount;
using protocol::Reply;
using protocol::Request;
using protocol::RequestStream;

inline std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::string dataPath(std::string_view rel) {
  return std::string(TCPSTORE_TEST_DATA_DIR) + "/" + std::string(rel);
}

// The vectors file, parsed once.
inline const nlohmann::json& vectorsJson() {
  static const nlohmann::json j =
      nlohmann::json::parse(readFile(dataPath("tcpstore_vectors.json")));
  return j;
}

inline const char* jsonDialectName(Dialect d) {
  return d == Dialect::kV113 ? "1.13" : "2.x";
}

inline const nlohmann::json& dialectJson(Dialect d) {
  return vectorsJson().at("dialects").at(jsonDialectName(d));
}

// The command whose wire code the vectors file lists for `code` (by name,
// matched against commandName()). nullopt if the file has no such code.
inline std::optional<Command> jsonCommandOfCode(Dialect d, std::uint8_t code) {
  for (const auto& [name, value] : dialectJson(d).at("codes").items()) {
    if (value.get<int>() != code) continue;
    for (std::size_t i = 0; i < kCommandCount; ++i) {
      auto c = static_cast<Command>(i);
      if (commandName(c) == name) return c;
    }
    FAIL("vectors file names a command we do not know: " << name);
  }
  return std::nullopt;
}

struct Vector {
  Dialect dialect;
  std::string op;
  std::string request;  // raw bytes ("" for a server push)
  std::string reply;    // raw bytes ("" = no reply)
};

inline std::vector<Vector> loadVectors(Dialect d) {
  std::vector<Vector> out;
  for (const auto& v : dialectJson(d).at("vectors")) {
    out.push_back({d, v.at("op").get<std::string>(),
                   fromHex(v.at("request").get<std::string>()),
                   fromHex(v.at("reply").get<std::string>())});
  }
  return out;
}

struct Close {
  Dialect dialect;
  std::size_t number;  // 1-based, as "C<n>" in docs/protocol.md §9.1
  std::string op;
  std::string request;
  bool after_handshake;
};

inline std::vector<Close> loadCloses(Dialect d) {
  std::vector<Close> out;
  std::size_t n = 0;
  for (const auto& v : dialectJson(d).at("closes")) {
    out.push_back({d, ++n, v.at("op").get<std::string>(),
                   fromHex(v.at("request").get<std::string>()),
                   v.at("after_handshake").get<bool>()});
  }
  return out;
}

inline const Close& closeNumber(Dialect d, std::size_t number) {
  static const std::vector<Close> v113 = loadCloses(Dialect::kV113);
  static const std::vector<Close> v2 = loadCloses(Dialect::kV2);
  const auto& all = d == Dialect::kV113 ? v113 : v2;
  REQUIRE(number >= 1);
  REQUIRE(number <= all.size());
  return all[number - 1];
}

inline std::string describe(const Request& r) {
  std::ostringstream ss;
  ss << commandName(r.command) << " key=" << toHex(r.key)
     << " value=" << toHex(r.value) << " desired=" << toHex(r.desired)
     << " number=" << r.number << " u32=" << r.u32 << " keys=[";
  for (auto k : r.keys) ss << toHex(k) << ";";
  ss << "] values=[";
  for (auto v : r.values) ss << toHex(v) << ";";
  ss << "]";
  return ss.str();
}

inline bool sameRequest(const Request& a, const Request& b) {
  return a.command == b.command && a.key == b.key && a.value == b.value &&
         a.desired == b.desired && a.number == b.number && a.u32 == b.u32 &&
         a.keys == b.keys && a.values == b.values;
}

inline std::string describe(const Reply& r) {
  std::ostringstream ss;
  ss << "shape=" << static_cast<int>(r.shape)
     << " byte=" << static_cast<int>(r.byte) << " u32=" << r.u32
     << " number=" << r.number << " value=" << toHex(r.value)
     << " old=" << toHex(r.old_value) << " new=" << toHex(r.new_value)
     << " values=[";
  for (auto v : r.values) ss << toHex(v) << ";";
  ss << "]";
  return ss.str();
}

inline std::string describe(const DecodeResult& r) {
  std::ostringstream ss;
  switch (r.kind) {
    case DecodeResult::kFrame:
      ss << "kFrame consumed=" << r.consumed;
      break;
    case DecodeResult::kNeedMore:
      ss << "kNeedMore need_at_least=" << r.need_at_least;
      break;
    case DecodeResult::kError:
      ss << "kError " << decodeErrorCodeName(r.error.code) << ": "
         << r.error.message();
      break;
  }
  return ss.str();
}

// Feeds `stream_bytes` to a RequestStream as a server would: call next() on
// the unconsumed bytes, advance on kFrame, stop on kError or when it needs
// more than is there. Returns every frame's request re-encoded (in the
// stream's dialect) and the consumed sizes.
struct Drained {
  std::vector<Command> commands;
  std::vector<std::size_t> sizes;
  std::size_t consumed = 0;
  DecodeResult last;       // the result that stopped the loop
  DecodeResult at_finish;  // finish() on what was left
  bool reencode_matches = true;
  // Every 2.x frame's Request::wire viewed exactly its bytes; 1.13's empty.
  bool wire_matches = true;
};

inline Drained drain(RequestStream& stream, std::string_view bytes) {
  Drained d;
  Request req;
  // Bounded: every kFrame consumes >= 1 byte.
  for (std::size_t guard = 0; guard <= bytes.size(); ++guard) {
    std::string_view rest = bytes.substr(d.consumed);
    req.clear();
    DecodeResult r = stream.next(rest, req);
    d.last = r;
    if (!r.frame()) break;
    if (r.consumed == 0 || r.consumed > rest.size()) {
      d.reencode_matches = false;
      break;
    }
    std::string again;
    if (!stream.dialect() || !encodeRequest(*stream.dialect(), req, again) ||
        again != rest.substr(0, r.consumed)) {
      d.reencode_matches = false;
    }
    const bool v2 = stream.dialect() == protocol::Dialect::kV2;
    if (v2 ? req.wire.data() != rest.data() || req.wire.size() != r.consumed
           : !req.wire.empty()) {
      d.wire_matches = false;
    }
    d.commands.push_back(req.command);
    d.sizes.push_back(r.consumed);
    d.consumed += r.consumed;
  }
  d.at_finish = stream.finish(bytes.substr(d.consumed));
  return d;
}

}  // namespace tcpstore::test
