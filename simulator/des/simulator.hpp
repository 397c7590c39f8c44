#pragma once
// Discrete-event core: an integer-nanosecond clock and a binary-heap event queue. Events at the same
// time run in the order they were scheduled (a sequence number breaks ties), so a run is
// reproducible to the bit for the same inputs. Events carry a handler pointer and a 64-bit argument
// instead of a closure: no allocation per event, which keeps the core at millions of events per
// second on one core.
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace tandem::simulator::des {

using TimeNs = int64_t;
constexpr TimeNs kNever = std::numeric_limits<TimeNs>::max();

// Seconds <-> nanoseconds. to_ns rounds to the nearest nanosecond; durations computed from rates use
// ceil_ns so that work is never declared done before it is.
TimeNs to_ns(double seconds);
TimeNs ceil_ns(double seconds);
inline double to_seconds(TimeNs t) { return static_cast<double>(t) * 1e-9; }

class EventHandler {
 public:
  virtual void on_event(uint64_t arg) = 0;

 protected:
  ~EventHandler() = default;
};

// Called once whenever every event of the current instant has run and the clock is about to move
// on (or the queue has drained). The network model uses it to recompute rates once per instant
// instead of once per event. A hook may schedule events, including at the current instant.
class InstantHook {
 public:
  virtual void on_instant_end() = 0;

 protected:
  ~InstantHook() = default;
};

class Simulator {
 public:
  Simulator() = default;
  Simulator(const Simulator&) = delete;
  Simulator& operator=(const Simulator&) = delete;

  TimeNs now() const noexcept { return now_; }
  // Schedules handler->on_event(arg) at absolute time t (t >= now(); an earlier t is an error).
  void schedule_at(TimeNs t, EventHandler* handler, uint64_t arg);
  void schedule_in(TimeNs delay, EventHandler* handler, uint64_t arg) { schedule_at(now_ + delay, handler, arg); }
  void add_instant_hook(InstantHook* hook) { hooks_.push_back(hook); }

  // Runs until the queue is empty or the next event lies after `until`; returns the events run.
  uint64_t run(TimeNs until = kNever);
  bool empty() const noexcept { return heap_.empty(); }
  size_t pending() const noexcept { return heap_.size(); }
  uint64_t events_processed() const noexcept { return processed_; }

 private:
  struct Entry {
    TimeNs time;
    uint64_t seq;
    EventHandler* handler;
    uint64_t arg;
  };
  static bool before(const Entry& a, const Entry& b) noexcept {
    return a.time < b.time || (a.time == b.time && a.seq < b.seq);
  }
  void push(const Entry& e);
  Entry pop();
  void end_instant();

  std::vector<Entry> heap_;
  std::vector<InstantHook*> hooks_;
  TimeNs now_ = 0;
  uint64_t next_seq_ = 0;
  uint64_t processed_ = 0;
};

}  // namespace tandem::simulator::des
