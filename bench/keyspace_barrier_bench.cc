// keyspace_bench, BARRIER: one N-rank server-side barrier (N BARRIER calls on
// one key, from N connections) in the keyspace alone, no sockets. Per-arrival
// time must not grow with N (issue 12: it did, N^2/2 wait visits per
// barrier).
#include <benchmark/benchmark.h>

#include <string>

#include "protocol/message.h"
#include "store/keyspace.h"

namespace {

using tcpstore::protocol::Command;
using tcpstore::protocol::Request;
using tcpstore::store::Effects;
using tcpstore::store::Keyspace;

void BM_BarrierArrivals(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  Keyspace ks;
  Effects fx;
  Request req;
  req.command = Command::kBarrier;
  req.number = n;
  Request del;
  del.command = Command::kDeleteKey;
  std::size_t released = 0;
  int round = 0;
  for (auto _ : state) {
    const std::string key = "/b/" + std::to_string(round++);
    req.key = key;
    for (std::int64_t c = 1; c <= n; ++c) {
      fx.clear();
      if (!ks.apply(static_cast<tcpstore::store::ConnId>(c), req, fx).isOk()) {
        state.SkipWithError("BARRIER failed");
      }
    }
    released = fx.sends().size();  // the last arrival releases everyone
    state.PauseTiming();
    del.key = key;
    fx.clear();
    (void)ks.apply(1, del, fx);
    ks.reclaim(SIZE_MAX);
    state.ResumeTiming();
  }
  if (released != static_cast<std::size_t>(n)) {
    state.SkipWithError("the last arrival did not release every rank");
  }
  state.counters["ns_per_arrival"] = benchmark::Counter(
      static_cast<double>(state.iterations() * n),
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_BarrierArrivals)
    ->Arg(1024)
    ->Arg(4096)
    ->Arg(16384)
    ->MinTime(0.3)
    ->Unit(benchmark::kMillisecond);

}  // namespace
