#pragma once
// Optimizers over flat parameter buffers (one per layer, or a stage's slice): SGD (momentum, Nesterov, weight
// decay, dampening) and Adam / AdamW with PyTorch's semantics, executed by the backend's fused update kernels.
// State (momentum or Adam moments, step count) is saved and restored as plain tensors.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/compute/backend.hpp"

namespace tandem::engine::optim {

enum class OptimizerKind : int32_t { kSgd = 0, kAdam = 1, kAdamW = 2 };
std::string_view optimizer_name(OptimizerKind k) noexcept;
OptimizerKind parse_optimizer(std::string_view s);  // "sgd", "adam", "adamw"; kInvalidArgument otherwise

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::kSgd;
  float lr = 0.01f;            // the base rate; schedules scale it per step
  float momentum = 0.0f;       // sgd
  float dampening = 0.0f;      // sgd
  bool nesterov = false;       // sgd (needs momentum > 0 and dampening 0)
  float weight_decay = 0.0f;   // sgd/adam: L2 in the gradient; adamw: decoupled
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;  // adam/adamw
  void validate() const;       // throws kInvalidArgument naming the field
};

// f32 state tensors the Optimizer keeps per parameter buffer: SGD 0, with momentum 1, Adam/AdamW 2 (m, v). The
// Optimizer allocates by it; the memory guard (engine/train) and the job compiler count its bytes by it.
int state_tensors_per_param(const OptimizerConfig& c) noexcept;
// Bytes of that state per parameter: 4 x state_tensors_per_param.
inline double state_bytes_per_param(const OptimizerConfig& c) noexcept { return 4.0 * state_tensors_per_param(c); }

class Optimizer {
 public:
  // `params` are flat plain f32 buffers on the backend's device (their storage is updated in place).
  Optimizer(compute::Backend& backend, OptimizerConfig config, std::vector<Tensor> params);

  // One update with learning rate `lr` (from the schedule); grads[i] matches params[i]. Buffers with no elements
  // are skipped.
  void step(const std::vector<Tensor>& grads, float lr);
  int64_t steps() const noexcept { return steps_; }
  const OptimizerConfig& config() const noexcept { return config_; }
  const std::vector<Tensor>& params() const noexcept { return params_; }

  // State: the step count and, per parameter buffer, its state tensors (sgd with momentum: 1, adam: 2, else 0),
  // flattened in order: buffer 0's, then buffer 1's, ...
  std::vector<Tensor> state_tensors() const;
  // Restores the step count and copies values into the state tensors (shapes must match state_tensors()).
  void restore(int64_t steps, const std::vector<Tensor>& state);

 private:
  compute::Backend& backend_;
  OptimizerConfig config_;
  std::vector<Tensor> params_;
  std::vector<Tensor> state1_, state2_;  // momentum or Adam m; Adam v
  int64_t steps_ = 0;
};

// Scales every gradient by max_norm / (norm + 1e-6) when their global L2 norm exceeds max_norm (PyTorch's
// clip_grad_norm_); returns the norm before clipping.
double clip_grad_norm(compute::Backend& backend, std::vector<Tensor>& grads, double max_norm);

}  // namespace tandem::engine::optim
