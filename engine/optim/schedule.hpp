#pragma once
// Learning-rate schedules as pure functions of the optimizer step (0-based count of updates taken), so resuming
// needs only the step count: constant, step decay, cosine annealing, each with an optional linear warm-up.
#include <cstdint>
#include <string>
#include <string_view>

namespace tandem::engine::optim {

enum class ScheduleKind : int32_t { kConstant = 0, kStep = 1, kCosine = 2 };

struct ScheduleConfig {
  ScheduleKind kind = ScheduleKind::kConstant;
  float base_lr = 0.01f;
  int64_t warmup_steps = 0;  // lr ramps linearly: base * (step + 1) / warmup_steps for step < warmup_steps
  int64_t step_size = 1;     // step decay: multiply by gamma every step_size steps (after warm-up)
  float gamma = 0.1f;
  int64_t total_steps = 1;   // cosine: reaches min_lr at total_steps
  float min_lr = 0.0f;
  void validate() const;     // throws kInvalidArgument naming the field
};

// The learning rate for the update numbered `step` (0 = first update).
float lr_at(const ScheduleConfig& s, int64_t step);

// Parses "constant", "step:S:G" (every S epochs multiply by G), "cosine" (over the run), each optionally followed by
// ",warmup:E" (epochs); epochs convert to steps with steps_per_epoch. Throws kInvalidArgument naming the part.
ScheduleConfig parse_schedule(std::string_view text, float base_lr, int64_t steps_per_epoch, int64_t total_epochs);

}  // namespace tandem::engine::optim
