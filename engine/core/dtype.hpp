#pragma once
// Element types and reduction operators shared by tensors, collectives and the wire format.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace tandem {

// Values equal tandem_dtype_t's.
enum class DType : int32_t { kF32 = 0, kF64 = 1, kF16 = 2, kBF16 = 3, kI32 = 4, kI64 = 5, kU8 = 6 };
constexpr int kNumDTypes = 7;

// Values equal tandem_op_t's.
enum class ReduceOp : int32_t { kSum = 0, kAvg = 1, kMin = 2, kMax = 3, kProd = 4 };
constexpr int kNumReduceOps = 5;

bool dtype_valid(int32_t v) noexcept;
bool reduce_op_valid(int32_t v) noexcept;
size_t dtype_size(DType t) noexcept;
std::string_view dtype_name(DType t) noexcept;
std::string_view reduce_op_name(ReduceOp op) noexcept;
// Parses "f32", "float32", "bf16", ... ; throws kInvalidArgument naming the text.
DType parse_dtype(std::string_view s);
ReduceOp parse_reduce_op(std::string_view s);

// IEEE half and bfloat16 conversions (round to nearest even).
uint16_t float_to_half(float f) noexcept;
float half_to_float(uint16_t h) noexcept;
inline uint16_t float_to_bf16(float f) noexcept {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_float(uint16_t h) noexcept {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// dst[i] = dst[i] op src[i] for n elements (kAvg accumulates as a sum; finish with scale()).
void reduce_into(void* dst, const void* src, size_t n, DType t, ReduceOp op);
// dst[i] = a[i] op b[i].
void reduce_pair(void* dst, const void* a, const void* b, size_t n, DType t, ReduceOp op);
// x[i] /= divisor, used to finish kAvg (integer types divide with truncation).
void divide_by(void* x, size_t n, DType t, double divisor);

}  // namespace tandem
