// oneDNN batch normalization, ReLU/ReLU6 and pooling. These primitives work on the layout their
// input arrives in (the conv's blocked layout), so no reorder happens between layers.
#include <cmath>
#include <optional>

#include "engine/compute/cpu/cpu_backend.hpp"
#include "engine/compute/cpu/cpu_kernels.hpp"
#include "engine/compute/cpu/cpu_plans.hpp"
#include "engine/compute/cpu/dnnl_exec.hpp"
#include "engine/compute/validate.hpp"
#include "engine/core/error.hpp"

namespace tandem::engine::compute::cpu {

using dt = memory::data_type;
using tag = memory::format_tag;
using nf = dnnl::normalization_flags;

// ---------------------------------------------------------------- batch norm


NormPlan& CpuBackend::norm_plan(const memory::desc& md, float eps) {
  const std::string key = fmt::format("{}|{}", md_key(md), eps);
  auto it = norm_plans_.find(key);
  if (it != norm_plans_.end()) return *it->second;
  auto plan = std::make_unique<NormPlan>();
  plan->md = md;
  plan->stat_md = memory::desc({md.dims()[1]}, dt::f32, tag::x);
  dnnl_try("batch normalization forward", [&] {
    dnnl::batch_normalization_forward::desc d(dnnl::prop_kind::forward_training, md, eps, nf::use_scale | nf::use_shift);
    plan->train_pd = dnnl::batch_normalization_forward::primitive_desc(d, engine_);
    plan->train = dnnl::batch_normalization_forward(plan->train_pd);
  });
  return *norm_plans_.emplace(key, std::move(plan)).first->second;
}

BatchNormForward CpuBackend::batch_norm_forward_training(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                                         Tensor& running_mean, Tensor& running_var,
                                                         const BatchNormParams& p) {
  const int64_t C = validate::batch_norm(x, gamma, beta, device());
  TANDEM_REQUIRE(x.dtype() == DType::kF32, "batch_norm (cpu): f32 only, got {}", x.str());
  validate::plain(running_mean, "batch_norm", "running_mean", device(), Shape{C}, DType::kF32);
  validate::plain(running_var, "batch_norm", "running_var", device(), Shape{C}, DType::kF32);
  TANDEM_REQUIRE(p.eps > 0 && p.momentum >= 0 && p.momentum <= 1,
                 "batch_norm: eps {} must be > 0, momentum {} in [0, 1]", p.eps, p.momentum);
  const int64_t M = x.numel() / C;
  TANDEM_REQUIRE(M > 1, "batch_norm: training needs more than one value per channel, input {}", x.shape().str());
  const memory::desc md = md_of(x);
  NormPlan& plan = norm_plan(md, p.eps);
  BatchNormForward out{alloc(md, x.shape()), Tensor::empty({C}), Tensor::empty({C})};
  run(plan.train,
       {{DNNL_ARG_SRC, mem(x, md)},
        {DNNL_ARG_DST, mem(out.y, md)},
        {DNNL_ARG_SCALE, mem(gamma, plan.stat_md)},
        {DNNL_ARG_SHIFT, mem(beta, plan.stat_md)},
        {DNNL_ARG_MEAN, mem(out.mean, plan.stat_md)},
        {DNNL_ARG_VARIANCE, mem(out.var, plan.stat_md)}},
       "batch normalization forward");
  float* rm = static_cast<float*>(running_mean.raw_data());
  float* rv = static_cast<float*>(running_var.raw_data());
  const float* bm = static_cast<const float*>(out.mean.raw_data());
  const float* bv = static_cast<const float*>(out.var.raw_data());
  const float unbias = static_cast<float>(static_cast<double>(M) / static_cast<double>(M - 1));
  for (int64_t c = 0; c < C; ++c) {
    rm[c] = (1.0f - p.momentum) * rm[c] + p.momentum * bm[c];
    rv[c] = (1.0f - p.momentum) * rv[c] + p.momentum * bv[c] * unbias;
  }
  return out;
}

Tensor CpuBackend::batch_norm_forward_inference(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                                const Tensor& running_mean, const Tensor& running_var, float eps) {
  const int64_t C = validate::batch_norm(x, gamma, beta, device());
  TANDEM_REQUIRE(x.dtype() == DType::kF32, "batch_norm (cpu): f32 only, got {}", x.str());
  validate::plain(running_mean, "batch_norm", "running_mean", device(), Shape{C}, DType::kF32);
  validate::plain(running_var, "batch_norm", "running_var", device(), Shape{C}, DType::kF32);
  TANDEM_REQUIRE(eps > 0, "batch_norm: eps {} must be > 0", eps);
  const memory::desc md = md_of(x);
  NormPlan& plan = norm_plan(md, eps);
  if (!plan.infer) {
    dnnl_try("batch normalization inference", [&] {
      dnnl::batch_normalization_forward::desc d(dnnl::prop_kind::forward_inference, md, eps,
                                                nf::use_global_stats | nf::use_scale | nf::use_shift);
      plan.infer.emplace(dnnl::batch_normalization_forward::primitive_desc(d, engine_));
    });
  }
  Tensor y = alloc(md, x.shape());
  run(*plan.infer,
       {{DNNL_ARG_SRC, mem(x, md)},
        {DNNL_ARG_DST, mem(y, md)},
        {DNNL_ARG_SCALE, mem(gamma, plan.stat_md)},
        {DNNL_ARG_SHIFT, mem(beta, plan.stat_md)},
        {DNNL_ARG_MEAN, mem(running_mean, plan.stat_md)},
        {DNNL_ARG_VARIANCE, mem(running_var, plan.stat_md)}},
       "batch normalization inference");
  return y;
}

Tensor CpuBackend::batch_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                                       const Tensor& var, float eps, Tensor& dgamma, Tensor& dbeta, bool accumulate) {
  const int64_t C = validate::batch_norm(x, gamma, gamma, device());
  validate::tensor(dy, "batch_norm_backward", "dy", device(), x.rank());
  validate::same_shape(dy, x, "batch_norm_backward", "dy", "input");
  for (const Tensor* t : std::initializer_list<const Tensor*>{&mean, &var, &dgamma, &dbeta})
    validate::plain(*t, "batch_norm_backward", "statistics/gradients", device(), Shape{C}, DType::kF32);
  const memory::desc md = md_of(x);
  NormPlan& plan = norm_plan(md, eps);
  if (!plan.bwd) {
    dnnl_try("batch normalization backward", [&] {
      dnnl::batch_normalization_backward::desc d(dnnl::prop_kind::backward, md, md, eps, nf::use_scale | nf::use_shift);
      plan.bwd_pd.emplace(d, engine_, plan.train_pd);
      plan.bwd.emplace(*plan.bwd_pd);
    });
  }
  Tensor dys = as_layout(dy, md);
  Tensor dx = alloc(md, x.shape());
  Tensor dg = accumulate ? Tensor::empty({C}) : dgamma;
  Tensor db = accumulate ? Tensor::empty({C}) : dbeta;
  run(*plan.bwd,
       {{DNNL_ARG_SRC, mem(x, md)},
        {DNNL_ARG_DIFF_DST, mem(dys, md)},
        {DNNL_ARG_MEAN, mem(mean, plan.stat_md)},
        {DNNL_ARG_VARIANCE, mem(var, plan.stat_md)},
        {DNNL_ARG_SCALE, mem(gamma, plan.stat_md)},
        // oneDNN 2.6 asks for the shift although backward never reads it; gamma stands in.
        {DNNL_ARG_SHIFT, mem(gamma, plan.stat_md)},
        {DNNL_ARG_DIFF_SRC, mem(dx, md)},
        {DNNL_ARG_DIFF_SCALE, mem(dg, plan.stat_md)},
        {DNNL_ARG_DIFF_SHIFT, mem(db, plan.stat_md)}},
       "batch normalization backward");
  if (accumulate) {
    store_param_grad(dg, plan.stat_md, dgamma, plan.stat_md, true);
    store_param_grad(db, plan.stat_md, dbeta, plan.stat_md, true);
  }
  return dx;
}

// ---------------------------------------------------------------- activations


namespace {
dnnl::algorithm eltwise_algo(Activation a) {
  return a == Activation::kRelu ? dnnl::algorithm::eltwise_relu_use_dst_for_bwd
                                : dnnl::algorithm::eltwise_clip_v2_use_dst_for_bwd;
}
float eltwise_beta(Activation a) { return a == Activation::kRelu ? 0.0f : 6.0f; }
}  // namespace

EltwisePlan& CpuBackend::eltwise_plan(Activation a, const memory::desc& md) {
  const std::string key = fmt::format("{}|{}", static_cast<int>(a), md_key(md));
  auto it = eltwise_plans_.find(key);
  if (it != eltwise_plans_.end()) return *it->second;
  auto plan = std::make_unique<EltwisePlan>();
  dnnl_try("eltwise forward", [&] {
    dnnl::eltwise_forward::desc d(dnnl::prop_kind::forward_training, eltwise_algo(a), md, 0.0f, eltwise_beta(a));
    plan->fwd_pd = dnnl::eltwise_forward::primitive_desc(d, engine_);
    plan->fwd = dnnl::eltwise_forward(plan->fwd_pd);
  });
  return *eltwise_plans_.emplace(key, std::move(plan)).first->second;
}

Tensor CpuBackend::activation_forward(Activation a, const Tensor& x, bool in_place) {
  validate::tensor(x, "activation_forward", "input", device(), -1);
  const memory::desc md = md_of(x);
  EltwisePlan& plan = eltwise_plan(a, md);
  Tensor y = in_place ? x : alloc(md, x.shape());
  run(plan.fwd, {{DNNL_ARG_SRC, mem(x, md)}, {DNNL_ARG_DST, mem(y, md)}}, "activation forward");
  return y;
}

Tensor CpuBackend::activation_backward(Activation a, const Tensor& dy, const Tensor& y) {
  validate::tensor(dy, "activation_backward", "dy", device(), -1);
  validate::tensor(y, "activation_backward", "y", device(), -1);
  validate::same_shape(dy, y, "activation_backward", "dy", "y");
  const memory::desc md = md_of(y);
  EltwisePlan& plan = eltwise_plan(a, md);
  if (!plan.bwd) {
    dnnl_try("eltwise backward", [&] {
      dnnl::eltwise_backward::desc d(eltwise_algo(a), md, md, 0.0f, eltwise_beta(a));
      plan.bwd.emplace(dnnl::eltwise_backward::primitive_desc(d, engine_, plan.fwd_pd));
    });
  }
  Tensor dys = as_layout(dy, md);
  Tensor dx = alloc(md, y.shape());
  run(*plan.bwd,
       {{DNNL_ARG_DST, mem(y, md)}, {DNNL_ARG_DIFF_DST, mem(dys, md)}, {DNNL_ARG_DIFF_SRC, mem(dx, md)}},
       "activation backward");
  return dx;
}

// ---------------------------------------------------------------- pooling


namespace {
dnnl::algorithm pool_algo(PoolKind k, const PoolParams& p) {
  if (k == PoolKind::kMax) return dnnl::algorithm::pooling_max;
  return p.count_include_pad ? dnnl::algorithm::pooling_avg_include_padding
                             : dnnl::algorithm::pooling_avg_exclude_padding;
}
}  // namespace

// src_md null (backward without a forward at hand): the plan last used for these shapes, or a
// new one on the plain layout.
PoolPlan& CpuBackend::pool_plan(PoolKind kind, const Shape& x, const memory::desc* src_md, const PoolParams& p) {
  const std::string base = fmt::format("{}{}|{},{},{},{},{},{},{}", static_cast<int>(kind), x.str(), p.kernel_h,
                                       p.kernel_w, p.stride_h, p.stride_w, p.pad_h, p.pad_w, p.count_include_pad);
  if (src_md == nullptr) {
    auto last = last_pool_plan_.find(base);
    if (last != last_pool_plan_.end()) return *last->second;
  }
  const memory::desc md = src_md ? *src_md : plain_md(x);
  const std::string key = base + "|" + md_key(md);
  auto it = pool_plans_.find(key);
  if (it == pool_plans_.end()) {
    const Shape y = pool_output_shape(x, p);
    auto plan = std::make_unique<PoolPlan>();
    plan->strides = {p.stride_h, p.stride_w};
    plan->kernel = {p.kernel_h, p.kernel_w};
    plan->pad = {p.pad_h, p.pad_w};
    plan->algo = pool_algo(kind, p);
    dnnl_try("pooling forward " + key, [&] {
      memory::desc y_any({y[0], y[1], y[2], y[3]}, dt::f32, tag::any);
      dnnl::pooling_forward::desc d(dnnl::prop_kind::forward_training, plan->algo, md, y_any, plan->strides,
                                    plan->kernel, plan->pad, plan->pad);
      plan->fwd_pd = dnnl::pooling_forward::primitive_desc(d, engine_);
      plan->fwd = dnnl::pooling_forward(plan->fwd_pd);
    });
    it = pool_plans_.emplace(key, std::move(plan)).first;
  }
  last_pool_plan_[base] = it->second.get();
  return *it->second;
}

// Max pooling runs on cpu_kernels.hpp's kernel when the input is plain NCHW or blocked nChw8c /
// nChw16c: oneDNN 2.6's max pooling took 8-11 ms forward and as long backward on LeNet-5's
// 64x6x28x28 (channels padded 6 -> 8) on an AVX2 EPYC, the kernel ~0.5 ms (both under load). Its
// workspace is a u8 tensor of the output's shape, stored like the output (oneDNN's is rank 1).
namespace {
kernels::MaxPoolGeometry max_pool_geometry(const Shape& x, const Shape& y, int64_t lanes, const PoolParams& p) {
  return {x[0], x[1], lanes, x[2], x[3], y[2], y[3], p.kernel_h, p.kernel_w, p.stride_h, p.stride_w, p.pad_h, p.pad_w};
}
}  // namespace

PoolForward CpuBackend::pool_forward(PoolKind kind, const Tensor& x, const PoolParams& p) {
  const Shape ys = validate::pool(x, p, device());
  const memory::desc md = md_of(x);
  const int64_t lanes = kind == PoolKind::kMax ? channel_block_lanes(md, x.shape(), dt::f32) : 0;
  if (lanes > 0 && p.kernel_h * p.kernel_w <= kernels::kMaxPoolMaxTaps) {
    PoolForward out{alloc(channel_blocked_md(ys, lanes, dt::f32), ys),
                    Tensor::with_layout(ys, DType::kU8, Device::cpu(),
                                        std::make_shared<DnnlLayout>(channel_blocked_md(ys, lanes, dt::u8)))};
    kernels::max_pool_forward(isa_, static_cast<const float*>(x.raw_data()), static_cast<float*>(out.y.raw_data()),
                              static_cast<uint8_t*>(out.workspace.raw_data()),
                              max_pool_geometry(x.shape(), ys, lanes, p), threads_);
    return out;
  }
  PoolPlan& plan = pool_plan(kind, x.shape(), &md, p);
  const auto& pd = plan.fwd_pd;
  PoolForward out{alloc(pd.dst_desc(), ys), Tensor()};
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, mem(x, md)}, {DNNL_ARG_DST, mem(out.y, pd.dst_desc())}};
  if (kind == PoolKind::kMax) {
    const memory::desc ws = pd.workspace_desc();
    out.workspace = Tensor::with_layout(Shape{static_cast<int64_t>(ws.get_size())}, DType::kU8, Device::cpu(),
                                        std::make_shared<DnnlLayout>(ws));
    args.emplace(DNNL_ARG_WORKSPACE, mem(out.workspace, ws));
  }
  run(plan.fwd, args, "pooling forward");
  return out;
}

Tensor CpuBackend::pool_backward(PoolKind kind, const Tensor& dy, const Tensor& workspace, const Shape& x_shape,
                                 const PoolParams& p) {
  validate::tensor(dy, "pool_backward", "dy", device(), 4);
  const Shape ys = pool_output_shape(x_shape, p);
  TANDEM_REQUIRE(dy.shape() == ys, "pool_backward: dy must be {}, got {}", ys.str(), dy.shape().str());
  if (kind == PoolKind::kMax && workspace.defined() && workspace.rank() == 4) {  // the kernel's workspace
    TANDEM_REQUIRE(workspace.shape() == ys && workspace.dtype() == DType::kU8 && workspace.layout() != nullptr,
                   "pool_backward: max pooling needs the workspace its forward returned (got {})", workspace.str());
    const auto* wl = dynamic_cast<const DnnlLayout*>(workspace.layout());
    const int64_t lanes = wl ? channel_block_lanes(wl->md(), ys, dt::u8) : 0;
    TANDEM_REQUIRE(lanes > 0, "pool_backward: workspace {} is not one max pooling forward returned", workspace.str());
    Tensor dys = as_layout(dy, channel_blocked_md(ys, lanes, dt::f32));
    Tensor dx = alloc(channel_blocked_md(x_shape, lanes, dt::f32), x_shape);
    kernels::max_pool_backward(static_cast<const float*>(dys.raw_data()),
                               static_cast<const uint8_t*>(workspace.raw_data()), static_cast<float*>(dx.raw_data()),
                               max_pool_geometry(x_shape, ys, lanes, p), threads_);
    return dx;
  }
  PoolPlan& plan = pool_plan(kind, x_shape, nullptr, p);
  const auto& fpd = plan.fwd_pd;
  if (kind == PoolKind::kMax) {
    TANDEM_REQUIRE(workspace.defined() && workspace.layout() != nullptr && workspace.nbytes() == fpd.workspace_desc().get_size(),
                   "pool_backward: max pooling needs the workspace its forward returned (got {})", workspace.str());
  }
  if (!plan.bwd) {
    dnnl_try("pooling backward", [&] {
      memory::desc dy_any({ys[0], ys[1], ys[2], ys[3]}, dt::f32, tag::any);
      dnnl::pooling_backward::desc d(plan.algo, fpd.src_desc(), dy_any, plan.strides, plan.kernel, plan.pad, plan.pad);
      plan.bwd_pd.emplace(d, engine_, fpd);
      plan.bwd.emplace(*plan.bwd_pd);
    });
  }
  const auto& pd = *plan.bwd_pd;
  Tensor dys = as_layout(dy, pd.diff_dst_desc());
  Tensor dx = alloc(pd.diff_src_desc(), x_shape);
  std::unordered_map<int, memory> args{{DNNL_ARG_DIFF_DST, mem(dys, pd.diff_dst_desc())},
                                       {DNNL_ARG_DIFF_SRC, mem(dx, pd.diff_src_desc())}};
  if (kind == PoolKind::kMax) args.emplace(DNNL_ARG_WORKSPACE, mem(workspace, fpd.workspace_desc()));
  run(*plan.bwd, args, "pooling backward");
  return dx;
}

// Global average pooling is average pooling with the whole plane as the window.
Tensor CpuBackend::global_avg_pool_forward(const Tensor& x) {
  validate::tensor(x, "global_avg_pool_forward", "input", device(), 4);
  const PoolParams p{x.dim(2), x.dim(3), x.dim(2), x.dim(3), 0, 0, true};
  Tensor y = to_plain(pool_forward(PoolKind::kAvg, x, p).y);
  return y.view({x.dim(0), x.dim(1)});
}

Tensor CpuBackend::global_avg_pool_backward(const Tensor& dy, const Shape& x_shape) {
  validate::tensor(dy, "global_avg_pool_backward", "dy", device(), 2);
  TANDEM_REQUIRE(x_shape.rank() == 4 && dy.dim(0) == x_shape[0] && dy.dim(1) == x_shape[1],
                 "global_avg_pool_backward: dy {} does not match input shape {}", dy.shape().str(), x_shape.str());
  const PoolParams p{x_shape[2], x_shape[3], x_shape[2], x_shape[3], 0, 0, true};
  return pool_backward(PoolKind::kAvg, to_plain(dy).view({x_shape[0], x_shape[1], 1, 1}), Tensor(), x_shape, p);
}

}  // namespace tandem::engine::compute::cpu
