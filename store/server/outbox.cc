#include "store/server/outbox.h"

#include <algorithm>

namespace tcpstore::server {

namespace {
// Largest piece of one uv_buf_t.
constexpr std::size_t kMaxBufBytes = std::size_t{1} << 30;
// Output buffers above this are released once written.
constexpr std::size_t kKeepBytes = 64 * 1024;

void release(std::string& s) noexcept {
  s.clear();
  if (s.capacity() > kKeepBytes) std::string().swap(s);
}
}  // namespace

Outbox::Flushed Outbox::flush(uv_stream_t* stream, void* data, uv_write_cb cb) {
  Flushed f;
  if (writing_ || pending_.empty()) return f;
  uv_buf_t b = uv_buf_init(
      pending_.data(),
      static_cast<unsigned>(std::min(pending_.size(), kMaxBufBytes)));
  int r = uv_try_write(stream, &b, 1);
  if (r == UV_EAGAIN || r == UV_ENOSYS) r = 0;
  if (r < 0) {
    f.error = r;
    return f;
  }
  f.written = static_cast<std::size_t>(r);
  if (f.written == pending_.size()) {
    release(pending_);
    return f;
  }
  inflight_.assign(pending_, f.written, std::string::npos);
  release(pending_);
  std::vector<uv_buf_t> bufs;
  for (std::size_t at = 0; at < inflight_.size(); at += kMaxBufBytes) {
    std::size_t len = std::min(kMaxBufBytes, inflight_.size() - at);
    bufs.push_back(
        uv_buf_init(inflight_.data() + at, static_cast<unsigned>(len)));
  }
  wreq_.data = data;
  int rc = uv_write(&wreq_, stream, bufs.data(),
                    static_cast<unsigned>(bufs.size()), cb);
  if (rc != 0) {
    f.error = rc;
    return f;
  }
  writing_ = true;
  return f;
}

std::size_t Outbox::finishWrite() noexcept {
  writing_ = false;
  std::size_t n = inflight_.size();
  release(inflight_);
  return n;
}

}  // namespace tcpstore::server
