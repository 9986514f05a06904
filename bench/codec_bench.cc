// codec_bench: decode and encode throughput of a realistic request mix, in
// both dialects (requests/s and MB/s counters).
//
// The mix is what a rendezvous plus a little training-time traffic puts on the
// wire (docs/protocol.md §5.5, §6.2, §6.3): per 16 requests
//   4 ADD  "/default_pg/store_based_barrier_key:1" +0/+1   (barrier polling)
//   1 ADD  "init/" +1                                      (wait_for_workers)
//   3 SET  "/default_pg/0//cpu//0/<rank>" -> 170-byte value  (gloo address)
//   3 GET  of such a key
//   3 WAIT of one such key
//   1 CHECK of two keys
//   1 GETNUMKEYS
// plus, for 2.x, the VALIDATE + PING handshake once per 64 requests (a new
// connection).
#include <benchmark/benchmark.h>

#include <string>
#include <vector>

#include "protocol/codec.h"

namespace {

using tcpstore::protocol::Command;
using tcpstore::protocol::decodeReply;
using tcpstore::protocol::decodeRequest;
using tcpstore::protocol::Dialect;
using tcpstore::protocol::encodeReply;
using tcpstore::protocol::encodeRequest;
using tcpstore::protocol::Limits;
using tcpstore::protocol::Reply;
using tcpstore::protocol::ReplyShape;
using tcpstore::protocol::replyShapeOf;
using tcpstore::protocol::Request;
using tcpstore::protocol::RequestStream;

constexpr int kRequests = 4096;  // per batch (one "pipelined" buffer)

struct Mix {
  std::vector<std::string> keys;  // storage the requests' views point into
  std::string value;
  std::vector<Request> requests;
  std::vector<Reply> replies;
  std::string wire;        // all requests back to back
  std::string reply_wire;  // all replies back to back
  std::vector<ReplyShape> shapes;
  std::vector<std::uint64_t> counts;
};

Mix makeMix(Dialect d) {
  Mix m;
  m.value.assign(170, 'g');
  m.keys.reserve(kRequests + 8);
  m.keys.push_back("/default_pg/store_based_barrier_key:1");
  m.keys.push_back("init/");
  for (int r = 0; r < kRequests; ++r)
    m.keys.push_back("/default_pg/0//cpu//0/" + std::to_string(r));
  const std::string& barrier = m.keys[0];
  const std::string& init = m.keys[1];
  auto gloo = [&](int i) -> const std::string& {
    return m.keys[2 + (i * 7919) % kRequests];
  };
  for (int i = 0; static_cast<int>(m.requests.size()) < kRequests; ++i) {
    Request q;
    if (d == Dialect::kV2 && i % 64 == 0) {
      q.command = Command::kValidate;
      q.u32 = tcpstore::protocol::kValidateMagic;
      m.requests.push_back(q);
      q = Request();
      q.command = Command::kPing;
      q.u32 = 12345;
      m.requests.push_back(q);
      q = Request();
    }
    switch (i % 16) {
      case 0:
      case 1:
      case 2:
      case 3:
        q.command = Command::kAdd;
        q.key = barrier;
        q.number = i % 16 == 0 ? 1 : 0;
        break;
      case 4:
        q.command = Command::kAdd;
        q.key = init;
        q.number = 1;
        break;
      case 5:
      case 6:
      case 7:
        q.command = Command::kSet;
        q.key = gloo(i);
        q.value = m.value;
        break;
      case 8:
      case 9:
      case 10:
        q.command = Command::kGet;
        q.key = gloo(i);
        break;
      case 11:
      case 12:
      case 13:
        q.command = Command::kWait;
        q.keys.push_back(gloo(i));
        break;
      case 14:
        q.command = Command::kCheck;
        q.keys.push_back(gloo(i));
        q.keys.push_back(gloo(i + 1));
        break;
      default:
        q.command = Command::kGetNumKeys;
        break;
    }
    m.requests.push_back(q);
  }
  for (const Request& q : m.requests) {
    encodeRequest(d, q, m.wire);
    Reply r;
    r.shape = replyShapeOf(q.command);
    switch (r.shape) {
      case ReplyShape::kInt64:
        r.number = 42;
        break;
      case ReplyShape::kString:
        r.value = m.value;
        break;
      case ReplyShape::kU32:
        r.u32 = 12345;
        break;
      default:
        break;
    }
    if (r.shape == ReplyShape::kNone) continue;
    encodeReply(r, m.reply_wire);
    m.replies.push_back(r);
    m.shapes.push_back(r.shape);
    m.counts.push_back(q.keys.size());
  }
  return m;
}

Dialect dialectOf(const benchmark::State& state) {
  return state.range(0) == 113 ? Dialect::kV113 : Dialect::kV2;
}

void setCounters(benchmark::State& state, std::size_t messages,
                 std::size_t bytes) {
  const auto it = static_cast<double>(state.iterations());
  state.counters["requests"] = benchmark::Counter(
      it * static_cast<double>(messages), benchmark::Counter::kIsRate);
  state.counters["MB"] = benchmark::Counter(
      it * static_cast<double>(bytes) / 1e6, benchmark::Counter::kIsRate);
  state.SetLabel(state.range(0) == 113 ? "1.13" : "2.x");
}

// Server side: decodeRequest over one pipelined buffer of the mix.
void BM_DecodeRequests(benchmark::State& state) {
  const Dialect d = dialectOf(state);
  const Mix m = makeMix(d);
  const Limits limits;
  Request req;
  std::size_t n = 0;
  for (auto _ : state) {
    std::string_view in = m.wire;
    n = 0;
    while (!in.empty()) {
      auto r = decodeRequest(in, d, limits, req);
      if (!r.frame()) {
        state.SkipWithError("decode failed");
        return;
      }
      benchmark::DoNotOptimize(req.key.data());
      in.remove_prefix(r.consumed);
      ++n;
    }
  }
  setCounters(state, n, m.wire.size());
}
BENCHMARK(BM_DecodeRequests)->Arg(113)->Arg(2)->MinTime(0.2);

// Server side as the server runs it: RequestStream (dialect detection, 2.x
// handshake rules).
void BM_RequestStream(benchmark::State& state) {
  const Dialect d = dialectOf(state);
  Mix m = makeMix(d);
  if (d == Dialect::kV2) {
    // One stream per connection: a stream accepts VALIDATE once, so keep only
    // the first.
    std::string wire;
    bool first = true;
    std::size_t pos = 0;
    const Limits limits;
    Request req;
    while (pos < m.wire.size()) {
      auto r =
          decodeRequest(std::string_view(m.wire).substr(pos), d, limits, req);
      if (!r.frame()) break;
      if (req.command != Command::kValidate || first)
        wire.append(m.wire, pos, r.consumed);
      if (req.command == Command::kValidate) first = false;
      pos += r.consumed;
    }
    m.wire = wire;
  }
  const Limits limits;
  Request req;
  std::size_t n = 0;
  for (auto _ : state) {
    RequestStream stream(limits);
    std::string_view in = m.wire;
    n = 0;
    while (!in.empty()) {
      auto r = stream.next(in, req);
      if (!r.frame()) {
        state.SkipWithError("stream decode failed");
        return;
      }
      benchmark::DoNotOptimize(req.key.data());
      in.remove_prefix(r.consumed);
      ++n;
    }
  }
  setCounters(state, n, m.wire.size());
}
BENCHMARK(BM_RequestStream)->Arg(113)->Arg(2)->MinTime(0.2);

// Client side: encodeRequest of the mix into one buffer.
void BM_EncodeRequests(benchmark::State& state) {
  const Dialect d = dialectOf(state);
  const Mix m = makeMix(d);
  std::string out;
  out.reserve(m.wire.size());
  for (auto _ : state) {
    out.clear();
    for (const Request& q : m.requests) encodeRequest(d, q, out);
    benchmark::DoNotOptimize(out.data());
  }
  setCounters(state, m.requests.size(), m.wire.size());
}
BENCHMARK(BM_EncodeRequests)->Arg(113)->Arg(2)->MinTime(0.2);

// Server side: encodeReply of the mix's replies.
void BM_EncodeReplies(benchmark::State& state) {
  const Dialect d = dialectOf(state);
  const Mix m = makeMix(d);
  std::string out;
  out.reserve(m.reply_wire.size());
  for (auto _ : state) {
    out.clear();
    for (const Reply& r : m.replies) encodeReply(r, out);
    benchmark::DoNotOptimize(out.data());
  }
  setCounters(state, m.replies.size(), m.reply_wire.size());
}
BENCHMARK(BM_EncodeReplies)->Arg(113)->Arg(2)->MinTime(0.2);

// Client side: decodeReply of the mix's replies.
void BM_DecodeReplies(benchmark::State& state) {
  const Dialect d = dialectOf(state);
  const Mix m = makeMix(d);
  const Limits limits;
  Reply reply;
  for (auto _ : state) {
    std::string_view in = m.reply_wire;
    for (std::size_t i = 0; i < m.shapes.size(); ++i) {
      auto r = decodeReply(in, m.shapes[i], limits, reply, m.counts[i]);
      if (!r.frame()) {
        state.SkipWithError("reply decode failed");
        return;
      }
      benchmark::DoNotOptimize(reply.number);
      in.remove_prefix(r.consumed);
    }
  }
  setCounters(state, m.shapes.size(), m.reply_wire.size());
}
BENCHMARK(BM_DecodeReplies)->Arg(113)->Arg(2)->MinTime(0.2);

// Worst case for resumability: the mix arriving one byte per read (the
// decoder is told how much it needs and is not called again before that).
void BM_DecodeOneByteAtATime(benchmark::State& state) {
  const Dialect d = dialectOf(state);
  const Mix m = makeMix(d);
  const Limits limits;
  Request req;
  std::size_t n = 0;
  for (auto _ : state) {
    std::size_t start = 0, avail = 0, need = 1;
    n = 0;
    while (avail < m.wire.size()) {
      ++avail;  // one more byte arrived
      if (avail - start < need) continue;
      auto r =
          decodeRequest(std::string_view(m.wire).substr(start, avail - start),
                        d, limits, req);
      if (r.frame()) {
        start += r.consumed;
        need = 1;
        ++n;
      } else if (r.needMore()) {
        need = r.need_at_least;
      } else {
        state.SkipWithError("decode failed");
        return;
      }
    }
  }
  setCounters(state, n, m.wire.size());
}
BENCHMARK(BM_DecodeOneByteAtATime)->Arg(113)->Arg(2)->MinTime(0.2);

}  // namespace

BENCHMARK_MAIN();
