#pragma once
// The CPU of one node as the event core sees it when the node is time-shared or quota-limited:
//  - cores shared by time slicing: `cores` cores, each task (a rank's training thread or its
//    collective thread while it computes) runs on at most `task_cores` of them; with A tasks running,
//    each gets min(1, cores / (A x task_cores)) of its full speed (the OS scheduler's fair share);
//  - a CFS quota (cgroup cpu.cfs_quota_us / cpu.max): the node may use quota_cores x period of CPU
//    time in each period (periods aligned to time 0); once that is spent every task stops until the
//    period ends. Simulated as on/off windows, so a phase shorter than the quota runs at full speed
//    and a long phase averages quota_cores / cores in use.
// Tasks are given as work in seconds at full speed; when one is done the model calls
// handler->on_event(arg) with the caller's own event argument. Rates change only at task starts and
// ends, window ends and period starts, so a task's completion is exact to the nanosecond.
#include <cstdint>
#include <utility>
#include <vector>

#include "simulator/des/simulator.hpp"

namespace tandem::simulator {

struct CpuShare {
  double cores = 1;           // cores of the node
  double task_cores = 1;      // cores one task can use (a rank on a node of `cores` with R ranks: max(1, cores / R))
  double quota_cores = 0;     // CFS quota in cores (0: none)
  double period_s = 0.1;      // CFS period (the kernel's default is 100 ms)
  // Co-run contention (the profile's corun_slowdown): (runnable tasks per core, CPU seconds per unit of work
  // relative to a task alone), ascending; empty: none. With A >= 2 tasks running, each compute task runs
  // slowdown(A / cores) times slower besides its fair share: caches, memory bandwidth and context switches shared.
  // The table is measured on model passes, so it applies to compute only: a task started as not contended (a
  // copy, a reduction, a transfer's CPU) runs at its fair share. Applied to those too, it over-predicted the
  // emulated 4r2c all-reduces of 4 and 16 MiB by 28% and 66% (bench/emu run 12).
  std::vector<std::pair<double, double>> corun;
  // A woken receiver's wait for a core held by another runnable rank (the profile's wakeup_latency_s), paid by a
  // message to a blocked rank of a node with more ranks than cores (the step executor); 0: none.
  double wakeup_s = 0;
  bool shared() const noexcept { return quota_cores > 0; }
  // The co-run slow-down of `tasks` tasks running at once: 1 for one task or an empty table, else the table
  // interpolated linearly at tasks / cores, held at its ends (and never below 1 before its first point).
  double slowdown(int32_t tasks) const noexcept;
  // Whether `tasks` tasks at once can ever run slower than alone (else the plain model is exact).
  bool needs_model(int32_t tasks) const noexcept {
    return shared() || tasks * task_cores > cores || slowdown(tasks) != 1.0;
  }
};

class NodeCpu final : public des::EventHandler {
 public:
  NodeCpu(des::Simulator& sim, const CpuShare& share);
  NodeCpu(const NodeCpu&) = delete;
  NodeCpu& operator=(const NodeCpu&) = delete;

  // Runs `work_s` seconds of full-speed work; handler->on_event(arg) when it is done. `contended`: whether the
  // co-run table slows it (compute), or only the fair share does (copies, reductions, a transfer's CPU).
  void start(double work_s, des::EventHandler* handler, uint64_t arg, bool contended = true);
  // Stops the task started with (handler, arg), if it still runs: its event never comes, and the others get its
  // share from now. Returns whether there was one.
  bool cancel(des::EventHandler* handler, uint64_t arg);
  size_t running() const noexcept { return tasks_.size(); }
  // CPU seconds the node has used so far (for tests).
  double cpu_seconds() const noexcept { return cpu_s_; }

  void on_event(uint64_t gen) override;

 private:
  struct Task {
    double remaining_s;
    des::EventHandler* handler;
    uint64_t arg;
    bool contended;
  };
  void settle();
  void reschedule();
  double rate() const;        // each task's fair share of full speed while the node may run
  double rate(const Task& t) const;  // that over the co-run slow-down where it applies to t
  double cores_in_use() const;

  des::Simulator& sim_;
  CpuShare share_;
  double budget_s_ = 0;       // CPU seconds of quota per period
  std::vector<Task> tasks_;
  des::TimeNs last_ = 0;
  int64_t period_ = 0;        // index of the period `used_s_` belongs to
  double used_s_ = 0;         // quota spent in that period
  double cpu_s_ = 0;
  uint64_t gen_ = 0;
};

}  // namespace tandem::simulator
