// BackendHarness: drives a store::Backend the way the server's dispatcher
// does, on its own uv loop thread, and records what every connection would
// have received (test code; no sockets).
//
// Requests are queued per connection and submitted one at a time: the next
// one only after the previous completed (the dispatcher's ordering rule).
// Every byte routed to a connection is appended to its log; an error closes
// the connection (recorded, later requests of it are dropped).
#pragma once

#include <uv.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "protocol/message.h"
#include "store/backend.h"

namespace tcpstore::test {

// A request that owns its bytes (protocol::Request only holds views).
struct OwnedRequest {
  protocol::Command command = protocol::Command::kGetNumKeys;
  std::string key, value, desired;
  std::int64_t number = 0;
  std::uint32_t u32 = 0;
  std::vector<std::string> keys, values;

  // Views into this object (valid while it lives and is not modified).
  protocol::Request view() const {
    protocol::Request r;
    r.command = command;
    r.key = key;
    r.value = value;
    r.desired = desired;
    r.number = number;
    r.u32 = u32;
    for (const auto& k : keys) r.keys.emplace_back(k);
    for (const auto& v : values) r.values.emplace_back(v);
    return r;
  }
};

class BackendHarness final : private store::BackendHost {
 public:
  struct Conn {
    std::string bytes;    // everything routed to it
    bool closed = false;  // closed by an error
    std::string close_reason;
    bool pending = false;  // a request awaits complete()
    std::deque<OwnedRequest> queue;
    std::size_t done = 0;  // requests finished (completed or kDone)
    // Per request, in order: when it was submitted and finished (loop
    // thread clock), and the range of `bytes` it produced.
    struct Timing {
      std::chrono::steady_clock::time_point start, end;
      std::size_t begin = 0, finish = 0;
      bool finished = false, failed = false;
    };
    std::vector<Timing> timings;
  };

  explicit BackendHarness(store::Backend& backend) : backend_(backend) {
    if (uv_loop_init(&loop_) != 0) throw std::runtime_error("uv_loop_init");
    uv_async_init(&loop_, &async_, [](uv_async_t* h) noexcept {
      static_cast<BackendHarness*>(h->data)->pump();
    });
    async_.data = this;
    thread_ = std::thread([this] {
      Status st = backend_.open(*this, &loop_);
      {
        std::lock_guard<std::mutex> lock(mu_);
        open_status_ = st;
        opened_ = true;
      }
      cv_.notify_all();
      if (!st.isOk())
        uv_close(reinterpret_cast<uv_handle_t*>(&async_), nullptr);
      uv_run(&loop_, UV_RUN_DEFAULT);
    });
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return opened_; });
  }

  // The backend's open() result.
  Status openStatus() {
    std::lock_guard<std::mutex> lock(mu_);
    return open_status_;
  }

  ~BackendHarness() { stop(); }

  // Closes the backend and stops the loop thread. Idempotent.
  void stop() {
    if (!thread_.joinable()) return;
    if (!openStatus().isOk()) {
      thread_.join();
      uv_loop_close(&loop_);
      return;
    }
    post([this] {
      backend_.close();
      uv_close(reinterpret_cast<uv_handle_t*>(&async_), nullptr);
    });
    thread_.join();
    uv_loop_close(&loop_);
  }

  // Queues `req` on connection `conn`.
  void send(store::ConnId conn, OwnedRequest req) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      conns_[conn].queue.push_back(std::move(req));
    }
    uv_async_send(&async_);
  }

  // Waits until `pred(state)` holds (state read under the lock) or `timeout`
  // passes; returns whether it held.
  bool waitFor(const std::function<bool()>& pred,
               std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, pred);
  }

  // Sends `req` and waits until it finished (completed, or the connection
  // closed); returns the bytes it produced for `conn`, or throws on timeout.
  std::string roundTrip(
      store::ConnId conn, OwnedRequest req,
      std::chrono::milliseconds timeout = std::chrono::milliseconds(30000)) {
    std::size_t before_done, before_bytes;
    {
      std::lock_guard<std::mutex> lock(mu_);
      before_done = conns_[conn].done;
      before_bytes = conns_[conn].bytes.size();
    }
    send(conn, std::move(req));
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] {
          const Conn& c = conns_[conn];
          return c.closed || c.done > before_done;
        })) {
      throw std::runtime_error("request timed out");
    }
    return conns_[conn].bytes.substr(before_bytes);
  }

  // A copy of a connection's state.
  Conn conn(store::ConnId id) {
    std::lock_guard<std::mutex> lock(mu_);
    return conns_[id];
  }
  std::size_t bytesOf(store::ConnId id) {
    std::lock_guard<std::mutex> lock(mu_);
    return conns_[id].bytes.size();
  }
  // Must be called with the lock held (inside a waitFor predicate).
  const Conn& connLocked(store::ConnId id) { return conns_[id]; }

  // Simulates the connection closing (backend.disconnect on the loop).
  void disconnect(store::ConnId id) {
    post([this, id] { backend_.disconnect(id); });
  }

  // Runs `fn` on the loop thread.
  void post(std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      posted_.push_back(std::move(fn));
    }
    uv_async_send(&async_);
  }

 private:
  // ---- loop thread ------------------------------------------------------
  void pump() noexcept {
    for (;;) {
      std::vector<std::function<void()>> fns;
      std::vector<std::pair<store::ConnId, OwnedRequest>> todo;
      {
        std::lock_guard<std::mutex> lock(mu_);
        fns.swap(posted_);
        for (auto& [id, c] : conns_) {
          if (c.pending || c.queue.empty()) continue;
          if (c.closed) {
            c.queue.clear();
            continue;
          }
          todo.emplace_back(id, std::move(c.queue.front()));
          c.queue.pop_front();
          c.pending = true;  // until submit() returns or complete()
          Conn::Timing t;
          t.start = std::chrono::steady_clock::now();
          t.begin = c.bytes.size();
          c.timings.push_back(t);
        }
      }
      for (auto& fn : fns) fn();
      if (fns.empty() && todo.empty()) return;
      for (auto& [id, req] : todo) {
        store::Effects fx;
        const protocol::Request view = req.view();
        auto r = backend_.submit(id, view, fx);
        std::unique_lock<std::mutex> lock(mu_);
        Conn& c = conns_[id];
        if (!r) {
          c.pending = false;
          closeLocked(c, r.error().message());
          cv_.notify_all();
          lock.unlock();
          backend_.disconnect(id);
          continue;
        } else if (*r == store::Backend::Outcome::kDone) {
          c.pending = false;
          routeLocked(fx);
          finishLocked(c, false);
          ++c.done;
        }
        cv_.notify_all();
      }
    }
  }

  void routeLocked(const store::Effects& fx) {
    for (const auto& s : fx.sends()) {
      Conn& c = conns_[s.conn];
      if (!c.closed) c.bytes.append(fx.bytesOf(s));
    }
  }
  void finishLocked(Conn& c, bool failed) {
    if (c.timings.empty() || c.timings.back().finished) return;
    auto& t = c.timings.back();
    t.end = std::chrono::steady_clock::now();
    t.finish = c.bytes.size();
    t.finished = true;
    t.failed = failed;
  }
  void closeLocked(Conn& c, const std::string& why) {
    finishLocked(c, true);
    c.closed = true;
    c.close_reason = why;
    c.queue.clear();
    ++c.done;
  }

  void deliver(const store::Effects& fx) override {
    std::lock_guard<std::mutex> lock(mu_);
    routeLocked(fx);
    cv_.notify_all();
  }
  void complete(store::ConnId conn, const Status& status,
                const store::Effects& fx) override {
    bool failed = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      Conn& c = conns_[conn];
      if (c.closed) return;
      c.pending = false;
      if (status.isOk()) {
        routeLocked(fx);
        finishLocked(c, false);
        ++c.done;
      } else {
        routeLocked(fx);  // other connections' sends still go out
        closeLocked(c, status.message());
        cv_.notify_all();
        failed = true;
      }
      cv_.notify_all();
    }
    if (failed) backend_.disconnect(conn);
    pump();  // resume decoding (the dispatcher does it inside complete())
  }
  void close(store::ConnId conn, const Status& why) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      closeLocked(conns_[conn], why.message());
      cv_.notify_all();
    }
    backend_.disconnect(conn);
  }

  store::Backend& backend_;
  uv_loop_t loop_{};
  uv_async_t async_{};
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool opened_ = false;
  Status open_status_;
  std::map<store::ConnId, Conn> conns_;
  std::vector<std::function<void()>> posted_;
};

}  // namespace tcpstore::test
