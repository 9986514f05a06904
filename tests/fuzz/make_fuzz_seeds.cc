// Writes the fuzzers' seed corpora from tests/data/tcpstore_vectors.json:
//   make_fuzz_seeds VECTORS_JSON OUT_DIR
// creates OUT_DIR/<target>/<n> for fuzz_request_stream, fuzz_request_v113,
// fuzz_request_v2 and fuzz_reply, each input prefixed with the selector
// bytes that target reads first.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "protocol/codec.h"
#include "tests/support/hex.h"

namespace fs = std::filesystem;
using namespace tcpstore::protocol;
using tcpstore::test::fromHex;

namespace {

class Corpus {
 public:
  Corpus(const fs::path& root, const std::string& target)
      : dir_(root / target) {
    fs::create_directories(dir_);
  }
  void add(const std::string& bytes) {
    std::ofstream f(dir_ / std::to_string(n_++), std::ios::binary);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  std::size_t size() const { return n_; }

 private:
  fs::path dir_;
  std::size_t n_ = 0;
};

std::string sel(std::uint8_t b) { return std::string(1, static_cast<char>(b)); }

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: make_fuzz_seeds VECTORS_JSON OUT_DIR\n";
    return 2;
  }
  std::ifstream in(argv[1]);
  if (!in) {
    std::cerr << "cannot open " << argv[1] << "\n";
    return 1;
  }
  const nlohmann::json j = nlohmann::json::parse(in);
  const fs::path root = argv[2];
  Corpus stream(root, "fuzz_request_stream");
  Corpus v113(root, "fuzz_request_v113");
  Corpus v2(root, "fuzz_request_v2");
  Corpus reply(root, "fuzz_reply");

  const std::string handshake = fromHex("00cef7853c0d92100000");
  for (Dialect d : {Dialect::kV113, Dialect::kV2}) {
    const auto& dj = j.at("dialects").at(d == Dialect::kV113 ? "1.13" : "2.x");
    Corpus& fixed = d == Dialect::kV113 ? v113 : v2;
    std::string all;  // every request of the dialect, pipelined
    for (const auto& v : dj.at("vectors")) {
      const std::string req = fromHex(v.at("request").get<std::string>());
      const std::string rep = fromHex(v.at("reply").get<std::string>());
      ReplyShape shape = ReplyShape::kWatchNotification;
      std::uint64_t count = 0;
      if (!req.empty()) {
        Request r;
        if (!decodeRequest(req, d, Limits{}, r).frame()) {
          std::cerr << "vector does not decode: " << v.at("op") << "\n";
          return 1;
        }
        shape = replyShapeOf(r.command);
        if (r.command == Command::kMultiGet) count = r.keys.size();
        for (std::uint8_t lim : {0, 1, 2}) fixed.add(sel(lim) + req);
        const bool validate = r.command == Command::kValidate;
        if (d == Dialect::kV113) {
          stream.add(sel(0) + req);  // detected as 1.13
          stream.add(sel(1) + req);
        } else {
          stream.add(sel(0) + (validate ? req : handshake + req));
          stream.add(sel(validate ? 2 : 3) + req);
          stream.add(sel(0x04 | 3) + req);  // tiny limits
        }
        if (!(d == Dialect::kV2 && validate && !all.empty())) all += req;
      }
      if (!rep.empty()) {
        if (count > 255) count = 255;
        reply.add(sel(static_cast<std::uint8_t>(shape)) +
                  sel(static_cast<std::uint8_t>(count)) + sel(0) + rep);
      }
    }
    for (std::uint8_t pattern = 0; pattern < 4; ++pattern) {
      stream.add(sel(static_cast<std::uint8_t>(pattern << 4)) + all);
    }
    fixed.add(sel(0) + all);
    for (const auto& c : dj.at("closes")) {
      const std::string req = fromHex(c.at("request").get<std::string>());
      const bool after = c.at("after_handshake").get<bool>();
      stream.add(sel(0) + (after ? handshake + req : req));
      fixed.add(sel(0) + req);
    }
  }
  std::cout << "seeds: stream " << stream.size() << ", v113 " << v113.size()
            << ", v2 " << v2.size() << ", reply " << reply.size() << "\n";
  return 0;
}
