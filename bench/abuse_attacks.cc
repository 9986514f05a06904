// The attacks of `tcpstore-bench abuse` (issue 13), one member of Abuse
// each; bench/abuse.cc says what each does and runs them in order.
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

#include "bench/abuse_run.h"
#include "protocol/requests.h"
#include "tests/keyspace/collide.h"

namespace tcpstore::bench::abuse {
namespace {

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

}  // namespace

using protocol::ReplyShape;
namespace req = protocol::requests;

// ---- partial: most of one 100 MiB request per connection -------------------

void Abuse::partial() {
  const int conns = scaled(23, 2);
  const std::int64_t vbytes = scaledBytes(8 * kMiB, 64 * 1024);
  std::vector<std::string> keys;
  for (int i = 0; i < 12; ++i) keys.push_back(key(fmt::format("part/{}", i)));
  const std::vector<std::string> values(12, std::string(vbytes, 'p'));
  const std::string full = encode2(req::multiSet(keys, values));
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
    socks.push_back(RawSock::connect(c_.addr(), within(10 * kSec), true));
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
  if (!ctl_.sendAll(encode2(req::set(big_key, value)), within(30 * kSec))) {
    return;
  }
  garbage_.push_back(big_key);
  Phase& p =
      begin("nonreaders",
            fmt::format("{} clients pipeline {} GETs of a {:.2f} MiB "
                        "value and never read",
                        clients, kGets, static_cast<double>(vbytes) / kMiB));
  std::string gets;
  for (int i = 0; i < kGets; ++i) encode2(req::get(big_key), gets);
  std::vector<RawSock> socks;
  for (int i = 0; i < clients && !timedOut(); ++i) {
    RawSock s = RawSock::connect(c_.addr(), within(10 * kSec), true, 16 * 1024);
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
    encode2(req::wait(keys), m);
    request_mib = static_cast<double>(m.size()) / kMiB;
    RawSock s = RawSock::connect(c_.addr(), within(10 * kSec), true);
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
  RawSock s = RawSock::connect(c_.addr(), within(10 * kSec), true);
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
      for (const auto& k : keys) encode2(req::set(k, "v"), m);
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
      encode2(req::wait(keys), m);
      RawSock w = RawSock::connect(c_.addr(), within(10 * kSec), true);
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
  if (!ctl_.sendAll(encode2(req::set(text, "abc")), within(30 * kSec))) return;
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
    RawSock s = RawSock::connect(c_.addr(), within(10 * kSec), true);
    if (!s.ok()) {
      ++missing;
      continue;
    }
    ++p.conns;
    std::string m = encode2(req::add(counter[v], 1));
    if (v == 0) {
      encode2(req::add(text, 1), m);  // not a number: an error
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
  RawSock s = RawSock::connect(c_.addr(), within(10 * kSec), true);
  p.conns = 1;
  std::vector<std::string> stored;
  bool refused = false;
  while (s.ok() && static_cast<int>(stored.size()) < o_.hog_values &&
         !timedOut()) {
    const std::string k = key(fmt::format("hog/{}", stored.size()));
    const std::string m = encode2(req::set(k, value));
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

}  // namespace tcpstore::bench::abuse
