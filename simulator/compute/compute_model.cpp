#include "simulator/compute/compute_model.hpp"

#include <algorithm>

#include "engine/core/error.hpp"

namespace tandem::simulator {

OptimizerKind parse_optimizer(const std::string& s) {
  if (s == "sgd") return OptimizerKind::kSgd;
  if (s == "momentum" || s == "sgd-momentum" || s == "nesterov") return OptimizerKind::kMomentum;
  if (s == "adam" || s == "adamw") return OptimizerKind::kAdam;
  TANDEM_THROW(Status::kInvalidArgument, "unknown optimizer \"{}\" (sgd, momentum, adam)", s);
}

const char* optimizer_name(OptimizerKind k) noexcept {
  switch (k) {
    case OptimizerKind::kSgd: return "sgd";
    case OptimizerKind::kMomentum: return "momentum";
    case OptimizerKind::kAdam: return "adam";
  }
  return "?";
}

namespace {
// f32 bytes read and written per parameter by one fused update: w, g (+ m) (+ v), written w (+ m) (+ v)
double update_bytes_per_param(OptimizerKind k) {
  switch (k) {
    case OptimizerKind::kSgd: return 12;
    case OptimizerKind::kMomentum: return 20;
    case OptimizerKind::kAdam: return 28;
  }
  return 12;
}
}  // namespace

ComputeModel ComputeModel::roofline(const Workload& w, const Preset& hw, OptimizerKind opt) {
  TANDEM_REQUIRE(hw.peak_flops > 0 && hw.efficiency > 0 && hw.mem_bytes_per_s > 0,
                 "{}: roofline needs peak FLOP/s, efficiency and memory bandwidth > 0", hw.name);
  ComputeModel m;
  const double flops = hw.peak_flops * hw.efficiency;
  for (const LayerCost& l : w.layers) {
    // weights are streamed once per pass (gradients written once in backward)
    m.fwd_.push_back({l.fwd_flops / flops, l.fwd_bytes / hw.mem_bytes_per_s,
                      l.param_bytes / hw.mem_bytes_per_s + hw.kernel_overhead_s});
    m.bwd_.push_back({l.bwd_flops / flops, l.bwd_bytes / hw.mem_bytes_per_s,
                      2 * l.param_bytes / hw.mem_bytes_per_s + 2 * hw.kernel_overhead_s});
    const double params = l.param_bytes / 4;
    m.opt_.push_back(params > 0 ? params * update_bytes_per_param(opt) / hw.mem_bytes_per_s + hw.kernel_overhead_s
                                : 0.0);
  }
  return m;
}

ComputeModel ComputeModel::from_profile(const Workload& w, const CalibrationProfile& p) {
  TANDEM_REQUIRE(p.layers.size() == w.layers.size(), "calibration profile has {} layers but model {} has {}",
                 p.layers.size(), w.model, w.layers.size());
  TANDEM_REQUIRE(p.batch >= 1, "calibration profile batch must be >= 1");
  ComputeModel m;
  m.source_ = "profile";
  double total_params = w.param_bytes(0, w.layers.size());
  for (size_t i = 0; i < w.layers.size(); ++i) {
    TANDEM_REQUIRE(p.layers[i].name == w.layers[i].name,
                   "calibration profile layer {} is \"{}\" but model {} has \"{}\" there (profile of another model?)",
                   i, p.layers[i].name, w.model, w.layers[i].name);
    m.fwd_.push_back({p.layers[i].forward_s / static_cast<double>(p.batch), 0, 0});
    m.bwd_.push_back({p.layers[i].backward_s / static_cast<double>(p.batch), 0, 0});
    m.opt_.push_back(total_params > 0 ? p.optimizer_step_s * w.layers[i].param_bytes / total_params : 0.0);
  }
  for (const auto& [b, t] : p.batch_curve) {
    m.curve_.emplace_back(static_cast<double>(b), t);
    if (b == p.batch) m.curve_ref_per_sample_s_ = t / static_cast<double>(b);
  }
  if (m.curve_ref_per_sample_s_ <= 0) m.curve_.clear();  // no point at the profile's batch: stay linear
  return m;
}

double ComputeModel::batch_factor(int64_t samples) const {
  if (curve_.empty() || samples <= 0) return 1.0;
  const double n = static_cast<double>(samples);
  double per_sample = 0;
  if (n <= curve_.front().first) {
    per_sample = curve_.front().second / curve_.front().first;
  } else if (n >= curve_.back().first) {
    per_sample = curve_.back().second / curve_.back().first;
  } else {
    size_t i = 1;
    while (curve_[i].first < n) ++i;
    const auto& [b0, t0] = curve_[i - 1];
    const auto& [b1, t1] = curve_[i];
    per_sample = (t0 + (t1 - t0) * (n - b0) / (b1 - b0)) / n;
  }
  return per_sample / curve_ref_per_sample_s_;
}

double ComputeModel::eval(const Coef& c, int64_t samples) {
  const double n = static_cast<double>(samples);
  return std::max(c.per_sample_s * n, c.bytes_per_sample_s * n) + c.fixed_s;
}

double ComputeModel::forward_s(size_t first, size_t end, int64_t samples) const {
  double t = 0;
  for (size_t i = first; i < end; ++i) t += eval(fwd_[i], samples);
  return t * scale_ * batch_factor(samples);
}

double ComputeModel::backward_s(size_t first, size_t end, int64_t samples) const {
  double t = 0;
  for (size_t i = first; i < end; ++i) t += eval(bwd_[i], samples);
  return t * scale_ * batch_factor(samples);
}

double ComputeModel::optimizer_s(size_t first, size_t end) const {
  double t = 0;
  for (size_t i = first; i < end; ++i) t += opt_[i];
  return t * scale_;
}

}  // namespace tandem::simulator
