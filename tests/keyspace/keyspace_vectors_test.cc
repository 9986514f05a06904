// The semantic "closes" of tests/data/tcpstore_vectors.json: requests after
// which a real server closes the connection without a reply because of the
// store's state (GET/MULTI_GET of a missing key, ADD/BARRIER on a value that
// is not a number). Decoded with the real codec, applied to a keyspace holding
// the state the captures had; apply() must fail, emit nothing and change
// nothing.
#include <doctest/doctest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "protocol/codec.h"
#include "protocol/limits.h"
#include "store/keyspace.h"
#include "test_util.h"

namespace tcpstore::store::testing {
namespace {

struct Case {
  const char* dialect;
  const char* op;
};
// 2.x closes C11-C14, C17, C18 and 1.13 closes C3, C4 of the vectors file.
constexpr Case kSemanticCloses[] = {
    {"2.x", "raw GET of a missing key"},
    {"2.x", "ADD on a non-numeric value"},
    {"2.x", "ADD on an empty value"},
    {"2.x", "ADD on an out-of-range decimal (10^20)"},
    {"2.x", "MULTI_GET [/mg1, /missing, /mg1] (missing key not last)"},
    {"2.x", "BARRIER on a non-numeric value"},
    {"1.13", "raw GET of a missing key"},
    {"1.13", "ADD on a non-numeric value"},
};

nlohmann::json loadVectors() {
  std::ifstream in(TCPSTORE_TEST_DATA_DIR "/tcpstore_vectors.json");
  REQUIRE_MESSAGE(in.good(), "cannot open " TCPSTORE_TEST_DATA_DIR
                             "/tcpstore_vectors.json");
  return nlohmann::json::parse(in);
}

// The state the captured servers held when these requests were sent.
void seed(Harness& h) {
  REQUIRE(h.run(1, set("/nn", "abc")).empty());
  REQUIRE(h.run(1, set("/ev", "")).empty());
  REQUIRE(h.run(1, set("/big", "100000000000000000000")).empty());
  REQUIRE(h.run(1, set("/bn", "not a number")).empty());
  REQUIRE(h.run(1, set("/mg1", "v1")).empty());
}

TEST_CASE("vectors: semantic closes are apply() errors") {
  const nlohmann::json doc = loadVectors();
  int found = 0;
  for (const Case& c : kSemanticCloses) {
    CAPTURE(c.dialect);
    CAPTURE(c.op);
    const nlohmann::json& closes =
        doc.at("dialects").at(c.dialect).at("closes");
    const nlohmann::json* entry = nullptr;
    for (const auto& e : closes) {
      if (e.at("op").get<std::string>() == c.op) entry = &e;
    }
    REQUIRE_MESSAGE(entry != nullptr, "vector not found");
    ++found;
    const std::string bytes = fromHex(entry->at("request").get<std::string>());
    const auto dialect = std::string(c.dialect) == "2.x"
                             ? protocol::Dialect::kV2
                             : protocol::Dialect::kV113;
    protocol::Request r;
    protocol::DecodeResult d =
        protocol::decodeRequest(bytes, dialect, protocol::Limits{}, r);
    REQUIRE_MESSAGE(d.frame(),
                    "the codec must decode it (the close is semantic)");
    CHECK(d.consumed == bytes.size());

    Harness h;
    seed(h);
    const std::size_t keys_before = h.ks.numKeys();
    REQUIRE(h.run(5, waitKeys({"/never"})).empty());
    Status s = h.apply(2, r);
    CHECK_FALSE(s.isOk());
    CHECK(s.code() == StatusCode::kProtocolError);
    CHECK(h.fx.sends().empty());
    CHECK(h.ks.numKeys() == keys_before);
    CHECK(h.value("/nn") == "abc");
    CHECK(h.value("/ev") == "");
    CHECK(h.value("/big") == "100000000000000000000");
    CHECK(h.value("/bn") == "not a number");
    CHECK(h.ks.numPendingWaits() == 1);
    CHECK(h.ks.find("/nope") == nullptr);
    CHECK(h.ks.find("/missing") == nullptr);
  }
  CHECK(found == 8);
}

TEST_CASE("vectors: the same requests succeed once the state allows them") {
  // Guards against the test above passing for the wrong reason (e.g. a
  // keyspace that rejects every ADD): with numeric values and present keys
  // each request is answered.
  const nlohmann::json doc = loadVectors();
  int answered = 0;
  for (const Case& c : kSemanticCloses) {
    CAPTURE(c.op);
    const nlohmann::json* entry = nullptr;
    for (const auto& e : doc.at("dialects").at(c.dialect).at("closes")) {
      if (e.at("op").get<std::string>() == c.op) entry = &e;
    }
    REQUIRE(entry != nullptr);
    const std::string bytes = fromHex(entry->at("request").get<std::string>());
    const auto dialect = std::string(c.dialect) == "2.x"
                             ? protocol::Dialect::kV2
                             : protocol::Dialect::kV113;
    protocol::Request r;
    REQUIRE(
        protocol::decodeRequest(bytes, dialect, protocol::Limits{}, r).frame());
    Harness h;
    for (const char* k :
         {"/nn", "/ev", "/big", "/bn", "/mg1", "/nope", "/missing"}) {
      REQUIRE(h.run(1, set(k, "1")).empty());
    }
    Status s = h.apply(2, r);
    CHECK(s.isOk());
    CHECK(h.fx.sends().size() == 1);
    answered += s.isOk() ? 1 : 0;
  }
  CHECK(answered == 8);
}

}  // namespace
}  // namespace tcpstore::store::testing
