// Tandem's Winograd F(4x4, 3x3) transforms (cpu_winograd.hpp). Each is compiled once per ISA
// (cpu_winograd_isa.inc through engine/core/cpu_isa_variants.inc) on 8-lane vectors of GCC's vector
// extension: one nChw8c channel block per vector, so the AVX2 and AVX-512 variants run whole ymm
// registers and the baseline pairs of SSE ones.
#include "engine/compute/cpu/cpu_winograd.hpp"

#include <algorithm>
#include <cstring>

#include <immintrin.h>

#include "engine/compute/cpu/cpu_kernels.hpp"

#pragma GCC diagnostic ignored "-Wpsabi"  // the vector type never crosses a non-inlined call

namespace tandem::engine::compute::cpu::winograd {
namespace {

using v8f = float __attribute__((vector_size(32)));

[[gnu::always_inline]] inline v8f load8(const float* p) {
  v8f r;
  std::memcpy(&r, p, sizeof(r));
  return r;
}
[[gnu::always_inline]] inline void store8(float* p, v8f v) { std::memcpy(p, &v, sizeof(v)); }
[[gnu::always_inline]] inline v8f splat(float f) { return v8f{f, f, f, f, f, f, f, f}; }

// B^T d over 6 points (Lavin and Gray's F(4,3) with interpolation points 0, 1, -1, 2, -2, inf).
[[gnu::always_inline]] inline void bt6(const v8f d[6], v8f t[6]) {
  const v8f four = splat(4.0f), five = splat(5.0f), two = splat(2.0f);
  t[0] = four * d[0] - five * d[2] + d[4];
  t[1] = d[3] + d[4] - four * (d[1] + d[2]);
  t[2] = four * (d[1] - d[2]) - d[3] + d[4];
  t[3] = two * (d[3] - d[1]) - d[2] + d[4];
  t[4] = two * (d[1] - d[3]) - d[2] + d[4];
  t[5] = four * d[1] - five * d[3] + d[5];
}

// A^T m: 6 points to 4 outputs.
[[gnu::always_inline]] inline void at4(const v8f m[6], v8f s[4]) {
  const v8f a = m[1] + m[2], b = m[1] - m[2], c = m[3] + m[4], d = m[3] - m[4];
  s[0] = m[0] + a + c;
  s[1] = b + splat(2.0f) * d;
  s[2] = a + splat(4.0f) * c;
  s[3] = b + splat(8.0f) * d + m[5];
}

// G g: 3 taps to 6 points.
[[gnu::always_inline]] inline void g6(const v8f g[3], v8f u[6]) {
  const v8f sixth = splat(1.0f / 6.0f);
  const v8f even = g[0] + g[2];
  u[0] = splat(0.25f) * g[0];
  u[1] = -sixth * (even + g[1]);
  u[2] = -sixth * (even - g[1]);
  const v8f p = splat(1.0f / 24.0f) * g[0] + sixth * g[2], q = splat(1.0f / 12.0f) * g[1];
  u[3] = p + q;
  u[4] = p - q;
  u[5] = g[2];
}

// The adjoint of at4 (A s: 4 outputs' gradients to 6 points).
[[gnu::always_inline]] inline void a6(const v8f s[4], v8f m[6]) {
  const v8f even = s[0] + splat(4.0f) * s[2], odd = s[1] + splat(4.0f) * s[3];
  m[0] = s[0];
  m[1] = s[0] + s[1] + s[2] + s[3];
  m[2] = s[0] - s[1] + s[2] - s[3];
  m[3] = even + splat(2.0f) * odd;
  m[4] = even - splat(2.0f) * odd;
  m[5] = s[3];
}

// The adjoint of g6 (G^T u: 6 points' gradients to 3 taps).
[[gnu::always_inline]] inline void gt3(const v8f u[6], v8f g[3]) {
  const v8f sixth = splat(1.0f / 6.0f), p = u[3] + u[4], q = u[3] - u[4];
  g[0] = splat(0.25f) * u[0] - sixth * (u[1] + u[2]) + splat(1.0f / 24.0f) * p;
  g[1] = sixth * (u[2] - u[1]) + splat(1.0f / 12.0f) * q;
  g[2] = sixth * (p - u[1] - u[2]) + u[5];
}

// F d F^T for an n x n block d through the 1-D map f (n values to 6 points), point (i, j) stored at
// dst + (i * 6 + j) * stride.
template <int64_t n, void (*f)(const v8f*, v8f*)>
[[gnu::always_inline]] inline void transform_store(const v8f (&d)[n][n], float* dst, int64_t stride) {
  v8f t[kAlpha][n];
  for (int64_t j = 0; j < n; ++j) {
    v8f col[n], out[kAlpha];
    for (int64_t i = 0; i < n; ++i) col[i] = d[i][j];
    f(col, out);
    for (int64_t i = 0; i < kAlpha; ++i) t[i][j] = out[i];
  }
  for (int64_t i = 0; i < kAlpha; ++i) {
    v8f out[kAlpha];
    f(t[i], out);
    for (int64_t j = 0; j < kAlpha; ++j) store8(dst + (i * kAlpha + j) * stride, out[j]);
  }
}

// The 6x6 input tile at (h0, w0) of one channel block of one image (xp), zero outside the plane.
[[gnu::always_inline]] inline void load_tile(const float* __restrict xp, const Geometry& g, int64_t h0, int64_t w0,
                                             v8f d[kAlpha][kAlpha]) {
  const bool inside = h0 >= 0 && w0 >= 0 && h0 + kAlpha <= g.h && w0 + kAlpha <= g.w;
  for (int64_t i = 0; i < kAlpha; ++i)
    for (int64_t j = 0; j < kAlpha; ++j) {
      const int64_t ih = h0 + i, iw = w0 + j;
      d[i][j] = (inside || (ih >= 0 && ih < g.h && iw >= 0 && iw < g.w)) ? load8(xp + (ih * g.w + iw) * kLanes)
                                                                         : splat(0.0f);
    }
}

// V rows [0, count) of a block: tiles t0 .. t0 + count - 1, every channel block; vb is [36][block][cp].
[[gnu::always_inline]] inline void input_tiles(const float* __restrict x, float* __restrict vb, const Geometry& g,
                                               int64_t t0, int64_t count) {
  const int64_t th_n = g.tiles_h(), tw_n = g.tiles_w(), cp = g.cp(), blocks = cp / kLanes;
  const int64_t point_stride = g.block * cp;
  for (int64_t k = 0; k < count; ++k) {
    const int64_t t = t0 + k, n = t / (th_n * tw_n), th = t / tw_n % th_n, tw = t % tw_n;
    const int64_t h0 = th * kTile - g.pad_h, w0 = tw * kTile - g.pad_w;
    for (int64_t cb = 0; cb < blocks; ++cb) {
      v8f d[kAlpha][kAlpha];
      load_tile(x + (n * blocks + cb) * g.h * g.w * kLanes, g, h0, w0, d);
      transform_store<kAlpha, bt6>(d, vb + k * cp + cb * kLanes, point_stride);
    }
  }
}

// One [1 input channel] x [8 output channels] block of U (packed: u_offset).
[[gnu::always_inline]] inline void weight_block(const float* __restrict w, float* __restrict u, const Geometry& g,
                                                bool flip, int64_t ci, int64_t ob) {
  float taps[9][kLanes];
  for (int64_t l = 0; l < kLanes; ++l) {
    const int64_t co = ob * kLanes + l;
    const bool real = ci < g.c && co < g.o;
    for (int64_t k = 0; k < 9; ++k)
      taps[k][l] = !real ? 0.0f : flip ? w[(ci * g.o + co) * 9 + (8 - k)] : w[(co * g.c + ci) * 9 + k];
  }
  v8f t[kAlpha][3];
  for (int64_t kw = 0; kw < 3; ++kw) {
    const v8f col[3] = {load8(taps[kw]), load8(taps[3 + kw]), load8(taps[6 + kw])};
    v8f out[kAlpha];
    g6(col, out);
    for (int64_t i = 0; i < kAlpha; ++i) t[i][kw] = out[i];
  }
  for (int64_t i = 0; i < kAlpha; ++i) {
    v8f out[kAlpha];
    g6(t[i], out);
    for (int64_t j = 0; j < kAlpha; ++j) store8(u + u_offset(g, i * kAlpha + j, ci, ob * kLanes), out[j]);
  }
}

// Rows [r0, r1) of the source weights, in their memory order: output channels (forward: w is
// [o][c][3][3]) or input channels (flip: w is [c][o][3][3]), 8 at a time as U's blocks.
[[gnu::always_inline]] inline void weight_tiles(const float* __restrict w, float* __restrict u, const Geometry& g,
                                                bool flip, int64_t r0, int64_t r1) {
  if (flip) {
    for (int64_t ci = r0; ci < r1; ++ci)
      for (int64_t ob = 0; ob < g.op() / kLanes; ++ob) weight_block(w, u, g, flip, ci, ob);
  } else {
    for (int64_t ob = r0; ob < r1; ++ob)
      for (int64_t ci = 0; ci < g.cp(); ++ci) weight_block(w, u, g, flip, ci, ob);
  }
}

// Output tile t's image, first row and column, and rows and columns inside the plane.
struct OutputTile {
  int64_t n, oh0, ow0, rows, cols;
};
[[gnu::always_inline]] inline OutputTile output_tile(const Geometry& g, int64_t t) {
  const int64_t th_n = g.tiles_h(), tw_n = g.tiles_w(), oh0 = t / tw_n % th_n * kTile, ow0 = t % tw_n * kTile;
  return {t / (th_n * tw_n), oh0, ow0, std::min(kTile, g.oh - oh0), std::min(kTile, g.ow - ow0)};
}

// y for tiles t0 .. t0 + count - 1 from their products mb [36][block][op], plus bias.
[[gnu::always_inline]] inline void output_tiles(const float* __restrict mb, const float* __restrict bias,
                                                float* __restrict y, const Geometry& g, int64_t t0, int64_t count) {
  const int64_t op = g.op(), blocks = op / kLanes, point_stride = g.block * op;
  for (int64_t k = 0; k < count; ++k) {
    const auto [n, oh0, ow0, rows, cols] = output_tile(g, t0 + k);
    for (int64_t ob = 0; ob < blocks; ++ob) {
      const float* mp = mb + k * op + ob * kLanes;
      v8f s[kTile][kAlpha];
      for (int64_t j = 0; j < kAlpha; ++j) {
        v8f col[kAlpha], out[kTile];
        for (int64_t i = 0; i < kAlpha; ++i) col[i] = load8(mp + (i * kAlpha + j) * point_stride);
        at4(col, out);
        for (int64_t i = 0; i < kTile; ++i) s[i][j] = out[i];
      }
      v8f b = splat(0.0f);
      if (bias != nullptr) {
        float lanes[kLanes];
        for (int64_t l = 0; l < kLanes; ++l) lanes[l] = ob * kLanes + l < g.o ? bias[ob * kLanes + l] : 0.0f;
        b = load8(lanes);
      }
      float* yp = y + ((n * blocks + ob) * g.oh + oh0) * g.ow * kLanes;
      for (int64_t i = 0; i < rows; ++i) {
        v8f out[kTile];
        at4(s[i], out);
        for (int64_t j = 0; j < cols; ++j) store8(yp + (i * g.ow + ow0 + j) * kLanes, out[j] + b);
      }
    }
  }
}

// dM = A dY A^T for tiles t0 .. t0 + count - 1 of dy (nChw8c, [n, o, oh, ow]; outside the plane zero)
// into mb [36][block][op]: the adjoint of output_tiles.
[[gnu::always_inline]] inline void grad_tiles(const float* __restrict dy, float* __restrict mb, const Geometry& g,
                                              int64_t t0, int64_t count) {
  const int64_t op = g.op(), blocks = op / kLanes, point_stride = g.block * op;
  for (int64_t k = 0; k < count; ++k) {
    const auto [n, oh0, ow0, rows, cols] = output_tile(g, t0 + k);
    for (int64_t ob = 0; ob < blocks; ++ob) {
      const float* yp = dy + ((n * blocks + ob) * g.oh + oh0) * g.ow * kLanes;
      v8f d[kTile][kTile];
      for (int64_t i = 0; i < kTile; ++i)
        for (int64_t j = 0; j < kTile; ++j)
          d[i][j] = i < rows && j < cols ? load8(yp + (i * g.ow + ow0 + j) * kLanes) : splat(0.0f);
      transform_store<kTile, a6>(d, mb + k * op + ob * kLanes, point_stride);
    }
  }
}

// dw (plain [o][c][3][3]; = or +=) = G^T dU G for input channels [c0, c1), dU [36][cp][op] plain.
[[gnu::always_inline]] inline void weight_grad_tiles(const float* __restrict du, float* __restrict dw,
                                                     const Geometry& g, bool accumulate, int64_t c0, int64_t c1) {
  const int64_t op = g.op(), point_stride = g.cp() * op;
  for (int64_t ci = c0; ci < c1; ++ci)
    for (int64_t ob = 0; ob < op / kLanes; ++ob) {
      v8f t[3][kAlpha];
      for (int64_t j = 0; j < kAlpha; ++j) {
        v8f col[kAlpha], out[3];
        for (int64_t i = 0; i < kAlpha; ++i) col[i] = load8(du + (i * kAlpha + j) * point_stride + ci * op + ob * kLanes);
        gt3(col, out);
        for (int64_t i = 0; i < 3; ++i) t[i][j] = out[i];
      }
      float taps[9][kLanes];
      for (int64_t i = 0; i < 3; ++i) {
        v8f out[3];
        gt3(t[i], out);
        for (int64_t j = 0; j < 3; ++j) store8(taps[i * 3 + j], out[j]);
      }
      for (int64_t l = 0; l < kLanes && ob * kLanes + l < g.o; ++l) {
        float* d = dw + ((ob * kLanes + l) * g.c + ci) * 9;
        for (int64_t k = 0; k < 9; ++k) d[k] = accumulate ? d[k] + taps[k][l] : taps[k][l];
      }
    }
}

// du[e] += vb[e]^T . mb[e] over rows [0, count) (the weights' products), plain C++.
void gemm_t_generic(const float* __restrict vb, const float* __restrict mb, float* __restrict du, const Geometry& g,
                    int64_t count) {
  const int64_t cp = g.cp(), op = g.op();
  for (int64_t e = 0; e < kPoints; ++e)
    for (int64_t r = 0; r < count; ++r) {
      const float* a = vb + (e * g.block + r) * cp;
      const float* b = mb + (e * g.block + r) * op;
      float* c = du + e * cp * op;
      for (int64_t i = 0; i < cp; ++i)
        for (int64_t j = 0; j < op; ++j) c[i * op + j] += a[i] * b[j];
    }
}

// mb[e] = vb[e] . U[e] for every point e, rows [0, count), in plain C++ (the baseline ISA; the
// vector ISAs run gemm_fma below).
void gemm_generic(const float* __restrict vb, const float* __restrict u, float* __restrict mb, const Geometry& g,
                  int64_t count) {
  const int64_t cp = g.cp(), op = g.op();
  for (int64_t e = 0; e < kPoints; ++e)
    for (int64_t r = 0; r < count; ++r) {
      float* c = mb + (e * g.block + r) * op;
      const float* a = vb + (e * g.block + r) * cp;
      for (int64_t j = 0; j < op; ++j) c[j] = 0.0f;
      for (int64_t k = 0; k < cp; ++k)
        for (int64_t j = 0; j < op; ++j) c[j] += a[k] * u[u_offset(g, e, k, j)];
    }
}

// The AVX2/FMA products: a 6-row x 16-column register block (12 accumulators) over the whole depth:
// c[NR x NW*8] (+)= a . b with a(r, k) = a[r * ar + k * ak] and b(k, j) = b[k * bk + j]. All AVX2 CPUs
// but a few early VIA ones have FMA; where it is missing the generic products run.
template <int NR, int NW, bool kAccumulate>
[[gnu::target("avx2,fma"), gnu::always_inline]] inline void micro(const float* __restrict a, int64_t ar, int64_t ak,
                                                                  const float* __restrict b, int64_t bk, int64_t depth,
                                                                  float* __restrict c, int64_t ldc) {
  __m256 acc[NR][NW];
  for (int r = 0; r < NR; ++r)
    for (int j = 0; j < NW; ++j) acc[r][j] = kAccumulate ? _mm256_loadu_ps(c + r * ldc + j * 8) : _mm256_setzero_ps();
  for (int64_t k = 0; k < depth; ++k) {
    __m256 bv[NW];
    for (int j = 0; j < NW; ++j) bv[j] = _mm256_loadu_ps(b + k * bk + j * 8);
    for (int r = 0; r < NR; ++r) {
      const __m256 av = _mm256_broadcast_ss(a + r * ar + k * ak);
      for (int j = 0; j < NW; ++j) acc[r][j] = _mm256_fmadd_ps(av, bv[j], acc[r][j]);
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int j = 0; j < NW; ++j) _mm256_storeu_ps(c + r * ldc + j * 8, acc[r][j]);
}

// Rows [0, nr) (nr <= 6) of c, 16 columns (wide) or 8.
template <bool kAccumulate>
[[gnu::target("avx2,fma"), gnu::always_inline]] inline void micro_rows(int64_t nr, bool wide, const float* a,
                                                                       int64_t ar, int64_t ak, const float* b,
                                                                       int64_t bk, int64_t depth, float* c,
                                                                       int64_t ldc) {
#define TANDEM_WINO_MICRO(NR)                                                                 \
  case NR:                                                                                    \
    return wide ? micro<NR, 2, kAccumulate>(a, ar, ak, b, bk, depth, c, ldc)                  \
                : micro<NR, 1, kAccumulate>(a, ar, ak, b, bk, depth, c, ldc)
  switch (nr) {
    TANDEM_WINO_MICRO(6);
    TANDEM_WINO_MICRO(5);
    TANDEM_WINO_MICRO(4);
    TANDEM_WINO_MICRO(3);
    TANDEM_WINO_MICRO(2);
    default: return wide ? micro<1, 2, kAccumulate>(a, ar, ak, b, bk, depth, c, ldc)
                         : micro<1, 1, kAccumulate>(a, ar, ak, b, bk, depth, c, ldc);
  }
#undef TANDEM_WINO_MICRO
}

// du[e] (cp x op) += vb[e]^T mb[e] for every point e, the depth being the block's tiles.
[[gnu::target("avx2,fma")]] void gemm_t_fma(const float* __restrict vb, const float* __restrict mb,
                                           float* __restrict du, const Geometry& g, int64_t count) {
  constexpr int64_t kRows = 6;
  const int64_t cp = g.cp(), op = g.op();
  for (int64_t e = 0; e < kPoints; ++e) {
    const float* a = vb + e * g.block * cp;
    const float* b = mb + e * g.block * op;
    float* c = du + e * cp * op;
    for (int64_t r0 = 0; r0 < cp; r0 += kRows)
      for (int64_t j0 = 0; j0 < op; j0 += 16) {
        micro_rows<true>(std::min(kRows, cp - r0), op - j0 >= 16, a + r0, 1, cp, b + j0, op, count,
                         c + r0 * op + j0, op);
      }
  }
}

[[gnu::target("avx2,fma")]] void gemm_fma(const float* __restrict vb, const float* __restrict u, float* __restrict mb,
                                         const Geometry& g, int64_t count) {
  constexpr int64_t kRows = 6;
  const int64_t cp = g.cp(), op = g.op();
  // The smaller of a point's U (cp x op) and V (count x cp) is re-read from cache, the other streamed once.
  const bool rows_outer = op <= count;
  const int64_t outer = rows_outer ? count : op, inner = rows_outer ? op : count;
  const int64_t outer_step = rows_outer ? kRows : 16, inner_step = rows_outer ? 16 : kRows;
  for (int64_t e = 0; e < kPoints; ++e) {
    const float* a = vb + e * g.block * cp;
    float* c = mb + e * g.block * op;
    const float* ue = u + u_offset(g, e, 0, 0);
    for (int64_t i = 0; i < outer; i += outer_step)
      for (int64_t k = 0; k < inner; k += inner_step) {
        const int64_t r0 = rows_outer ? i : k, j0 = rows_outer ? k : i;
        const int64_t pw = std::min<int64_t>(16, op - j0);
        micro_rows<false>(std::min(kRows, count - r0), pw == 16, a + r0 * cp, cp, 1, ue + j0 * cp, pw, cp,
                          c + r0 * op + j0, op);
      }
  }
}

}  // namespace
}  // namespace tandem::engine::compute::cpu::winograd

#define TANDEM_ISA_VARIANTS_FILE "engine/compute/cpu/cpu_winograd_isa.inc"
#include "engine/core/cpu_isa_variants.inc"

namespace tandem::engine::compute::cpu::winograd {
namespace {

struct Variant {
  decltype(&isa_baseline::input_block) input;
  decltype(&isa_baseline::weight_rows) weights;
  decltype(&isa_baseline::output_block) output;
  decltype(&isa_baseline::grad_block) grad;
  decltype(&isa_baseline::weight_grad_rows) weight_grad;
};
#define TANDEM_VARIANT(NS) \
  Variant { NS::input_block, NS::weight_rows, NS::output_block, NS::grad_block, NS::weight_grad_rows }

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
#undef TANDEM_VARIANT

using Gemm = void (*)(const float*, const float*, float*, const Geometry&, int64_t);
// The products' kernel for `isa`: the FMA one (`transposed`: the weights' gradient) or the generic one.
Gemm gemm_for(CpuIsa isa, bool transposed) {
#if defined(__x86_64__) && defined(TANDEM_CPU_ISA_VARIANTS)
  static const bool fma = __builtin_cpu_supports("fma");
  if (fma && variant_cpu_isa(isa) != CpuIsa::kBaseline) return transposed ? gemm_t_fma : gemm_fma;
#endif
  (void)isa;
  return transposed ? gemm_t_generic : gemm_generic;
}

}  // namespace

void plan_block(Geometry& g, int threads) {
  constexpr int64_t kCacheFloats = 192 * 1024;  // 768 KiB of a core's L2 for a block's V and M
  const int64_t T = g.tiles(), per_thread = (T + threads - 1) / std::max(threads, 1);
  const int64_t fit = std::max<int64_t>(6, kCacheFloats / (kPoints * (g.cp() + g.op())) / 6 * 6);
  // Per tile, a cached block re-reads U / fit floats; an uncached one writes and reads V and M.
  const bool cached = static_cast<double>(u_floats(g)) / fit < 2.0 * kPoints * (g.cp() + g.op());
  g.block = std::max<int64_t>(1, cached ? std::min(fit, per_thread) : per_thread);
}

void weight_transform(CpuIsa isa, const float* w, float* u, const Geometry& g, bool flip, int threads) {
  const auto f = variant(isa).weights;
  const int64_t rows = flip ? g.cp() : g.op() / kLanes;
  kernels::parallel_chunks(rows, threads, 2, [&](int64_t lo, int64_t hi) { f(w, u, g, flip, lo, hi); });
}

void convolution(CpuIsa isa, const float* x, const float* u, const float* bias, float* y, float* scratch,
                 const Geometry& g, int threads) {
  const Variant& v = variant(isa);
  const Gemm gemm = gemm_for(isa, false);
  const int64_t T = g.tiles(), per_thread = kPoints * g.block * (g.cp() + g.op());
  kernels::parallel_chunks(g.blocks(), threads, 2, [&](int64_t lo, int64_t hi) {
    float* vb = scratch + omp_get_thread_num() * per_thread;
    float* mb = vb + kPoints * g.block * g.cp();
    for (int64_t b = lo; b < hi; ++b) {
      const int64_t t0 = b * g.block, count = std::min(g.block, T - t0);
      v.input(x, vb, g, t0, count);
      gemm(vb, u, mb, g, count);
      v.output(mb, bias, y, g, t0, count);
    }
  });
}

void weight_gradient(CpuIsa isa, const float* x, const float* dy, float* dw, bool accumulate, float* scratch,
                     float* du, const Geometry& g, int threads) {
  const Variant& v = variant(isa);
  const Gemm gemm = gemm_for(isa, true);
  const int64_t T = g.tiles(), per_thread = kPoints * g.block * (g.cp() + g.op()), du_size = u_floats(g);
  const int64_t parts = std::min<int64_t>(threads, g.blocks());
  std::fill(du, du + parts * du_size, 0.0f);
  kernels::parallel_chunks(g.blocks(), threads, 2, [&](int64_t lo, int64_t hi) {
    const int64_t me = omp_get_thread_num();
    float* vb = scratch + me * per_thread;
    float* mb = vb + kPoints * g.block * g.cp();
    for (int64_t b = lo; b < hi; ++b) {
      const int64_t t0 = b * g.block, count = std::min(g.block, T - t0);
      v.input(x, vb, g, t0, count);
      v.grad(dy, mb, g, t0, count);
      gemm(vb, mb, du + me * du_size, g, count);
    }
  });
  for (int64_t p = 1; p < parts; ++p)
    for (int64_t i = 0; i < du_size; ++i) du[i] += du[p * du_size + i];
  const auto f = v.weight_grad;
  kernels::parallel_chunks(g.cp(), threads, 2, [&](int64_t lo, int64_t hi) {
    f(du, dw, g, accumulate, lo, std::min(hi, g.c));
  });
}

}  // namespace tandem::engine::compute::cpu::winograd
