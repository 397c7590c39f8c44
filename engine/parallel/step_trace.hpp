#pragma once
// Where a rank's training time goes, and (optionally) a Chrome trace of it.
//
// The time split of a step:
//   compute  -- forward, backward, loss, optimizer, gradient (de)compression: the rank is busy;
//   bubble   -- blocked receiving activations or gradients from a neighbouring stage (pipeline fill,
//               drain and imbalance; includes the transfer itself, which on one host is short);
//   comm     -- exposed communication: blocked on data-parallel all-reduces, on sends still in
//               flight at the end of the step, and on the small collectives of clipping;
//   data     -- blocked waiting for the loader;
//   other    -- the rest of the step's wall time (bookkeeping).
// allreduce_ns is the all-reduces' own time (first issue to last completion, per bucket, without the
// gaps between them): with overlap, comm is the part of it that backward could not hide.
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace tandem::engine::parallel {

struct TimeSplit {
  int64_t steps = 0;
  int64_t step_ns = 0;
  int64_t compute_ns = 0;
  int64_t bubble_ns = 0;
  int64_t comm_ns = 0;
  int64_t data_ns = 0;
  int64_t allreduce_ns = 0;
  int64_t other_ns() const noexcept { return step_ns - compute_ns - bubble_ns - comm_ns - data_ns; }
  TimeSplit& operator+=(const TimeSplit& o) noexcept;
};

// Chrome trace "complete" events (ph "X"), times in ns since the tracer's zero.
struct TraceEvent {
  std::string name;
  const char* category = "";  // compute, bubble, comm, send, recv, allreduce, data, optimizer
  int64_t start_ns = 0;
  int64_t dur_ns = 0;
  int32_t tid = 0;            // 0: the training thread; 1: all-reduces as the communicator runs them
};

class Tracer {
 public:
  using Clock = std::chrono::steady_clock;
  explicit Tracer(bool enabled = false) : enabled_(enabled), zero_(Clock::now()) {}

  bool enabled() const noexcept { return enabled_; }
  // Times are taken against a zero that every rank resets right after a common barrier, so that
  // traces of different processes line up.
  void reset_zero() { zero_ = Clock::now(); }
  int64_t now_ns() const { return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - zero_).count(); }
  void add(std::string name, const char* category, int64_t start_ns, int64_t end_ns, int32_t tid = 0);
  const std::vector<TraceEvent>& events() const noexcept { return events_; }
  size_t dropped() const noexcept { return dropped_; }

  // This rank's events as a JSON array body (no brackets): {"name":..,"ph":"X","pid":rank,...},...
  std::string to_json(int rank, const std::string& process_name) const;

 private:
  static constexpr size_t kMaxEvents = 2'000'000;  // bounded memory; later events are counted, not kept
  bool enabled_;
  Clock::time_point zero_;
  std::vector<TraceEvent> events_;
  size_t dropped_ = 0;
};

// Writes {"traceEvents": [...], "displayTimeUnit": "ms"} from per-rank JSON bodies (Tracer::to_json).
// Throws kIo naming the file when it cannot be written.
void write_chrome_trace(const std::string& path, const std::vector<std::string>& rank_bodies);

}  // namespace tandem::engine::parallel
