// tcpstore-test-launcher: one "rank" of a custom launcher built on the C++
// client. Each process: connect, waitForWorkers(N), then `--barriers` barriers
// named launch/b0, launch/b1, ... (under the "launch" prefix view).
//   tcpstore-test-launcher --port P --world N [--host H] [--dialect 2.x|1.13]
//                          [--barriers 3] [--timeout SECONDS]
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "tcpstore/client.h"

int main(int argc, char** argv) {
  tcpstore::ClientOptions o;
  long world = 0;
  long barriers = 3;
  double timeout = 60;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string_view a = argv[i];
    const char* v = argv[i + 1];
    if (a == "--port") {
      o.port = static_cast<std::uint16_t>(std::atoi(v));
    } else if (a == "--host") {
      o.host = v;
    } else if (a == "--world") {
      world = std::atol(v);
    } else if (a == "--barriers") {
      barriers = std::atol(v);
    } else if (a == "--timeout") {
      timeout = std::atof(v);
    } else if (a == "--dialect") {
      o.dialect = std::string_view(v) == "1.13" ? tcpstore::Dialect::kV113
                                                : tcpstore::Dialect::kV2;
    } else {
      std::fprintf(stderr, "launcher: unknown option %s\n", argv[i]);
      return 2;
    }
  }
  if (o.port == 0 || world < 1) {
    std::fprintf(stderr, "launcher: need --port and --world\n");
    return 2;
  }
  o.timeout = std::chrono::milliseconds(static_cast<long long>(timeout * 1000));
  o.connect_timeout = o.timeout;
  auto c = tcpstore::Client::connect(o);
  if (!c) {
    std::fprintf(stderr, "launcher: connect: %s\n",
                 c.error().toString().c_str());
    return 3;
  }
  if (auto s = c->waitForWorkers(world); !s) {
    std::fprintf(stderr, "launcher: waitForWorkers: %s\n",
                 s.toString().c_str());
    return 4;
  }
  tcpstore::Client view = c->withPrefix("launch");
  for (long b = 0; b < barriers; ++b) {
    if (auto s = view.barrier("b" + std::to_string(b), world); !s) {
      std::fprintf(stderr, "launcher: barrier %ld: %s\n", b,
                   s.toString().c_str());
      return 5;
    }
  }
  std::printf("done\n");
  return 0;
}
