#pragma once
// Polling before blocking, for transport cores whose waiters otherwise sleep in poll(): while
// messages flow (one arrived within kSpinWindow) a waiter drives progress, yielding the CPU
// between polls, for up to its spin time before it blocks -- a blocked thread pays a wake-up per
// message (on a VM an inter-processor interrupt to a halted vCPU). Long waits (a pipeline stage
// waiting for activations) block at once and burn no CPU.
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>

namespace tandem::transports {

inline constexpr auto kDefaultSpin = std::chrono::microseconds(100);
inline constexpr auto kSpinWindow = std::chrono::milliseconds(1);

// The spin time from `var` (microseconds in [0, 1e6]; unset: kDefaultSpin). Throws
// kInvalidArgument naming the variable for anything else.
std::chrono::microseconds spin_from_env(const char* var);

class Spinner {
 public:
  explicit Spinner(std::chrono::microseconds spin) : spin_(spin) {}
  void note_arrival() noexcept {
    last_arrival_ns_.store(std::chrono::steady_clock::now().time_since_epoch().count(), std::memory_order_relaxed);
  }
  // Drives progress() once, then -- while messages flow -- keeps driving it, yielding, until news()
  // changes or the spin time (at most `timeout`) is over. Returns whether news() changed.
  template <typename Progress, typename News>
  bool spin(Progress&& progress, News&& news, std::chrono::microseconds timeout) {
    const uint64_t seen = news();
    progress();
    const auto now = std::chrono::steady_clock::now();
    const int64_t since = now.time_since_epoch().count() - last_arrival_ns_.load(std::memory_order_relaxed);
    if (spin_.count() == 0 || since > std::chrono::nanoseconds(kSpinWindow).count()) return news() != seen;
    const auto until = now + std::min(spin_, timeout);
    while (news() == seen && std::chrono::steady_clock::now() < until) {
      sched_yield();
      progress();
    }
    return news() != seen;
  }

 private:
  const std::chrono::microseconds spin_;
  std::atomic<int64_t> last_arrival_ns_{0};
};

}  // namespace tandem::transports
