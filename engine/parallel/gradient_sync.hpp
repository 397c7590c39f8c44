#pragma once
// What a stage executor drives around the gradients of a step's last backward pass: DDP's bucket all-reduce
// (GradientReducer) or a parameter server's push and pull (ParameterServerSync). While armed, the model's grad-ready
// hook issues each bucket as soon as backward has completed it; finish() completes what is still running before the
// optimizer step.
#include <cstdint>

namespace tandem::engine::parallel {

class GradientSync {
 public:
  virtual ~GradientSync() = default;
  // While armed, the grad-ready hook issues each bucket as soon as it is complete.
  virtual void arm(bool armed) noexcept = 0;
  // Issues bucket b unless it already is (kAllreduceBucket ops of a plan).
  virtual void issue(int bucket) = 0;
  // Issues every bucket not yet issued, waits for all, leaves the step's result in the model and disarms. Returns
  // the nanoseconds spent blocked (exposed communication).
  virtual int64_t finish() = 0;
  // Communication time of the last finish() (for the overlap figure and the trace).
  virtual int64_t last_allreduce_ns() const noexcept = 0;
};

}  // namespace tandem::engine::parallel
