// Effects: the bytes one request (or one outside event) produced, and the
// connections they go to. The one seam between a state holder (a Backend)
// and the server's outboxes: a backend appends, the dispatcher routes.
//
// Pure data: no I/O. Reuse one Effects across calls; clear() keeps capacity.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

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
  };

  void clear() noexcept {
    bytes_.clear();
    sends_.clear();
  }
  bool empty() const noexcept { return sends_.empty(); }
  // The sends, in the order their bytes must reach each connection.
  const std::vector<Send>& sends() const noexcept { return sends_; }
  // The bytes of `s`; valid until the next non-const call.
  std::string_view bytesOf(const Send& s) const noexcept {
    return std::string_view(bytes_).substr(s.offset, s.length);
  }
  const std::string& bytes() const noexcept { return bytes_; }
  // Hands over the bytes (for an Effects whose one send covers them all)
  // and empties this Effects; its capacity goes with them.
  std::string takeBytes() noexcept {
    sends_.clear();
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
    sends_.push_back(Send{conn, like.offset, like.length});
  }

 private:
  std::string bytes_;
  std::vector<Send> sends_;
  ConnId open_conn_ = 0;
  std::size_t open_offset_ = 0;
};

}  // namespace tcpstore::store
