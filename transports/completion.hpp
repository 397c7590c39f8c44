#pragma once
// The completion state a transport request shares with the transport's progress machinery: set
// once (complete, fail or cancel) by whichever thread finishes the operation, read by test().
#include <atomic>
#include <cstddef>
#include <string>

#include "engine/core/error.hpp"

namespace tandem::transports {

class Completion {
 public:
  enum State : int { kPending = 0, kDone = 1, kFailed = 2 };

  // First finisher wins; later calls are ignored. Return whether this call finished it.
  bool complete(size_t bytes, bool truncated) noexcept {
    if (claimed_.exchange(true, std::memory_order_acq_rel)) return false;
    bytes_ = bytes;
    truncated_ = truncated;
    state_.store(kDone, std::memory_order_release);
    return true;
  }
  bool fail(Status status, std::string message) noexcept {
    if (claimed_.exchange(true, std::memory_order_acq_rel)) return false;
    status_ = status;
    message_ = std::move(message);
    state_.store(kFailed, std::memory_order_release);
    return true;
  }

  int state() const noexcept { return state_.load(std::memory_order_acquire); }
  bool pending() const noexcept { return state() == kPending; }
  // True when done; throws the failure.
  bool test() const {
    const int s = state();
    if (s == kFailed) throw Error(status_, message_);
    return s == kDone;
  }
  size_t bytes() const noexcept { return bytes_; }
  bool truncated() const noexcept { return truncated_; }

 private:
  std::atomic<bool> claimed_{false};
  std::atomic<int> state_{kPending};
  size_t bytes_ = 0;
  bool truncated_ = false;
  Status status_ = Status::kOk;
  std::string message_;
};

}  // namespace tandem::transports
