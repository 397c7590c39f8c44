#include "simulator/compute/node_cpu.hpp"

#include <algorithm>
#include <limits>
#include <cmath>

#include "engine/core/error.hpp"

namespace tandem::simulator {

namespace {
// Work below this is done (a nanosecond at full speed): rounding of ns times must not leave a
// task with a remainder that would need another event.
constexpr double kDoneS = 1e-9;
}  // namespace

double CpuShare::slowdown(int32_t tasks) const noexcept {
  if (corun.empty() || tasks < 2) return 1.0;
  const double x = static_cast<double>(tasks) / cores;
  if (x <= corun.front().first) return std::max(1.0, corun.front().second);
  if (x >= corun.back().first) return corun.back().second;
  const auto hi = std::lower_bound(corun.begin(), corun.end(), x, [](const auto& p, double v) { return p.first < v; });
  const auto lo = hi - 1;
  return lo->second + (hi->second - lo->second) * (x - lo->first) / (hi->first - lo->first);
}

NodeCpu::NodeCpu(des::Simulator& sim, const CpuShare& share) : sim_(sim), share_(share) {
  TANDEM_REQUIRE(share.cores > 0 && std::isfinite(share.cores), "node CPU: cores must be > 0, got {}", share.cores);
  TANDEM_REQUIRE(share.task_cores > 0 && share.task_cores <= share.cores,
                 "node CPU: a task's cores must be in (0, {}], got {}", share.cores, share.task_cores);
  TANDEM_REQUIRE(share.quota_cores >= 0 && share.quota_cores <= share.cores,
                 "node CPU: quota must be in [0, {}] cores, got {}", share.cores, share.quota_cores);
  TANDEM_REQUIRE(share.period_s > 0 && std::isfinite(share.period_s), "node CPU: period must be > 0 s, got {}",
                 share.period_s);
  for (size_t i = 0; i < share.corun.size(); ++i)
    TANDEM_REQUIRE(share.corun[i].first > 0 && share.corun[i].second > 0 &&
                       (i == 0 || share.corun[i].first > share.corun[i - 1].first),
                   "node CPU: co-run point {} ({} tasks per core, slow-down {}) must be > 0 and ascend", i,
                   share.corun[i].first, share.corun[i].second);
  TANDEM_REQUIRE(share.wakeup_s >= 0 && std::isfinite(share.wakeup_s), "node CPU: wake-up latency must be >= 0 s, got {}",
                 share.wakeup_s);
  budget_s_ = share.quota_cores * share.period_s;
  last_ = sim.now();
}

double NodeCpu::rate() const {
  if (tasks_.empty()) return 0;
  return std::min(1.0, share_.cores / (static_cast<double>(tasks_.size()) * share_.task_cores));
}

double NodeCpu::rate(const Task& t) const {
  // no co-run table, or a task it does not apply to: the fair share alone
  if (share_.corun.empty() || !t.contended) return rate();
  return rate() / share_.slowdown(static_cast<int32_t>(tasks_.size()));
}

double NodeCpu::cores_in_use() const {
  return std::min(share_.cores, static_cast<double>(tasks_.size()) * share_.task_cores);
}

// Brings every task and the quota to now. While tasks run, an event falls on every period start
// (reschedule), so the interval since the last call lies within one period (now may be its end).
void NodeCpu::settle() {
  const des::TimeNs now = sim_.now();
  if (now == last_) return;
  double run_s = des::to_seconds(now - last_);
  const double use = cores_in_use();
  if (share_.shared()) {
    if (use > 0) run_s = std::min(run_s, std::max(0.0, (budget_s_ - used_s_) / use));
    used_s_ += use * run_s;
    const int64_t p = now / des::to_ns(share_.period_s);
    if (p != period_) {
      period_ = p;
      used_s_ = 0;
    }
  }
  for (Task& t : tasks_) t.remaining_s -= rate(t) * run_s;
  cpu_s_ += use * run_s;
  last_ = now;
}

void NodeCpu::start(double work_s, des::EventHandler* handler, uint64_t arg, bool contended) {
  TANDEM_REQUIRE(work_s >= 0 && std::isfinite(work_s), "node CPU: work must be finite and >= 0 s, got {}", work_s);
  settle();
  tasks_.push_back({work_s, handler, arg, contended});
  reschedule();
}

bool NodeCpu::cancel(des::EventHandler* handler, uint64_t arg) {
  const auto it = std::find_if(tasks_.begin(), tasks_.end(), [&](const Task& t) { return t.handler == handler && t.arg == arg; });
  if (it == tasks_.end()) return false;
  settle();
  tasks_.erase(it);
  reschedule();
  return true;
}

// The next instant something changes: the first task done, the quota spent, or (quota spent) the
// next period's start.
void NodeCpu::reschedule() {
  ++gen_;
  if (tasks_.empty()) return;
  const des::TimeNs now = sim_.now();
  double first_s = std::numeric_limits<double>::infinity();  // the first task done, at the rates of now
  for (const Task& t : tasks_) first_s = std::min(first_s, std::max(0.0, t.remaining_s) / rate(t));
  des::TimeNs at = now + des::ceil_ns(first_s);
  if (share_.shared()) {
    const des::TimeNs period_ns = des::to_ns(share_.period_s);
    const des::TimeNs period_end = (now / period_ns + 1) * period_ns;
    const double left = budget_s_ - used_s_;
    if (left <= kDoneS * cores_in_use()) {
      at = period_end;  // off until the quota refills
    } else {
      at = std::min({at, now + des::ceil_ns(left / cores_in_use()), period_end});
    }
  }
  sim_.schedule_at(at, this, gen_);
}

void NodeCpu::on_event(uint64_t gen) {
  if (gen != gen_) return;  // superseded by a later change
  settle();
  // Tasks done now leave in start order; their handlers may start new tasks (re-entering start()).
  std::vector<Task> done;
  for (size_t i = 0; i < tasks_.size();) {
    if (tasks_[i].remaining_s <= kDoneS) {
      done.push_back(tasks_[i]);
      tasks_.erase(tasks_.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
  reschedule();
  for (const Task& t : done) t.handler->on_event(t.arg);
}

}  // namespace tandem::simulator
