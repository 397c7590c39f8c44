#pragma once
// Hand-written CPU kernels of the oneDNN backend, where they beat oneDNN 2.6 at the small shapes
// of LeNet-5 and the MLP (see bench/train/README.md for the profile that chose them). They are
// compiled for AVX-512F, AVX2 and the baseline ISA; each call takes the CpuIsa to run (the
// backend's: TANDEM_CPU_MAX_ISA capped by the CPU; a call runs variant_cpu_isa(isa), never above the CPU). Every variant
// does the same IEEE operations in the same order (no FMA contraction), so results do not depend
// on the machine or the cap.
#include <omp.h>

#include <algorithm>
#include <cstdint>

#include "engine/core/cpu_isa.hpp"

namespace tandem::engine::compute::cpu::kernels {

// Runs f(begin, end) over [0, n) split into one contiguous chunk per thread; one thread below
// min_parallel elements (fork/join costs more than it saves there).
template <typename F> void parallel_chunks(int64_t n, int threads, int64_t min_parallel, F&& f) {
  if (threads <= 1 || n < min_parallel) {
    f(int64_t{0}, n);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t chunk = (n + nt - 1) / nt;
    const int64_t lo = std::min(n, t * chunk), hi = std::min(n, lo + chunk);
    if (lo < hi) f(lo, hi);
  }
}

// SGD over n elements: d = g + wd * w; with momentum b = first ? d : m * b + damp * d and
// w -= lr * (nesterov ? d + m * b : b); without, w -= lr * d (b unused, may be null).
struct SgdStep {
  float lr, weight_decay, momentum, damp;
  bool use_momentum, first, nesterov;
};
void sgd(CpuIsa isa, float* w, const float* g, float* b, int64_t n, const SgdStep& s);

// Max pooling over tensors stored as [planes, H, W, lanes]: plain NCHW is lanes = 1 with
// planes = N * C; oneDNN's nChw8c / nChw16c blocks are lanes = 8 / 16 with planes = N * C / lanes
// (channels padded up to a whole block; lanes past `channels` stay zero).
struct MaxPoolGeometry {
  int64_t n, channels, lanes, h, w, oh, ow, kh, kw, sh, sw, ph, pw;
  int64_t blocks() const { return (channels + lanes - 1) / lanes; }  // planes per image
};
// Largest window whose tap index fits the u8 workspace.
constexpr int64_t kMaxPoolMaxTaps = 256;
// y and arg (the window tap, kh * KW + kw, of each maximum; ties keep the first) in y's storage.
void max_pool_forward(CpuIsa isa, const float* x, float* y, uint8_t* arg, const MaxPoolGeometry& g, int threads);
// dx (fully written, padding lanes zero) = dy scattered to where each maximum came from.
void max_pool_backward(const float* dy, const uint8_t* arg, float* dx, const MaxPoolGeometry& g, int threads);

// Convolution weight and bias gradients computed directly, for groups 1: dy stored as
// [N, O / L, OH, OW, L] with L = dy_lanes (8 or 16: oneDNN's nChw8c / nChw16c), x as
// [N, C / x_lanes, H, W, x_lanes] (x_lanes 1 is plain NCHW), dw plain [O, C, KH, KW], db [O] or
// null. Meant for small layers whose channel counts are not whole vectors (LeNet-5's 1 -> 6 and
// 6 -> 16), where oneDNN 2.6's AVX2 backward-weights kernels pad and mask (3.5-5 ms for
// LeNet-5's first layer at batch 64). Dilations as in ConvParams: 1 is a dense kernel.
constexpr int64_t kDirectConvMaxKw = 7;  // kernel width: one accumulator register per column
struct ConvWeightsGeometry {
  int64_t n, c, h, w, o, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw, x_lanes, dy_lanes;
};
void conv_backward_weights_direct(CpuIsa isa, const float* x, const float* dy, float* dw, float* db,
                                  const ConvWeightsGeometry& g, bool accumulate, int threads);

// db[o] (= or +=) sum over rows n of dy[n, o], rows added in order (as a column loop would).
void bias_grad(CpuIsa isa, const float* dy, float* db, int64_t rows, int64_t cols, bool accumulate);

}  // namespace tandem::engine::compute::cpu::kernels
