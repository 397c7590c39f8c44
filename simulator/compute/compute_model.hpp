#pragma once
// Per-layer compute time on one rank. Two sources:
//  - roofline: time = max(FLOPs / (peak x efficiency), bytes / memory bandwidth) + a fixed per-layer
//    overhead (GPU kernel launches), from the layer specs and the node's preset;
//  - a calibration profile of times measured on the target machine (profile.hpp), scaled linearly in
//    the number of samples -- or, when the profile carries a batch_curve, by the measured cost of that
//    many samples (the whole pass's curve, interpolated between its points, shared by every layer).
// Either can be scaled by one factor (set_scale), which is how --epoch-time-s calibrates with one
// measured number.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "simulator/compute/profile.hpp"
#include "simulator/compute/workload.hpp"
#include "simulator/presets.hpp"

namespace tandem::simulator {

enum class OptimizerKind : uint8_t { kSgd = 0, kMomentum = 1, kAdam = 2 };
OptimizerKind parse_optimizer(const std::string& s);  // "sgd", "momentum", "adam" ("adamw" = adam)
const char* optimizer_name(OptimizerKind k) noexcept;

class ComputeModel {
 public:
  static ComputeModel roofline(const Workload& w, const Preset& hw, OptimizerKind opt);
  // Throws kInvalidArgument when the profile's layers do not match the workload's (names the first).
  static ComputeModel from_profile(const Workload& w, const CalibrationProfile& p);

  double forward_s(size_t first, size_t end, int64_t samples) const;
  double backward_s(size_t first, size_t end, int64_t samples) const;
  double optimizer_s(size_t first, size_t end) const;  // one update of the layers' parameters
  void set_scale(double s) { scale_ = s; }
  double scale() const noexcept { return scale_; }
  const char* source() const noexcept { return source_; }
  // Per-sample cost of `samples` relative to the profile's batch (1 without a batch_curve): what a pass of
  // `samples` costs over samples/batch of the profile's pass. Below the curve's first point its per-sample
  // cost holds; between points the pass time is interpolated linearly; above the last, its per-sample cost.
  double batch_factor(int64_t samples) const;

 private:
  struct Coef {
    double per_sample_s = 0;  // compute-bound time per sample
    double bytes_per_sample_s = 0;  // memory-bound time per sample
    double fixed_s = 0;       // per pass, whatever the batch (weights streamed once, launches)
  };
  static double eval(const Coef& c, int64_t samples);
  std::vector<Coef> fwd_, bwd_;
  std::vector<double> opt_;
  std::vector<std::pair<double, double>> curve_;  // (batch, pass seconds), ascending; empty: linear
  double curve_ref_per_sample_s_ = 0;              // the curve's per-sample cost at the profile's batch
  double scale_ = 1.0;
  const char* source_ = "roofline";
};

}  // namespace tandem::simulator
