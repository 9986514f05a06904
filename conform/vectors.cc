#include "conform/vectors.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "conform/ctx.h"
#include "protocol/codec.h"
#include "protocol/limits.h"

namespace tcpstore::conform {

extern const char kVectorsJson[];  // generated from tcpstore_vectors.json

namespace {

struct Table {
  std::vector<Vector> replies[2];
  std::vector<Vector> closes[2];
};

Vector fromJson(const nlohmann::json& j) {
  Vector v;
  v.op = j.at("op").get<std::string>();
  v.request = unhex(j.at("request").get<std::string>());
  if (j.contains("reply")) v.reply = unhex(j.at("reply").get<std::string>());
  if (j.contains("after_handshake")) {
    v.after_handshake = j.at("after_handshake").get<bool>();
  }
  const auto& va = j.at("verified_against");
  if (va.is_array()) {
    for (const auto& s : va) v.verified_against.push_back(s.get<std::string>());
  } else {
    v.verified_against.push_back(va.get<std::string>());
  }
  return v;
}

const Table& table() {
  static const Table t = [] {
    Table out;
    auto j = nlohmann::json::parse(kVectorsJson);
    const char* names[2] = {"1.13", "2.x"};
    for (int d = 0; d < 2; ++d) {
      const auto& dj = j.at("dialects").at(names[d]);
      for (const auto& v : dj.at("vectors"))
        out.replies[d].push_back(fromJson(v));
      for (const auto& v : dj.at("closes"))
        out.closes[d].push_back(fromJson(v));
    }
    return out;
  }();
  return t;
}

const Vector& at(const std::vector<Vector>& v, int number, const char* what) {
  if (number < 1 || static_cast<std::size_t>(number) > v.size()) {
    fail(fmt::format("no {} vector #{}", what, number));
  }
  return v[static_cast<std::size_t>(number - 1)];
}

}  // namespace

const Vector& replyVector(protocol::Dialect d, int number) {
  return at(table().replies[static_cast<int>(d)], number, "request/reply");
}

const Vector& closeVector(protocol::Dialect d, int number) {
  return at(table().closes[static_cast<int>(d)], number, "closes");
}

std::string rekey(protocol::Dialect d, const std::string& request,
                  const std::string& prefix) {
  protocol::Limits limits;  // libuv's: the vectors' keys are far below
  protocol::Request r;
  auto res = protocol::decodeRequest(request, d, limits, r);
  if (!res.frame() || res.consumed != request.size()) return request;
  std::string again;
  protocol::encodeRequest(d, r, again);
  if (again != request) {
    fail(fmt::format("tool error: codec re-encodes {} as {}", hex(request),
                     hex(again)));
  }
  auto move = [&](std::string_view k) {
    return k.empty() || k.front() != '/' ? prefix + "/" + std::string(k)
                                         : prefix + std::string(k);
  };
  std::string key = move(r.key);
  std::vector<std::string> keys;
  for (auto k : r.keys) keys.push_back(move(k));
  bool keyed = !r.key.empty();
  if (keyed) r.key = key;
  for (std::size_t i = 0; i < keys.size(); ++i) r.keys[i] = keys[i];
  std::string out;
  protocol::encodeRequest(d, r, out);
  return out;
}

}  // namespace tcpstore::conform
