// libFuzzer target: the server's data path in-process, without sockets:
// per-connection RequestStreams -> the memory budget's admission ->
// Keyspace::apply -> replies into per-connection outboxes, with
// disconnects and bounded reclaim() between "loop turns".
//
// Input byte 0: bits 0-2 pick the memory budget (none, or 1 KiB << n), bits
// 3-4 the decoder limits. Then chunks: a header byte h, then up to
// (h >> 3) + 1 payload bytes for connection slot h & 3; (h & 4) ends a loop
// turn first (outboxes written, one reclaim() step); 0xFF closes the slot
// (a new connection takes it, ids are never reused).
//
// Properties: no crash or sanitizer report; every send goes to a live
// connection; a refused or failed request changes nothing for its sender;
// reclaim() frees at most what it is told and drains; after every
// connection closed and reclaim() returned 0, no wait or watch is left and
// the keyspace charges only stored data.
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "protocol/codec.h"
#include "store/keyspace.h"
#include "store/server/budget.h"
#include "tests/fuzz/fuzz_common.h"

using namespace tcpstore;
using protocol::DecodeResult;

namespace {

constexpr std::size_t kSlots = 4;
constexpr std::size_t kReclaimStep = 7;

struct Conn {
  std::unique_ptr<protocol::RequestStream> stream;
  std::string in;   // undecoded bytes
  std::string out;  // unsent replies
  store::ConnId id = 0;
};

struct World {
  protocol::Limits limits;
  server::MemoryBudget budget{0};
  store::Keyspace ks;
  std::array<Conn, kSlots> conns;
  store::ConnId next_id = 1;

  void open(std::size_t slot) {
    Conn& c = conns[slot];
    c.stream = std::make_unique<protocol::RequestStream>(limits);
    c.in.clear();
    c.out.clear();
    c.id = next_id++;
  }
  void close(std::size_t slot) {
    ks.disconnect(conns[slot].id);
    open(slot);
  }
  Conn* find(store::ConnId id) {
    for (Conn& c : conns)
      if (c.id == id) return &c;
    return nullptr;
  }
  server::MemoryUse use() const {
    server::MemoryUse u;
    for (const Conn& c : conns) {
      u.input += c.in.size();
      u.output += c.out.size();
    }
    u.backend = ks.memoryBytes();
    return u;
  }
  void turn() {
    for (Conn& c : conns) c.out.clear();
    const std::size_t before = ks.reclaim(0);
    const std::size_t left = ks.reclaim(kReclaimStep);
    FUZZ_CHECK(left <= before);
    FUZZ_CHECK(before - left <= kReclaimStep);
  }

  // Decodes and applies what slot's buffer holds; closes it on an error.
  void serve(std::size_t slot) {
    Conn& c = conns[slot];
    protocol::Request req;
    store::Effects fx;
    std::size_t off = 0;
    for (;;) {
      req.clear();
      DecodeResult r = c.stream->next(std::string_view(c.in).substr(off), req);
      if (r.kind == DecodeResult::kNeedMore) break;
      if (r.kind == DecodeResult::kError) return close(slot);
      off += r.consumed;
      if (budget.refuse(use(), server::estimateBytes(req))) return close(slot);
      fx.clear();
      const std::size_t keys = ks.numKeys();
      const std::size_t mem = ks.memoryBytes();
      Status st = ks.apply(c.id, req, fx);
      if (!st.isOk()) {
        FUZZ_CHECK(fx.empty());
        FUZZ_CHECK(ks.numKeys() == keys);
        FUZZ_CHECK(ks.memoryBytes() <= mem);  // reclaim may free a little
        return close(slot);
      }
      for (const store::Effects::Send& s : fx.sends()) {
        Conn* t = find(s.conn);
        FUZZ_CHECK(t != nullptr);  // only live connections get bytes
        t->out += fx.bytesOf(s);
      }
    }
    c.in.erase(0, off);
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data,
                                      std::size_t size) {
  if (size < 1) return 0;
  World w;
  w.limits = protocol::fuzz::limitsFor((data[0] >> 3) & 3);
  const unsigned b = data[0] & 7;
  w.budget = server::MemoryBudget(b == 0 ? 0 : std::uint64_t{1024} << b);
  for (std::size_t i = 0; i < kSlots; ++i) w.open(i);
  std::size_t pos = 1;
  while (pos < size) {
    const std::uint8_t h = data[pos++];
    const std::size_t slot = h & 3;
    if (h == 0xFF) {
      w.close(slot);
      continue;
    }
    if (h & 4) w.turn();
    const std::size_t n = std::min<std::size_t>((h >> 3) + 1, size - pos);
    w.conns[slot].in.append(reinterpret_cast<const char*>(data + pos), n);
    pos += n;
    w.serve(slot);
  }
  // Every connection closes; reclaim drains in bounded steps.
  for (std::size_t i = 0; i < kSlots; ++i) w.close(i);
  std::size_t left = w.ks.reclaim(0);
  for (std::size_t steps = 0; left > 0; ++steps) {
    FUZZ_CHECK(steps <= left + 1);
    const std::size_t next = w.ks.reclaim(kReclaimStep);
    FUZZ_CHECK(next < left);
    left = next;
  }
  FUZZ_CHECK(w.ks.numWaitingConnections() == 0);
  FUZZ_CHECK(w.ks.numWatchers() == 0);
  FUZZ_CHECK(w.ks.numPendingWaits() == 0);
  return 0;
}
