/* A C program built against the installed libtcpstore.so: set/get/add/ping
 * through the C API against the server at argv[1]:argv[2]. Exit 0 on success.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tcpstore/tcpstore.h>

static int fail(const char* what, int rc) {
  fprintf(stderr, "consumer_c: %s: %s: %s\n", what, tcpstore_status_name(rc),
          tcpstore_last_error_message());
  return 1;
}

int main(int argc, char** argv) {
  tcpstore_options opts;
  tcpstore_client* c = NULL;
  char buf[64];
  size_t len = sizeof buf;
  int64_t sum = 0;
  int rc;
  if (argc != 3) {
    fprintf(stderr, "usage: consumer_c HOST PORT\n");
    return 2;
  }
  tcpstore_options_init(&opts);
  opts.timeout_ms = 10000;
  opts.connect_timeout_ms = 10000;
  opts.prefix = "consumer_c/";
  rc = tcpstore_connect(argv[1], (uint16_t)atoi(argv[2]), &opts, &c);
  if (rc != TCPSTORE_OK) return fail("connect", rc);
  if ((rc = tcpstore_ping(c)) != TCPSTORE_OK) return fail("ping", rc);
  if ((rc = tcpstore_set(c, "k", "from C", 6)) != TCPSTORE_OK)
    return fail("set", rc);
  if ((rc = tcpstore_get(c, "k", -1, buf, &len)) != TCPSTORE_OK)
    return fail("get", rc);
  if ((rc = tcpstore_add(c, "n", 7, &sum)) != TCPSTORE_OK)
    return fail("add", rc);
  tcpstore_close(c);
  if (len != 6 || memcmp(buf, "from C", 6) != 0 || sum < 7) {
    fprintf(stderr, "consumer_c: got %zu bytes and %lld\n", len,
            (long long)sum);
    return 1;
  }
  printf("consumer_c: ok\n");
  return 0;
}
