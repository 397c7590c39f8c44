#pragma once
// What a rank woken by a message waits for a core its peers hold (the profile's wakeup_latency_s,
// simulator/compute/profile.hpp; charged by simulator/step.cpp to every message that reaches a blocked receiver on a
// node with more ranks than cores).
//
// Rank-like threads in a ring: each computes a burst of `burst_s` CPU seconds, sends a time-stamped message to the
// next one (a pipe) and blocks until the previous one's arrives. A message that reaches a receiver already blocked
// is a wake-up; its latency is the wall time from the write to the receiver running again. With more threads than
// CPUs the woken one finds the CPUs taken by peers in their bursts, which -- unlike a pure spinner -- have slept,
// woken and used up their share of the CPU as ranks do (a kernel's EEVDF scheduler lets a freshly woken thread
// preempt a spinner at once, so a spinner measures ~0). The same ring with one thread per CPU, placed by the same
// rules, is the baseline: what a wake-up costs where ranks do not outnumber cores (the simulator's message latency
// and fair sharing hold that already).
#include <cstdint>
#include <functional>
#include <vector>

namespace tandem::engine::train {

struct WakeupRingOptions {
  int ranks = 4;          // threads in the ring (>= 2)
  std::vector<int> cpus;  // CPUs every thread may run on (unpinned among them, as `tandem launch`'s ranks);
                          // empty: wherever the caller's affinity allows
  double burst_s = 1e-3;  // CPU seconds of work between messages (thread CPU time: preemption does not shorten it)
  double window_s = 0.3;  // wall seconds the ring runs (each thread at least 2 rounds)
  // Optional: a counter that moves when the CPU quota throttled the cgroup (cpu.stat nr_throttled); a wake-up during
  // which it moved is left out, so that a quota's pauses are not counted as waits for a core.
  std::function<long()> throttles;
};

struct WakeupSamples {
  std::vector<double> latency_s;  // one per wake-up kept, wall seconds from the write to the receiver running
  int64_t messages = 0;           // every message received (wake-ups or not)
  int64_t throttled = 0;          // wake-ups left out because the counter moved
};

// Runs the ring once. Throws kIo naming the call when a pipe or thread cannot be made, or a message is not
// received within 10 s (a thread that never runs again).
WakeupSamples sample_wakeups(const WakeupRingOptions& o);

// The figure the simulator takes from repeated measurements: per repetition, the mean latency of the shared ring
// less the mean of the baseline ring (the wait for a core, per wake-up); the median over the repetitions (a
// repetition disturbed by the machine's other work does not move it), never below 0. Repetitions with no samples on
// either side are skipped; none left: 0. Throws kInvalidArgument when the two lists differ in length.
double wakeup_wait_s(const std::vector<std::vector<double>>& shared, const std::vector<std::vector<double>>& alone);

// The mean of `v` (0 when empty).
double mean_of(const std::vector<double>& v);

}  // namespace tandem::engine::train
