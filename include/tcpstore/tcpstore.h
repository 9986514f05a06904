/* C API of the tcpstore client (a thin layer over tcpstore::Client, see
 * tcpstore/client.h for semantics: key mapping, threads, barriers).
 *
 * Conventions:
 *  - Every function returns an int status: TCPSTORE_OK (0) or a
 *    TCPSTORE_E_* code. The numbers equal tcpstore::StatusCode.
 *    tcpstore_last_error_message() describes the last failure of the calling
 *    thread (valid until that thread's next call).
 *  - Keys are NUL-terminated strings; values are (pointer, length) byte
 *    ranges and may contain NULs.
 *  - Output buffers are caller-owned: pass the buffer and its capacity in
 *    *len; on success *len is the number of bytes written. If the buffer is
 *    too small the call returns TCPSTORE_E_BUFFER_TOO_SMALL and sets *len to
 *    the size needed (the value is not kept: call again with a bigger buffer;
 *    a get then re-reads the key, which exists by now). buf may be NULL when
 *    *len is 0 (a size query).
 *  - timeout_ms < 0 means "the handle's default timeout".
 *  - A handle may be used from many threads at once. tcpstore_close() must
 *    not race with other calls on the same handle.
 */
#ifndef TCPSTORE_TCPSTORE_H_
#define TCPSTORE_TCPSTORE_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
  TCPSTORE_OK = 0,
  TCPSTORE_E_TIMEOUT = 1,
  TCPSTORE_E_REFUSED = 2,
  TCPSTORE_E_CLOSED = 3,
  TCPSTORE_E_IO = 4,
  TCPSTORE_E_PROTOCOL = 5,
  TCPSTORE_E_LIMIT = 6,
  TCPSTORE_E_INVALID_ARGUMENT = 7,
  TCPSTORE_E_NOT_SUPPORTED = 8,
  TCPSTORE_E_NOT_FOUND = 9,
  TCPSTORE_E_BUFFER_TOO_SMALL = 64
};

enum { TCPSTORE_DIALECT_V113 = 0, TCPSTORE_DIALECT_V2 = 1 };

typedef struct tcpstore_client tcpstore_client;

typedef struct tcpstore_options {
  int dialect;                /* TCPSTORE_DIALECT_V2 (default) or _V113 */
  int64_t timeout_ms;         /* default 300000 */
  int64_t connect_timeout_ms; /* default 300000 */
  const char* prefix;         /* PrefixStore-style prefix, NULL = none */
} tcpstore_options;

/* Fills *opts with the defaults. */
void tcpstore_options_init(tcpstore_options* opts);

/* Connects (with retry until the connect timeout). opts may be NULL. */
int tcpstore_connect(const char* host, uint16_t port,
                     const tcpstore_options* opts, tcpstore_client** out);
/* A new handle viewing keys under prefix (shares the connections). */
int tcpstore_with_prefix(const tcpstore_client* c, const char* prefix,
                         tcpstore_client** out);
/* Frees the handle (NULL is fine). */
void tcpstore_close(tcpstore_client* c);

int tcpstore_set(tcpstore_client* c, const char* key, const void* value,
                 size_t value_len);
/* Blocks until key exists (timeout_ms), then copies its value into buf. */
int tcpstore_get(tcpstore_client* c, const char* key, int64_t timeout_ms,
                 void* buf, size_t* len);
int tcpstore_add(tcpstore_client* c, const char* key, int64_t delta,
                 int64_t* new_value);
/* Copies the resulting value (torch compare_set semantics) into buf. */
int tcpstore_compare_set(tcpstore_client* c, const char* key,
                         const void* expected, size_t expected_len,
                         const void* desired, size_t desired_len, void* buf,
                         size_t* len);
/* *all_exist = 1 if every key exists, else 0. */
int tcpstore_check(tcpstore_client* c, const char* const* keys, size_t n,
                   int* all_exist);
int tcpstore_wait(tcpstore_client* c, const char* const* keys, size_t n,
                  int64_t timeout_ms);
/* *deleted = 1 if the key existed. deleted may be NULL. */
int tcpstore_delete_key(tcpstore_client* c, const char* key, int* deleted);
int tcpstore_num_keys(tcpstore_client* c, int64_t* out);
int tcpstore_append(tcpstore_client* c, const char* key, const void* value,
                    size_t value_len);
/* Sets n keys to n values (one request, no reply, like set). values[i] may
 * be NULL only when value_lens[i] is 0. */
int tcpstore_multi_set(tcpstore_client* c, const char* const* keys,
                       const void* const* values, const size_t* value_lens,
                       size_t n);
/* Blocks until all n keys exist (timeout_ms), then copies their values, in
 * order and back to back, into buf; value_lens[i] receives the length of the
 * i-th value (value_lens must hold n entries). *len works as for get: on
 * TCPSTORE_E_BUFFER_TOO_SMALL it is the total size needed. */
int tcpstore_multi_get(tcpstore_client* c, const char* const* keys, size_t n,
                       int64_t timeout_ms, void* buf, size_t* len,
                       size_t* value_lens);
/* Round trip with a nonce (2.x dialect); TCPSTORE_E_NOT_SUPPORTED in 1.13. */
int tcpstore_ping(tcpstore_client* c);
/* Keys as torch users see them, each followed by a NUL, packed into buf;
 * *count receives the number of keys (count may be NULL). */
int tcpstore_list_keys(tcpstore_client* c, char* buf, size_t* len,
                       size_t* count);
int tcpstore_queue_push(tcpstore_client* c, const char* key, const void* value,
                        size_t value_len);
/* block != 0: wait (default timeout) until the queue is non-empty; else an
 * empty queue gives TCPSTORE_E_NOT_FOUND. A value popped into a too-small
 * buffer is kept by the handle and returned by its next pop of that queue. */
int tcpstore_queue_pop(tcpstore_client* c, const char* key, int block,
                       void* buf, size_t* len);
int tcpstore_queue_len(tcpstore_client* c, const char* key, int64_t* out);
int tcpstore_barrier(tcpstore_client* c, const char* name, int64_t world_size,
                     int64_t timeout_ms);
int tcpstore_wait_for_workers(tcpstore_client* c, int64_t world_size,
                              int64_t timeout_ms);

/* Message of the calling thread's last failed call ("" if none). */
const char* tcpstore_last_error_message(void);
/* "ok", "timeout", ..., "buffer too small". */
const char* tcpstore_status_name(int code);

#ifdef __cplusplus
}
#endif

#endif /* TCPSTORE_TCPSTORE_H_ */
