// C API over tcpstore::Client. No exception crosses the C boundary.
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "tcpstore/client.h"
#include "tcpstore/tcpstore.h"

struct tcpstore_client {
  tcpstore::Client client;
  // Values popped into a too-small buffer, handed out by the next pop of the
  // same queue through this handle (a pop cannot be undone on the server).
  std::mutex stash_mu;
  std::map<std::string, std::deque<std::string>> stash;
};

namespace {

thread_local std::string g_last_error;

int report(const tcpstore::Status& s) {
  if (s.isOk()) return TCPSTORE_OK;
  g_last_error = s.toString();
  return static_cast<int>(s.code());
}

int invalid(const char* what) {
  g_last_error = std::string("invalid argument: ") + what;
  return TCPSTORE_E_INVALID_ARGUMENT;
}

// Copies bytes to a caller buffer with the size-in/size-out protocol.
int copyOut(const std::string& v, void* buf, size_t* len) {
  if (len == nullptr) return invalid("len is NULL");
  if (v.size() > *len || (buf == nullptr && !v.empty())) {
    *len = v.size();
    g_last_error =
        "buffer too small: need " + std::to_string(v.size()) + " bytes";
    return TCPSTORE_E_BUFFER_TOO_SMALL;
  }
  if (!v.empty()) std::memcpy(buf, v.data(), v.size());
  *len = v.size();
  return TCPSTORE_OK;
}

// The bytes of a (pointer, length) argument; a NULL pointer is only valid
// with length 0 (callers check that first) and reads as empty.
std::string_view bytesOf(const void* data, size_t len) {
  return data ? std::string_view(static_cast<const char*>(data), len)
              : std::string_view();
}

std::optional<std::chrono::milliseconds> timeoutOf(int64_t ms) {
  if (ms < 0) return std::nullopt;
  return std::chrono::milliseconds(ms);
}

bool keysOf(const char* const* keys, size_t n, std::vector<std::string>& out) {
  if (n > 0 && keys == nullptr) return false;
  for (size_t i = 0; i < n; ++i) {
    if (keys[i] == nullptr) return false;
    out.emplace_back(keys[i]);
  }
  return true;
}

template <typename F>
int guarded(F&& f) noexcept {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    g_last_error = "out of memory";
    return TCPSTORE_E_LIMIT;
  } catch (const std::exception& e) {
    g_last_error = std::string("internal error: ") + e.what();
    return TCPSTORE_E_IO;
  } catch (...) {
    g_last_error = "internal error";
    return TCPSTORE_E_IO;
  }
}

#define TCPSTORE_CHECK_HANDLE(c) \
  if ((c) == nullptr) return invalid("client is NULL")
#define TCPSTORE_CHECK_KEY(k) \
  if ((k) == nullptr) return invalid("key is NULL")

}  // namespace

extern "C" {

void tcpstore_options_init(tcpstore_options* opts) {
  if (opts == nullptr) return;
  opts->dialect = TCPSTORE_DIALECT_V2;
  opts->timeout_ms = 300000;
  opts->connect_timeout_ms = 300000;
  opts->prefix = nullptr;
}

int tcpstore_connect(const char* host, uint16_t port,
                     const tcpstore_options* opts, tcpstore_client** out) {
  return guarded([&]() -> int {
    if (out == nullptr) return invalid("out is NULL");
    *out = nullptr;
    tcpstore_options o;
    tcpstore_options_init(&o);
    if (opts != nullptr) o = *opts;
    if (o.dialect != TCPSTORE_DIALECT_V2 &&
        o.dialect != TCPSTORE_DIALECT_V113) {
      return invalid("unknown dialect");
    }
    if (o.timeout_ms < 0 || o.connect_timeout_ms < 0)
      return invalid("negative timeout");
    tcpstore::ClientOptions co;
    co.host = host != nullptr ? host : "127.0.0.1";
    co.port = port;
    co.dialect = o.dialect == TCPSTORE_DIALECT_V113 ? tcpstore::Dialect::kV113
                                                    : tcpstore::Dialect::kV2;
    co.timeout = std::chrono::milliseconds(o.timeout_ms);
    co.connect_timeout = std::chrono::milliseconds(o.connect_timeout_ms);
    if (o.prefix != nullptr) co.prefix = o.prefix;
    auto c = tcpstore::Client::connect(co);
    if (!c) return report(c.error());
    *out = new tcpstore_client{std::move(*c), {}, {}};
    return TCPSTORE_OK;
  });
}

int tcpstore_with_prefix(const tcpstore_client* c, const char* prefix,
                         tcpstore_client** out) {
  return guarded([&]() -> int {
    TCPSTORE_CHECK_HANDLE(c);
    if (prefix == nullptr || out == nullptr)
      return invalid("prefix or out is NULL");
    *out = new tcpstore_client{c->client.withPrefix(prefix), {}, {}};
    return TCPSTORE_OK;
  });
}

void tcpstore_close(tcpstore_client* c) { delete c; }

int tcpstore_set(tcpstore_client* c, const char* key, const void* value,
                 size_t value_len) {
  return guarded([&]() -> int {
    TCPSTORE_CHECK_HANDLE(c);
    TCPSTORE_CHECK_KEY(key);
    if (value == nullptr && value_len > 0) return invalid("value is NULL");
    return report(c->client.set(key, bytesOf(value, value_len)));
  });
}

int tcpstore_get(tcpstore_client* c, const char* key, int64_t timeout_ms,
                 void* buf, size_t* len) {
  return guarded([&]() -> int {
    TCPSTORE_CHECK_HANDLE(c);
    TCPSTORE_CHECK_KEY(key);
    if (len == nullptr) return invalid("len is NULL");
    auto t = timeoutOf(timeout_ms);
    auto r = t ? c->client.get(key, *t) : c->client.get(key);
    if (!r) return report(r.error());
    return copyOut(*r, buf, len);
  });
}

int tcpstore_add(tcpstore_client* c, const char* key, int64_t delta,
                 int64_t* new_value) {
  return guarded([&]() -> int {
    TCPSTORE_CHECK_HANDLE(c);
    TCPSTORE_CHECK_KEY(key);
    auto r = c->client.add(key, delta);
    if (!r) return report(r.error());
    if (new_value != nullptr) *new_value = *r;
    return TCPSTORE_OK;
  });
}

int tcpstore_compare_set(tcpstore_client* c, const char* key,
                         const void* expected, size_t expected_len,
                         const void* desired, size_t desired_len, void* buf,
                         size_t* len) {
  return guarded([&]() -> int {
    TCPSTORE_CHECK_HANDLE(c);
    TCPSTORE_CHECK_KEY(key);
    if ((expected == nullptr && expected_len > 0) ||
        (desired == nullptr && desired_len > 0)) {
      return invalid("expected or desired is NULL");
    }
    if (len == nullptr) return invalid("len is NULL");
    auto r = c->client.compareSet(key, bytesOf(expected, expected_len),
                                  bytesOf(desired, desired_len));
    if (!r) return report(r.error());
    return copyOut(*r, buf, len);
  });
}

int tcpstore_check(tcpstore_client* c, const char* const* keys, size_t n,
                   int* all_exist) {
  return guarded([&]() -> int {
    TCPSTORE_CHECK_HANDLE(c);
    std::vector<std::string> ks;
    if (!keysOf(keys, n, ks)) return invalid("NULL key");
    if (all_exist == nullptr) return invalid("all_exist is NULL");
    auto r = c->client.check(ks);
    if (!r) return report(r.error());
    *all_exist = *r ? 1 : 0;
    return TCPSTORE_OK;
  });
}

int tcpstore_wait(tcpstore_client* c, const char* const* keys, size_t n,
                  int64_t timeout_ms) {
  return guarded([&]() -> int {
    TCPSTORE_CHECK_HANDLE(c);
    std::vector<std::string> ks;
    if (!keysOf(keys, n, ks)) return invalid("NULL key");
    auto t = timeoutOf(timeout_ms);
    return report(t ? c->client.wait(ks, *t) : c->client.wait(ks));
  });
}

int tcpstore_delete_key(tcpstore_client* c, const char* key, int* deleted) {
  return guarded([&]() -> int {
    TCPSTORE_CHECK_HANDLE(c);
    TCPSTORE_CHECK_KEY(key);
    auto r = c->client.deleteKey(key);
    if (!r) return report(r.error());
    if (deleted != nullptr) *deleted = *r ? 1 : 0;
    return TCPSTORE_OK;
  });
}

int tcpstore_num_keys(tcpstore_client* c, int64_t* out) {
  return guarded([&]() -> int {
    TCPSTORE_CHECK_HANDLE(c);
    if (out == nullptr) return invalid("out is NULL");
    auto r = c->client.numKeys();
    if (!r) return report(r.error());
    *out = *r;
    return TCPSTORE_OK;
  });
}

int tcpstore_append(tcpstore_client* c, const char* key, const void* value,
                    size_t value_len) {
  return guarded([&]() -> int {
    TCPSTORE_CHECK_HANDLE(c);
    TCPSTORE_CHECK_KEY(key);
    if (value == nullptr && value_len > 0) return invalid("value is NULL");
    return report(c->client.append(key, bytesOf(value, value_len)));
  });
}

int tcpstore_multi_set(tcpstore_client* c, const char* const* keys,
                       const void* const* values, const size_t* value_lens,
                       size_t n) {
  return guarded([&]() -> int {
    TCPSTORE_CHECK_HANDLE(c);
    std::vector<std::string> ks;
    if (!keysOf(keys, n, ks)) return invalid("NULL key");
    if (n > 0 && (values == nullptr || value_lens == nullptr))
      return invalid("values or value_lens is NULL");
    std::vector<std::string> vs;
    vs.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      if (values[i] == nullptr && value_lens[i] > 0)
        return invalid("value is NULL");
      vs.emplace_back(bytesOf(values[i], value_lens[i]));
    }
    return report(c->client.multiSet(ks, vs));
  });
}

int tcpstore_multi_get(tcpstore_client* c, const char* const* keys, size_t n,
                       int64_t timeout_ms, void* buf, size_t* len,
                       size_t* value_lens) {
  return guarded([&]() -> int {
    TCPSTORE_CHECK_HANDLE(c);
    std::vector<std::string> ks;
    if (!keysOf(keys, n, ks)) return invalid("NULL key");
    if (len == nullptr) return invalid("len is NULL");
    if (n > 0 && value_lens == nullptr) return invalid("value_lens is NULL");
    // Client::multiGet has no per-call timeout: a copy of the handle (shares
    // the connections) carries this call's.
    tcpstore::Client view = c->client;
    if (auto t = timeoutOf(timeout_ms)) view.setTimeout(*t);
    auto r = view.multiGet(ks);
    if (!r) return report(r.error());
    std::string packed;
    for (size_t i = 0; i < r->size(); ++i) {
      packed += (*r)[i];
      value_lens[i] = (*r)[i].size();
    }
    return copyOut(packed, buf, len);
  });
}

int tcpstore_ping(tcpstore_client* c) {
  return guarded([&]() -> int {
    TCPSTORE_CHECK_HANDLE(c);
    return report(c->client.ping());
  });
}

int tcpstore_list_keys(tcpstore_client* c, char* buf, size_t* len,
                       size_t* count) {
  return guarded([&]() -> int {
    TCPSTORE_CHECK_HANDLE(c);
    if (len == nullptr) return invalid("len is NULL");
    auto r = c->client.listKeys();
    if (!r) return report(r.error());
    std::string packed;
    for (const auto& k : *r) {
      packed += k;
      packed.push_back('\0');
    }
    int rc = copyOut(packed, buf, len);
    if (rc == TCPSTORE_OK && count != nullptr) *count = r->size();
    return rc;
  });
}

int tcpstore_queue_push(tcpstore_client* c, const char* key, const void* value,
                        size_t value_len) {
  return guarded([&]() -> int {
    TCPSTORE_CHECK_HANDLE(c);
    TCPSTORE_CHECK_KEY(key);
    if (value == nullptr && value_len > 0) return invalid("value is NULL");
    return report(c->client.queuePush(key, bytesOf(value, value_len)));
  });
}

int tcpstore_queue_pop(tcpstore_client* c, const char* key, int block,
                       void* buf, size_t* len) {
  return guarded([&]() -> int {
    TCPSTORE_CHECK_HANDLE(c);
    TCPSTORE_CHECK_KEY(key);
    if (len == nullptr) return invalid("len is NULL");
    {
      std::lock_guard<std::mutex> lock(c->stash_mu);
      auto it = c->stash.find(key);
      if (it != c->stash.end() && !it->second.empty()) {
        int rc = copyOut(it->second.front(), buf, len);
        if (rc == TCPSTORE_OK) {
          it->second.pop_front();
          if (it->second.empty()) c->stash.erase(it);
        }
        return rc;
      }
    }
    auto r = c->client.queuePop(key, block != 0);
    if (!r) return report(r.error());
    int rc = copyOut(*r, buf, len);
    if (rc == TCPSTORE_E_BUFFER_TOO_SMALL) {
      std::lock_guard<std::mutex> lock(c->stash_mu);
      c->stash[key].push_back(std::move(*r));
    }
    return rc;
  });
}

int tcpstore_queue_len(tcpstore_client* c, const char* key, int64_t* out) {
  return guarded([&]() -> int {
    TCPSTORE_CHECK_HANDLE(c);
    TCPSTORE_CHECK_KEY(key);
    if (out == nullptr) return invalid("out is NULL");
    auto r = c->client.queueLen(key);
    if (!r) return report(r.error());
    *out = *r;
    return TCPSTORE_OK;
  });
}

int tcpstore_barrier(tcpstore_client* c, const char* name, int64_t world_size,
                     int64_t timeout_ms) {
  return guarded([&]() -> int {
    TCPSTORE_CHECK_HANDLE(c);
    TCPSTORE_CHECK_KEY(name);
    auto t = timeoutOf(timeout_ms);
    return report(t ? c->client.barrier(name, world_size, *t)
                    : c->client.barrier(name, world_size));
  });
}

int tcpstore_wait_for_workers(tcpstore_client* c, int64_t world_size,
                              int64_t timeout_ms) {
  return guarded([&]() -> int {
    TCPSTORE_CHECK_HANDLE(c);
    auto t = timeoutOf(timeout_ms);
    return report(t ? c->client.waitForWorkers(world_size, *t)
                    : c->client.waitForWorkers(world_size));
  });
}

const char* tcpstore_last_error_message(void) { return g_last_error.c_str(); }

const char* tcpstore_status_name(int code) {
  if (code == TCPSTORE_E_BUFFER_TOO_SMALL) return "buffer too small";
  if (code < 0 || code > static_cast<int>(tcpstore::StatusCode::kNotFound))
    return "unknown";
  // statusCodeName returns views of string literals: NUL-terminated.
  return tcpstore::statusCodeName(static_cast<tcpstore::StatusCode>(code))
      .data();
}

}  // extern "C"
