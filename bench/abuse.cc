// abuse: the attacks of issue 13, at full size by default, one after another
// against a running server, while the honest probe (bench/abuse_probe.h)
// measures round trips and the server's RSS is sampled:
//   partial     23 connections each send most of a legal 100 MiB MULTI_SET
//               (12 values of 8 MiB) and stop;
//   nonreaders  29 clients pipeline 100 GETs of a 1 MiB value, never read;
//   waits       89 connections each WAIT on 131,072 absent keys; then
//   waits-drop  all 89 dropped at once (the stall, and RSS coming back);
//   collide     50,000 SETs of keys crafted to collide under libstdc++'s
//               std::hash against 50,000 random keys (and 10,000-key WAITs);
//   owed        ADD k 1 pipelined before a protocol error: its reply comes;
//   hog         8 MiB values under new keys until the server refuses.
// Every loop is bounded in count and by --timeout.
#include "bench/abuse.h"

#include <fmt/format.h>
#include <poll.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "protocol/requests.h"
#include "tests/keyspace/collide.h"

namespace tcpstore::bench {
namespace {

using abuse::kMiB;
using abuse::Phase;
using abuse::RawSock;
using protocol::ReplyShape;
namespace req = protocol::requests;

constexpr std::int64_t kMs = 1000000;
constexpr std::int64_t kSec = 1000 * kMs;

std::string le64(std::uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(v >> (8 * i));
  return s;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

class Abuse {
 public:
  Abuse(const CommonOptions& common, const AbuseOptions& opt)
      : c_(common),
        o_(opt),
        sampler_(common.server_pid),
        probe_(common.addr, common.key_prefix, opt.probe_ms, 10) {
    hold_ns_ = static_cast<std::int64_t>(
        (o_.hold_s >= 0 ? o_.hold_s : std::max(0.3, 3 * o_.scale)) * 1e9);
    settle_ns_ = static_cast<std::int64_t>(o_.settle_s * 1e9);
    run_.addr = c_.addr.text;
    run_.scale = o_.scale;
  }
  int run();

 private:
  int scaled(int full, int least) const {
    return std::max(least, static_cast<int>(std::lround(full * o_.scale)));
  }
  std::int64_t scaledBytes(std::int64_t full, std::int64_t least) const {
    return std::max(least, static_cast<std::int64_t>(std::llround(
                               static_cast<double>(full) * o_.scale)));
  }
  bool wanted(const std::string& name) const {
    if (o_.only.empty()) return true;
    return ("," + o_.only + ",").find("," + name + ",") != std::string::npos;
  }
  bool timedOut() {
    if (nowNs() < deadline_) return false;
    run_.finished = false;
    return true;
  }
  std::int64_t within(std::int64_t ns) const {
    return std::min(deadline_, nowNs() + ns);
  }
  std::string key(std::string_view what) const {
    return fmt::format("/{}/{}", c_.key_prefix, what);
  }

  Phase& begin(std::string name, std::string what);
  void end(Phase& p);
  void settle(Phase& p, std::int64_t target, std::int64_t limit,
              std::int64_t plateau);
  void hold(std::vector<RawSock>& socks, Phase& p);
  bool deleteKeys(const std::vector<std::string>& keys);

  void baseline();
  void partial();
  void nonreaders();
  void waits();
  void collide();
  void owed();
  void hog();

  CommonOptions c_;
  AbuseOptions o_;
  abuse::RssSampler sampler_;
  abuse::Probe probe_;
  RawSock ctl_;  // setup and cleanup, an honest client too
  std::int64_t deadline_ = 0;
  std::int64_t hold_ns_ = 0;
  std::int64_t settle_ns_ = 0;
  std::int64_t phase_t0_ = 0;
  double phase_cpu0_ = 0;
  std::vector<std::string>
      garbage_;  // keys the attacks left, deleted at the end
  abuse::RunSummary run_;
};

Phase& Abuse::begin(std::string name, std::string what) {
  if (!c_.quiet) fmt::print(stderr, "abuse: {}: {}\n", name, what);
  // A quiet server first: what the previous phase queued is processed.
  if (!ctl_.fence(within(30 * kSec))) {
    ++run_.control_failures;
    if (!c_.quiet) fmt::print(stderr, "abuse: the control connection failed\n");
    ctl_ = RawSock::connect(c_.addr, within(10 * kSec), true);
  }
  run_.phases.emplace_back();
  Phase& p = run_.phases.back();
  p.name = std::move(name);
  p.what = std::move(what);
  const int idx = static_cast<int>(run_.phases.size()) - 1;
  probe_.setPhase(idx);
  p.rss_before = sampler_.now();
  sampler_.setPhase(idx);
  phase_t0_ = nowNs();
  p.t0_ns = phase_t0_;
  phase_cpu0_ = c_.server_pid > 0 ? processCpuSeconds(c_.server_pid) : -1;
  return p;
}

void Abuse::end(Phase& p) {
  const int idx = static_cast<int>(&p - run_.phases.data());
  p.rss_peak = sampler_.peak(idx);
  p.sched_lag_ms = sampler_.lagMs(idx);
  if (p.rss_after < 0) p.rss_after = sampler_.now();
  p.rss_peak = std::max(p.rss_peak, std::max(p.rss_before, p.rss_after));
  p.seconds = static_cast<double>(nowNs() - phase_t0_) / 1e9;
  if (phase_cpu0_ >= 0) {
    p.server_cpu_s = processCpuSeconds(c_.server_pid) - phase_cpu0_;
  }
}

// Waits until the server's RSS is down to `target`, or (with a plateau) has
// not fallen for that long, or `limit` passed (at most --settle); records
// it as the phase's "after".
void Abuse::settle(Phase& p, std::int64_t target, std::int64_t limit,
                   std::int64_t plateau) {
  const std::int64_t t0 = nowNs();
  const std::int64_t end = within(limit);
  std::int64_t best = sampler_.now(), best_at = nowNs();
  while (best >= 0 && best > target && nowNs() < end &&
         (plateau <= 0 || nowNs() - best_at < plateau)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const std::int64_t r = sampler_.now();
    if (r < best - kMiB / 2) best_at = nowNs();
    best = std::min(best, r);
  }
  p.rss_after = sampler_.now();
  p.figures.emplace_back("settle_s", static_cast<double>(nowNs() - t0) / 1e9);
}

// Keeps the attack up for the hold time, counting the connections the
// server closes meanwhile.
void Abuse::hold(std::vector<RawSock>& socks, Phase& p) {
  const std::int64_t end = within(hold_ns_);
  std::vector<bool> closed(socks.size(), false);
  for (;;) {
    for (std::size_t i = 0; i < socks.size(); ++i) {
      if (!closed[i] && socks[i].peerClosed()) closed[i] = true;
    }
    if (nowNs() >= end) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  p.closed = static_cast<int>(std::count(closed.begin(), closed.end(), true));
}

bool Abuse::deleteKeys(const std::vector<std::string>& keys) {
  std::string m;
  protocol::Reply r;
  constexpr std::size_t kBatch = 4096;
  for (std::size_t i = 0; i < keys.size(); i += kBatch) {
    const std::size_t n = std::min(kBatch, keys.size() - i);
    m.clear();
    for (std::size_t k = i; k < i + n; ++k) {
      abuse::encode2(req::deleteKey(keys[k]), m);
    }
    if (!ctl_.sendAll(m, within(30 * kSec))) return false;
    for (std::size_t k = 0; k < n; ++k) {
      if (!ctl_.recvReply(ReplyShape::kInt64, r, within(30 * kSec))) {
        return false;
      }
    }
  }
  return true;
}

void Abuse::baseline() {
  Phase& p = begin("baseline", "the probe alone, no attack");
  std::this_thread::sleep_for(std::chrono::nanoseconds(std::min<std::int64_t>(
      hold_ns_, std::max<std::int64_t>(0, deadline_ - nowNs()))));
  end(p);
}

// ---- partial: most of one 100 MiB request per connection -------------------

void Abuse::partial() {
  const int conns = scaled(23, 2);
  const std::int64_t vbytes = scaledBytes(8 * kMiB, 64 * 1024);
  std::vector<std::string> keys;
  for (int i = 0; i < 12; ++i) keys.push_back(key(fmt::format("part/{}", i)));
  const std::vector<std::string> values(12, std::string(vbytes, 'p'));
  const std::string full = abuse::encode2(req::multiSet(keys, values));
  // Stop in the middle of the 11th value.
  const std::size_t most =
      full.size() - static_cast<std::size_t>(vbytes * 3 / 2);
  Phase& p =
      begin("partial", fmt::format("{} conns each send {:.1f} of a {:.1f} MiB "
                                   "MULTI_SET (12 values) and stop",
                                   conns, static_cast<double>(most) / kMiB,
                                   static_cast<double>(full.size()) / kMiB));
  std::vector<RawSock> socks;
  for (int i = 0; i < conns && !timedOut(); ++i) {
    socks.push_back(RawSock::connect(c_.addr, within(10 * kSec), true));
  }
  p.conns = static_cast<int>(socks.size());
  std::vector<std::size_t> sent(socks.size(), 0);
  std::int64_t last_progress = nowNs();
  // Every connection sends what the kernel takes, until all sent `most` or
  // no byte moved for 1 s (the server stopped reading them).
  while (!timedOut()) {
    bool all_done = true, moved = false;
    std::vector<pollfd> pfds;
    for (std::size_t i = 0; i < socks.size(); ++i) {
      if (!socks[i].ok() || sent[i] >= most) continue;
      all_done = false;
      const long n = socks[i].sendSome(
          std::string_view(full).substr(sent[i], most - sent[i]));
      if (n < 0) {
        socks[i].close();
        ++p.closed;
        continue;
      }
      sent[i] += static_cast<std::size_t>(n);
      moved = moved || n > 0;
      pfds.push_back({socks[i].fd(), POLLOUT, 0});
    }
    if (all_done) break;
    if (moved) {
      last_progress = nowNs();
    } else if (nowNs() - last_progress > kSec) {
      break;
    } else {
      ::poll(pfds.data(), pfds.size(), 10);
    }
  }
  std::uint64_t offered = 0;
  for (std::size_t s : sent) offered += s;
  const int closed_sending = p.closed;
  hold(socks, p);
  p.closed = std::max(p.closed, closed_sending);
  p.figures = {{"offered_mib", static_cast<double>(offered) / kMiB},
               {"request_mib", static_cast<double>(full.size()) / kMiB}};
  // A peer whose bytes wait in a full window cannot get its FIN through:
  // the server frees a paused partial request at --partial-request-ms.
  socks.clear();
  settle(p, p.rss_before + 16 * kMiB,
         static_cast<std::int64_t>(o_.partial_linger_s * 1e9), 0);
  p.notes = fmt::format(
      "{:.0f} MiB offered; RSS {:.0f} MiB {:.1f} s after the hang-up",
      static_cast<double>(offered) / kMiB,
      static_cast<double>(p.rss_after) / kMiB, p.figures.back().second);
  end(p);
}

// ---- nonreaders: pipelined GETs of a 1 MiB value, never read ----------------

void Abuse::nonreaders() {
  const int clients = scaled(29, 2);
  constexpr int kGets = 100;
  const std::int64_t vbytes = scaledBytes(kMiB, 16 * 1024);
  const std::string big_key = key("big");
  const std::string value(vbytes, 'g');
  if (!ctl_.sendAll(abuse::encode2(req::set(big_key, value)),
                    within(30 * kSec))) {
    return;
  }
  garbage_.push_back(big_key);
  Phase& p =
      begin("nonreaders",
            fmt::format("{} clients pipeline {} GETs of a {:.2f} MiB "
                        "value and never read",
                        clients, kGets, static_cast<double>(vbytes) / kMiB));
  std::string gets;
  for (int i = 0; i < kGets; ++i) abuse::encode2(req::get(big_key), gets);
  std::vector<RawSock> socks;
  for (int i = 0; i < clients && !timedOut(); ++i) {
    RawSock s = RawSock::connect(c_.addr, within(10 * kSec), true, 16 * 1024);
    if (s.ok() && !s.sendAll(gets, within(10 * kSec))) s.close();
    socks.push_back(std::move(s));
  }
  p.conns = static_cast<int>(socks.size());
  hold(socks, p);
  // Now read: a client the server dropped ends early (EOF); one it kept
  // gets every reply, exact.
  const std::string head = le64(static_cast<std::uint64_t>(vbytes));
  const std::size_t per = head.size() + value.size();
  const std::size_t want = per * kGets;
  std::vector<std::size_t> got(socks.size(), 0);
  int dropped = 0, complete = 0, corrupt = 0;
  std::vector<char> buf(256 * 1024);
  const std::int64_t until = within(60 * kSec);
  for (;;) {
    std::vector<pollfd> pfds;
    std::vector<std::size_t> idx;
    for (std::size_t i = 0; i < socks.size(); ++i) {
      if (!socks[i].ok()) continue;
      pfds.push_back({socks[i].fd(), POLLIN, 0});
      idx.push_back(i);
    }
    if (pfds.empty() || nowNs() >= until) break;
    if (::poll(pfds.data(), pfds.size(), 100) <= 0) continue;
    for (std::size_t k = 0; k < pfds.size(); ++k) {
      if (pfds[k].revents == 0) continue;
      const std::size_t i = idx[k];
      const ssize_t n =
          ::recv(socks[i].fd(), buf.data(), buf.size(), MSG_DONTWAIT);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (n <= 0) {
        ++dropped;
        socks[i].close();
        continue;
      }
      for (ssize_t b = 0; b < n; ++b, ++got[i]) {
        const std::size_t at = got[i] % per;
        const char expect = at < head.size() ? head[at] : 'g';
        if (buf[b] != expect || got[i] >= want) {
          ++corrupt;
          socks[i].close();
          break;
        }
      }
      if (socks[i].ok() && got[i] == want) {
        ++complete;
        socks[i].close();
      }
    }
  }
  p.closed = std::max(p.closed, dropped);
  p.ok = corrupt == 0;
  p.figures = {
      {"dropped", dropped}, {"complete", complete}, {"corrupt", corrupt}};
  p.notes =
      fmt::format("{} dropped, {} read all replies exact{}", dropped, complete,
                  corrupt ? fmt::format(", {} CORRUPT", corrupt) : "");
  socks.clear();
  settle(p, p.rss_before + 16 * kMiB, settle_ns_, 3 * kSec);
  end(p);
}

// ---- waits: 89 x WAIT on 131,072 absent keys, then all dropped -------------

void Abuse::waits() {
  const int conns = scaled(89, 2);
  const int nkeys = std::min(131072, scaled(131072, 1024));
  Phase& p = begin("waits", fmt::format("{} conns each WAIT on {} absent keys",
                                        conns, nkeys));
  std::vector<RawSock> socks;
  std::vector<std::string> keys(static_cast<std::size_t>(nkeys));
  std::string m;
  int registered = 0, refused = 0;
  double request_mib = 0;
  for (int i = 0; i < conns && !timedOut(); ++i) {
    for (int k = 0; k < nkeys; ++k) keys[k] = key(fmt::format("w/{}/{}", i, k));
    m.clear();
    abuse::encode2(req::wait(keys), m);
    request_mib = static_cast<double>(m.size()) / kMiB;
    RawSock s = RawSock::connect(c_.addr, within(10 * kSec), true);
    // The PING after the WAIT answers once the WAIT is registered; a WAIT
    // the server refuses closes the connection instead.
    if (s.ok() && s.sendAll(m, within(60 * kSec)) &&
        s.fence(within(60 * kSec))) {
      ++registered;
    } else {
      ++refused;
    }
    socks.push_back(std::move(s));
  }
  p.conns = static_cast<int>(socks.size());
  hold(socks, p);
  p.closed = std::max(p.closed, refused);
  p.figures = {{"registered", registered},
               {"refused", refused},
               {"request_mib", request_mib}};
  p.notes = fmt::format("{} registered, {} refused", registered, refused);
  end(p);
  const std::int64_t rss_preload = p.rss_before;

  Phase& d = begin(
      "waits-drop",
      fmt::format("the {} WAIT connections dropped at once", socks.size()));
  const std::int64_t t0 = nowNs();
  socks.clear();
  settle(d, 2 * rss_preload, settle_ns_, 0);
  d.figures.emplace_back("rss_preload_mib",
                         static_cast<double>(rss_preload) / kMiB);
  d.ok = true;
  d.notes = fmt::format(
      "RSS {:.0f} MiB {:.1f} s after the drop ({:.0f} MiB before the WAITs)",
      static_cast<double>(d.rss_after) / kMiB,
      static_cast<double>(nowNs() - t0) / 1e9,
      static_cast<double>(rss_preload) / kMiB);
  end(d);
}

// ---- collide: crafted std::hash collisions vs random keys -------------------

void Abuse::collide() {
  using store::testing::collidingKeys;
  using store::testing::randomKeys;
  const int n = scaled(50000, 1000);
  const int nwait = scaled(10000, 500);
  Phase& p = begin(
      "collide",
      fmt::format("{} SETs of keys colliding under std::hash vs {} random "
                  "(and WAITs on {}), 3 rounds",
                  n, n, nwait));
  std::vector<double> set_crafted, set_random, wait_crafted, wait_random;
  RawSock s = RawSock::connect(c_.addr, within(10 * kSec), true);
  p.conns = 1;
  std::string m;
  for (int round = 0; round < 3 && s.ok() && !timedOut(); ++round) {
    for (bool crafted : {false, true}) {
      std::string prefix =
          key(fmt::format("c{}{}/", round, crafted ? 'x' : 'r'));
      prefix.resize((prefix.size() + 7) / 8 * 8, '_');
      auto keys = crafted ? collidingKeys(static_cast<std::size_t>(n), prefix)
                          : randomKeys(static_cast<std::size_t>(n), prefix);
      m.clear();
      for (const auto& k : keys) abuse::encode2(req::set(k, "v"), m);
      std::int64_t t0 = nowNs();
      if (!s.sendAll(m, within(120 * kSec)) || !s.fence(within(120 * kSec))) {
        s.close();
        break;
      }
      (crafted ? set_crafted : set_random)
          .push_back(static_cast<double>(nowNs() - t0) / 1e6);
      garbage_.insert(garbage_.end(), keys.begin(), keys.end());
      // WAITs on absent keys of the same shape, on a connection of their own
      // (closed after: the registrations go with it).
      std::string wprefix =
          key(fmt::format("cw{}{}/", round, crafted ? 'x' : 'r'));
      wprefix.resize((wprefix.size() + 7) / 8 * 8, '_');
      keys = crafted ? collidingKeys(static_cast<std::size_t>(nwait), wprefix)
                     : randomKeys(static_cast<std::size_t>(nwait), wprefix);
      m.clear();
      abuse::encode2(req::wait(keys), m);
      RawSock w = RawSock::connect(c_.addr, within(10 * kSec), true);
      ++p.conns;
      t0 = nowNs();
      if (!w.sendAll(m, within(120 * kSec)) || !w.fence(within(120 * kSec))) {
        ++p.closed;
        continue;
      }
      (crafted ? wait_crafted : wait_random)
          .push_back(static_cast<double>(nowNs() - t0) / 1e6);
    }
  }
  if (!s.ok()) ++p.closed;
  const double sc = median(set_crafted), sr = median(set_random);
  const double wc = median(wait_crafted), wr = median(wait_random);
  const double set_ratio = sr > 0 ? sc / sr : 0,
               wait_ratio = wr > 0 ? wc / wr : 0;
  p.figures = {{"set_crafted_ms", sc},   {"set_random_ms", sr},
               {"set_ratio", set_ratio}, {"wait_crafted_ms", wc},
               {"wait_random_ms", wr},   {"wait_ratio", wait_ratio}};
  p.notes = fmt::format(
      "SET {:.0f} vs {:.0f} ms ({:.2f}x); WAIT {:.1f} vs {:.1f} ms ({:.2f}x)",
      sc, sr, set_ratio, wc, wr, wait_ratio);
  p.ok = !set_crafted.empty() && !set_random.empty();
  end(p);
}

// ---- owed: the reply owed before a protocol error ---------------------------

void Abuse::owed() {
  const int reps = scaled(1000, 20);
  const std::string text = key("owed-text");
  if (!ctl_.sendAll(abuse::encode2(req::set(text, "abc")), within(30 * kSec)))
    return;
  garbage_.push_back(text);
  Phase& p =
      begin("owed", fmt::format("{} x (ADD k 1, then ADD text-key 1 or a bad "
                                "command byte) in one write",
                                reps));
  const std::string counter[2] = {key("owed-a"), key("owed-b")};
  garbage_.push_back(counter[0]);
  garbage_.push_back(counter[1]);
  int ok = 0, missing = 0;
  std::int64_t next[2] = {1, 1};
  for (int i = 0; i < reps && !timedOut(); ++i) {
    const int v = i % 2;
    RawSock s = RawSock::connect(c_.addr, within(10 * kSec), true);
    if (!s.ok()) {
      ++missing;
      continue;
    }
    ++p.conns;
    std::string m = abuse::encode2(req::add(counter[v], 1));
    if (v == 0) {
      abuse::encode2(req::add(text, 1), m);  // not a number: an error
    } else {
      m += '\xEE';  // no such command
    }
    std::string got;
    const bool closed = s.sendAll(m, within(10 * kSec)) &&
                        s.waitClosed(within(10 * kSec), &got);
    if (closed) ++p.closed;
    if (closed && got == le64(static_cast<std::uint64_t>(next[v]))) {
      ++ok;
    } else {
      ++missing;
    }
    ++next[v];  // the ADD is applied either way
  }
  p.ok = missing == 0;
  p.figures = {{"first_reply_ok", ok}, {"first_reply_missing", missing}};
  p.notes = fmt::format("first reply arrived {}/{}", ok, ok + missing);
  end(p);
}

// ---- hog: 8 MiB values under new keys until refused -------------------------

void Abuse::hog() {
  const std::int64_t vbytes = 8 * kMiB;
  Phase& p =
      begin("hog", fmt::format("one client SETs 8 MiB values under new keys "
                               "until refused (at most {})",
                               o_.hog_values));
  const std::string value(vbytes, 'h');
  RawSock s = RawSock::connect(c_.addr, within(10 * kSec), true);
  p.conns = 1;
  std::vector<std::string> stored;
  bool refused = false;
  while (s.ok() && static_cast<int>(stored.size()) < o_.hog_values &&
         !timedOut()) {
    const std::string k = key(fmt::format("hog/{}", stored.size()));
    const std::string m = abuse::encode2(req::set(k, value));
    if (!s.sendAll(m, within(30 * kSec)) || !s.fence(within(30 * kSec))) {
      refused = s.peerClosed();  // closed by the server, not timed out
      break;
    }
    stored.push_back(k);
  }
  p.closed = refused ? 1 : 0;
  const std::int64_t peak_now = sampler_.now();
  s.close();
  p.figures = {{"stored_values", static_cast<double>(stored.size())},
               {"stored_mib", static_cast<double>(stored.size()) * 8},
               {"refused", refused ? 1 : 0},
               {"rss_full_mib", static_cast<double>(peak_now) / kMiB}};
  // The hog's values go, so the server is usable again.
  const bool deleted = deleteKeys(stored);
  p.notes = fmt::format("refused after {} values ({} MiB){}", stored.size(),
                        stored.size() * 8, deleted ? ", then deleted" : "");
  if (!refused)
    p.notes = fmt::format("NOT refused: stopped at {} values", stored.size());
  settle(p, p.rss_before + 16 * kMiB, settle_ns_, 3 * kSec);
  end(p);
}

int Abuse::run() {
  deadline_ = nowNs() + static_cast<std::int64_t>(c_.timeout_s * 1e9);
  ctl_ = RawSock::connect(c_.addr, within(10 * kSec), true);
  if (!ctl_.ok()) {
    fmt::print(stderr, "abuse: cannot connect to {}\n", c_.addr.text);
    return 1;
  }
  std::string err;
  if (!probe_.start(err)) {
    fmt::print(stderr, "abuse: {}\n", err);
    return 1;
  }
  run_.phases.reserve(abuse::kMaxPhases);  // Phase& stay valid
  run_.rss_start = sampler_.now();
  baseline();
  struct Step {
    const char* name;
    void (Abuse::*fn)();
  };
  // clang-format off
  const Step steps[] = {
      {"partial", &Abuse::partial}, {"nonreaders", &Abuse::nonreaders},
      {"waits", &Abuse::waits},     {"collide", &Abuse::collide},
      {"owed", &Abuse::owed},       {"hog", &Abuse::hog},
  };
  // clang-format on
  for (const Step& s : steps) {
    if (timedOut()) break;
    if (wanted(s.name)) (this->*s.fn)();
  }
  // Not an attack: the keys the attacks stored are deleted (within 120 s
  // more, even after a timeout).
  const bool finished = run_.finished;
  deadline_ = std::max(deadline_, nowNs() + 120 * kSec);
  Phase& cleanup = begin(
      "cleanup", fmt::format("DELETE_KEY of the {} keys the attacks stored",
                             garbage_.size()));
  cleanup.ok = deleteKeys(garbage_);
  end(cleanup);
  run_.finished = finished;
  probe_.stop();
  for (std::size_t i = 0; i < run_.phases.size(); ++i) {
    run_.phases[i].probe = probe_.stats(static_cast<int>(i));
  }
  run_.probe_data_errors = probe_.dataErrors();
  run_.probe_lost = probe_.lost();
  run_.verdicts = abuse::judge(run_);
  abuse::printReport(run_);
  if (!c_.json_path.empty() &&
      !writeFile(c_.json_path, abuse::reportJson(run_))) {
    return 1;
  }
  bool ok = run_.probe_data_errors == 0 && run_.probe_lost == 0 &&
            run_.control_failures == 0;
  for (const Phase& p : run_.phases) ok = ok && p.ok;
  if (!ok) return 1;
  return run_.finished ? 0 : 2;
}

}  // namespace

int runAbuse(const CommonOptions& common, const AbuseOptions& opt) {
  auto a = std::make_unique<Abuse>(common, opt);
  return a->run();
}

}  // namespace tcpstore::bench
