// A program built against the installed tcpstore: starts an embedded server on
// a free loopback port, does a set/get/add through a client, stops the server.
// Exit 0 on success.
#include <tcpstore/client.h>
#include <tcpstore/server.h>

#include <chrono>
#include <cstdio>

namespace {

int fail(const char* what, const tcpstore::Status& status) {
  std::fprintf(stderr, "consumer_cxx: %s: %s\n", what,
               status.message().c_str());
  return 1;
}

}  // namespace

int main() {
  tcpstore::ServerOptions server_options;
  server_options.host = "127.0.0.1";
  server_options.port = 0;
  server_options.log_level = "warn";
  auto server = tcpstore::Server::start(server_options);
  if (!server) return fail("Server::start", server.error());

  tcpstore::ClientOptions client_options;
  client_options.port = (*server)->port();
  client_options.timeout = std::chrono::seconds(10);
  client_options.connect_timeout = std::chrono::seconds(10);
  int rc = 0;
  {
    auto client = tcpstore::Client::connect(client_options);
    if (!client) return fail("Client::connect", client.error());
    if (auto s = client->set("installed", "yes"); !s) return fail("set", s);
    auto value = client->get("installed");
    if (!value) return fail("get", value.error());
    auto sum = client->add("counter", 41);
    if (sum) sum = client->add("counter", 1);
    if (!sum) return fail("add", sum.error());
    if (*value != "yes" || *sum != 42) {
      std::fprintf(stderr, "consumer_cxx: got '%s' and %lld\n", value->c_str(),
                   static_cast<long long>(*sum));
      rc = 1;
    }
  }
  if (auto s = (*server)->stop(); !s) return fail("Server::stop", s);
  if (rc == 0)
    std::printf("consumer_cxx: ok (embedded server on port %u)\n",
                static_cast<unsigned>((*server)->port()));
  return rc;
}
