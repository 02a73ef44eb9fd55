// Framed JSON messages between two processes over a connected Unix stream socket.
//
// Each frame is a JSON object, optionally carrying file descriptors (SCM_RIGHTS: shared memory
// handed to the other process). Frames carry a sequence number; once a side has a key, every
// frame it sends carries an HMAC-SHA256 over the sequence number and the payload, and the
// receiving side, given the same key, accepts only frames whose MAC verifies and whose number is
// the next one. That is how the sandbox's judge tells what the candidate process's harness sent
// from what solution code in that process wrote on the same socket: the key lives in the
// harness's memory, handed over before any solution code ran.
//
// A MessageChannel owns its descriptor. Not thread-safe: one thread sends and receives.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuda_agent/core/error.h"
#include "cuda_agent/core/unique_fd.h"

namespace cuda_agent {

// Why a receive failed. The message names the peer's side of the problem.
class ChannelError : public Error {
 public:
  enum class Kind {
    kClosed,     // the peer closed its end (it exited or crashed)
    kTimeout,    // nothing complete arrived in time
    kMalformed,  // bytes that are not a frame of this protocol, or a payload that is not JSON
    kTooLarge,   // a frame longer than the receiver accepts
    kBadMac,     // a frame whose MAC or sequence number is wrong: not written by the keyed sender
  };
  ChannelError(Kind kind, const std::string& what) : Error(what), kind_(kind) {}
  Kind kind() const { return kind_; }

 private:
  Kind kind_;
};

struct ChannelMessage {
  nlohmann::json body;
  std::vector<UniqueFd> fds;  // descriptors that came with the frame (close-on-exec)
};

class MessageChannel {
 public:
  static constexpr size_t kDefaultMaxBytes = size_t{64} << 20;
  static constexpr size_t kMaxFds = 16;

  explicit MessageChannel(UniqueFd socket);
  MessageChannel(MessageChannel&&) noexcept = default;
  MessageChannel& operator=(MessageChannel&&) noexcept = default;

  // A connected pair: this process's end, and the peer's end for a child (pass it as the
  // child's descriptor 3; it is close-on-exec here). Throws Error when the system refuses.
  static std::pair<MessageChannel, UniqueFd> pair();

  // From now on frames sent carry a MAC under `key`; frames received must carry one.
  void set_send_key(std::string key) { send_key_ = std::move(key); }
  void set_receive_key(std::string key) { receive_key_ = std::move(key); }

  // Sends one frame (blocking until the kernel took it). `fds` are duplicated by the kernel into
  // the peer; the caller keeps owning them. Throws ChannelError(kClosed) when the peer is gone.
  void send(const nlohmann::json& body, const std::vector<int>& fds = {});

  // Waits up to `timeout_s` (< 0: forever) for one frame. Throws ChannelError.
  ChannelMessage receive(double timeout_s, size_t max_bytes = kDefaultMaxBytes);

  // Busy-waits up to `spin_s` for a frame to arrive, without sleeping: the calling thread stays
  // awake on its core for a frame expected soon. True when one is there to receive().
  bool spin_until_readable(double spin_s) const;

  int fd() const { return socket_.get(); }

 private:
  UniqueFd socket_;
  std::string send_key_, receive_key_;
  uint64_t sent_ = 0, received_ = 0;
};

}  // namespace cuda_agent
