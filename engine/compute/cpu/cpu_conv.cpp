// oneDNN convolution (forward, backward data, backward weights) and linear layers (matmul on
// plain [N, features] tensors: the weights' transpose is a stride view, so nothing is reordered).
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string_view>

#include "engine/compute/cpu/cpu_backend.hpp"
#include "engine/compute/cpu/cpu_kernels.hpp"
#include "engine/compute/cpu/cpu_plans.hpp"
#include "engine/compute/cpu/dnnl_exec.hpp"
#include "engine/compute/validate.hpp"
#include "engine/core/error.hpp"
#include "engine/core/settings.hpp"

namespace tandem::engine::compute::cpu {

using dt = memory::data_type;
using tag = memory::format_tag;


std::string_view conv_algo_name(ConvAlgo a) noexcept {
  switch (a) {
    case ConvAlgo::kOnednnWinograd: return "onednn-winograd";
    case ConvAlgo::kTandemWinograd: return "tandem-winograd";
    case ConvAlgo::kDirect: break;
  }
  return "direct";
}

// oneDNN's Winograd F(4x4, 3x3) (jit_wino_4x3, AVX-512 only) for 3x3, stride-1 convolutions with
// whole 16-channel blocks on both sides: ResNet-18's 3x3 stride-1 layers at CIFAR resolutions, batch
// 64, one AVX-512 EPYC core (tandem calibrate), ran forward in 0.40-0.62x and backward (data and
// weights) in 0.42-0.48x the direct kernel's time (64 ch @ 32x32 to 512 ch @ 4x4); the whole
// step went from 2.10 s to 1.15 s. Its results differ from the direct kernel's by
// f32 rounding (relative RMS 0.6-2.3e-6 over those layers). Below 16 channels (ResNet's 3-channel
// stem) oneDNN's Winograd is 4x slower than direct, so it is left out there.
//
// Where oneDNN has no Winograd (kernels and oneDNN capped at AVX2, or an AVX2-only CPU), Tandem's
// own (cpu_winograd.hpp) runs forward, backward data and backward weights (without bias; with one,
// oneDNN's direct kernel) of such layers with at least kTandemMinChannels channels on both sides and at
// least kTandemMinTiles 4x4 output tiles per call.
// Batch 64, one core of this EPYC capped at AVX2: 1.8-3x the direct kernel's speed on ResNet-18's
// layers (64 ch @ 32x32 to 512 ch @ 4x4), ~1.4x at 32 channels, not always a gain at 16
// (bench/train/README.md, session 15).
// "on" runs Tandem's on every 3x3 stride-1 layer it takes, whatever the ISA (tests, comparisons);
// "off" runs the direct kernels everywhere.
ConvAlgo CpuBackend::conv_algo(std::string_view mode, CpuIsa isa, const Shape& x, const Shape& w,
                               const ConvParams& p) {
  constexpr int64_t kTandemMinChannels = 32;
  constexpr int64_t kTandemMinTiles = 16;  // 4x4 output tiles per call
  const bool three_by_three_s1 = p.groups == 1 && w[2] == 3 && w[3] == 3 && p.stride_h == 1 && p.stride_w == 1 &&
                                 p.dilation_h == 1 && p.dilation_w == 1;
  // Backward data runs as a forward convolution padded by 2 - pad.
  const bool tandem_takes = three_by_three_s1 && p.pad_h >= 0 && p.pad_h <= 2 && p.pad_w >= 0 && p.pad_w <= 2;
  TANDEM_REQUIRE(mode == "auto" || mode == "on" || mode == "off" || mode == "1" || mode == "0",
                 "TANDEM_CPU_WINOGRAD='{}' must be one of auto|on|off (or 1|0)", mode);
  if (mode == "off" || mode == "0" || !three_by_three_s1) return ConvAlgo::kDirect;
  if (mode == "on") return tandem_takes ? ConvAlgo::kTandemWinograd : ConvAlgo::kDirect;
  if (isa == CpuIsa::kAvx512) return x[1] % 16 == 0 && w[0] % 16 == 0 ? ConvAlgo::kOnednnWinograd : ConvAlgo::kDirect;
  // Few tiles (small batches of small planes: ResNet-18's 512-channel layers at batch 1 have one) leave U, 4x the
  // weights' size, read from memory for little work: the direct kernel is faster there (bench/train/README.md,
  // session 16: batch-1 inference 55 -> 77 img/s at 2 threads with the direct kernels everywhere).
  const int64_t tiles = x[0] * ((x[2] + 2 * p.pad_h - 2 + 3) / 4) * ((x[3] + 2 * p.pad_w - 2 + 3) / 4);
  if (isa == CpuIsa::kAvx2 && tandem_takes && x[1] >= kTandemMinChannels && w[0] >= kTandemMinChannels &&
      tiles >= kTandemMinTiles)
    return ConvAlgo::kTandemWinograd;
  return ConvAlgo::kDirect;
}

ConvAlgo CpuBackend::conv_algo_of(const Shape& x, const Shape& w, bool bias, const ConvParams& p) {
  return conv_plan(x, w, bias, p).choice;
}

namespace {
// Creates a backward primitive with the plan's algorithm, or with the direct one where oneDNN
// has no Winograd kernel for that direction.
template <typename F> void with_algo_fallback(const ConvPlan& plan, const char* what, F&& make) {
  if (plan.algo != dnnl::algorithm::convolution_direct) {
    try {
      make(plan.algo);
      return;
    } catch (const dnnl::error&) {
    }
  }
  dnnl_try(what, [&] { make(dnnl::algorithm::convolution_direct); });
}
}  // namespace

ConvPlan& CpuBackend::conv_plan(const Shape& x, const Shape& w, bool bias, const ConvParams& p) {
  const std::string key = fmt::format("{}{}{}|{},{},{},{},{},{},{}", x.str(), w.str(), bias, p.stride_h, p.stride_w,
                                      p.pad_h, p.pad_w, p.dilation_h, p.dilation_w, p.groups);
  auto it = conv_plans_.find(key);
  if (it != conv_plans_.end()) return *it->second;
  const Shape y = conv_output_shape(x, w, p);
  auto plan = std::make_unique<ConvPlan>();
  const int64_t G = p.groups;
  memory::dims wd = G == 1 ? memory::dims{w[0], w[1], w[2], w[3]} : memory::dims{G, w[0] / G, w[1], w[2], w[3]};
  plan->user_w = plain_md(Shape(std::span<const int64_t>(wd.data(), wd.size())));
  plan->strides = {p.stride_h, p.stride_w};
  plan->dilates = {p.dilation_h - 1, p.dilation_w - 1};
  plan->pad_l = {p.pad_h, p.pad_w};
  plan->pad_r = {p.pad_h, p.pad_w};
  plan->x_any = memory::desc({x[0], x[1], x[2], x[3]}, dt::f32, tag::any);
  plan->w_any = memory::desc(wd, dt::f32, tag::any);
  plan->y_any = memory::desc({y[0], y[1], y[2], y[3]}, dt::f32, tag::any);
  plan->b_md = memory::desc({w[0]}, dt::f32, tag::x);
  const auto make_fwd = [&](dnnl::algorithm algo) {
    auto d = bias ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, algo, plan->x_any, plan->w_any,
                                                    plan->b_md, plan->y_any, plan->strides, plan->dilates, plan->pad_l,
                                                    plan->pad_r)
                  : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, algo, plan->x_any, plan->w_any,
                                                    plan->y_any, plan->strides, plan->dilates, plan->pad_l,
                                                    plan->pad_r);
    plan->fwd_pd = dnnl::convolution_forward::primitive_desc(d, engine_);
    plan->fwd = dnnl::convolution_forward(plan->fwd_pd);
    plan->algo = algo;
  };
  plan->choice = conv_algo(winograd_mode_, isa_, x, w, p);
  if (plan->choice == ConvAlgo::kTandemWinograd) {
    auto wp = std::make_unique<WinogradPlan>();
    wp->fwd = winograd::Geometry{x[0], x[1], x[2], x[3], w[0], y[2], y[3], p.pad_h, p.pad_w};
    wp->data = winograd::Geometry{x[0], w[0], y[2], y[3], x[1], x[2], x[3], 2 - p.pad_h, 2 - p.pad_w};
    winograd::plan_block(wp->fwd, threads_);
    winograd::plan_block(wp->data, threads_);
    plan->wino = std::move(wp);
  }
  bool made = false;
  if (plan->choice == ConvAlgo::kOnednnWinograd) {
    try {  // oneDNN implements f32 Winograd on AVX-512 only; elsewhere it says unimplemented
      make_fwd(dnnl::algorithm::convolution_winograd);
      made = true;
    } catch (const dnnl::error&) {
      plan->choice = ConvAlgo::kDirect;
    }
  }
  if (!made) dnnl_try("convolution forward for " + key, [&] { make_fwd(dnnl::algorithm::convolution_direct); });
  return *conv_plans_.emplace(key, std::move(plan)).first->second;
}

Tensor CpuBackend::conv_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const ConvParams& p) {
  const Shape ys = validate::conv(x, w, bias, p, device());
  TANDEM_REQUIRE(x.dtype() == DType::kF32, "conv_forward (cpu): f32 only, got {}", x.str());
  TANDEM_REQUIRE(w.is_plain(), "conv_forward: weights {} must be plain", w.str());
  if (gemm_conv(ys, p)) return gemm_conv_forward(x, w, bias, p, ys);
  ConvPlan& plan = conv_plan(x.shape(), w.shape(), bias.defined(), p);
  if (plan.wino) {
    return winograd_run(x, w, bias, plan.wino->fwd, false, ys);
  }
  const auto& pd = plan.fwd_pd;
  Tensor xs = as_layout(x, pd.src_desc());
  Tensor ws = w;
  if (!(pd.weights_desc() == plan.user_w)) {
    ws = alloc(pd.weights_desc(), w.shape());
    reorder(w, plan.user_w, ws, pd.weights_desc());
  }
  Tensor y = alloc(pd.dst_desc(), ys);
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, mem(xs, pd.src_desc())},
                                       {DNNL_ARG_WEIGHTS, mem(ws, pd.weights_desc())},
                                       {DNNL_ARG_DST, mem(y, pd.dst_desc())}};
  if (bias.defined()) args.emplace(DNNL_ARG_BIAS, mem(bias, plan.b_md));
  run(plan.fwd, args, "convolution forward");
  return y;
}

Tensor CpuBackend::conv_backward_data(const Tensor& dy, const Tensor& w, const Shape& x_shape, const ConvParams& p) {
  validate::tensor(dy, "conv_backward_data", "dy", device(), 4);
  validate::tensor(w, "conv_backward_data", "weights", device(), 4);
  TANDEM_REQUIRE(w.is_plain(), "conv_backward_data: weights {} must be plain", w.str());
  const Shape ys = conv_output_shape(x_shape, w.shape(), p);
  TANDEM_REQUIRE(dy.shape() == ys, "conv_backward_data: dy must be {}, got {}", ys.str(), dy.shape().str());
  if (gemm_conv(ys, p)) return gemm_conv_backward_data(dy, w, x_shape, p);
  // The forward plan (created here if backward comes first) is the hint for the backward one.
  ConvPlan& plan = conv_plan(x_shape, w.shape(), false, p);
  if (plan.wino) {
    return winograd_run(dy, w, Tensor(), plan.wino->data, true, x_shape);
  }
  if (!plan.bwd_data) {
    with_algo_fallback(plan, "convolution backward data", [&](dnnl::algorithm algo) {
      dnnl::convolution_backward_data::desc d(algo, plan.x_any, plan.w_any, plan.y_any, plan.strides, plan.dilates,
                                              plan.pad_l, plan.pad_r);
      plan.bwd_data_pd.emplace(d, engine_, plan.fwd_pd);
      plan.bwd_data.emplace(*plan.bwd_data_pd);
    });
  }
  const auto& pd = *plan.bwd_data_pd;
  Tensor dys = as_layout(dy, pd.diff_dst_desc());
  Tensor ws = w;
  if (!(pd.weights_desc() == plan.user_w)) {
    ws = alloc(pd.weights_desc(), w.shape());
    reorder(w, plan.user_w, ws, pd.weights_desc());
  }
  Tensor dx = alloc(pd.diff_src_desc(), x_shape);
  run(*plan.bwd_data,
       {{DNNL_ARG_DIFF_DST, mem(dys, pd.diff_dst_desc())},
        {DNNL_ARG_WEIGHTS, mem(ws, pd.weights_desc())},
        {DNNL_ARG_DIFF_SRC, mem(dx, pd.diff_src_desc())}},
       "convolution backward data");
  return dx;
}

void CpuBackend::conv_backward_weights(const Tensor& x, const Tensor& dy, Tensor& dw, Tensor& dbias,
                                       const ConvParams& p, bool accumulate) {
  validate::tensor(x, "conv_backward_weights", "input", device(), 4);
  validate::tensor(dy, "conv_backward_weights", "dy", device(), 4);
  validate::plain(dw, "conv_backward_weights", "dw", device(), dw.shape(), DType::kF32);
  TANDEM_REQUIRE(dw.rank() == 4, "conv_backward_weights: dw must be [O, C/groups, KH, KW], got {}", dw.shape().str());
  const Shape ys = conv_output_shape(x.shape(), dw.shape(), p);
  TANDEM_REQUIRE(dy.shape() == ys, "conv_backward_weights: dy must be {}, got {}", ys.str(), dy.shape().str());
  const bool want_bias = dbias.defined();
  if (want_bias) validate::plain(dbias, "conv_backward_weights", "dbias", device(), Shape{ys[1]}, DType::kF32);
  if (gemm_conv(ys, p)) return gemm_conv_backward_weights(x, dy, dw, dbias, p, accumulate);
  if (direct_conv_weights(x, dy, dw, dbias, p, accumulate)) return;
  ConvPlan& plan = conv_plan(x.shape(), dw.shape(), false, p);
  if (plan.wino && !want_bias) {
    const winograd::Geometry& g = plan.wino->fwd;
    Tensor xs = as_layout(x, channel_blocked_md(x.shape(), winograd::kLanes));
    Tensor dys = as_layout(dy, channel_blocked_md(dy.shape(), winograd::kLanes));
    Tensor scratch = Tensor::empty(Shape{winograd::scratch_floats(g, threads_)});
    Tensor du = Tensor::empty(Shape{winograd::du_floats(g, threads_)});
    winograd::weight_gradient(isa_, static_cast<const float*>(xs.raw_data()), static_cast<const float*>(dys.raw_data()),
                              static_cast<float*>(dw.raw_data()), accumulate, static_cast<float*>(scratch.raw_data()),
                              static_cast<float*>(du.raw_data()), g, threads_);
    return;
  }
  const int v = want_bias ? 1 : 0;
  if (!plan.bwd_w[v]) {
    with_algo_fallback(plan, "convolution backward weights", [&](dnnl::algorithm algo) {
      auto d = want_bias ? dnnl::convolution_backward_weights::desc(algo, plan.x_any, plan.w_any, plan.b_md,
                                                                     plan.y_any, plan.strides, plan.dilates,
                                                                     plan.pad_l, plan.pad_r)
                         : dnnl::convolution_backward_weights::desc(algo, plan.x_any, plan.w_any, plan.y_any,
                                                                     plan.strides, plan.dilates, plan.pad_l,
                                                                     plan.pad_r);
      plan.bwd_w_pd[v].emplace(d, engine_, plan.fwd_pd);
      plan.bwd_w[v].emplace(*plan.bwd_w_pd[v]);
    });
  }
  const auto& pd = *plan.bwd_w_pd[v];
  Tensor xs = as_layout(x, pd.src_desc());
  Tensor dys = as_layout(dy, pd.diff_dst_desc());
  const bool direct_w = !accumulate && pd.diff_weights_desc() == plan.user_w;
  Tensor dws = direct_w ? dw : alloc(pd.diff_weights_desc(), dw.shape());
  Tensor dbs = want_bias ? (accumulate ? Tensor::empty(dbias.shape()) : dbias) : Tensor();
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, mem(xs, pd.src_desc())},
                                       {DNNL_ARG_DIFF_DST, mem(dys, pd.diff_dst_desc())},
                                       {DNNL_ARG_DIFF_WEIGHTS, mem(dws, pd.diff_weights_desc())}};
  if (want_bias) args.emplace(DNNL_ARG_DIFF_BIAS, mem(dbs, plan.b_md));
  run(*plan.bwd_w[v], args, "convolution backward weights");
  if (!direct_w) store_param_grad(dws, pd.diff_weights_desc(), dw, plan.user_w, accumulate);
  if (want_bias && accumulate) store_param_grad(dbs, plan.b_md, dbias, plan.b_md, true);
}

// Per block of tiles V = B^T x B, M = V U (36 products), y = A^T M A, with U = G w G^T
// (cpu_winograd.hpp). Backward data is the forward convolution of dy with the kernel flipped and its
// channel axes swapped (`flip`).
Tensor CpuBackend::winograd_run(const Tensor& x, const Tensor& w, const Tensor& bias, const winograd::Geometry& g,
                                bool flip, const Shape& ys) {
  Tensor xs = as_layout(x, channel_blocked_md(x.shape(), winograd::kLanes));
  const Tensor u = winograd_weights(w, g, flip);
  Tensor scratch = Tensor::empty(Shape{winograd::scratch_floats(g, threads_)});
  Tensor y = alloc(channel_blocked_md(ys, winograd::kLanes), ys);
  winograd::convolution(isa_, static_cast<const float*>(xs.raw_data()), static_cast<const float*>(u.raw_data()),
                        bias.defined() ? static_cast<const float*>(bias.raw_data()) : nullptr,
                        static_cast<float*>(y.raw_data()), static_cast<float*>(scratch.raw_data()), g, threads_);
  return y;
}

namespace {
// At most this many bytes of kept transforms and weight copies per backend (least recently used dropped
// first): ResNet-18's Winograd layers keep 190 MB (forward only: evaluation, inference) to 340 MB (both
// directions: micro-batches), VGG-16's forward 295 MB.
constexpr int64_t kWinogradCacheBytes = int64_t{512} << 20;
// A version's transform is kept from its third use in a direction on: a training step uses each version once per
// direction, and one evaluation batch between epochs makes a second forward use (the next step's), which would
// otherwise keep every forward transform through that step (+180 MiB peak RSS for ResNet-18 in bench_train.py).
constexpr int kKeepFromUse = 3;

// Whether a and b hold the same n floats, bit for bit (-0 and +0 differ, a NaN equals its own bits).
bool same_bits(const float* a, const float* b, int64_t n, int threads) {
  std::atomic<bool> same{true};
  kernels::parallel_chunks(n, threads, int64_t{1} << 18, [&](int64_t lo, int64_t hi) {
    if (std::memcmp(a + lo, b + lo, static_cast<size_t>(hi - lo) * sizeof(float)) != 0) same = false;
  });
  return same;
}
}  // namespace

Tensor CpuBackend::winograd_weights(const Tensor& w, const winograd::Geometry& g, bool flip) {
  const auto* wp = static_cast<const float*>(w.raw_data());
  const int64_t n = w.numel();
  auto& slot = wino_weights_[wp];
  if (!slot) slot = std::make_unique<WinogradWeights>();
  WinogradWeights& e = *slot;
  e.last_used = ++wino_calls_;
  const int64_t before = e.bytes();
  if (!(e.seen.defined() && e.seen.shape() == w.shape() &&
        same_bits(static_cast<const float*>(e.seen.raw_data()), wp, n, threads_))) {
    // A new weight version (or another tensor at this address): forget the old one's transforms.
    if (!e.seen.defined() || !(e.seen.shape() == w.shape())) e.seen = Tensor::empty(w.shape());
    auto* seen = static_cast<float*>(e.seen.raw_data());
    kernels::parallel_chunks(n, threads_, int64_t{1} << 18, [&](int64_t lo, int64_t hi) {
      std::memcpy(seen + lo, wp + lo, static_cast<size_t>(hi - lo) * sizeof(float));
    });
    e.u[0] = e.u[1] = Tensor();
    e.uses[0] = e.uses[1] = 0;
  }
  const int d = flip ? 1 : 0;
  Tensor u = e.u[d];
  if (u.defined()) {
    ++wino_stats_.hits;
  } else {
    u = Tensor::empty(Shape{winograd::u_floats(g)});
    winograd::weight_transform(isa_, wp, static_cast<float*>(u.raw_data()), g, flip, threads_);
    ++wino_stats_.transforms;
    if (++e.uses[d] >= kKeepFromUse) e.u[d] = u;
  }
  wino_bytes_ += e.bytes() - before;
  // Over the budget: drop the least recently used other entries (the current one stays, whatever its size).
  while (wino_bytes_ > kWinogradCacheBytes && wino_weights_.size() > 1) {
    auto lru = wino_weights_.end();
    for (auto it = wino_weights_.begin(); it != wino_weights_.end(); ++it)
      if (it->first != wp && (lru == wino_weights_.end() || it->second->last_used < lru->second->last_used)) lru = it;
    wino_bytes_ -= lru->second->bytes();
    wino_weights_.erase(lru);
  }
  return u;
}

CpuBackend::WinogradCacheStats CpuBackend::winograd_cache_stats() const {
  WinogradCacheStats s = wino_stats_;
  s.entries = static_cast<int64_t>(wino_weights_.size());
  s.bytes = wino_bytes_;
  return s;
}

// Small layers whose channel counts are not whole vectors go to the direct kernel (see
// cpu_kernels.hpp); larger ones stay with oneDNN (the first layers of ResNet-18 and MobileNetV2,
// 113-226 MFLOP at batch 64, are above the limit: the kernel was measured on LeNet-5's only).
bool CpuBackend::direct_conv_weights(const Tensor& x_in, const Tensor& dy_in, Tensor& dw, Tensor& dbias,
                                     const ConvParams& p, bool accumulate) {
  constexpr double kMaxFlops = 64e6;
  constexpr int64_t kVector = 8;  // channel counts that are multiples of this suit oneDNN's kernels
  const Shape& xs = x_in.shape();
  const Shape& ys = dy_in.shape();
  if (p.groups != 1 || x_in.dtype() != DType::kF32 || dy_in.dtype() != DType::kF32) return false;
  if (xs[1] % kVector == 0 && ys[1] % kVector == 0) return false;
  const double flops = 2.0 * ys[0] * ys[1] * ys[2] * ys[3] * xs[1] * dw.dim(2) * dw.dim(3);
  if (flops > kMaxFlops || dw.dim(3) > kernels::kDirectConvMaxKw) return false;
  // The choice above depends on shapes only, and the kernel's arithmetic not on the layouts
  // (each output channel sums the same products in the same order), so results are the same
  // whichever layouts the tensors arrive in (a pipeline stage receives them plain).
  int64_t dy_lanes = channel_block_lanes(md_of(dy_in), ys);
  Tensor dy = dy_in;
  if (dy_lanes < 8) {
    dy_lanes = 8;
    dy = as_layout(dy_in, channel_blocked_md(ys, dy_lanes));
  }
  int64_t x_lanes = channel_block_lanes(md_of(x_in), xs);
  Tensor x = x_in;
  if (x_lanes == 0) {
    x_lanes = 1;
    x = to_plain(x_in);
  }
  const kernels::ConvWeightsGeometry g{xs[0], xs[1], xs[2], xs[3], ys[1], ys[2], ys[3], dw.dim(2), dw.dim(3),
                                       p.stride_h, p.stride_w, p.pad_h, p.pad_w, p.dilation_h, p.dilation_w,
                                       x_lanes, dy_lanes};
  kernels::conv_backward_weights_direct(isa_, static_cast<const float*>(x.raw_data()), static_cast<const float*>(dy.raw_data()),
                                        static_cast<float*>(dw.raw_data()),
                                        dbias.defined() ? static_cast<float*>(dbias.raw_data()) : nullptr, g, accumulate,
                                        threads_);
  return true;
}

// ---------------------------------------------------------------- linear (matmul)


// which: 0 forward  y[N,Out] = x[N,In] . W^T         (m=N, k=In, n=Out)
//        1 data     dx[N,In] = dy[N,Out] . W          (m=N, k=Out, n=In)
//        2 weights  dW[Out,In] = dy^T[Out,N] . x      (m=Out, k=N, n=In), optionally += (sum post-op)
MatmulPlan& CpuBackend::matmul_md(const memory::desc& a, const memory::desc& b, const memory::desc& bias,
                                  const memory::desc& c, bool accumulate) {
  const std::string key = md_key(a) + "|" + md_key(b) + "|" + md_key(bias) + "|" + md_key(c) + (accumulate ? "+" : "");
  auto it = matmul_plans_.find(key);
  if (it != matmul_plans_.end()) return *it->second;
  auto plan = std::make_unique<MatmulPlan>();
  plan->a = a;
  plan->b = b;
  plan->bias = bias;
  plan->c = c;
  dnnl_try("matmul " + key, [&] {
    dnnl::primitive_attr attr;
    if (accumulate) {
      dnnl::post_ops po;
      po.append_sum(1.0f);
      attr.set_post_ops(po);
    }
    auto d = bias.data.ndims > 0 ? dnnl::matmul::desc(a, b, bias, c) : dnnl::matmul::desc(a, b, c);
    plan->prim = dnnl::matmul(dnnl::matmul::primitive_desc(d, attr, engine_));
  });
  return *matmul_plans_.emplace(key, std::move(plan)).first->second;
}

MatmulPlan& CpuBackend::matmul_plan(int64_t m, int64_t k, int64_t n, int which, bool bias, bool accumulate) {
  const memory::desc a =
      which == 2 ? memory::desc({m, k}, dt::f32, memory::dims{1, m}) : memory::desc({m, k}, dt::f32, tag::ab);
  const memory::desc b =
      which == 0 ? memory::desc({k, n}, dt::f32, memory::dims{1, k}) : memory::desc({k, n}, dt::f32, tag::ab);
  const memory::desc bias_md = bias ? memory::desc({1, n}, dt::f32, tag::ab) : memory::desc();
  return matmul_md(a, b, bias_md, memory::desc({m, n}, dt::f32, tag::ab), accumulate);
}

Tensor CpuBackend::linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias) {
  const auto [N, In] = validate::linear(x, w, bias, device());
  TANDEM_REQUIRE(x.dtype() == DType::kF32 && w.is_plain(), "linear_forward (cpu): f32 input and plain weights, got {} and {}",
                 x.str(), w.str());
  const int64_t Out = w.dim(0);
  Tensor xp = to_plain(x);
  Tensor y = Tensor::empty({N, Out});
  MatmulPlan& plan = matmul_plan(N, In, Out, 0, bias.defined(), false);
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, mem(xp, plan.a)}, {DNNL_ARG_WEIGHTS, mem(w, plan.b)}, {DNNL_ARG_DST, mem(y, plan.c)}};
  if (bias.defined()) args.emplace(DNNL_ARG_BIAS, mem(bias, plan.bias));
  run(plan.prim, args, "linear forward");
  return y;
}

Tensor CpuBackend::linear_backward_data(const Tensor& dy, const Tensor& w, const Shape& x_shape) {
  const auto [N, In, Out] = validate::linear_data(dy, w, x_shape, device(), false);
  Tensor d = to_plain(dy);
  Tensor dx = Tensor::empty(x_shape);
  MatmulPlan& plan = matmul_plan(N, Out, In, 1, false, false);
  run(plan.prim,
       {{DNNL_ARG_SRC, mem(d, plan.a)}, {DNNL_ARG_WEIGHTS, mem(w, plan.b)}, {DNNL_ARG_DST, mem(dx, plan.c)}},
       "linear backward data");
  return dx;
}

void CpuBackend::linear_backward_weights(const Tensor& x, const Tensor& dy, Tensor& dw, Tensor& dbias,
                                         bool accumulate) {
  const auto [N, In, Out] = validate::linear_weights(x, dy, dw, dbias, device());
  TANDEM_REQUIRE(x.dtype() == DType::kF32, "linear_backward_weights (cpu): f32 only, got {}", x.str());
  Tensor xp = to_plain(x);
  Tensor d = to_plain(dy);
  MatmulPlan& plan = matmul_plan(Out, N, In, 2, false, accumulate);
  run(plan.prim,
       {{DNNL_ARG_SRC, mem(d, plan.a)}, {DNNL_ARG_WEIGHTS, mem(xp, plan.b)}, {DNNL_ARG_DST, mem(dw, plan.c)}},
       "linear backward weights");
  if (dbias.defined()) {
    kernels::bias_grad(isa_, static_cast<const float*>(d.raw_data()), static_cast<float*>(dbias.raw_data()), N, Out,
                       accumulate);
  }
}

}  // namespace tandem::engine::compute::cpu
