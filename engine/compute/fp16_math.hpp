#pragma once
// Emulated fp16 math on the host backends (TANDEM_CPU_MATH=fp16): what the cuda backend's fp16 math
// (TANDEM_CUDA_MATH=fp16) does to a convolution or a GEMM, reproduced in f32 so that a model's fp16 training --
// loss scaling included -- can be checked on a CPU before a GPU is rented. It is an emulation: every op still runs
// in f32 on the wrapped backend, plus a rounding pass over its operands, so it is slower than plain f32, never faster.
//
// Exactly as the GPU sees them (engine/compute/cuda/cuda_backend.cpp, fp16 math):
//   - convolutions (cuDNN, fp16 descriptors, f32 compute): x, w and dy are rounded to IEEE half, and so is the
//     result (y, dx, dw: cuDNN writes fp16); the bias is added, and the bias gradient summed, in f32 from f32 dy;
//     an accumulating dw adds the rounded gradient to dw in f32;
//   - GEMMs of linear layers (cublasGemmEx, fp16 inputs, f32 output and accumulation): x, w and dy are rounded to
//     half, the result stays f32; bias and bias gradient in f32.
// Rounding is round-to-nearest-even with subnormals (2^-24 the smallest) and overflow to +-inf (|x| >= 65520), as
// __float2half_rn. The products of two halves are exact in f32, so emulation and GPU differ only in the order of
// the f32 accumulation (and, for convolutions, in the half rounding of results that land between two halves).
// Grouped (depthwise) convolutions stay f32 in 16-bit math unless TANDEM_HALF_GROUPED_CONV=1
// (half_math_for_conv): they read and write as many bytes as they compute, so the tensor cores gain them nothing
// and the operand conversions cost more than the convolution.
// Everything else (batch norm, activations, pooling, loss, elementwise, optimizer updates) is the wrapped
// backend's f32, as on the GPU.
#include <cstdint>
#include <memory>

#include "engine/compute/backend.hpp"

namespace tandem::engine::compute {

// Whether 16-bit math (the cuda backend's bf16 / fp16, this emulation's fp16) applies to a convolution with these
// parameters: every ungrouped one; a grouped one only under TANDEM_HALF_GROUPED_CONV=1 (default: f32).
bool half_math_for_conv(const ConvParams& p);

// x[i] = half_to_float(float_to_half(x[i])) for n values (in place).
void round_to_half(float* x, int64_t n) noexcept;

// The emulation around a host backend ("cpu" or "reference"); its name and device are inner's.
std::unique_ptr<Backend> make_fp16_emulation(std::unique_ptr<Backend> inner);

// Whether `be` is such an emulation (for messages and tests).
bool is_fp16_emulation(const Backend& be) noexcept;

}  // namespace tandem::engine::compute
