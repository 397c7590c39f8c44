#pragma once
// The transport one rank's communicators share (the world's and every split of it), with the
// graveyard of buffers that abandoned sends may still read and the communicator ids in use.
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "transports/transport.hpp"

namespace tandem::engine::comm {

class SharedTransport {
 public:
  explicit SharedTransport(std::unique_ptr<transports::Transport> t) : transport_(std::move(t)) {}
  ~SharedTransport() { transport_.reset(); }  // before the buried buffers it may still read
  SharedTransport(const SharedTransport&) = delete;
  SharedTransport& operator=(const SharedTransport&) = delete;

  transports::Transport& transport() { return *transport_; }
  // Keeps `p` alive until the transport is gone (buffers of sends that never completed).
  void bury(std::shared_ptr<void> p);
  size_t buried() const;
  // Communicator ids: every id handed out on this rank is below next_id().
  uint32_t next_id() const;
  void reserve_ids(uint32_t next);

 private:
  mutable std::mutex mu_;
  std::vector<std::shared_ptr<void>> graveyard_;
  uint32_t next_id_ = 1;  // 0 is the world communicator
  std::unique_ptr<transports::Transport> transport_;
};

}  // namespace tandem::engine::comm
