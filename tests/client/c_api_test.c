/* Test of the C API, written in C (compiled as C11). Run against a server:
 *   tcpstore-c-api-test PORT [1.13]
 * Exit 0 and "c api ok" on success; otherwise the failed check on stderr.
 * Driven by the doctest case "C API test program (written in C)". */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tcpstore/tcpstore.h"

static int failures = 0;

#define EXPECT(cond)                                                          \
  do {                                                                        \
    if (!(cond)) {                                                            \
      fprintf(stderr, "%s:%d: check failed: %s (last error: %s)\n", __FILE__, \
              __LINE__, #cond, tcpstore_last_error_message());                \
      ++failures;                                                             \
    }                                                                         \
  } while (0)

static void test_v2(tcpstore_client* c) {
  char buf[64];
  size_t len;
  int64_t n = 0;
  int flag = -1;

  EXPECT(tcpstore_set(c, "ck", "value", 5) == TCPSTORE_OK);
  len = sizeof(buf);
  EXPECT(tcpstore_get(c, "ck", -1, buf, &len) == TCPSTORE_OK);
  EXPECT(len == 5 && memcmp(buf, "value", 5) == 0);

  /* Too small: needed size reported, then a retry succeeds. */
  len = 2;
  EXPECT(tcpstore_get(c, "ck", -1, buf, &len) == TCPSTORE_E_BUFFER_TOO_SMALL);
  EXPECT(len == 5);
  len = 0;
  EXPECT(tcpstore_get(c, "ck", -1, NULL, &len) == TCPSTORE_E_BUFFER_TOO_SMALL);
  EXPECT(len == 5);

  /* Binary value with a NUL. */
  EXPECT(tcpstore_set(c, "bin", "a\0b", 3) == TCPSTORE_OK);
  len = sizeof(buf);
  EXPECT(tcpstore_get(c, "bin", 1000, buf, &len) == TCPSTORE_OK);
  EXPECT(len == 3 && memcmp(buf, "a\0b", 3) == 0);

  EXPECT(tcpstore_add(c, "cnt", 40, &n) == TCPSTORE_OK && n == 40);
  EXPECT(tcpstore_add(c, "cnt", 2, &n) == TCPSTORE_OK && n == 42);

  len = sizeof(buf);
  EXPECT(tcpstore_compare_set(c, "ck", "value", 5, "new", 3, buf, &len) ==
         TCPSTORE_OK);
  EXPECT(len == 3 && memcmp(buf, "new", 3) == 0);
  len = sizeof(buf);
  EXPECT(tcpstore_compare_set(c, "ck", "zzz", 3, "x", 1, buf, &len) ==
         TCPSTORE_OK);
  EXPECT(len == 3 && memcmp(buf, "new", 3) == 0);

  {
    const char* keys[] = {"ck", "cnt"};
    const char* missing[] = {"ck", "nope"};
    EXPECT(tcpstore_check(c, keys, 2, &flag) == TCPSTORE_OK && flag == 1);
    EXPECT(tcpstore_check(c, missing, 2, &flag) == TCPSTORE_OK && flag == 0);
    EXPECT(tcpstore_wait(c, keys, 2, 1000) == TCPSTORE_OK);
    EXPECT(tcpstore_wait(c, missing, 2, 100) == TCPSTORE_E_TIMEOUT);
    EXPECT(strstr(tcpstore_last_error_message(), "timeout") != NULL);
    /* Still usable after the timeout. */
    EXPECT(tcpstore_add(c, "cnt", 0, &n) == TCPSTORE_OK && n == 42);
  }

  EXPECT(tcpstore_num_keys(c, &n) == TCPSTORE_OK && n == 3);
  EXPECT(tcpstore_delete_key(c, "bin", &flag) == TCPSTORE_OK && flag == 1);
  EXPECT(tcpstore_delete_key(c, "bin", &flag) == TCPSTORE_OK && flag == 0);

  EXPECT(tcpstore_append(c, "ap", "xy", 2) == TCPSTORE_OK);
  EXPECT(tcpstore_append(c, "ap", "z", 1) == TCPSTORE_OK);
  len = sizeof(buf);
  EXPECT(tcpstore_get(c, "ap", -1, buf, &len) == TCPSTORE_OK);
  EXPECT(len == 3 && memcmp(buf, "xyz", 3) == 0);

  EXPECT(tcpstore_ping(c) == TCPSTORE_OK);

  {
    size_t count = 0;
    len = sizeof(buf);
    EXPECT(tcpstore_list_keys(c, buf, &len, &count) == TCPSTORE_OK);
    /* sorted: ap, ck, cnt, each NUL-terminated */
    EXPECT(count == 3);
    EXPECT(len == 3 + 3 + 4 && memcmp(buf, "ap\0ck\0cnt\0", 10) == 0);
    len = 1;
    EXPECT(tcpstore_list_keys(c, buf, &len, &count) ==
           TCPSTORE_E_BUFFER_TOO_SMALL);
    EXPECT(len == 10);
  }

  EXPECT(tcpstore_queue_push(c, "q", "hello", 5) == TCPSTORE_OK);
  EXPECT(tcpstore_queue_len(c, "q", &n) == TCPSTORE_OK && n == 1);
  len = 2; /* too small: the popped value is kept for the next pop */
  EXPECT(tcpstore_queue_pop(c, "q", 1, buf, &len) ==
         TCPSTORE_E_BUFFER_TOO_SMALL);
  EXPECT(len == 5);
  len = sizeof(buf);
  EXPECT(tcpstore_queue_pop(c, "q", 0, buf, &len) == TCPSTORE_OK);
  EXPECT(len == 5 && memcmp(buf, "hello", 5) == 0);
  len = sizeof(buf);
  EXPECT(tcpstore_queue_pop(c, "q", 0, buf, &len) == TCPSTORE_E_NOT_FOUND);

  EXPECT(tcpstore_barrier(c, "cb", 1, 1000) == TCPSTORE_OK);
  EXPECT(tcpstore_wait_for_workers(c, 1, 1000) == TCPSTORE_OK);

  {
    tcpstore_client* p = NULL;
    EXPECT(tcpstore_with_prefix(c, "pg1", &p) == TCPSTORE_OK && p != NULL);
    EXPECT(tcpstore_set(p, "k", "pv", 2) == TCPSTORE_OK);
    len = sizeof(buf);
    EXPECT(tcpstore_get(c, "pg1/k", -1, buf, &len) == TCPSTORE_OK);
    EXPECT(len == 2 && memcmp(buf, "pv", 2) == 0);
    tcpstore_close(p);
  }

  /* Argument errors. */
  EXPECT(tcpstore_set(NULL, "k", "v", 1) == TCPSTORE_E_INVALID_ARGUMENT);
  EXPECT(tcpstore_set(c, NULL, "v", 1) == TCPSTORE_E_INVALID_ARGUMENT);
  EXPECT(tcpstore_get(c, "ck", -1, buf, NULL) == TCPSTORE_E_INVALID_ARGUMENT);
  EXPECT(tcpstore_barrier(c, "bad", 0, 100) == TCPSTORE_E_INVALID_ARGUMENT);
  EXPECT(strcmp(tcpstore_status_name(TCPSTORE_E_TIMEOUT), "timeout") == 0);
  EXPECT(strcmp(tcpstore_status_name(TCPSTORE_E_BUFFER_TOO_SMALL),
                "buffer too small") == 0);
}

static void test_v113(tcpstore_client* c) {
  char buf[16];
  size_t len = sizeof(buf);
  int64_t n = 0;
  EXPECT(tcpstore_set(c, "old", "v", 1) == TCPSTORE_OK);
  EXPECT(tcpstore_get(c, "old", -1, buf, &len) == TCPSTORE_OK && len == 1);
  EXPECT(tcpstore_add(c, "oc", 7, &n) == TCPSTORE_OK && n == 7);
  EXPECT(tcpstore_ping(c) == TCPSTORE_E_NOT_SUPPORTED);
  EXPECT(tcpstore_append(c, "old", "x", 1) == TCPSTORE_E_NOT_SUPPORTED);
  EXPECT(tcpstore_barrier(c, "ob", 1, 1000) == TCPSTORE_OK);
}

int main(int argc, char** argv) {
  tcpstore_options opts;
  tcpstore_client* c = NULL;
  int rc;
  if (argc < 2) {
    fprintf(stderr, "usage: %s PORT [1.13]\n", argv[0]);
    return 2;
  }
  tcpstore_options_init(&opts);
  opts.timeout_ms = 10000;
  opts.connect_timeout_ms = 10000;
  if (argc > 2 && strcmp(argv[2], "1.13") == 0)
    opts.dialect = TCPSTORE_DIALECT_V113;

  /* Refused: typed error and a message. */
  {
    tcpstore_options quick = opts;
    tcpstore_client* none = NULL;
    quick.connect_timeout_ms = 200;
    EXPECT(tcpstore_connect("127.0.0.1", 1, &quick, &none) ==
           TCPSTORE_E_REFUSED);
    EXPECT(none == NULL);
    EXPECT(strlen(tcpstore_last_error_message()) > 0);
  }

  rc = tcpstore_connect("127.0.0.1", (uint16_t)atoi(argv[1]), &opts, &c);
  if (rc != TCPSTORE_OK) {
    fprintf(stderr, "connect failed: %s\n", tcpstore_last_error_message());
    return 1;
  }
  if (opts.dialect == TCPSTORE_DIALECT_V113) {
    test_v113(c);
  } else {
    test_v2(c);
  }
  tcpstore_close(c);
  if (failures != 0) {
    fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  printf("c api ok\n");
  return 0;
}
