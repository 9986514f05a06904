// MuxSession: the server side of the relay extension (protocol/mux.h,
// docs/relay.md). A connection whose first bytes are kMuxPreamble gets one;
// from then on its bytes are frames, decoded here instead of requests.
//
// Each channel the relay OPENs is a Channel: an Endpoint with a fresh ConnId
// from the server's never-reused id space, so the dispatcher, the backend
// and every wait or watch treat it exactly like a connection of its own. A
// REQUEST frame holds one request of the channel's dialect; it goes through
// the dispatcher like a connection's request (counters, join progress,
// budget). What the backend sends to a channel's ConnId leaves as DATA
// frames on the mux connection; a channel the server closes (its request
// broke a rule, the backend closed it) gets a CLOSED frame with the reason,
// and only that channel ends. CLOSE from the relay, and the mux connection
// closing, disconnect channels from the backend (their waits are forgotten).
//
// A channel whose request the backend left pending queues its later
// REQUESTs (charged to the memory budget as input) while the other channels
// go on; complete() resumes it. A channel costs kChannelBytes of the budget
// while open.
//
// Channel ids follow protocol/mux.h: strictly increasing OPENs; REQUEST or
// CLOSE of a channel that was opened and is closed now is ignored; any other
// breach (and DATA or CLOSED from the relay, or a REQUEST that is not
// exactly one request) closes the whole mux connection with a log line.
//
// Lifetime: owned by its Connection; channels are freed in the check phase
// after they close (Connections::dead_channels_). Loop thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "protocol/codec.h"
#include "protocol/mux.h"
#include "store/server/endpoint.h"

namespace tcpstore::server {

class Connection;
class Connections;
class MuxSession;

// Budget charge of one open channel (the Channel and its two table entries).
inline constexpr std::size_t kChannelBytes = 192;
// DATA payloads are split at this size.
inline constexpr std::size_t kMaxDataFrameBytes = std::size_t{16} << 20;

enum class MuxPreamble { kNo, kYes, kNeedMore };
// Whether a connection's first bytes are the mux preamble: kNeedMore while
// they are a proper prefix of it of at least 2 bytes. A lone first byte is
// kNo: 0xff alone is an unknown 1.13 command that every server closes at
// once (a relay writes its 8 bytes at once: TCP never splits them there).
MuxPreamble detectMuxPreamble(std::string_view first_bytes) noexcept;

class Channel final : public Endpoint {
 public:
  Channel(MuxSession& session, ConnId id, std::uint32_t number,
          protocol::Dialect dialect) noexcept;
  ~Channel();

  std::uint32_t number() const noexcept { return number_; }

  // Endpoint
  std::string peerName() const override;
  std::string_view dialectName() const noexcept override;
  void send(std::string_view bytes, bool requested) override;
  // 0: a channel's bytes go straight to its connection, whose reader is the
  // relay (paused by flow control, never judged as a non-reading client).
  std::size_t unsentBytes() const noexcept override { return 0; }
  void resume() override;
  void reject(Counter& counter, std::string_view reason) noexcept override;
  // A channel owes nothing that is not already queued on the connection (its
  // DATA is ahead of the CLOSED): the same as reject().
  void fail(Counter& counter, std::string_view reason) noexcept override {
    reject(counter, reason);
  }
  void drop(std::string_view reason) noexcept override;

 private:
  friend class MuxSession;
  friend class Connections;  // frees closed channels
  // Requests that arrived while one was pending, back to back.
  struct Queue {
    std::string bytes;
    std::vector<std::uint32_t> lengths;
    std::size_t next = 0;       // index into lengths
    std::size_t next_byte = 0;  // offset of lengths[next] in bytes
    std::size_t charged = 0;    // bytes.capacity() charged to the budget
    bool empty() const noexcept { return next == lengths.size(); }
  };

  // One REQUEST payload (views valid during the call).
  void request(std::string_view payload);
  // SHUTDOWN: the relay's client half-closed after its last REQUEST.
  void shutdown();
  // After SHUTDOWN, once nothing is pending or queued: asks the backend
  // whether replies are still owed (then waits for resume()), else ends the
  // channel with an empty CLOSED. Throws std::bad_alloc.
  void finishIfDone();
  void dispatch(std::string_view payload);
  void enqueue(std::string_view payload);
  void releaseQueue() noexcept;
  void logClosing(std::string_view reason) noexcept;

  MuxSession& session_;
  const std::uint32_t number_;
  const protocol::Dialect dialect_;
  bool draining_ = false;  // inside resume(): it must not re-enter
  bool eof_ = false;       // SHUTDOWN received: no REQUEST may follow
  std::unique_ptr<Queue> queue_;
  // Closed: the next in Connections' list of channels to free.
  std::unique_ptr<Channel> next_dead_;
};

class MuxSession {
 public:
  // `conn` has just sent the preamble (echoed by the caller).
  explicit MuxSession(Connection& conn);
  ~MuxSession();
  MuxSession(const MuxSession&) = delete;
  MuxSession& operator=(const MuxSession&) = delete;

  // Decodes and handles frames from [data, data+len) while the connection
  // may decode; returns the bytes consumed (sets its busy state's need).
  // Throws std::bad_alloc.
  std::size_t drain(const char* data, std::size_t len);
  // Resumes channels whose queued requests waited for the connection's
  // output to drain. Throws std::bad_alloc.
  void resumeChannels();
  // The connection is closing: every channel is closed and disconnected
  // from the backend (no CLOSED is sent).
  void closeAll() noexcept;
  std::size_t openChannels() const noexcept { return channels_.size(); }

 private:
  friend class Channel;
  void onFrame(const protocol::mux::Frame& f);
  void open(std::uint32_t number, protocol::Dialect dialect);
  // Refuses an OPEN: CLOSED with `reason`, counted in `counter`.
  void refuse(std::uint32_t number, Counter& counter, std::string_view reason);
  // A relay bug: closes the whole connection with `reason` logged.
  void violation(std::string_view reason) noexcept;
  // Closes `ch`: CLOSED with `reason` if `tell`, then the backend forgets it.
  void closeChannel(Channel& ch, bool tell, std::string_view reason) noexcept;
  // What every close does: the backend forgets `ch`, its budget is freed.
  void retire(Channel& ch) noexcept;
  void sendClosed(std::uint32_t number, std::string_view reason);
  protocol::RequestStream& stream(protocol::Dialect d) noexcept {
    return d == protocol::Dialect::kV2 ? v2_ : v113_;
  }
  void resetStream(protocol::Dialect d) noexcept;

  Connection& conn_;
  Connections& set_;
  const std::uint64_t max_payload_;
  std::unordered_map<std::uint32_t, std::unique_ptr<Channel>> channels_;
  std::uint32_t highest_ = 0;  // highest channel id opened so far
  // Channels whose queued requests wait for the connection to unpause.
  std::vector<std::uint32_t> blocked_;
  // Every REQUEST payload is one whole request, so no parse state crosses
  // frames: one decoder per dialect serves all channels (reset after an
  // error), instead of one per channel.
  protocol::RequestStream v113_;
  protocol::RequestStream v2_;
};

}  // namespace tcpstore::server
