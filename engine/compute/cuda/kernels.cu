// The CUDA backend's own kernels: grid-stride elementwise loops, batch-norm reductions split over
// channels and parts of channels (double accumulators), one thread per output for pooling.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <stdexcept>
#include <string>

#include "engine/compute/cuda/kernels.hpp"
#include "engine/compute/dropout_mask.hpp"

namespace tandem::engine::compute::cuda::kernels {
namespace {

constexpr int kThreads = 256;

inline unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > (1 << 20) ? (1 << 20) : b));
}

#define GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); i += static_cast<int64_t>(blockDim.x) * gridDim.x)

// Sums v over the block; the result is valid in thread 0.
__device__ double block_sum(double v) {
  __shared__ double sh[kThreads];
  sh[threadIdx.x] = v;
  __syncthreads();
  for (int o = blockDim.x / 2; o > 0; o >>= 1) {
    if (threadIdx.x < o) sh[threadIdx.x] += sh[threadIdx.x + o];
    __syncthreads();
  }
  const double r = sh[0];
  __syncthreads();
  return r;
}

__global__ void k_fill(float* x, int64_t n, float v) { GRID_STRIDE(i, n) x[i] = v; }
__global__ void k_to_bf16(const float* x, __nv_bfloat16* y, int64_t n) { GRID_STRIDE(i, n) y[i] = __float2bfloat16_rn(x[i]); }
__global__ void k_from_bf16(const __nv_bfloat16* x, float* y, int64_t n, bool acc) {
  GRID_STRIDE(i, n) y[i] = acc ? y[i] + __bfloat162float(x[i]) : __bfloat162float(x[i]);
}
__global__ void k_to_f16(const float* x, __half* y, int64_t n) { GRID_STRIDE(i, n) y[i] = __float2half_rn(x[i]); }
__global__ void k_from_f16(const __half* x, float* y, int64_t n, bool acc) {
  GRID_STRIDE(i, n) y[i] = acc ? y[i] + __half2float(x[i]) : __half2float(x[i]);
}
__global__ void k_add(float* o, const float* a, const float* b, int64_t n) { GRID_STRIDE(i, n) o[i] = a[i] + b[i]; }
__global__ void k_scale(float* x, int64_t n, float a) { GRID_STRIDE(i, n) x[i] *= a; }
__global__ void k_axpy(float a, const float* x, float* y, int64_t n) { GRID_STRIDE(i, n) y[i] += a * x[i]; }

__global__ void k_sum_squares(const float* x, int64_t n, double* out) {
  double s = 0;
  GRID_STRIDE(i, n) s += static_cast<double>(x[i]) * x[i];
  s = block_sum(s);
  if (threadIdx.x == 0) atomicAdd(out, s);
}

__global__ void k_clamp_fwd(const float* x, float* y, int64_t n, float hi) {
  GRID_STRIDE(i, n) y[i] = fminf(fmaxf(x[i], 0.0f), hi);
}
__global__ void k_clamp_bwd(const float* dy, const float* y, float* dx, int64_t n, float hi) {
  GRID_STRIDE(i, n) dx[i] = (y[i] > 0.0f && y[i] < hi) ? dy[i] : 0.0f;
}

__global__ void k_bias_add(float* y, const float* b, int64_t N, int64_t C, int64_t S) {
  GRID_STRIDE(i, N * C * S) y[i] += b[(i / S) % C];
}

// One block per channel.
__global__ void k_bias_grad(const float* dy, float* db, int64_t N, int64_t C, int64_t S, bool acc) {
  const int64_t c = blockIdx.x;
  double s = 0;
  for (int64_t j = threadIdx.x; j < N * S; j += blockDim.x) s += dy[((j / S) * C + c) * S + j % S];
  s = block_sum(s);
  if (threadIdx.x == 0) db[c] = acc ? db[c] + static_cast<float>(s) : static_cast<float>(s);
}

// Batch norm over [N, C, S]. The reductions split each channel over blockIdx.y parts of its N * S values
// (so that a layer with few channels still fills the GPU) and add each part's double sums into acc[2C]
// (zeroed by the launcher) with atomics; a per-channel pass then turns the sums into statistics. Indices are
// 32-bit (the launchers check that N * C * S fits), since 64-bit division costs several times more.
__device__ void block_sum2(double& a, double& b) {
  for (int o = 16; o > 0; o >>= 1) {
    a += __shfl_down_sync(0xffffffffu, a, o);
    b += __shfl_down_sync(0xffffffffu, b, o);
  }
  __shared__ double sa[32], sb[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    sa[warp] = a;
    sb[warp] = b;
  }
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  a = threadIdx.x < warps ? sa[threadIdx.x] : 0.0;
  b = threadIdx.x < warps ? sb[threadIdx.x] : 0.0;
  if (warp == 0)
    for (int o = 16; o > 0; o >>= 1) {
      a += __shfl_down_sync(0xffffffffu, a, o);
      b += __shfl_down_sync(0xffffffffu, b, o);
    }
}

// The range [begin, end) of a channel's M = N * S values that part blockIdx.y of gridDim.y covers.
__device__ void part_range(uint32_t M, uint32_t& begin, uint32_t& end) {
  const uint32_t per = (M + gridDim.y - 1) / gridDim.y;
  begin = blockIdx.y * per;
  end = min(M, begin + per);
}

// acc[c] += sum x, acc[C + c] += sum x^2
__global__ void k_bn_stats_part(const float* x, double* acc, uint32_t N, uint32_t C, uint32_t S) {
  const uint32_t c = blockIdx.x;
  uint32_t begin, end;
  part_range(N * S, begin, end);
  double s = 0, q = 0;
  for (uint32_t j = begin + threadIdx.x; j < end; j += blockDim.x) {
    const uint32_t n = j / S;
    const double v = x[(n * C + c) * S + (j - n * S)];
    s += v;
    q += v * v;
  }
  block_sum2(s, q);
  if (threadIdx.x == 0) {
    atomicAdd(&acc[c], s);
    atomicAdd(&acc[C + c], q);
  }
}

__global__ void k_bn_stats_final(const double* acc, float* mean, float* var, uint32_t C, double M) {
  GRID_STRIDE(c, C) {
    const double mu = acc[c] / M;
    mean[c] = static_cast<float>(mu);
    var[c] = static_cast<float>(fmax(acc[C + c] / M - mu * mu, 0.0));
  }
}

__global__ void k_bn_apply(const float* x, float* y, const float* g, const float* b, const float* mean,
                           const float* var, float eps, uint32_t C, uint32_t S, uint32_t total) {
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += blockDim.x * gridDim.x) {
    const uint32_t c = (i / S) % C;
    y[i] = (x[i] - mean[c]) * rsqrtf(var[c] + eps) * g[c] + b[c];
  }
}

__global__ void k_bn_running(float* rm, float* rv, const float* mean, const float* var, int64_t C, float m,
                             float unbias) {
  GRID_STRIDE(c, C) {
    rm[c] = (1.0f - m) * rm[c] + m * mean[c];
    rv[c] = (1.0f - m) * rv[c] + m * var[c] * unbias;
  }
}

// acc[c] += sum dy, acc[C + c] += sum dy * (x - mean)
__global__ void k_bn_bwd_part(const float* dy, const float* x, const float* mean, double* acc, uint32_t N,
                              uint32_t C, uint32_t S) {
  const uint32_t c = blockIdx.x;
  const float mu = mean[c];
  uint32_t begin, end;
  part_range(N * S, begin, end);
  double sd = 0, sdx = 0;
  for (uint32_t j = begin + threadIdx.x; j < end; j += blockDim.x) {
    const uint32_t n = j / S;
    const uint32_t i = (n * C + c) * S + (j - n * S);
    const float d = dy[i];
    sd += d;
    sdx += static_cast<double>(d) * (x[i] - mu);
  }
  block_sum2(sd, sdx);
  if (threadIdx.x == 0) {
    atomicAdd(&acc[c], sd);
    atomicAdd(&acc[C + c], sdx);
  }
}

// scratch [2C] = (sum dy, sum dy * xhat); dgamma/dbeta (= or +=).
__global__ void k_bn_bwd_final(const double* acc, const float* var, float eps, float* dgamma, float* dbeta, bool acc_out,
                               float* scratch, uint32_t C) {
  GRID_STRIDE(c, C) {
    const float sd = static_cast<float>(acc[c]);
    const float sdx = static_cast<float>(acc[C + c] * static_cast<double>(rsqrtf(var[c] + eps)));
    scratch[c] = sd;
    scratch[C + c] = sdx;
    dbeta[c] = acc_out ? dbeta[c] + sd : sd;
    dgamma[c] = acc_out ? dgamma[c] + sdx : sdx;
  }
}

__global__ void k_bn_bwd_dx(const float* dy, const float* x, const float* g, const float* mean, const float* var,
                            float eps, const float* scratch, float* dx, uint32_t C, uint32_t S, uint32_t total,
                            float M) {
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += blockDim.x * gridDim.x) {
    const uint32_t c = (i / S) % C;
    const float istd = rsqrtf(var[c] + eps);
    const float xhat = (x[i] - mean[c]) * istd;
    dx[i] = g[c] * istd / M * (M * dy[i] - scratch[c] - xhat * scratch[C + c]);
  }
}

struct PoolGeom {
  int64_t H, W, OH, OW, kh, kw, sh, sw, ph, pw;
  bool include_pad;
};

__global__ void k_pool_fwd(bool max, const float* x, float* y, int32_t* idx, int64_t NC, PoolGeom g) {
  GRID_STRIDE(o, NC * g.OH * g.OW) {
    const int64_t ow = o % g.OW, oh = (o / g.OW) % g.OH, plane = o / (g.OW * g.OH);
    const float* xp = x + plane * g.H * g.W;
    float best = -FLT_MAX;
    int32_t arg = -1;
    double sum = 0;
    int64_t count = 0;
    for (int64_t a = 0; a < g.kh; ++a) {
      const int64_t ih = oh * g.sh - g.ph + a;
      if (ih < 0 || ih >= g.H) continue;
      for (int64_t b = 0; b < g.kw; ++b) {
        const int64_t iw = ow * g.sw - g.pw + b;
        if (iw < 0 || iw >= g.W) continue;
        const float v = xp[ih * g.W + iw];
        if (arg < 0 || v > best) {
          best = v;
          arg = static_cast<int32_t>(ih * g.W + iw);
        }
        sum += v;
        ++count;
      }
    }
    if (max) {
      y[o] = best;
      idx[o] = arg;
    } else {
      y[o] = static_cast<float>(sum / static_cast<double>(g.include_pad ? g.kh * g.kw : count));
    }
  }
}

__global__ void k_pool_bwd_max(const float* dy, const int32_t* idx, float* dx, int64_t NC, PoolGeom g) {
  GRID_STRIDE(o, NC * g.OH * g.OW) {
    const int64_t plane = o / (g.OW * g.OH);
    if (idx[o] >= 0) atomicAdd(dx + plane * g.H * g.W + idx[o], dy[o]);
  }
}

// Gather: each input element sums the windows that cover it.
__global__ void k_pool_bwd_avg(const float* dy, float* dx, int64_t NC, PoolGeom g) {
  GRID_STRIDE(i, NC * g.H * g.W) {
    const int64_t iw = i % g.W, ih = (i / g.W) % g.H, plane = i / (g.W * g.H);
    double s = 0;
    for (int64_t oh = 0; oh < g.OH; ++oh) {
      const int64_t h0 = oh * g.sh - g.ph;
      if (ih < h0 || ih >= h0 + g.kh) continue;
      for (int64_t ow = 0; ow < g.OW; ++ow) {
        const int64_t w0 = ow * g.sw - g.pw;
        if (iw < w0 || iw >= w0 + g.kw) continue;
        int64_t div = g.kh * g.kw;
        if (!g.include_pad) {
          const int64_t hs = h0 < 0 ? 0 : h0, he = h0 + g.kh > g.H ? g.H : h0 + g.kh;
          const int64_t ws = w0 < 0 ? 0 : w0, we = w0 + g.kw > g.W ? g.W : w0 + g.kw;
          div = (he - hs) * (we - ws);
        }
        s += static_cast<double>(dy[(plane * g.OH + oh) * g.OW + ow]) / static_cast<double>(div);
      }
    }
    dx[i] = static_cast<float>(s);
  }
}

__global__ void k_gap_fwd(const float* x, float* y, int64_t NC, int64_t S) {
  GRID_STRIDE(p, NC) {
    double s = 0;
    for (int64_t j = 0; j < S; ++j) s += x[p * S + j];
    y[p] = static_cast<float>(s / static_cast<double>(S));
  }
}
__global__ void k_gap_bwd(const float* dy, float* dx, int64_t NC, int64_t S) {
  GRID_STRIDE(i, NC * S) dx[i] = dy[i / S] / static_cast<float>(S);
}

__global__ void k_softmax_ce(const float* logits, const void* labels, bool i32, int64_t N, int64_t K, double norm,
                             float* dlogits, double* loss, int32_t* correct, int64_t* bad_row) {
  GRID_STRIDE(n, N) {
    const int64_t l = i32 ? static_cast<const int32_t*>(labels)[n] : static_cast<const int64_t*>(labels)[n];
    const float* row = logits + n * K;
    if (l < 0 || l >= K) {
      atomicMin(reinterpret_cast<unsigned long long*>(bad_row), static_cast<unsigned long long>(n));
      loss[n] = 0;
      correct[n] = 0;
      continue;
    }
    int64_t arg = 0;
    for (int64_t k = 1; k < K; ++k)
      if (row[k] > row[arg]) arg = k;
    double se = 0;
    for (int64_t k = 0; k < K; ++k) se += exp(static_cast<double>(row[k]) - row[arg]);
    const double lse = row[arg] + log(se);
    loss[n] = lse - row[l];
    correct[n] = arg == l ? 1 : 0;
    if (dlogits)
      for (int64_t k = 0; k < K; ++k)
        dlogits[n * K + k] = static_cast<float>((exp(row[k] - lse) - (k == l ? 1.0 : 0.0)) / norm);
  }
}

__global__ void k_dropout_fwd(const float* x, float* y, uint8_t* mask, int64_t n, uint64_t seed, uint32_t th,
                              float scale) {
  GRID_STRIDE(i, n) {
    const bool keep = dropout_keep(seed, static_cast<uint64_t>(i), th);
    mask[i] = keep ? 1 : 0;
    y[i] = keep ? x[i] * scale : 0.0f;
  }
}
__global__ void k_dropout_bwd(const float* dy, const uint8_t* mask, float* dx, int64_t n, float scale) {
  GRID_STRIDE(i, n) dx[i] = mask[i] ? dy[i] * scale : 0.0f;
}

__global__ void k_sgd(float* w, const float* g, float* buf, int64_t n, float lr, float wd, float m, float damp,
                      bool first, bool nesterov) {
  GRID_STRIDE(i, n) {
    float d = g[i] + wd * w[i];
    if (buf) {
      const float nb = first ? d : m * buf[i] + damp * d;
      buf[i] = nb;
      d = nesterov ? d + m * nb : nb;
    }
    w[i] -= lr * d;
  }
}

__global__ void k_adam(float* w, const float* g, float* m, float* v, int64_t n, float step, float isb2, float b1,
                       float b2, float eps, float l2, float decay) {
  GRID_STRIDE(i, n) {
    const float gi = g[i] + l2 * w[i];
    const float mi = b1 * m[i] + (1.0f - b1) * gi;
    const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    w[i] = w[i] * decay - step * mi / (sqrtf(vi) * isb2 + eps);
  }
}

}  // namespace

void fill(float* x, int64_t n, float v, cudaStream_t s) { k_fill<<<blocks_for(n), kThreads, 0, s>>>(x, n, v); }
void to_bf16(const float* x, uint16_t* y, int64_t n, cudaStream_t s) {
  k_to_bf16<<<blocks_for(n), kThreads, 0, s>>>(x, reinterpret_cast<__nv_bfloat16*>(y), n);
}
void from_bf16(const uint16_t* x, float* y, int64_t n, bool acc, cudaStream_t s) {
  k_from_bf16<<<blocks_for(n), kThreads, 0, s>>>(reinterpret_cast<const __nv_bfloat16*>(x), y, n, acc);
}
void to_f16(const float* x, uint16_t* y, int64_t n, cudaStream_t s) {
  k_to_f16<<<blocks_for(n), kThreads, 0, s>>>(x, reinterpret_cast<__half*>(y), n);
}
void from_f16(const uint16_t* x, float* y, int64_t n, bool acc, cudaStream_t s) {
  k_from_f16<<<blocks_for(n), kThreads, 0, s>>>(reinterpret_cast<const __half*>(x), y, n, acc);
}
void add(float* o, const float* a, const float* b, int64_t n, cudaStream_t s) {
  k_add<<<blocks_for(n), kThreads, 0, s>>>(o, a, b, n);
}
void scale(float* x, int64_t n, float a, cudaStream_t s) { k_scale<<<blocks_for(n), kThreads, 0, s>>>(x, n, a); }
void axpy(float a, const float* x, float* y, int64_t n, cudaStream_t s) {
  k_axpy<<<blocks_for(n), kThreads, 0, s>>>(a, x, y, n);
}
void sum_squares(const float* x, int64_t n, double* out, cudaStream_t s) {
  cudaMemsetAsync(out, 0, sizeof(double), s);
  const unsigned b = blocks_for(n) > 1024 ? 1024 : blocks_for(n);
  k_sum_squares<<<b, kThreads, 0, s>>>(x, n, out);
}
void clamp_forward(const float* x, float* y, int64_t n, float hi, cudaStream_t s) {
  k_clamp_fwd<<<blocks_for(n), kThreads, 0, s>>>(x, y, n, hi);
}
void clamp_backward(const float* dy, const float* y, float* dx, int64_t n, float hi, cudaStream_t s) {
  k_clamp_bwd<<<blocks_for(n), kThreads, 0, s>>>(dy, y, dx, n, hi);
}
void bias_add(float* y, const float* b, int64_t N, int64_t C, int64_t S, cudaStream_t s) {
  k_bias_add<<<blocks_for(N * C * S), kThreads, 0, s>>>(y, b, N, C, S);
}
void bias_grad(const float* dy, float* db, int64_t N, int64_t C, int64_t S, bool acc, cudaStream_t s) {
  k_bias_grad<<<static_cast<unsigned>(C), kThreads, 0, s>>>(dy, db, N, C, S, acc);
}
// Parts per channel for the batch-norm reductions: about 1024 blocks in all, none with fewer than 4096 values.
unsigned bn_parts(int64_t N, int64_t C, int64_t S) {
  const int64_t by_blocks = (1024 + C - 1) / C, by_values = (N * S + 4095) / 4096;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>({by_blocks, by_values, 65535})));
}
void check_32bit(int64_t N, int64_t C, int64_t S) {
  if (N * C * S >= (int64_t{1} << 31))
    throw std::length_error("cuda batch norm: tensor of " + std::to_string(N * C * S) + " values (over 2^31)");
}
constexpr unsigned kBnThreads = 512;

void bn_stats(const float* x, float* mean, float* var, double* acc, int64_t N, int64_t C, int64_t S, cudaStream_t s) {
  check_32bit(N, C, S);
  cudaMemsetAsync(acc, 0, 2 * static_cast<size_t>(C) * sizeof(double), s);
  const dim3 grid(static_cast<unsigned>(C), bn_parts(N, C, S));
  k_bn_stats_part<<<grid, kBnThreads, 0, s>>>(x, acc, static_cast<uint32_t>(N), static_cast<uint32_t>(C),
                                              static_cast<uint32_t>(S));
  k_bn_stats_final<<<blocks_for(C), kThreads, 0, s>>>(acc, mean, var, static_cast<uint32_t>(C),
                                                      static_cast<double>(N * S));
}
void bn_apply(const float* x, float* y, const float* g, const float* b, const float* mean, const float* var, float eps,
              int64_t N, int64_t C, int64_t S, cudaStream_t s) {
  check_32bit(N, C, S);
  k_bn_apply<<<blocks_for(N * C * S), kThreads, 0, s>>>(x, y, g, b, mean, var, eps, static_cast<uint32_t>(C),
                                                        static_cast<uint32_t>(S), static_cast<uint32_t>(N * C * S));
}
void bn_running_update(float* rm, float* rv, const float* mean, const float* var, int64_t C, float m, float unbias,
                       cudaStream_t s) {
  k_bn_running<<<blocks_for(C), kThreads, 0, s>>>(rm, rv, mean, var, C, m, unbias);
}
void bn_backward(const float* dy, const float* x, const float* g, const float* mean, const float* var, float eps,
                 float* dx, float* dgamma, float* dbeta, bool acc_out, float* scratch, double* acc, int64_t N,
                 int64_t C, int64_t S, cudaStream_t s) {
  check_32bit(N, C, S);
  cudaMemsetAsync(acc, 0, 2 * static_cast<size_t>(C) * sizeof(double), s);
  const dim3 grid(static_cast<unsigned>(C), bn_parts(N, C, S));
  const auto n32 = static_cast<uint32_t>(N), c32 = static_cast<uint32_t>(C), s32 = static_cast<uint32_t>(S);
  k_bn_bwd_part<<<grid, kBnThreads, 0, s>>>(dy, x, mean, acc, n32, c32, s32);
  k_bn_bwd_final<<<blocks_for(C), kThreads, 0, s>>>(acc, var, eps, dgamma, dbeta, acc_out, scratch, c32);
  k_bn_bwd_dx<<<blocks_for(N * C * S), kThreads, 0, s>>>(dy, x, g, mean, var, eps, scratch, dx, c32, s32,
                                                         static_cast<uint32_t>(N * C * S), static_cast<float>(N * S));
}
void pool_forward(bool max, const float* x, float* y, int32_t* idx, int64_t NC, int64_t H, int64_t W, int64_t OH,
                  int64_t OW, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw, bool incl,
                  cudaStream_t s) {
  const PoolGeom g{H, W, OH, OW, kh, kw, sh, sw, ph, pw, incl};
  k_pool_fwd<<<blocks_for(NC * OH * OW), kThreads, 0, s>>>(max, x, y, idx, NC, g);
}
void pool_backward(bool max, const float* dy, const int32_t* idx, float* dx, int64_t NC, int64_t H, int64_t W,
                   int64_t OH, int64_t OW, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw,
                   bool incl, cudaStream_t s) {
  const PoolGeom g{H, W, OH, OW, kh, kw, sh, sw, ph, pw, incl};
  if (max) {
    cudaMemsetAsync(dx, 0, sizeof(float) * NC * H * W, s);
    k_pool_bwd_max<<<blocks_for(NC * OH * OW), kThreads, 0, s>>>(dy, idx, dx, NC, g);
  } else {
    k_pool_bwd_avg<<<blocks_for(NC * H * W), kThreads, 0, s>>>(dy, dx, NC, g);
  }
}
void gap_forward(const float* x, float* y, int64_t NC, int64_t S, cudaStream_t s) {
  k_gap_fwd<<<blocks_for(NC), kThreads, 0, s>>>(x, y, NC, S);
}
void gap_backward(const float* dy, float* dx, int64_t NC, int64_t S, cudaStream_t s) {
  k_gap_bwd<<<blocks_for(NC * S), kThreads, 0, s>>>(dy, dx, NC, S);
}
void softmax_cross_entropy(const float* logits, const void* labels, bool i32, int64_t N, int64_t K, double norm,
                           float* dlogits, double* loss, int32_t* correct, int64_t* bad_row, cudaStream_t s) {
  cudaMemsetAsync(bad_row, 0x7f, sizeof(int64_t), s);  // "no bad row": a large positive value
  k_softmax_ce<<<blocks_for(N), kThreads, 0, s>>>(logits, labels, i32, N, K, norm, dlogits, loss, correct, bad_row);
}
void dropout_forward(const float* x, float* y, uint8_t* mask, int64_t n, uint64_t seed, uint32_t th, float scale,
                     cudaStream_t s) {
  k_dropout_fwd<<<blocks_for(n), kThreads, 0, s>>>(x, y, mask, n, seed, th, scale);
}
void dropout_backward(const float* dy, const uint8_t* mask, float* dx, int64_t n, float scale, cudaStream_t s) {
  k_dropout_bwd<<<blocks_for(n), kThreads, 0, s>>>(dy, mask, dx, n, scale);
}
void sgd(float* w, const float* g, float* buf, int64_t n, float lr, float wd, float m, float damp, bool first,
         bool nesterov, cudaStream_t s) {
  k_sgd<<<blocks_for(n), kThreads, 0, s>>>(w, g, buf, n, lr, wd, m, damp, first, nesterov);
}
void adam(float* w, const float* g, float* m, float* v, int64_t n, float step, float isb2, float b1, float b2,
          float eps, float l2, float decay, cudaStream_t s) {
  k_adam<<<blocks_for(n), kThreads, 0, s>>>(w, g, m, v, n, step, isb2, b1, b2, eps, l2, decay);
}

}  // namespace tandem::engine::compute::cuda::kernels
