// Convolutions whose output planes have only a few pixels (ResNet's last stages at CIFAR
// resolutions: 2x2 and 1x1) as im2col + oneDNN matmul on plain tensors. There oneDNN's direct
// backward-weights kernel ran at ~10 GFLOP/s (28 ms for 512x512x3x3 on a 1x1 plane, batch 64,
// one core) and every call reordered the multi-megabyte weights; the matmul reads the plain
// weights in place.
#include <cstring>
#include <vector>

#include "engine/compute/cpu/cpu_backend.hpp"
#include "engine/compute/cpu/cpu_plans.hpp"
#include "engine/compute/cpu/dnnl_exec.hpp"
#include "engine/core/error.hpp"

namespace tandem::engine::compute::cpu {

using dt = memory::data_type;
using tag = memory::format_tag;

namespace {

constexpr int64_t kGemmConvMaxPixels = 4;

struct Geometry {
  int64_t N, C, H, W, O, KH, KW, OH, OW;
  ConvParams p;
  // Kernel taps (kh * KW + kw) that read at least one real input element for some output
  // pixel; the others only ever see padding (8 of 9 taps for a 3x3 kernel on a 1x1 plane) and
  // are left out of the matmuls.
  std::vector<int64_t> taps;
  Geometry(const Shape& x, const Shape& w, const ConvParams& cp)
      : N(x[0]), C(x[1]), H(x[2]), W(x[3]), O(w[0]), KH(w[2]), KW(w[3]), p(cp) {
    const Shape y = conv_output_shape(x, w, cp);
    OH = y[2];
    OW = y[3];
    for (int64_t kh = 0; kh < KH; ++kh)
      for (int64_t kw = 0; kw < KW; ++kw) {
        bool live = false;
        for (int64_t oh = 0; oh < OH && !live; ++oh)
          for (int64_t ow = 0; ow < OW && !live; ++ow) {
            const int64_t a = ih(oh, kh), b = iw(ow, kw);
            live = a >= 0 && a < H && b >= 0 && b < W;
          }
        if (live) taps.push_back(kh * KW + kw);
      }
  }
  int64_t S() const { return OH * OW; }
  int64_t T() const { return static_cast<int64_t>(taps.size()); }
  int64_t K() const { return C * T(); }  // matmul depth: channels x live taps
  bool all_taps() const { return T() == KH * KW; }
  // Input row of output row oh at kernel row kh (may be outside [0, H)).
  int64_t ih(int64_t oh, int64_t kh) const { return oh * p.stride_h - p.pad_h + kh * p.dilation_h; }
  int64_t iw(int64_t ow, int64_t kw) const { return ow * p.stride_w - p.pad_w + kw * p.dilation_w; }
};

// col [N * S, K]: one row per output pixel; padding reads as zero.
void im2col(const float* x, float* col, const Geometry& g, int threads) {
  const int64_t S = g.S(), K = g.K(), T = g.T();
#pragma omp parallel for num_threads(threads) if (g.N > 1)
  for (int64_t n = 0; n < g.N; ++n)
    for (int64_t c = 0; c < g.C; ++c)
      for (int64_t t = 0; t < T; ++t) {
        const int64_t kh = g.taps[t] / g.KW, kw = g.taps[t] % g.KW, k = c * T + t;
        for (int64_t oh = 0; oh < g.OH; ++oh) {
          const int64_t ih = g.ih(oh, kh);
          for (int64_t ow = 0; ow < g.OW; ++ow) {
            const int64_t iw = g.iw(ow, kw);
            const float v = (ih >= 0 && ih < g.H && iw >= 0 && iw < g.W) ? x[((n * g.C + c) * g.H + ih) * g.W + iw] : 0.0f;
            col[(n * S + oh * g.OW + ow) * K + k] = v;
          }
        }
      }
}

// dx (zeroed here) = the scatter-add of col [N * S, K] back onto the input positions.
void col2im(const float* col, float* dx, const Geometry& g, int threads) {
  const int64_t S = g.S(), K = g.K(), T = g.T();
#pragma omp parallel for num_threads(threads) if (g.N > 1)
  for (int64_t n = 0; n < g.N; ++n) {
    float* d = dx + n * g.C * g.H * g.W;
    std::memset(d, 0, sizeof(float) * g.C * g.H * g.W);
    for (int64_t c = 0; c < g.C; ++c)
      for (int64_t t = 0; t < T; ++t) {
        const int64_t kh = g.taps[t] / g.KW, kw = g.taps[t] % g.KW, k = c * T + t;
        for (int64_t oh = 0; oh < g.OH; ++oh) {
          const int64_t ih = g.ih(oh, kh);
          if (ih < 0 || ih >= g.H) continue;
          for (int64_t ow = 0; ow < g.OW; ++ow) {
            const int64_t iw = g.iw(ow, kw);
            if (iw >= 0 && iw < g.W) d[(c * g.H + ih) * g.W + iw] += col[(n * S + oh * g.OW + ow) * K + k];
          }
        }
      }
  }
}

// Weights restricted to the live taps: [O, C * T] (the weights themselves when all taps live).
Tensor live_weights(const Tensor& w, const Geometry& g) {
  if (g.all_taps()) return w;
  Tensor out = Tensor::empty({g.O, g.K()});
  const float* src = static_cast<const float*>(w.raw_data());
  float* dst = static_cast<float*>(out.raw_data());
  const int64_t KK = g.KH * g.KW, T = g.T();
  for (int64_t o = 0; o < g.O; ++o)
    for (int64_t c = 0; c < g.C; ++c)
      for (int64_t t = 0; t < T; ++t) dst[(o * g.C + c) * T + t] = src[(o * g.C + c) * KK + g.taps[t]];
  return out;
}

// [N, C, S] <-> [N * S, C] (pixel-major rows); only needed when S > 1.
void nchw_to_rows(const float* src, float* dst, int64_t N, int64_t C, int64_t S) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t s = 0; s < S; ++s) dst[(n * S + s) * C + c] = src[(n * C + c) * S + s];
}
void rows_to_nchw(const float* src, float* dst, int64_t N, int64_t C, int64_t S) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t s = 0; s < S; ++s) dst[(n * C + c) * S + s] = src[(n * S + s) * C + c];
}

}  // namespace

bool CpuBackend::gemm_conv(const Shape& y, const ConvParams& p) {
  return p.groups == 1 && y[2] * y[3] <= kGemmConvMaxPixels;
}

// rows (N*S x O) = col (N*S x K) . W^T (K x O); with one pixel per plane the rows are y itself.
Tensor CpuBackend::gemm_conv_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const ConvParams& p,
                                     const Shape& ys) {
  const Geometry g(x.shape(), w.shape(), p);
  const int64_t S = g.S(), K = g.K(), M = g.N * S;
  Tensor xp = to_plain(x);
  Tensor col = Tensor::empty({M, K});
  im2col(static_cast<const float*>(xp.raw_data()), static_cast<float*>(col.raw_data()), g, threads_);
  Tensor y = Tensor::empty(ys);
  Tensor rows = S == 1 ? y : Tensor::empty({M, g.O});
  const memory::desc a({M, K}, dt::f32, tag::ab), b({K, g.O}, dt::f32, memory::dims{1, K}),
      c({M, g.O}, dt::f32, tag::ab);
  const memory::desc bmd = bias.defined() ? memory::desc({1, g.O}, dt::f32, tag::ab) : memory::desc();
  MatmulPlan& plan = matmul_md(a, b, bmd, c, false);
  Tensor wl = live_weights(w, g);
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, mem(col, a)}, {DNNL_ARG_WEIGHTS, mem(wl, b)}, {DNNL_ARG_DST, mem(rows, c)}};
  if (bias.defined()) args.emplace(DNNL_ARG_BIAS, mem(bias, bmd));
  run(plan.prim, args, "convolution forward (gemm)");
  if (S > 1) rows_to_nchw(static_cast<const float*>(rows.raw_data()), static_cast<float*>(y.raw_data()), g.N, g.O, S);
  return y;
}

// dcol (N*S x K) = dy rows (N*S x O) . W (O x K), then col2im.
Tensor CpuBackend::gemm_conv_backward_data(const Tensor& dy, const Tensor& w, const Shape& x_shape,
                                           const ConvParams& p) {
  const Geometry g(x_shape, w.shape(), p);
  const int64_t S = g.S(), K = g.K(), M = g.N * S;
  Tensor d = to_plain(dy);
  Tensor rows = d;
  if (S > 1) {
    rows = Tensor::empty({M, g.O});
    nchw_to_rows(static_cast<const float*>(d.raw_data()), static_cast<float*>(rows.raw_data()), g.N, g.O, S);
  }
  Tensor dcol = Tensor::empty({M, K});
  const memory::desc a({M, g.O}, dt::f32, tag::ab), b({g.O, K}, dt::f32, tag::ab), c({M, K}, dt::f32, tag::ab);
  MatmulPlan& plan = matmul_md(a, b, memory::desc(), c, false);
  Tensor wl = live_weights(w, g);
  run(plan.prim, {{DNNL_ARG_SRC, mem(rows, a)}, {DNNL_ARG_WEIGHTS, mem(wl, b)}, {DNNL_ARG_DST, mem(dcol, c)}},
       "convolution backward data (gemm)");
  Tensor dx = Tensor::empty(x_shape);
  col2im(static_cast<const float*>(dcol.raw_data()), static_cast<float*>(dx.raw_data()), g, threads_);
  return dx;
}

// dW (O x K) = dy^T (O x N*S) . col (N*S x K); with one pixel per plane dy^T is a stride view.
void CpuBackend::gemm_conv_backward_weights(const Tensor& x, const Tensor& dy, Tensor& dw, Tensor& dbias,
                                            const ConvParams& p, bool accumulate) {
  const Geometry g(x.shape(), dw.shape(), p);
  const int64_t S = g.S(), K = g.K(), M = g.N * S;
  Tensor xp = to_plain(x);
  Tensor d = to_plain(dy);
  Tensor col = Tensor::empty({M, K});
  im2col(static_cast<const float*>(xp.raw_data()), static_cast<float*>(col.raw_data()), g, threads_);
  Tensor dyt = d;
  memory::desc a({g.O, M}, dt::f32, memory::dims{1, g.O});
  if (S > 1) {
    dyt = Tensor::empty({g.O, M});
    const float* src = static_cast<const float*>(d.raw_data());
    float* dst = static_cast<float*>(dyt.raw_data());
    for (int64_t n = 0; n < g.N; ++n)
      for (int64_t o = 0; o < g.O; ++o)
        for (int64_t s = 0; s < S; ++s) dst[o * M + n * S + s] = src[(n * g.O + o) * S + s];
    a = memory::desc({g.O, M}, dt::f32, tag::ab);
  }
  const memory::desc b({M, K}, dt::f32, tag::ab), c({g.O, K}, dt::f32, tag::ab);
  const bool direct = g.all_taps();
  Tensor dwl = direct ? dw : Tensor::empty({g.O, K});
  MatmulPlan& plan = matmul_md(a, b, memory::desc(), c, direct && accumulate);
  run(plan.prim, {{DNNL_ARG_SRC, mem(dyt, a)}, {DNNL_ARG_WEIGHTS, mem(col, b)}, {DNNL_ARG_DST, mem(dwl, c)}},
       "convolution backward weights (gemm)");
  if (!direct) {  // scatter the live taps back; dead taps get zero gradient
    const float* src = static_cast<const float*>(dwl.raw_data());
    float* dst = static_cast<float*>(dw.raw_data());
    const int64_t KK = g.KH * g.KW, T = g.T();
    if (!accumulate) std::memset(dst, 0, sizeof(float) * g.O * g.C * KK);
    for (int64_t o = 0; o < g.O; ++o)
      for (int64_t ch = 0; ch < g.C; ++ch)
        for (int64_t t = 0; t < T; ++t) dst[(o * g.C + ch) * KK + g.taps[t]] += src[(o * g.C + ch) * T + t];
  }
  if (dbias.defined()) {
    const float* src = static_cast<const float*>(d.raw_data());
    float* db = static_cast<float*>(dbias.raw_data());
    for (int64_t o = 0; o < g.O; ++o) {
      double s = 0;
      for (int64_t n = 0; n < g.N; ++n)
        for (int64_t i = 0; i < S; ++i) s += src[(n * g.O + o) * S + i];
      db[o] = accumulate ? db[o] + static_cast<float>(s) : static_cast<float>(s);
    }
  }
}

}  // namespace tandem::engine::compute::cpu
