#pragma once
// Loss scaling for fp16 training (issue #14): the loss gradient is multiplied by a scale S before backward, so that
// gradients too small for IEEE half (below 2^-24) survive the fp16 convolutions and GEMMs; the gradients are divided
// by S again before clipping and the optimizer, which update the f32 master weights. A step whose gradients hold an
// inf or NaN (S too large: fp16 overflowed) is skipped -- no optimizer update -- and the scale backs off.
//
// Dynamic scaling follows PyTorch's torch.amp.GradScaler: start at `init` (65536), multiply by `backoff` (0.5) after
// a non-finite step, and by `growth` (2) after `growth_interval` (2000) finite steps in a row. A fixed scale
// (kFixed) never changes, but still skips non-finite steps.
//
// Device-agnostic: the check is the backend's sum_squares of the unscaled gradients (f64 accumulation on every
// backend; inf or NaN in any element makes it non-finite). Across ranks the decision must be one: a caller with
// several ranks passes an `agree` that combines the local flags over every rank of the job (ParallelTrainer: one
// all-reduce over the whole world, the step program's kAgreeFinite), so no rank steps while another skips.
#include <cstdint>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/compute/backend.hpp"

namespace tandem::engine::train {

struct LossScaleConfig {
  enum class Mode : int32_t { kOff = 0, kFixed = 1, kDynamic = 2 };
  Mode mode = Mode::kOff;
  double scale = 1.0;              // kFixed: the scale (> 0, finite)
  double init = 65536.0;           // kDynamic: the first scale (> 0, finite)
  double growth = 2.0;             // kDynamic: > 1
  double backoff = 0.5;            // kDynamic: in (0, 1)
  int64_t growth_interval = 2000;  // kDynamic: finite steps in a row before growth, >= 1
  bool enabled() const noexcept { return mode != Mode::kOff; }
  // Throws kInvalidArgument naming the field and the value.
  void validate() const;
  // "dynamic (init 65536, growth 2 every 2000 steps, backoff 0.5)", "fixed 128", "off".
  std::string describe() const;
};

struct LossScaleState {
  double scale = 1.0;          // the scale the next step multiplies the loss gradient by
  int64_t growth_tracker = 0;  // finite steps since the last growth or back-off
  int64_t skipped = 0;         // steps skipped so far (non-finite gradients)
  bool last_skipped = false;   // the last step was skipped
};

class LossScaler {
 public:
  // Combines this rank's "found non-finite" flag with every other rank's and returns the job's (true: skip).
  using Agree = std::function<bool(bool local_nonfinite)>;

  explicit LossScaler(LossScaleConfig c);
  const LossScaleConfig& config() const noexcept { return config_; }
  bool enabled() const noexcept { return config_.enabled(); }
  // The factor for the loss gradient (1 when off).
  float scale() const noexcept { return enabled() ? static_cast<float>(state_.scale) : 1.0f; }

  // After backward, before clipping and the optimizer: divides `grads` (this rank's, flat f32) by the scale and
  // decides, with `agree` over the ranks (none: this rank alone), whether the step is taken; updates the scale.
  // Returns true when the optimizer should step. Sets *sum_squares (if non-null) to the unscaled gradients' local
  // sum of squares, which clipping can reuse. Off: returns true and leaves the gradients alone.
  bool unscale_and_update(compute::Backend& be, Tensor& grads, const Agree& agree = {},
                          double* sum_squares = nullptr);
  // The update rule alone (what unscale_and_update applies once the job agreed): true when the step is taken.
  bool update(bool found_nonfinite);

  const LossScaleState& state() const noexcept { return state_; }
  // Checkpoints: {"mode", "scale", "growth_tracker", "skipped"}. restore takes the scale and growth count when both
  // the checkpoint and this run scale dynamically (else this run's scale starts afresh) and the skipped count always;
  // damaged values throw kIo.
  nlohmann::json to_json() const;
  void restore(const nlohmann::json& j);

 private:
  LossScaleConfig config_;
  LossScaleState state_;
};

}  // namespace tandem::engine::train
