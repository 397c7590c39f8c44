#pragma once
// Tandem's own Winograd F(4x4, 3x3) convolution (3x3 kernel, stride 1, dilation 1, one group) for the
// CPU ISAs where oneDNN 2.6 has none (it implements f32 Winograd on AVX-512 only). Each 4x4 output
// tile is A^T [ (G g G^T) . (B^T d B) ] A over a 6x6 input tile d (Lavin and Gray's points 0, +-1,
// +-2, inf), so the 36 tile positions are 36 independent [tiles x Cin] x [Cin x Cout] matrix
// products: 4x fewer multiply-adds than the direct convolution, at the price of the transforms below
// and of f32 rounding errors up to ~10x the direct kernel's (tests/compute/winograd_test.cpp).
//
// Layouts: activations are channel-blocked nChw8c (what oneDNN picks on AVX2); a block of tiles'
// transformed data V is [36][block][Cp], transformed weights U [36][Cp][Op] in 16-channel panels
// (Cp, Op: channels rounded up to 8, the padding zero), products M [36][block][Op]; tiles are
// ordered (image, tile row, tile col). The products run on a 6x16 AVX2/FMA register-blocked kernel
// of our own; with few channels a block's V and M stay in L2 between the transforms and the products.
//
// Backward data of a stride-1 convolution is the forward one of dy with the kernel flipped and
// its channel axes swapped, padded by 2 - pad: the same kernels with `flip` set in the weights'.
// Backward weights runs the adjoints: dU = sum over tiles of V^T (A dy A^T), dw = G^T dU G.
#include <algorithm>
#include <cstdint>

#include "engine/core/cpu_isa.hpp"

namespace tandem::engine::compute::cpu::winograd {

constexpr int64_t kTile = 4;    // output pixels per tile side
constexpr int64_t kAlpha = 6;   // input pixels per tile side
constexpr int64_t kPoints = 36; // kAlpha^2 independent products
constexpr int64_t kLanes = 8;   // channel block of the activations

struct Geometry {
  int64_t n, c, h, w;  // input [n, c, h, w] (nChw8c)
  int64_t o, oh, ow;   // output [n, o, oh, ow] (nChw8c)
  int64_t pad_h, pad_w;
  int64_t block = 1;   // tiles per block (plan_block)
  int64_t tiles_h() const { return (oh + kTile - 1) / kTile; }
  int64_t tiles_w() const { return (ow + kTile - 1) / kTile; }
  int64_t tiles() const { return n * tiles_h() * tiles_w(); }
  int64_t blocks() const { return (tiles() + block - 1) / block; }
  int64_t cp() const { return (c + kLanes - 1) / kLanes * kLanes; }
  int64_t op() const { return (o + kLanes - 1) / kLanes * kLanes; }
};

// Where U's entry (point e, input channel ci, output channel co) is: U is [36][panels][cp][pw], each panel
// 16 output channels wide (the last one pw = 8 when op is an odd number of 8s), so the products read
// one panel's rows in order.
inline int64_t u_offset(const Geometry& g, int64_t e, int64_t ci, int64_t co) {
  const int64_t panel = co / 16, pw = std::min<int64_t>(16, g.op() - panel * 16);
  return e * g.cp() * g.op() + panel * 16 * g.cp() + ci * pw + co % 16;
}
inline int64_t u_floats(const Geometry& g) { return kPoints * g.cp() * g.op(); }

// The tiles per block for `threads` threads (sets g.block): blocks small enough for their
// transformed tiles V and products M ([36][block][cp + op]) to stay in a core's L2 cache where
// re-reading U once per block costs less than sending V and M through memory (few channels),
// else one block per thread.
void plan_block(Geometry& g, int threads);
// Scratch floats the convolution needs (V and M of one block per thread).
inline int64_t scratch_floats(const Geometry& g, int threads) {
  return static_cast<int64_t>(threads) * kPoints * g.block * (g.cp() + g.op());
}

// U from plain weights. flip = false: w is [o][c][3][3] (forward). flip = true: w is the forward
// convolution's [c][o][3][3], used flipped (backward data, g being the equivalent forward).
void weight_transform(CpuIsa isa, const float* w, float* u, const Geometry& g, bool flip, int threads);
// y (nChw8c, padded channels zero) = the convolution of x (nChw8c) by the weights U stands for, plus
// bias[o] when not null: per block of tiles, V = B^T x B, M = V U (36 products), y = A^T M A.
void convolution(CpuIsa isa, const float* x, const float* u, const float* bias, float* y, float* scratch,
                 const Geometry& g, int threads);

// The weights' gradient of the forward convolution g (no bias): dU[e] = sum over tiles of V^T dM, with
// V = B^T x B and dM = A dy A^T (the output transform's adjoint), then dw = G^T dU G (= or +=). du
// holds min(threads, blocks) partial sums of u_floats(g) each.
void weight_gradient(CpuIsa isa, const float* x, const float* dy, float* dw, bool accumulate, float* scratch,
                     float* du, const Geometry& g, int threads);
inline int64_t du_floats(const Geometry& g, int threads) {
  return std::min<int64_t>(threads, g.blocks()) * u_floats(g);
}

}  // namespace tandem::engine::compute::cpu::winograd
