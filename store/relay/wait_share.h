// WaitShare: a relay's shared WAITs. Identical WAITs (same key list) of idle
// clients become one upstream WAIT on a relay-owned channel of their own;
// its STOP_WAITING releases every caller (each gets its own `00`).
//
// Exactness: a caller joins only a WAIT that is sent after it arrived (the
// group's `next` callers, sent when the one in flight is answered or
// cancelled), never one already in flight. An in-flight WAIT may have been
// released upstream before the joiner arrived, and a DELETE_KEY in between
// would make a server hold the joiner; a WAIT sent after the joiner arrived
// is released only at an instant when all its keys exist, inside the
// joiner's own request-reply interval. So at most one WAIT per key list is
// upstream at a time, plus at most one more round trip for late joiners.
//
// A caller is not pending: its submit() answered kDone, so its next
// request (a CANCEL_WAIT after its timeout) reaches the relay as it would
// reach a server. Any request of a caller takes it out of the group, and
// the relay re-sends its WAIT on the client's own channel ahead of the
// request (the relay cannot answer a CANCEL_WAIT itself: `01` or `00 01`
// depends on whether the keys exist upstream). A caller's disconnect takes
// it out too. When the last caller of the WAIT in flight leaves, its
// channel is closed (CLOSE: the upstream forgets the wait).
//
// Loop thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "protocol/codec.h"
#include "tcpstore/status.h"

namespace tcpstore::store::relay {

class RelayBackend;
using ConnId = std::uint64_t;

class WaitShare {
 public:
  explicit WaitShare(RelayBackend& relay);
  ~WaitShare();

  // Takes the WAIT `req` of idle client `conn` into its group (sent at the
  // next flush() if no WAIT of that group is in flight). The caller answers
  // kDone: the STOP_WAITING comes later through host().deliver(). False if
  // `req` is not a WAIT (or cannot be encoded).
  bool offer(ConnId conn, const protocol::Request& req);
  // `conn` is waiting in a group.
  bool waiting(ConnId conn) const { return members_.count(conn) > 0; }
  // Takes `conn` out of its group (a disconnect, or another request);
  // returns the WAIT's encoded 2.x request, empty if `conn` was
  // not waiting here.
  std::string leave(ConnId conn);
  // Sends the WAITs of groups with callers and none in flight.
  void flush();
  // Frames of the shared WAIT channels.
  void onData(std::uint32_t channel, std::string_view payload);
  void onClosed(std::uint32_t channel, std::string_view reason);
  // The link is gone (its channels with it): forgets every group and
  // returns the callers, for the relay to close.
  std::vector<ConnId> onLinkDown();
  // Heap bytes held for the groups' key lists and callers (an estimate,
  // O(1)), charged to the server's memory budget through the relay.
  std::size_t memoryBytes() const noexcept {
    return bytes_ + members_.size() * kMemberBytes;
  }

 private:
  struct Caller {
    ConnId conn;
    std::uint64_t ticket;
  };
  struct Group {
    std::string request;        // the encoded 2.x WAIT (the group's key)
    std::uint32_t channel = 0;  // 0: none; else its own channel
    bool in_flight = false;     // a WAIT sent on `channel`, not answered
    std::vector<Caller> sent;   // callers of the WAIT in flight
    std::vector<Caller> next;   // callers of the next WAIT
    std::size_t live_sent = 0;  // callers in `sent` still waiting
    std::size_t live_next = 0;
    bool dirty = false;  // listed in dirty_
  };
  struct Member {
    Group* group;
    std::uint64_t ticket;
    bool in_sent;
  };

  bool live(const Caller& c, const Group* g) const;
  void markDirty(Group& g);
  void closeChannel(Group& g);
  void maybeErase(Group& g);
  Group* byChannel(std::uint32_t channel);

  RelayBackend& relay_;
  // By the WAIT's 2.x bytes; looked up by a view of them (no copy).
  struct BytesHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept {
      return std::hash<std::string_view>{}(s);
    }
  };
  std::unordered_map<std::string, std::unique_ptr<Group>, BytesHash,
                     std::equal_to<>>
      groups_;
  std::unordered_map<std::uint32_t, Group*> channels_;
  std::unordered_map<ConnId, Member> members_;
  std::vector<std::string> dirty_;
  std::uint64_t next_ticket_ = 1;
  std::string scratch_;
  // The groups' encoded WAITs (their key lists) and the groups themselves.
  std::size_t bytes_ = 0;
  // A caller: its Member entry and its Caller in a group's list.
  static constexpr std::size_t kMemberBytes = 96;
  static std::size_t groupBytes(const Group& g) noexcept {
    return sizeof(Group) + 64 + 2 * g.request.capacity();  // + groups_' key
  }
};

}  // namespace tcpstore::store::relay
