#pragma once
// Calibration: what one training step of a model costs on this machine, measured with the real compute
// backend, in the terms the simulator prices a job with (simulator/compute/profile.hpp): per layer the
// forward and backward time for `batch` samples, and one optimizer step over all parameters.
//
// How: each layer runs on its own (Model::forward_range / backward_range over [i, i + 1), chained the way a
// pipeline of one-layer stages would run them), timed separately, `iters` times after `warmup`; the median of
// each layer is its share. Per-layer timing misses what a whole step pays between layers, and a CPU quota
// (a cgroup, an emulated host) throttles a long step but rarely a short layer, so the layer medians are then
// scaled to the whole step: forward + loss + backward + optimizer of the whole model, timed `iters` times,
// whose MEAN (the sustained cost, throttling included; the middle 80% from 10 iterations on, so that a few
// steps preempted on a shared machine do not count) is what the scaled layers and optimizer add up to.
// The loss (softmax cross-entropy) is charged to the last layer's forward, where the trainer runs it.
// The model's parameters, gradients and batch-norm statistics are restored afterwards.
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "engine/nn/model.hpp"
#include "engine/optim/optimizer.hpp"

namespace tandem::engine::train {

struct CalibrationOptions {
  int64_t batch = 64;  // samples per pass (the simulator scales linearly from here: calibrate at the
                       // micro-batch size a pipeline will run for the best figures)
  int warmup = 2;      // untimed passes first (the backend builds its primitives there)
  int iters = 10;      // timed passes
  optim::OptimizerConfig optimizer{optim::OptimizerKind::kSgd, 0.01f, 0.9f};  // `tandem train`'s default
  bool scale_to_step = true;  // scale layer medians so they add up to the whole step's mean
  uint64_t seed = 0;          // synthetic inputs and labels
  // The per-sample cost curve: whole forward + loss + backward passes also timed at these batch sizes (each
  // >= 1; `batch` itself is always a point), so the simulator prices a micro-batch of m samples by what m
  // costs here, not by m/batch of the full pass (small batches cost more per sample: fixed per-layer work).
  std::vector<int64_t> curve_batches;
  // The CFS quota, in cores, of the measuring process (0: none). Below the backend's threads, the whole steps and
  // the curve's passes are timed by the CPU time they use over the quota, not by the clock (calibrate_model).
  double cpu_quota = 0;
  // Called once the passes at `batch` (whole steps and layer by layer) ran, before the curve's other batch sizes:
  // the process then holds what a training step at `batch` leaves behind (tandem_calibrate's runtime figure).
  std::function<void()> after_batch_passes;
  // Around `peak_steps` more whole training steps at `batch` (forward, loss, backward, optimizer, as the trainer runs
  // them), run after after_batch_passes when both hooks are set: the caller measures what the steps add to the
  // process's resident size at their peak (tandem_calibrate's activation_peak_bytes). Their times are not kept.
  // They train on an input batch made after before_peak_steps, so that peak holds it, as a training process holds
  // the batch it trains on beside its activations (and the job compiler counts it with them; issue #16: without it
  // mlp's prediction at batch 128 fell short by that batch, 0.38 MiB). Then the same at each of `peak_batches` (other batch sizes, each >= 1; `batch` itself is skipped), each after
  // one untimed step at that batch outside the hooks (the backend builds that shape's primitives there: runtime,
  // not the step's peak). The hooks get the batch the steps between them run (tandem_calibrate's
  // activation_peak_curve: a peak has a part that does not grow with the batch, which one batch cannot tell).
  std::function<void(int64_t batch)> before_peak_steps, after_peak_steps;
  int peak_steps = 3;
  std::vector<int64_t> peak_batches;
  // Around the first step at each batch size other than `batch` -- those of peak_batches (before their peak steps)
  // and then those of `shape_batches` (one step each, after every peak) -- when both are set: the backend builds that
  // shape's primitives there (oneDNN's kernels, scratchpads, reordered weights), and the caller measures what they
  // keep resident (tandem_calibrate's primitive_bytes_curve: what one more batch shape costs, so the simulator can
  // charge an epoch's short last batch and the primitives of a batch other than the calibrated one; issue #16).
  std::function<void(int64_t batch)> before_new_shape, after_new_shape;
  std::vector<int64_t> shape_batches;
  void validate() const;      // kInvalidArgument naming the field
};

struct LayerTime {
  std::string name;
  double forward_s = 0, backward_s = 0;  // for `batch` samples
};

struct Calibration {
  std::string model, backend;
  nn::SampleShape input;
  int64_t batch = 0;
  int threads = 0;
  int warmup = 0, iters = 0;
  std::string optimizer;        // the simulator's names: "sgd", "momentum" or "adam"
  std::vector<LayerTime> layers;
  double optimizer_step_s = 0;  // one update of every parameter
  // Checks on the method, kept for the record: the whole step (mean, and its spread), and the sum of the
  // unscaled per-layer medians plus the optimizer median it was scaled from (scale = step / that).
  double step_mean_s = 0, step_median_s = 0, step_min_s = 0, step_max_s = 0;
  double unscaled_sum_s = 0;
  double scale = 1;
  // How much the whole forward + loss + backward pass varies from pass to pass here: the sample standard deviation
  // of the timed passes' wall times over their mean (0 with fewer than 2 passes). The profile's compute_cv.
  double pass_cv = 0;
  // The same over the passes' process CPU time (every thread), which a CFS quota does not stretch: under a quota the
  // wall times vary by where each pass falls in the quota's on/off windows, which the simulator models itself.
  double pass_cpu_cv = 0;
  // Under a CFS quota (CalibrationOptions::cpu_quota > 0): the cores the process sustained over its timed passes --
  // their process CPU time over their wall time, every pass back to back -- which is the quota where the kernel
  // delivers it and less where the host's cores are oversubscribed (several quota'd hosts and other work on fewer
  // cores). 0 without a quota. The profile's cpu_quota_sustained.
  double sustained_cores = 0;
  // (batch, median seconds of forward + loss + backward at that batch), ascending by batch, `batch` included
  // (empty unless curve_batches asked for more points).
  std::vector<std::pair<int64_t, double>> batch_curve;

  double forward_s() const;   // sum over layers
  double backward_s() const;
};

// Measures `model` on its backend with synthetic data (the input shape and class count of its spec).
// Throws kInvalidArgument for bad options, kBackend for backend failures.
Calibration calibrate_model(nn::Model& model, const CalibrationOptions& options);

// The simulator's optimizer name for an optimizer configuration: sgd without momentum "sgd", with momentum
// "momentum", adam and adamw "adam" (same state size).
std::string simulator_optimizer_name(const optim::OptimizerConfig& c);

}  // namespace tandem::engine::train
