// Vectorized CPU kernels (cpu_kernels.hpp). Each kernel that vectorizes is compiled once per ISA
// (cpu_kernels_isa.inc: AVX-512F, AVX2 and the baseline) and the caller picks one variant by the
// CpuIsa it passes (the backend's, from TANDEM_CPU_MAX_ISA and the CPU). This file is built with
// -ffp-contract=off and "avx2" does not enable FMA, so every variant rounds alike: same bits.
#include "engine/compute/cpu/cpu_kernels.hpp"

#include <algorithm>
#include <cstring>
#include <limits>

namespace tandem::engine::compute::cpu::kernels {
namespace {

// One image's channel block: x [H, W, L], y and arg [OH, OW, L]; lanes >= valid are zeroed.
template <int L>
[[gnu::always_inline]] inline void max_pool_plane(const float* __restrict x, float* __restrict y, uint8_t* __restrict arg,
                                      const MaxPoolGeometry& g, int64_t valid) {
  for (int64_t oh = 0; oh < g.oh; ++oh) {
    const int64_t h0 = oh * g.sh - g.ph;
    for (int64_t ow = 0; ow < g.ow; ++ow) {
      const int64_t w0 = ow * g.sw - g.pw;
      float best[L];
      uint8_t at[L];
      for (int l = 0; l < L; ++l) {
        best[l] = -std::numeric_limits<float>::infinity();
        at[l] = 0;
      }
      bool first = true;
      for (int64_t i = 0; i < g.kh; ++i) {
        const int64_t h = h0 + i;
        if (h < 0 || h >= g.h) continue;
        for (int64_t j = 0; j < g.kw; ++j) {
          const int64_t w = w0 + j;
          if (w < 0 || w >= g.w) continue;
          const float* v = x + (h * g.w + w) * L;
          const auto tap = static_cast<uint8_t>(i * g.kw + j);
          // The first valid tap is taken as is (so a NaN there, or -inf, still names a tap).
          for (int l = 0; l < L; ++l) {
            const bool take = first || v[l] > best[l];
            best[l] = take ? v[l] : best[l];
            at[l] = take ? tap : at[l];
          }
          first = false;
        }
      }
      float* yo = y + (oh * g.ow + ow) * L;
      uint8_t* ao = arg + (oh * g.ow + ow) * L;
      for (int l = 0; l < L; ++l) {
        yo[l] = l < valid ? best[l] : 0.0f;
        ao[l] = at[l];
      }
    }
  }
}

template <int L>
void max_pool_backward_plane(const float* __restrict dy, const uint8_t* __restrict arg, float* __restrict dx,
                             const MaxPoolGeometry& g, int64_t valid) {
  std::memset(dx, 0, sizeof(float) * g.h * g.w * L);
  for (int64_t oh = 0; oh < g.oh; ++oh)
    for (int64_t ow = 0; ow < g.ow; ++ow) {
      const float* d = dy + (oh * g.ow + ow) * L;
      const uint8_t* a = arg + (oh * g.ow + ow) * L;
      for (int64_t l = 0; l < valid; ++l) {
        const int64_t h = oh * g.sh - g.ph + a[l] / g.kw, w = ow * g.sw - g.pw + a[l] % g.kw;
        dx[(h * g.w + w) * L + l] += d[l];
      }
    }
}

// Channel c of image n of a tensor stored as [N, C / lanes, H, W, lanes] (lanes 1: plain NCHW):
// element (h, w) is at plane[(h * W + w) * lanes].
struct Blocked {
  const float* p;
  int64_t cb, h, w, lanes;
  const float* plane(int64_t n, int64_t c) const { return p + ((n * cb + c / lanes) * h * w) * lanes + c % lanes; }
};

// L floats as one GCC vector (two SSE registers in the baseline variant, one AVX register for L 8).
template <int L> struct Lanes;
template <> struct Lanes<8> { typedef float V __attribute__((vector_size(32))); };
template <> struct Lanes<16> { typedef float V __attribute__((vector_size(64))); };

// acc[j] += x at kernel row i, column j of input channel c times dy, over one image's output
// pixels (dyb: that image's L-lane block of dy). T = KW accumulators stay in registers.
template <int L, int T>
[[gnu::always_inline]] inline void conv_dw_image(const Blocked& x, const float* __restrict dyb,
                                                 const ConvWeightsGeometry& g, int64_t n, int64_t c, int64_t i,
                                                 typename Lanes<L>::V (&acc)[T]) {
  using V = typename Lanes<L>::V;
  const float* xp = x.plane(n, c);
  const int64_t xl = x.lanes, dwx = g.dw * xl;
  V a[T];
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) a[t] = acc[t];
  for (int64_t oh = 0; oh < g.oh; ++oh) {
    const int64_t ih = oh * g.sh - g.ph + i * g.dh;
    if (ih < 0 || ih >= g.h) continue;
    const float* row = xp + ih * g.w * xl;
    for (int64_t ow = 0; ow < g.ow; ++ow) {
      V d;
      std::memcpy(&d, dyb + (oh * g.ow + ow) * L, sizeof d);
      const int64_t iw0 = ow * g.sw - g.pw;
      if (iw0 >= 0 && iw0 + (T - 1) * g.dw < g.w) {  // every tap inside the row
        const float* r = row + iw0 * xl;
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t) a[t] += r[t * dwx] * d;
      } else {
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t) {
          const int64_t iw = iw0 + t * g.dw;
          if (iw >= 0 && iw < g.w) a[t] += row[iw * xl] * d;
        }
      }
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) acc[t] = a[t];
}

template <int L, int T>
[[gnu::always_inline]] inline void conv_dw_task(const Blocked& x, const float* dy, float* dw, const ConvWeightsGeometry& g, int64_t ob, int64_t c,
                  int64_t i, bool accumulate) {
  using V = typename Lanes<L>::V;
  const int64_t ob_count = (g.o + L - 1) / L, valid = std::min<int64_t>(L, g.o - ob * L);
  V total[T] = {};
  for (int64_t n = 0; n < g.n; ++n) {  // per-image partial sums keep the float error small
    V acc[T] = {};
    conv_dw_image<L, T>(x, dy + ((n * ob_count + ob) * g.oh * g.ow) * L, g, n, c, i, acc);
    for (int t = 0; t < T; ++t) total[t] += acc[t];
  }
  for (int64_t l = 0; l < valid; ++l)
    for (int t = 0; t < T; ++t) {
      float& out = dw[(((ob * L + l) * g.c + c) * g.kh + i) * g.kw + t];
      out = accumulate ? out + total[t][l] : total[t][l];
    }
}

template <int L>
[[gnu::always_inline]] inline void conv_dw_task_kw(const Blocked& x, const float* dy, float* dw,
                                                   const ConvWeightsGeometry& g, int64_t ob, int64_t c, int64_t i,
                                                   bool accumulate) {
  switch (g.kw) {
    case 1: return conv_dw_task<L, 1>(x, dy, dw, g, ob, c, i, accumulate);
    case 2: return conv_dw_task<L, 2>(x, dy, dw, g, ob, c, i, accumulate);
    case 3: return conv_dw_task<L, 3>(x, dy, dw, g, ob, c, i, accumulate);
    case 4: return conv_dw_task<L, 4>(x, dy, dw, g, ob, c, i, accumulate);
    case 5: return conv_dw_task<L, 5>(x, dy, dw, g, ob, c, i, accumulate);
    case 6: return conv_dw_task<L, 6>(x, dy, dw, g, ob, c, i, accumulate);
    default: return conv_dw_task<L, 7>(x, dy, dw, g, ob, c, i, accumulate);
  }
}

}  // namespace
}  // namespace tandem::engine::compute::cpu::kernels

// The per-ISA variants; the always_inline helpers above are inlined into each and compiled for its ISA.
#define TANDEM_ISA_VARIANTS_FILE "engine/compute/cpu/cpu_kernels_isa.inc"
#include "engine/core/cpu_isa_variants.inc"

namespace tandem::engine::compute::cpu::kernels {
namespace {

// One ISA's entry points.
struct Variant {
  decltype(&isa_baseline::sgd_plain) sgd_plain;
  decltype(&isa_baseline::sgd_first) sgd_first;
  decltype(&isa_baseline::sgd_momentum) sgd_momentum;
  decltype(&isa_baseline::max_pool_plane1) max_pool_plane1, max_pool_plane8, max_pool_plane16;
  decltype(&isa_baseline::bias_grad) bias_grad;
  decltype(&isa_baseline::conv_dw_task8) conv_dw_task8, conv_dw_task16;
};
#define TANDEM_VARIANT(NS)                                                                                \
  Variant {                                                                                               \
    NS::sgd_plain, NS::sgd_first, NS::sgd_momentum, NS::max_pool_plane1, NS::max_pool_plane8,             \
        NS::max_pool_plane16, NS::bias_grad, NS::conv_dw_task8, NS::conv_dw_task16                        \
  }

// The variant for `isa`, never above what this CPU runs.
const Variant& variant(CpuIsa isa) {
#if defined(TANDEM_CPU_ISA_VARIANTS)
  static const Variant v[3] = {TANDEM_VARIANT(isa_baseline), TANDEM_VARIANT(isa_avx2), TANDEM_VARIANT(isa_avx512)};
  return v[static_cast<int>(variant_cpu_isa(isa))];
#else
  static const Variant v = TANDEM_VARIANT(isa_baseline);
  (void)isa;
  return v;
#endif
}

template <typename F> void for_planes(const MaxPoolGeometry& g, int threads, F&& f) {
  constexpr int64_t kParallelMinElems = 1 << 15;
  const int64_t planes = g.n * g.blocks();
  const bool big = planes * g.h * g.w * g.lanes >= kParallelMinElems;
  parallel_chunks(planes, big ? threads : 1, 2, [&](int64_t lo, int64_t hi) {
    for (int64_t p = lo; p < hi; ++p) f(p, std::min(g.lanes, g.channels - (p % g.blocks()) * g.lanes));
  });
}

}  // namespace

void sgd(CpuIsa isa, float* w, const float* g, float* b, int64_t n, const SgdStep& s) {
  const Variant& v = variant(isa);
  if (!s.use_momentum) return v.sgd_plain(w, g, n, s.lr, s.weight_decay);
  if (s.first) return v.sgd_first(w, g, b, n, s.lr, s.weight_decay, s.momentum, s.nesterov);
  v.sgd_momentum(w, g, b, n, s.lr, s.weight_decay, s.momentum, s.damp, s.nesterov);
}

void max_pool_forward(CpuIsa isa, const float* x, float* y, uint8_t* arg, const MaxPoolGeometry& g, int threads) {
  const Variant& v = variant(isa);
  const auto plane = g.lanes == 1 ? v.max_pool_plane1 : g.lanes == 8 ? v.max_pool_plane8 : v.max_pool_plane16;
  const int64_t xs = g.h * g.w * g.lanes, ys = g.oh * g.ow * g.lanes;
  for_planes(g, threads, [&](int64_t p, int64_t valid) { plane(x + p * xs, y + p * ys, arg + p * ys, g, valid); });
}

void max_pool_backward(const float* dy, const uint8_t* arg, float* dx, const MaxPoolGeometry& g, int threads) {
  const int64_t xs = g.h * g.w * g.lanes, ys = g.oh * g.ow * g.lanes;
  for_planes(g, threads, [&](int64_t p, int64_t valid) {
    switch (g.lanes) {
      case 1: return max_pool_backward_plane<1>(dy + p * ys, arg + p * ys, dx + p * xs, g, valid);
      case 8: return max_pool_backward_plane<8>(dy + p * ys, arg + p * ys, dx + p * xs, g, valid);
      default: return max_pool_backward_plane<16>(dy + p * ys, arg + p * ys, dx + p * xs, g, valid);
    }
  });
}

void bias_grad(CpuIsa isa, const float* dy, float* db, int64_t rows, int64_t cols, bool accumulate) {
  variant(isa).bias_grad(dy, db, rows, cols, accumulate);
}

void conv_backward_weights_direct(CpuIsa isa, const float* x, const float* dy, float* dw, float* db,
                                  const ConvWeightsGeometry& g, bool accumulate, int threads) {
  const Variant& v = variant(isa);
  const int64_t L = g.dy_lanes, ob_count = (g.o + L - 1) / L;
  const Blocked xb{x, (g.c + g.x_lanes - 1) / g.x_lanes, g.h, g.w, g.x_lanes};
  const int64_t tasks = ob_count * g.c * g.kh;  // each writes its own dw entries
  const auto task = L == 8 ? v.conv_dw_task8 : v.conv_dw_task16;
  parallel_chunks(tasks, threads, 2, [&](int64_t lo, int64_t hi) {
    for (int64_t k = lo; k < hi; ++k) {
      const int64_t ob = k / (g.c * g.kh), c = k / g.kh % g.c, i = k % g.kh;
      task(xb, dy, dw, g, ob, c, i, accumulate);
    }
  });
  if (db == nullptr) return;
  const int64_t plane = g.oh * g.ow;
  for (int64_t ob = 0; ob < ob_count; ++ob) {
    double s[16] = {};
    for (int64_t n = 0; n < g.n; ++n) {
      const float* d = dy + (n * ob_count + ob) * plane * L;
      for (int64_t p = 0; p < plane; ++p)
        for (int64_t l = 0; l < L; ++l) s[l] += d[p * L + l];
    }
    for (int64_t l = 0; l < L && ob * L + l < g.o; ++l) {
      float& out = db[ob * L + l];
      out = accumulate ? out + static_cast<float>(s[l]) : static_cast<float>(s[l]);
    }
  }
}

}  // namespace tandem::engine::compute::cpu::kernels
