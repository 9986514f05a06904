// Effects: the bytes one request (or one outside event) produced, and the
// connections they go to. The one seam between a state holder (a Backend)
// and the server's outboxes: a backend appends, the dispatcher routes.
//
// A send's bytes are either in the Effects' own buffer (bytes()) or in a
// SharedBytes buffer it references (sendShared(): one reply built once for
// many receivers, queued to each without a copy).
//
// Pure data: no I/O. Reuse one Effects across calls; clear() keeps capacity.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "store/shared_bytes.h"

namespace tcpstore::store {

// A server connection's id: unique for the server's lifetime, never reused,
// so bytes addressed to a closed connection can be dropped safely.
using ConnId = std::uint64_t;

class Effects {
 public:
  struct Send {
    ConnId conn;
    std::size_t offset;  // into bytes(); several sends may share a range
    std::size_t length;
    // 0: the bytes are in bytes(); i > 0: in the shared buffer i - 1
    // (sharedOf()), at offset/length within it.
    std::uint32_t shared = 0;
  };

  void clear() noexcept {
    bytes_.clear();
    sends_.clear();
    shared_.clear();
    shared_sent_ = 0;
  }
  bool empty() const noexcept { return sends_.empty(); }
  // The sends, in the order their bytes must reach each connection.
  const std::vector<Send>& sends() const noexcept { return sends_; }
  // The bytes of `s`; valid until the next non-const call.
  std::string_view bytesOf(const Send& s) const noexcept {
    const std::string_view all =
        s.shared == 0 ? std::string_view(bytes_) : shared_[s.shared - 1].view();
    return all.substr(s.offset, s.length);
  }
  // The shared buffer holding the bytes of `s`, or nullptr if they are in
  // bytes().
  const SharedBytes* sharedOf(const Send& s) const noexcept {
    return s.shared == 0 ? nullptr : &shared_[s.shared - 1];
  }
  // The bytes of the sends that are not shared.
  const std::string& bytes() const noexcept { return bytes_; }
  // Bytes of all sends: bytes() plus the length of every shared send.
  std::size_t sentBytes() const noexcept {
    return bytes_.size() + shared_sent_;
  }
  // Hands over the bytes (for an Effects whose one send covers them all)
  // and empties this Effects; its capacity goes with them.
  std::string takeBytes() noexcept {
    sends_.clear();
    shared_.clear();
    shared_sent_ = 0;
    return std::move(bytes_);
  }

  // Builder: start a send to `conn`, append its bytes to the returned
  // buffer, then end() it. An empty send is not recorded.
  std::string& begin(ConnId conn) {
    open_conn_ = conn;
    open_offset_ = bytes_.size();
    return bytes_;
  }
  void end() {
    auto len = bytes_.size() - open_offset_;
    if (len > 0) sends_.push_back(Send{open_conn_, open_offset_, len});
  }
  // Convenience: one whole send.
  void send(ConnId conn, std::string_view bytes) {
    begin(conn).append(bytes);
    end();
  }
  // Sends the bytes of an earlier send again, to `conn`, without copying
  // them (one notification for many receivers).
  void repeat(ConnId conn, const Send& like) {
    sends_.push_back(Send{conn, like.offset, like.length, like.shared});
    if (like.shared != 0) shared_sent_ += like.length;
  }
  // Sends all of `buf` to `conn` by reference: the receiver's outbox holds
  // the buffer, not a copy. Sending one buffer to many connections in a row
  // references it once here. Nothing is recorded for an empty buffer.
  void sendShared(ConnId conn, const SharedBytes& buf) {
    if (buf.empty()) return;
    if (shared_.empty() || !(shared_.back() == buf)) shared_.push_back(buf);
    sends_.push_back(
        Send{conn, 0, buf.size(), static_cast<std::uint32_t>(shared_.size())});
    shared_sent_ += buf.size();
  }

 private:
  std::string bytes_;
  std::vector<Send> sends_;
  std::vector<SharedBytes> shared_;
  std::size_t shared_sent_ = 0;  // lengths of the shared sends
  ConnId open_conn_ = 0;
  std::size_t open_offset_ = 0;
};

}  // namespace tcpstore::store
