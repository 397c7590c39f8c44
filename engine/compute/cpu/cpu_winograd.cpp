// Tandem's Winograd F(4x4, 3x3) transforms (cpu_winograd.hpp). Each is compiled once per ISA
// (cpu_winograd_isa.inc through engine/core/cpu_isa_variants.inc) on 8-lane vectors of GCC's vector
// extension: one nChw8c channel block per vector, so the AVX2 and AVX-512 variants run whole ymm
// registers and the baseline pairs of SSE ones.
#include "engine/compute/cpu/cpu_winograd.hpp"

#include <algorithm>
#include <cstring>

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

// Rows [r0, r1) of tiles (r = image * tiles_h + tile row), every channel block.
[[gnu::always_inline]] inline void input_tiles(const float* __restrict x, float* __restrict v, const Geometry& g,
                                              int64_t r0, int64_t r1) {
  const int64_t th_n = g.tiles_h(), tw_n = g.tiles_w(), cp = g.cp(), blocks = cp / kLanes;
  const int64_t point_stride = g.tiles() * cp;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t n = r / th_n, h0 = (r % th_n) * kTile - g.pad_h;
    for (int64_t tw = 0; tw < tw_n; ++tw) {
      const int64_t w0 = tw * kTile - g.pad_w, tile = r * tw_n + tw;
      const bool inside = h0 >= 0 && w0 >= 0 && h0 + kAlpha <= g.h && w0 + kAlpha <= g.w;
      for (int64_t cb = 0; cb < blocks; ++cb) {
        const float* xp = x + (n * blocks + cb) * g.h * g.w * kLanes;
        v8f d[kAlpha][kAlpha], t[kAlpha][kAlpha];
        for (int64_t i = 0; i < kAlpha; ++i)
          for (int64_t j = 0; j < kAlpha; ++j) {
            const int64_t ih = h0 + i, iw = w0 + j;
            d[i][j] = (inside || (ih >= 0 && ih < g.h && iw >= 0 && iw < g.w)) ? load8(xp + (ih * g.w + iw) * kLanes)
                                                                               : splat(0.0f);
          }
        for (int64_t j = 0; j < kAlpha; ++j) {
          v8f col[kAlpha], out[kAlpha];
          for (int64_t i = 0; i < kAlpha; ++i) col[i] = d[i][j];
          bt6(col, out);
          for (int64_t i = 0; i < kAlpha; ++i) t[i][j] = out[i];
        }
        float* vp = v + tile * cp + cb * kLanes;
        for (int64_t i = 0; i < kAlpha; ++i) {
          v8f out[kAlpha];
          bt6(t[i], out);
          for (int64_t j = 0; j < kAlpha; ++j) store8(vp + (i * kAlpha + j) * point_stride, out[j]);
        }
      }
    }
  }
}

// One [8 output channels] x [1 input channel] block of U.
[[gnu::always_inline]] inline void weight_block(const float* __restrict w, float* __restrict u, const Geometry& g,
                                                bool flip, int64_t ci, int64_t ob) {
  const int64_t cp = g.cp(), op = g.op(), point_stride = cp * op;
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
  float* up = u + ci * op + ob * kLanes;
  for (int64_t i = 0; i < kAlpha; ++i) {
    v8f out[kAlpha];
    g6(t[i], out);
    for (int64_t j = 0; j < kAlpha; ++j) store8(up + (i * kAlpha + j) * point_stride, out[j]);
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

[[gnu::always_inline]] inline void output_tiles(const float* __restrict m, const float* __restrict bias,
                                               float* __restrict y, const Geometry& g, int64_t r0, int64_t r1) {
  const int64_t th_n = g.tiles_h(), tw_n = g.tiles_w(), op = g.op(), blocks = op / kLanes;
  const int64_t point_stride = g.tiles() * op;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t n = r / th_n, oh0 = (r % th_n) * kTile;
    for (int64_t tw = 0; tw < tw_n; ++tw) {
      const int64_t ow0 = tw * kTile, tile = r * tw_n + tw;
      const int64_t rows = std::min(kTile, g.oh - oh0), cols = std::min(kTile, g.ow - ow0);
      for (int64_t ob = 0; ob < blocks; ++ob) {
        const float* mp = m + tile * op + ob * kLanes;
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
}

}  // namespace
}  // namespace tandem::engine::compute::cpu::winograd

#define TANDEM_ISA_VARIANTS_FILE "engine/compute/cpu/cpu_winograd_isa.inc"
#include "engine/core/cpu_isa_variants.inc"

namespace tandem::engine::compute::cpu::winograd {
namespace {

struct Variant {
  decltype(&isa_baseline::input_rows) input;
  decltype(&isa_baseline::weight_rows) weights;
  decltype(&isa_baseline::output_rows) output;
};
#define TANDEM_VARIANT(NS) \
  Variant { NS::input_rows, NS::weight_rows, NS::output_rows }

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

}  // namespace

void input_transform(CpuIsa isa, const float* x, float* v, const Geometry& g, int threads) {
  const auto f = variant(isa).input;
  kernels::parallel_chunks(g.n * g.tiles_h(), threads, 2, [&](int64_t lo, int64_t hi) { f(x, v, g, lo, hi); });
}

void weight_transform(CpuIsa isa, const float* w, float* u, const Geometry& g, bool flip, int threads) {
  const auto f = variant(isa).weights;
  const int64_t rows = flip ? g.cp() : g.op() / kLanes;
  kernels::parallel_chunks(rows, threads, 2, [&](int64_t lo, int64_t hi) { f(w, u, g, flip, lo, hi); });
}

void output_transform(CpuIsa isa, const float* m, const float* bias, float* y, const Geometry& g, int threads) {
  const auto f = variant(isa).output;
  kernels::parallel_chunks(g.n * g.tiles_h(), threads, 2, [&](int64_t lo, int64_t hi) { f(m, bias, y, g, lo, hi); });
}

}  // namespace tandem::engine::compute::cpu::winograd
