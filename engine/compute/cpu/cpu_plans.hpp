#pragma once
// Cached oneDNN primitives of the CPU backend, one per shape (and input layout).
#include <memory>
#include <optional>

#include <oneapi/dnnl/dnnl.hpp>

#include "engine/compute/cpu/cpu_backend.hpp"
#include "engine/compute/cpu/cpu_winograd.hpp"

namespace tandem::engine::compute::cpu {

using dnnl::memory;

// Tandem's own Winograd (cpu_winograd.hpp) for one convolution: the geometry (and tile blocks) of
// the forward pass and of backward data as its equivalent forward.
struct WinogradPlan {
  winograd::Geometry fwd, data;
};

// One weight tensor's Winograd transforms (CpuBackend::winograd_weights), valid while the weights hold the
// values in `seen`: the cache is keyed by the weights' bytes, not by who wrote them, so no route that
// changes weights (optimizer, checkpoint load, the C ABI, a collective or a transfer writing into the
// parameter buffer) can leave a stale transform behind.
struct WinogradWeights {
  Tensor seen;            // a copy of the weights' values the transforms below were made from
  Tensor u[2];            // [forward, backward data]: defined once kept for `seen`
  int uses[2] = {0, 0};   // transforms asked for in each direction since `seen` changed
  uint64_t last_used = 0; // the backend's call count at the last use (least recently used goes first)
  int64_t bytes() const {
    int64_t b = 0;
    for (const Tensor* t : {&seen, &u[0], &u[1]}) b += t->defined() ? static_cast<int64_t>(t->nbytes()) : 0;
    return b;
  }
};

struct ConvPlan {
  // Which algorithm the three passes run (cpu_conv.cpp's conv_algo; with kTandemWinograd, backward
  // weights with a bias run oneDNN's `algo` below).
  ConvAlgo choice = ConvAlgo::kDirect;
  std::unique_ptr<WinogradPlan> wino;  // when choice is kTandemWinograd
  // convolution_winograd where conv_algo picks oneDNN's and oneDNN implements it here (AVX-512),
  // else convolution_direct; the backward primitives use the same.
  dnnl::algorithm algo = dnnl::algorithm::convolution_direct;
  memory::desc user_w;  // plain weights, 5-D (goihw) when grouped
  memory::dims strides, dilates, pad_l, pad_r;
  memory::desc x_any, w_any, y_any, b_md;
  dnnl::convolution_forward::primitive_desc fwd_pd;
  dnnl::convolution_forward fwd;
  std::optional<dnnl::convolution_backward_data::primitive_desc> bwd_data_pd;
  std::optional<dnnl::convolution_backward_data> bwd_data;
  std::optional<dnnl::convolution_backward_weights::primitive_desc> bwd_w_pd[2];  // [without, with] bias
  std::optional<dnnl::convolution_backward_weights> bwd_w[2];
};

struct MatmulPlan {
  memory::desc a, b, bias, c;
  dnnl::matmul prim;
};

struct NormPlan {
  memory::desc md, stat_md;
  dnnl::batch_normalization_forward::primitive_desc train_pd;
  dnnl::batch_normalization_forward train;
  std::optional<dnnl::batch_normalization_forward> infer;
  std::optional<dnnl::batch_normalization_backward::primitive_desc> bwd_pd;
  std::optional<dnnl::batch_normalization_backward> bwd;
};

struct EltwisePlan {
  dnnl::eltwise_forward::primitive_desc fwd_pd;
  dnnl::eltwise_forward fwd;
  std::optional<dnnl::eltwise_backward> bwd;
};

struct PoolPlan {
  dnnl::pooling_forward::primitive_desc fwd_pd;
  dnnl::pooling_forward fwd;
  std::optional<dnnl::pooling_backward::primitive_desc> bwd_pd;
  std::optional<dnnl::pooling_backward> bwd;
  memory::dims strides, kernel, pad;
  dnnl::algorithm algo;
};

}  // namespace tandem::engine::compute::cpu
