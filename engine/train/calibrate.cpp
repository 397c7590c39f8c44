#include "engine/train/calibrate.hpp"

#include <algorithm>
#include <cmath>
#include <chrono>
#include <ctime>
#include <map>
#include <numeric>

#include "engine/core/error.hpp"
#include "engine/core/rng.hpp"

namespace tandem::engine::train {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// CPU seconds used so far: a CFS quota stops the process but does not stretch this. One compute thread runs in
// the calling thread, so only its own CPU counts (a communicator's progress thread polling beside it would not);
// with more, every thread of the process.
double cpu_s(bool whole_process) {
  timespec ts{};
  ::clock_gettime(whole_process ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Sample standard deviation over the mean; 0 with fewer than 2 values or a zero mean.
double coefficient_of_variation(const std::vector<double>& v) {
  if (v.size() < 2) return 0;
  const double mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  if (mean <= 0) return 0;
  double ss = 0;
  for (double x : v) ss += (x - mean) * (x - mean);
  return std::sqrt(ss / static_cast<double>(v.size() - 1)) / mean;
}

// The mean of the middle 80% (all of them below 10 values): a CPU quota's throttling stays in (it slows most
// steps), a few steps preempted by other processes on a shared machine do not.
double trimmed_mean(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t cut = v.size() >= 10 ? v.size() / 10 : 0;
  const auto first = v.begin() + static_cast<std::ptrdiff_t>(cut), last = v.end() - static_cast<std::ptrdiff_t>(cut);
  return std::accumulate(first, last, 0.0) / static_cast<double>(last - first);
}

// A host copy of a device tensor, and the way back (the calibration must leave the model as it found it).
Tensor save(compute::Backend& be, const Tensor& t) { return t.numel() > 0 ? be.to_host(be.to_plain(t)).clone() : Tensor(); }
void restore(compute::Backend& be, const Tensor& saved, Tensor dst) {
  if (saved.defined()) be.copy(saved, dst);
}

// Synthetic batch: inputs uniform in [-1, 1), labels uniform over the classes; the values do not change the
// cost of any layer, only the shapes do.
struct Batch {
  Tensor x, labels;
};

Batch make_batch(compute::Backend& be, const nn::ModelSpec& spec, int64_t n, uint64_t seed) {
  const nn::SampleShape in = spec.input;
  const Shape xs = in.h * in.w == 1 ? Shape{n, in.c} : Shape{n, in.c, in.h, in.w};
  Rng rng(seed);
  Tensor hx = Tensor::empty(xs, DType::kF32);
  float* px = hx.data<float>();
  for (int64_t i = 0; i < hx.numel(); ++i) px[i] = static_cast<float>(rng.uniform() * 2.0 - 1.0);
  Tensor hl = Tensor::empty(Shape{n}, DType::kI32);
  int32_t* pl = hl.data<int32_t>();
  for (int64_t i = 0; i < n; ++i) pl[i] = static_cast<int32_t>(rng.next_u64() % static_cast<uint64_t>(spec.num_classes()));
  Batch b;
  if (be.device().is_cpu()) {
    b.x = hx;
    b.labels = hl;
  } else {
    b.x = be.empty(xs);
    b.labels = be.empty(Shape{n}, DType::kI32);
    be.copy(hx, b.x);
    be.copy(hl, b.labels);
  }
  return b;
}

// One pass layer by layer: forward of each layer alone, the loss, backward of each layer alone. Adds each
// layer's times to fwd/bwd (the loss to the last layer's forward).
void layerwise_pass(nn::Model& model, const Batch& b, std::vector<double>& fwd, std::vector<double>& bwd) {
  compute::Backend& be = model.backend();
  const nn::ModelSpec& spec = model.spec();
  const size_t L = model.num_layers();
  const auto last = static_cast<int32_t>(L) - 1;
  std::map<int32_t, Tensor> val{{nn::kModelInput, b.x}}, grad;
  std::vector<nn::Activations> acts(L);
  auto outputs_of = [&](size_t i) { return i + 1 == L ? std::vector<int32_t>{last} : spec.crossing(i + 1); };
  for (size_t i = 0; i < L; ++i) {
    std::vector<Tensor> ins;
    for (int32_t id : spec.crossing(i)) ins.push_back(val.at(id));
    const auto t0 = Clock::now();
    std::vector<Tensor> outs = model.forward_range(i, i + 1, ins, acts[i], true);
    be.synchronize();
    fwd[i] = seconds_since(t0);
    const std::vector<int32_t> ids = outputs_of(i);
    TANDEM_CHECK(outs.size() == ids.size(), Status::kInternal, "calibrate: layer {} returned {} tensors, expected {}", i,
                 outs.size(), ids.size());
    for (size_t k = 0; k < ids.size(); ++k) val[ids[k]] = outs[k];
  }
  {
    const auto t0 = Clock::now();
    compute::LossOutput loss = be.softmax_cross_entropy(val.at(last), b.labels, true, 0);
    be.synchronize();
    fwd[L - 1] += seconds_since(t0);
    grad[last] = loss.dlogits;
  }
  for (size_t i = L; i-- > 0;) {
    std::vector<Tensor> gs;
    for (int32_t id : outputs_of(i)) {
      auto it = grad.find(id);
      gs.push_back(it != grad.end() && it->second.defined() ? it->second : be.zeros(be.to_plain(val.at(id)).shape()));
    }
    const auto t0 = Clock::now();
    std::vector<Tensor> back = model.backward_range(gs, acts[i], false);
    be.synchronize();
    bwd[i] = seconds_since(t0);
    const std::vector<int32_t> in_ids = spec.crossing(i);
    for (size_t k = 0; k < in_ids.size() && k < back.size(); ++k) grad[in_ids[k]] = back[k];
    for (int32_t id : outputs_of(i)) grad.erase(id);  // keep only what is still needed, as training does
  }
}

// One whole training step as the trainer runs it: forward, loss, backward, then the optimizer.
// Under a CFS quota of q cores (quota > 0), each time is the CPU time it used over q instead of the clock's: see
// calibrate_model.
void whole_step(nn::Model& model, const Batch& b, optim::Optimizer& opt, float lr, double& fb_s, double& opt_s,
                double* fb_cpu_s = nullptr, double quota = 0) {
  compute::Backend& be = model.backend();
  const bool all_threads = be.num_threads() != 1;
  const double c0 = cpu_s(all_threads);
  auto t0 = Clock::now();
  const Tensor logits = model.forward(b.x, true);
  compute::LossOutput loss = be.softmax_cross_entropy(logits, b.labels, true, 0);
  model.backward(loss.dlogits);
  be.synchronize();
  fb_s = seconds_since(t0);
  const double c1 = cpu_s(all_threads);
  if (fb_cpu_s != nullptr) *fb_cpu_s = c1 - c0;
  if (quota > 0) fb_s = (c1 - c0) / quota;
  t0 = Clock::now();
  opt.step({model.grads()}, lr);
  be.synchronize();
  opt_s = quota > 0 ? (cpu_s(all_threads) - c1) / quota : seconds_since(t0);
}

}  // namespace

void CalibrationOptions::validate() const {
  TANDEM_REQUIRE(batch >= 1, "calibrate.batch: must be >= 1, got {}", batch);
  TANDEM_REQUIRE(warmup >= 0, "calibrate.warmup: must be >= 0, got {}", warmup);
  TANDEM_REQUIRE(iters >= 1, "calibrate.iters: must be >= 1, got {}", iters);
  TANDEM_REQUIRE(peak_steps >= 1 && peak_steps <= 100, "calibrate.peak_steps: must be in [1, 100], got {}", peak_steps);
  optimizer.validate();
  for (int64_t b : curve_batches)
    TANDEM_REQUIRE(b >= 1 && b <= (int64_t{1} << 20), "calibrate.curve_batches: {} is not a batch size in [1, 2^20]", b);
  for (int64_t b : peak_batches)
    TANDEM_REQUIRE(b >= 1 && b <= (int64_t{1} << 20), "calibrate.peak_batches: {} is not a batch size in [1, 2^20]", b);
  for (int64_t b : shape_batches)
    TANDEM_REQUIRE(b >= 1 && b <= (int64_t{1} << 20), "calibrate.shape_batches: {} is not a batch size in [1, 2^20]", b);
}

double Calibration::forward_s() const {
  return std::accumulate(layers.begin(), layers.end(), 0.0, [](double a, const LayerTime& l) { return a + l.forward_s; });
}

double Calibration::backward_s() const {
  return std::accumulate(layers.begin(), layers.end(), 0.0,
                         [](double a, const LayerTime& l) { return a + l.backward_s; });
}

std::string simulator_optimizer_name(const optim::OptimizerConfig& c) {
  switch (c.kind) {
    case optim::OptimizerKind::kSgd: return c.momentum > 0 ? "momentum" : "sgd";
    case optim::OptimizerKind::kAdam:
    case optim::OptimizerKind::kAdamW: return "adam";
  }
  return "sgd";
}

Calibration calibrate_model(nn::Model& model, const CalibrationOptions& o) {
  o.validate();
  compute::Backend& be = model.backend();
  const nn::ModelSpec& spec = model.spec();
  const size_t L = model.num_layers();
  TANDEM_REQUIRE(L > 0, "calibrate: model '{}' has no layers", spec.name);

  // Everything the passes below change, restored at the end (also when a pass throws).
  const Tensor saved_params = save(be, model.params()), saved_buffers = save(be, model.buffers());
  struct Restore {
    compute::Backend& be;
    nn::Model& model;
    const Tensor &params, &buffers;
    ~Restore() {
      try {
        restore(be, params, model.params());
        restore(be, buffers, model.buffers());
        model.zero_grads();
        be.synchronize();
      } catch (...) {  // a destructor must not throw; the pass's own error is the one to report
      }
    }
  } restore_guard{be, model, saved_params, saved_buffers};

  const Batch b = make_batch(be, spec, o.batch, o.seed);
  // A tiny learning rate: the weights stay near their initial values, so no pass runs into NaNs.
  optim::Optimizer opt(be, o.optimizer, std::vector<Tensor>{model.params()});
  constexpr float kLr = 1e-6f;

  // Under a CFS quota of q cores below the backend's threads, a pass as short as the quota's period runs at full
  // speed or stalls until the period ends depending on where in the period it falls, so its clock time is anything
  // from T to T + the period: one host measured LeNet-5's step at 2.3, 4.9 and 4.3 ms in three calibrations. The
  // CPU time it uses is T x threads however it falls, and over q that is the mean a long run of passes shows at
  // the quota -- the figure the profile holds (simulator/compute/profile.hpp, full_speed_profile). So there the
  // whole steps and the curve's passes are timed by CPU time over q; the layers' medians are scaled to them.
  const double quota = o.cpu_quota > 0 && o.cpu_quota < be.num_threads() ? o.cpu_quota : 0.0;
  std::vector<std::vector<double>> fwd(L), bwd(L);
  std::vector<double> fb, upd, step, fb_cpu_s;
  std::vector<double> f(L), g(L);
  double loop_cpu0 = 0;
  Clock::time_point loop_t0;
  for (int it = 0; it < o.warmup + o.iters; ++it) {
    if (it == o.warmup) {  // the timed passes, back to back: the cores the process sustains under the quota
      loop_cpu0 = cpu_s(true);
      loop_t0 = Clock::now();
    }
    layerwise_pass(model, b, f, g);
    double fb_s = 0, opt_s = 0, fb_cpu = 0;
    whole_step(model, b, opt, kLr, fb_s, opt_s, &fb_cpu, quota);
    if (it < o.warmup) continue;
    fb_cpu_s.push_back(fb_cpu);
    for (size_t i = 0; i < L; ++i) {
      fwd[i].push_back(f[i]);
      bwd[i].push_back(g[i]);
    }
    fb.push_back(fb_s);
    upd.push_back(opt_s);
    step.push_back(fb_s + opt_s);
  }

  const double loop_cpu = cpu_s(true) - loop_cpu0, loop_wall = seconds_since(loop_t0);
  Calibration c;
  if (quota > 0 && loop_wall > 0) c.sustained_cores = std::min(quota, loop_cpu / loop_wall);
  c.model = spec.name;
  c.backend = std::string(be.name());
  c.input = spec.input;
  c.batch = o.batch;
  c.threads = be.num_threads();
  c.warmup = o.warmup;
  c.iters = o.iters;
  c.optimizer = simulator_optimizer_name(o.optimizer);
  double sum = 0;
  for (size_t i = 0; i < L; ++i) {
    LayerTime t{spec.layers[i].name, median(fwd[i]), median(bwd[i])};
    sum += t.forward_s + t.backward_s;
    c.layers.push_back(std::move(t));
  }
  c.optimizer_step_s = median(upd);
  c.unscaled_sum_s = sum + c.optimizer_step_s;
  c.step_mean_s = trimmed_mean(step);
  c.step_median_s = median(step);
  c.step_min_s = *std::min_element(step.begin(), step.end());
  c.step_max_s = *std::max_element(step.begin(), step.end());
  c.pass_cv = coefficient_of_variation(fb);
  c.pass_cpu_cv = coefficient_of_variation(fb_cpu_s);
  if (o.after_batch_passes) o.after_batch_passes();
  const bool shapes = o.before_new_shape && o.after_new_shape;
  const auto first_step_at = [&](int64_t n) {  // this shape's primitives: not the step's peak
    if (shapes) o.before_new_shape(n);
    {
      const Batch bn = make_batch(be, spec, n, o.seed);
      double fb_s = 0, opt_s = 0;
      whole_step(model, bn, opt, kLr, fb_s, opt_s);
    }
    if (shapes) o.after_new_shape(n);
  };
  std::vector<int64_t> seen{o.batch};  // shapes the backend has built
  const auto unseen = [&](int64_t n) {
    if (std::find(seen.begin(), seen.end(), n) != seen.end()) return false;
    seen.push_back(n);
    return true;
  };
  if (o.before_peak_steps && o.after_peak_steps) {
    const auto peak_at = [&](int64_t n) {
      o.before_peak_steps(n);
      const Batch bn = make_batch(be, spec, n, o.seed);  // inside the measured window: the peak holds the input
      for (int i = 0; i < o.peak_steps; ++i) {
        double fb_s = 0, opt_s = 0;
        whole_step(model, bn, opt, kLr, fb_s, opt_s);
      }
      o.after_peak_steps(n);
    };
    peak_at(o.batch);
    for (int64_t n : o.peak_batches) {
      if (!unseen(n)) continue;
      first_step_at(n);
      peak_at(n);
    }
  }
  if (shapes)
    for (int64_t n : o.shape_batches)
      if (unseen(n)) first_step_at(n);
  // The cost curve: whole passes at the other batch sizes, measured the same way (median after a warmup).
  if (!o.curve_batches.empty()) {
    std::map<int64_t, double> curve{{o.batch, median(fb)}};
    for (int64_t n : o.curve_batches) {
      if (curve.count(n) != 0) continue;
      const Batch bn = make_batch(be, spec, n, o.seed);
      std::vector<double> t;
      for (int it = 0; it < std::max(1, o.warmup) + std::max(3, o.iters / 2); ++it) {
        double fb_s = 0, opt_s = 0;
        whole_step(model, bn, opt, kLr, fb_s, opt_s, nullptr, quota);
        if (it >= std::max(1, o.warmup)) t.push_back(fb_s);
      }
      curve[n] = median(t);
    }
    c.batch_curve.assign(curve.begin(), curve.end());
  }
  if (o.scale_to_step && c.unscaled_sum_s > 0) {
    c.scale = c.step_mean_s / c.unscaled_sum_s;
    for (LayerTime& t : c.layers) {
      t.forward_s *= c.scale;
      t.backward_s *= c.scale;
    }
    c.optimizer_step_s *= c.scale;
  }
  return c;
}

}  // namespace tandem::engine::train
