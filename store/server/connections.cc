#include "store/server/connections.h"

#include <fmt/format.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "store/server/mux_session.h"

namespace tcpstore::server {

namespace {
// Rejection log lines per second before suppression.
constexpr int kMaxRejectLinesPerSecond = 10;
}  // namespace

Connections::Connections(const protocol::Limits& limits,
                         const OutputLimits& output, Counters& ctr,
                         const Logger& log)
    : limits_(limits),
      output_(output),
      ctr_(ctr),
      log_(log),
      scratch_(new char[kScratchBytes]),
      rejections_(kMaxRejectLinesPerSecond) {
  spare_busy_.reserve(kMaxSpareBusy);
}

Connections::~Connections() {
  freeDeadChannels();
  for (BusyState* b : spare_busy_) delete b;
}

BusyState* Connections::takeBusy() {
  if (spare_busy_.empty()) return new BusyState(limits_);
  BusyState* b = spare_busy_.back();
  spare_busy_.pop_back();
  return b;
}

void Connections::giveBusy(BusyState* b) noexcept {
  b->need = 1;
  b->counted_in = 0;
  b->stall = StallClock();
  b->last_read_ms = b->failed_ms = 0;
  b->turn_no = b->turn_bytes = b->turn_requests = 0;
  if (b->in.capacity() > kSpareKeepBytes) (void)b->in.takeStorage();
  b->outbox.shrink(kSpareKeepBytes);
  if (spare_busy_.size() < kMaxSpareBusy) {
    spare_busy_.push_back(b);  // within the reserved capacity
    return;
  }
  delete b;
}

// Iteratively: a list of 10^5 channels must not recurse 10^5 deep.
void Connections::freeDeadChannels() noexcept {
  while (dead_channels_) {
    std::unique_ptr<Channel> next = std::move(dead_channels_->next_dead_);
    dead_channels_ = std::move(next);
  }
}

Status Connections::open(LoopHandles& handles) {
  loop_ = handles.loop();
  auto check = handles.addCheck(this, &Connections::onCheck);
  if (!check) return check.error();
  auto idle = handles.addIdle(this);
  if (!idle) return idle.error();
  flush_idle_ = *idle;
  auto stall = handles.addTimer(this);
  if (!stall) return stall.error();
  stall_timer_ = *stall;
  auto log = handles.addTimer(this);
  if (!log) return log.error();
  log_timer_ = *log;
  auto sweep = handles.addTimer(this);
  if (!sweep) return sweep.error();
  sweep_timer_ = *sweep;
  auto hangup = handles.addTimer(this);
  if (!hangup) return hangup.error();
  hangup_timer_ = *hangup;
  const std::uint64_t every = partialSweepEveryMs(partial_ms_);
  uv_timer_start(sweep_timer_, &Connections::onSweepTimer, every, every);
  return Status::ok();
}

void Connections::accept(int fd) {
  Connection* c = nullptr;
  try {
    c = new Connection(*this, next_id_++);
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (uv_poll_init_socket(loop_, &c->poll_, fd) != 0) {
    // No handle came to be: nothing to close but the socket.
    ::close(fd);
    bump(ctr_.accept_errors);
    delete c;
    return;
  }
  c->poll_.data = c;
  int one = 1;
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  try {
    by_id_.emplace(c->id_, c);
  } catch (...) {
    c->closing_ = true;
    uv_close(reinterpret_cast<uv_handle_t*>(&c->poll_), &Connection::onClosed);
    ::close(fd);
    throw;
  }
  bump(ctr_.connections_accepted);
  c->updateReading();
}

void Connections::closed(Connection& c) noexcept {
  total_output_ -= c.unsentBytes();  // nothing more is sent or counted
  handler_->onClosing(c);
  by_id_.erase(c.id_);
  bump(ctr_.connections_closed);
}

void Connections::paused(Connection& c) {
  paused_ids_.push_back(c.id_);
  if (!uv_is_active(reinterpret_cast<uv_handle_t*>(stall_timer_))) {
    const std::uint64_t every = stallCheckEveryMs(output_.stall_ms);
    uv_timer_start(stall_timer_, &Connections::onStallTimer, every, every);
  }
}

namespace {
// CPU time of the calling thread, microseconds.
std::uint64_t threadCpuUs() noexcept {
  timespec ts{};
  if (::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0;
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000u +
         static_cast<std::uint64_t>(ts.tv_nsec) / 1000u;
}
}  // namespace

void Connections::onCheck(uv_check_t* check) noexcept {
  auto* s = static_cast<Connections*>(check->data);
  const std::uint64_t cpu = threadCpuUs();
  if (s->last_check_cpu_us_ != 0 &&
      cpu - s->last_check_cpu_us_ >
          s->ctr_.max_turn_cpu_us.load(std::memory_order_relaxed)) {
    s->ctr_.max_turn_cpu_us.store(cpu - s->last_check_cpu_us_,
                                  std::memory_order_relaxed);
  }
  s->last_check_cpu_us_ = cpu;
  uv_idle_stop(s->flush_idle_);
  s->turn_output_ = 0;
  s->turn_input_ = 0;
  s->turn_requests_ = 0;
  ++s->turn_no_;
  s->continueYielded();
  s->flush_list_.run([](Connection* c) { c->flush(); });
  s->freeDeadChannels();
  const bool more_dead = s->freeSome();
  const std::uint64_t total = s->memoryUse().total();
  s->ctr_.memory_bytes.store(total, std::memory_order_relaxed);
  if (s->budget_.max() != 0) {
    if (!s->input_paused_ids_.empty() && total < s->input_resume_below_)
      s->resumeInput();
    if (total > s->budget_.softLine()) s->shedOutput();
  }
  if (s->yield_head_ < s->yielded_ids_.size() || more_dead) s->continueSoon();
}

bool Connections::freeSome() noexcept {
  if (!dead_inputs_.empty()) dead_inputs_.pop_back();  // >= 4 MiB each
  std::size_t freed = 0;
  while (!dead_chunks_.empty() && freed < kFreePerTurnBytes) {
    freed += dead_chunks_.back().capacity();
    dead_chunks_.pop_back();
  }
  if (dead_chunks_.empty() && dead_chunks_.capacity() > 1024)
    std::vector<OutChunk>().swap(dead_chunks_);
  return !dead_inputs_.empty() || !dead_chunks_.empty();
}

void Connections::continueYielded() noexcept {
  // Oldest first, each served to its end (or its pause) before the next,
  // as it would be without yields, in slices of a turn: one that yields
  // again here stays at the head.
  while (yield_head_ < yielded_ids_.size() && !turnSpent()) {
    const ConnId id = yielded_ids_[yield_head_++];
    Connection* c = find(id);
    if (c == nullptr || c->closing_) continue;
    if (c->input_yielded_) {
      c->input_yielded_ = false;
      c->updateReading();
    }
    if (!c->yielded_) continue;
    c->yielded_ = false;
    try {
      c->resume();
    } catch (...) {
      c->reject(ctr_.rejected_limit,
                "out of memory while serving the connection");
    }
    if (c->yielded_ && yielded_ids_.back() == id) {  // yield() appended it
      yielded_ids_.pop_back();
      yielded_ids_[--yield_head_] = id;
    }
  }
  if (yield_head_ == yielded_ids_.size()) {
    yielded_ids_.clear();
    yield_head_ = 0;
  } else if (yield_head_ > yielded_ids_.size() / 2) {
    yielded_ids_.erase(
        yielded_ids_.begin(),
        yielded_ids_.begin() + static_cast<std::ptrdiff_t>(yield_head_));
    yield_head_ = 0;
  }
}

// Resumes the paused connections whose next buffer growth fits now (and
// under the resume line, so they do not flap); the others stay listed.
void Connections::resumeInput() noexcept {
  std::size_t kept = 0;
  input_resume_below_ = 0;
  for (std::size_t i = 0; i < input_paused_ids_.size(); ++i) {
    Connection* c = find(input_paused_ids_[i]);
    if (c == nullptr || c->closing_ || !c->input_paused_) continue;
    const MemoryUse use = memoryUse();
    if (budget_.mayResumeInput(use) &&
        !budget_.pauseInput(use, c->partialBytes(), c->inputGrowth())) {
      c->input_paused_ = false;
      c->busy_->last_read_ms = now();  // waiting for the peer again from now
      c->updateReading();
      continue;
    }
    notePausedInput(*c);
    input_paused_ids_[kept++] = c->id_;
  }
  input_paused_ids_.resize(kept);
}

void Connections::notePausedInput(const Connection& c) noexcept {
  const std::uint64_t g = c.inputGrowth();
  const std::uint64_t at =
      g < budget_.resumeLine() ? budget_.resumeLine() - g : 0;
  if (at > input_resume_below_) input_resume_below_ = at;
  if (!uv_is_active(reinterpret_cast<uv_handle_t*>(hangup_timer_))) {
    uv_timer_start(hangup_timer_, &Connections::onHangupTimer, kHangupCheckMs,
                   kHangupCheckMs);
  }
}

namespace {
// The peer of socket `fd` sent its FIN (or the connection is gone), as the
// kernel's TCP state says; false if it cannot tell.
bool peerHungUp(int fd) noexcept {
  if (fd < 0) return false;
  tcp_info info{};
  socklen_t len = sizeof info;
  if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0) return false;
  return info.tcpi_state == TCP_CLOSE_WAIT || info.tcpi_state == TCP_CLOSE ||
         info.tcpi_state == TCP_LAST_ACK;
}
}  // namespace

// One getsockopt per paused connection (about a microsecond), at most
// kHangupCheckMs apart; the list holds only connections paused for input.
void Connections::onHangupTimer(uv_timer_t* timer) noexcept {
  auto* s = static_cast<Connections*>(timer->data);
  bool any = false;
  for (std::size_t i = 0; i < s->input_paused_ids_.size(); ++i) {
    Connection* c = s->find(s->input_paused_ids_[i]);
    if (c == nullptr || c->closing_ || !c->input_paused_) continue;
    if (!peerHungUp(c->fd())) {
      any = true;
      continue;
    }
    std::string why;
    try {
      why = fmt::format(
          "peer hung up with {} bytes of a {} byte request buffered "
          "(paused for the memory budget)",
          c->busy_->in.size(), c->partialBytes());
    } catch (...) {
    }
    c->reject(s->ctr_.rejected_peer_gone, why);
  }
  if (!any) uv_timer_stop(timer);
}

// A connection counts as not reading when the kernel took all it would (a
// write is pending) and no write completed for kNotReadingMs.
void Connections::shedOutput() noexcept {
  constexpr std::uint64_t kShedEveryMs = 20;
  constexpr std::uint64_t kNotReadingMs = 100;
  const std::uint64_t t = now();
  if (t - last_shed_ms_ < kShedEveryMs) return;
  last_shed_ms_ = t;
  while (memoryUse().total() > budget_.softLine()) {
    Connection* worst = nullptr;
    for (auto& [id, c] : by_id_) {
      if (c->closing_ || c->busy_ == nullptr || !c->busy_->outbox.writing() ||
          c->busy_->outbox.size() <= kBehindBytes ||
          c->busy_->stall.idleMs(t) < kNotReadingMs) {
        continue;
      }
      if (worst == nullptr || c->unsentBytes() > worst->unsentBytes())
        worst = c;
    }
    if (worst == nullptr) return;
    std::string why;
    try {
      why = fmt::format(
          "memory budget: {} unsent bytes not read while the server holds "
          "{} of {} bytes",
          worst->unsentBytes(), memoryUse().total(), budget_.max());
    } catch (...) {
    }
    worst->reject(ctr_.budget_dropped, why);
  }
}

// A paused connection is dropped once its output took no byte for
// stall_ms: a client that never reads is paused, then dropped.
void Connections::onStallTimer(uv_timer_t* timer) noexcept {
  auto* s = static_cast<Connections*>(timer->data);
  const std::uint64_t now = s->now();
  std::size_t kept = 0;
  for (std::size_t i = 0; i < s->paused_ids_.size(); ++i) {
    Connection* c = s->find(s->paused_ids_[i]);
    if (c == nullptr || c->closing_ || !c->paused_) continue;
    if (c->busy_ == nullptr) continue;  // nothing unsent: not paused long
    BusyState& b = *c->busy_;
    if (b.stall.stalled(now, b.outbox.inflightBytes(), s->output_.stall_ms)) {
      std::string why;
      try {
        why =
            fmt::format("slow reader: {} bytes of replies not taken for {} ms",
                        b.outbox.size(), b.stall.idleMs(now));
      } catch (...) {
      }
      c->reject(s->ctr_.rejected_slow_reader, why);
      continue;
    }
    s->paused_ids_[kept++] = c->id_;
  }
  s->paused_ids_.resize(kept);
  if (kept == 0) uv_timer_stop(s->stall_timer_);
}

// Every connection is looked at (a few ns each, at most a few times a
// second): a partial request without progress is closed, and so is a
// failed connection whose peer does not take the replies it was owed.
void Connections::onSweepTimer(uv_timer_t* timer) noexcept {
  auto* s = static_cast<Connections*>(timer->data);
  if (s->stopping_) return;
  const std::uint64_t now = s->now();
  const std::uint64_t linger = s->partial_ms_ > 0 ? s->partial_ms_ : 60000;
  s->sweep_ids_.clear();
  try {
    for (auto& [id, c] : s->by_id_) {
      if (c->closing_) continue;
      if ((c->failed_ && now - c->busy_->failed_ms >= linger) ||
          (s->partial_ms_ > 0 && c->holdsPartialRequest() &&
           now - c->busy_->last_read_ms >= s->partial_ms_)) {
        s->sweep_ids_.push_back(id);
      }
    }
  } catch (...) {  // no memory for the list: the next sweep tries again
  }
  for (ConnId id : s->sweep_ids_) {
    Connection* c = s->find(id);
    if (c == nullptr || c->closing_) continue;
    if (c->failed_) {
      c->close();  // counted and logged when it failed
      continue;
    }
    std::string why;
    try {
      why = fmt::format(
          "partial request: {} bytes buffered and no progress for {} ms",
          c->busy_->in.size(), now - c->busy_->last_read_ms);
    } catch (...) {
    }
    c->reject(s->ctr_.rejected_partial_timeout, why);
  }
}

void Connections::logRejection(std::string_view line) noexcept {
  const std::uint64_t wait = rejections_.add(now(), line);
  if (wait > 0 && !stopping_) {
    uv_timer_start(log_timer_, &Connections::onLogTimer, wait, 0);
  }
}

void Connections::onLogTimer(uv_timer_t* timer) noexcept {
  auto* s = static_cast<Connections*>(timer->data);
  s->rejections_.endWindow(s->now());
}

bool Connections::beginStop() noexcept {
  stopping_ = true;
  rejections_.endWindow(now());
  try {
    std::vector<Connection*> all;
    all.reserve(by_id_.size());
    for (auto& kv : by_id_) all.push_back(kv.second);
    for (Connection* c : all) c->stopForShutdown();
  } catch (...) {
    closeAll();  // no memory to collect them: cut them all
  }
  return by_id_.empty();
}

void Connections::closeAll() noexcept {
  while (!by_id_.empty()) by_id_.begin()->second->close();
}

}  // namespace tcpstore::server
