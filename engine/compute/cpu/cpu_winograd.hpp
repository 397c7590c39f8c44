#pragma once
// Tandem's own Winograd F(4x4, 3x3) convolution (3x3 kernel, stride 1, dilation 1, one group) for the
// CPU ISAs where oneDNN 2.6 has none (it implements f32 Winograd on AVX-512 only). Each 4x4 output
// tile is A^T [ (G g G^T) . (B^T d B) ] A over a 6x6 input tile d (Lavin and Gray's points 0, +-1,
// +-2, inf), so the 36 tile positions are 36 independent [tiles x Cin] x [Cin x Cout] matrix
// products (oneDNN matmul, cpu_conv.cpp): 4x fewer multiply-adds than the direct convolution, at
// the price of the transforms below and of f32 rounding a few times the direct kernel's.
//
// Layouts: activations are channel-blocked nChw8c (what oneDNN picks on AVX2); transformed data
// V is [36][tiles][Cp] and transformed weights U [36][Cp][Op] (Cp, Op: channels rounded up to 8,
// the padding zero), products M [36][tiles][Op]; tiles are ordered (image, tile row, tile col).
//
// Backward data of a stride-1 convolution is the forward one of dy with the kernel flipped and
// its channel axes swapped, padded by 2 - pad: the same kernels with `flip` set in the weights'.
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
  int64_t tiles_h() const { return (oh + kTile - 1) / kTile; }
  int64_t tiles_w() const { return (ow + kTile - 1) / kTile; }
  int64_t tiles() const { return n * tiles_h() * tiles_w(); }
  int64_t cp() const { return (c + kLanes - 1) / kLanes * kLanes; }
  int64_t op() const { return (o + kLanes - 1) / kLanes * kLanes; }
};

// V[36][tiles][cp] from x (nChw8c; padding outside the image reads as zero).
void input_transform(CpuIsa isa, const float* x, float* v, const Geometry& g, int threads);
// U[36][cp][op] from plain weights. flip = false: w is [o][c][3][3] (forward). flip = true: w is the
// forward convolution's [c][o][3][3] and is used flipped (backward data, g being the equivalent forward).
void weight_transform(CpuIsa isa, const float* w, float* u, const Geometry& g, bool flip, int threads);
// y (nChw8c, padded channels zero) from M[36][tiles][op], plus bias[o] when not null.
void output_transform(CpuIsa isa, const float* m, const float* bias, float* y, const Geometry& g, int threads);

}  // namespace tandem::engine::compute::cpu::winograd
