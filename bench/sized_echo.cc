#include "bench/sized_echo.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <random>
#include <vector>

namespace tcpstore::bench {
namespace {

void putU32(char* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
std::uint32_t getU32(const unsigned char* p) {
  return static_cast<std::uint32_t>(p[0]) |
         (static_cast<std::uint32_t>(p[1]) << 8) |
         (static_cast<std::uint32_t>(p[2]) << 16) |
         (static_cast<std::uint32_t>(p[3]) << 24);
}

// Per connection: the header being read, the padding left to skip, and the
// reply bytes owed (all zeros, so a count is enough).
struct FdState {
  bool open = false;
  bool want_out = false;
  unsigned char hdr[kSizedEchoHeader];
  std::uint32_t hdr_have = 0;
  std::uint64_t skip = 0;
  std::uint64_t owed = 0;
};

constexpr std::size_t kBuf = 256 * 1024;

// Consumes `n` received bytes; adds the replies they complete to st.owed.
void consume(FdState& st, const unsigned char* p, std::size_t n) {
  while (n > 0) {
    if (st.skip > 0) {
      std::size_t k = std::min<std::uint64_t>(st.skip, n);
      st.skip -= k;
      p += k;
      n -= k;
      continue;
    }
    std::size_t k = std::min<std::size_t>(kSizedEchoHeader - st.hdr_have, n);
    std::memcpy(st.hdr + st.hdr_have, p, k);
    st.hdr_have += static_cast<std::uint32_t>(k);
    p += k;
    n -= k;
    if (st.hdr_have < kSizedEchoHeader) return;
    st.hdr_have = 0;
    std::uint32_t total = getU32(st.hdr);
    st.skip = total > kSizedEchoHeader ? total - kSizedEchoHeader : 0;
    st.owed += getU32(st.hdr + 4);
  }
}

}  // namespace

[[noreturn]] void serveSizedEcho(int lfd, int sndbuf) {
  int ep = epoll_create1(EPOLL_CLOEXEC);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = lfd;
  epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev);
  std::vector<unsigned char> in(kBuf);
  const std::vector<char> zeros(kBuf, 0);
  std::vector<FdState> fds;
  epoll_event events[256];
  auto closeFd = [&](int fd) {
    close(fd);
    fds[static_cast<std::size_t>(fd)] = FdState{};
  };
  // Sends what `fd` owes; false if the connection died.
  auto flush = [&](int fd, FdState& st) {
    while (st.owed > 0) {
      std::size_t k = std::min<std::uint64_t>(st.owed, kBuf);
      ssize_t w = send(fd, zeros.data(), k, MSG_NOSIGNAL);
      if (w > 0) {
        st.owed -= static_cast<std::uint64_t>(w);
        continue;
      }
      if (w < 0 && (errno == EAGAIN || errno == EINTR)) break;
      return false;
    }
    bool want = st.owed > 0;
    if (want != st.want_out) {
      st.want_out = want;
      epoll_event e{};
      e.events = EPOLLIN | (want ? EPOLLOUT : 0u);
      e.data.fd = fd;
      epoll_ctl(ep, EPOLL_CTL_MOD, fd, &e);
    }
    return true;
  };
  for (;;) {
    int n = epoll_wait(ep, events, 256, 1000);
    if (n < 0 && errno != EINTR) _exit(1);
    if (getppid() == 1) _exit(0);
    for (int i = 0; i < n; ++i) {
      int fd = events[i].data.fd;
      if (fd == lfd) {
        for (;;) {
          int c = accept4(lfd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
          if (c < 0) break;
          if (static_cast<std::size_t>(c) >= fds.size()) {
            fds.resize(static_cast<std::size_t>(c) * 2 + 1);
          }
          fds[static_cast<std::size_t>(c)] = FdState{};
          fds[static_cast<std::size_t>(c)].open = true;
          if (sndbuf > 0) {
            setsockopt(c, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
          }
          epoll_event cev{};
          cev.events = EPOLLIN;
          cev.data.fd = c;
          epoll_ctl(ep, EPOLL_CTL_ADD, c, &cev);
        }
        continue;
      }
      FdState& st = fds[static_cast<std::size_t>(fd)];
      if (!st.open) continue;
      if (events[i].events & EPOLLIN) {
        ssize_t r = recv(fd, in.data(), in.size(), 0);
        if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
          closeFd(fd);
          continue;
        }
        if (r > 0) consume(st, in.data(), static_cast<std::size_t>(r));
      }
      if (!flush(fd, st)) closeFd(fd);
    }
  }
}

void appendSizedEcho(std::string& out, std::uint32_t total_len,
                     std::uint32_t reply_len) {
  total_len = std::max(total_len, kSizedEchoHeader);
  const std::size_t at = out.size();
  out.resize(at + total_len, '\0');
  putU32(out.data() + at, total_len);
  putU32(out.data() + at + 4, reply_len);
}

int startSizedEchoServer(Endpoint& ep) {
  // Below the ephemeral range: the generator binds explicit ports in it.
  return forkLoopbackServer(ep, true, [](int lfd) { serveSizedEcho(lfd, 0); });
}

}  // namespace tcpstore::bench
