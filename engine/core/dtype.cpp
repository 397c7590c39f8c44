#include "engine/core/dtype.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "engine/core/error.hpp"

namespace tandem {

bool dtype_valid(int32_t v) noexcept { return v >= 0 && v < kNumDTypes; }
bool reduce_op_valid(int32_t v) noexcept { return v >= 0 && v < kNumReduceOps; }

size_t dtype_size(DType t) noexcept {
  switch (t) {
    case DType::kF32: case DType::kI32: return 4;
    case DType::kF64: case DType::kI64: return 8;
    case DType::kF16: case DType::kBF16: return 2;
    case DType::kU8: return 1;
  }
  return 0;
}

std::string_view dtype_name(DType t) noexcept {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kF64: return "f64";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    case DType::kI32: return "i32";
    case DType::kI64: return "i64";
    case DType::kU8: return "u8";
  }
  return "?";
}

std::string_view reduce_op_name(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kProd: return "prod";
  }
  return "?";
}

DType parse_dtype(std::string_view s) {
  if (s == "f32" || s == "float32" || s == "float") return DType::kF32;
  if (s == "f64" || s == "float64" || s == "double") return DType::kF64;
  if (s == "f16" || s == "float16" || s == "half") return DType::kF16;
  if (s == "bf16" || s == "bfloat16") return DType::kBF16;
  if (s == "i32" || s == "int32") return DType::kI32;
  if (s == "i64" || s == "int64") return DType::kI64;
  if (s == "u8" || s == "uint8") return DType::kU8;
  TANDEM_THROW(Status::kInvalidArgument, "unknown dtype '{}' (expected f32, f64, f16, bf16, i32, i64 or u8)",
               std::string(s));
}

ReduceOp parse_reduce_op(std::string_view s) {
  if (s == "sum") return ReduceOp::kSum;
  if (s == "avg" || s == "mean") return ReduceOp::kAvg;
  if (s == "min") return ReduceOp::kMin;
  if (s == "max") return ReduceOp::kMax;
  if (s == "prod") return ReduceOp::kProd;
  TANDEM_THROW(Status::kInvalidArgument, "unknown reduction op '{}' (expected sum, avg, min, max or prod)",
               std::string(s));
}

uint16_t float_to_half(float f) noexcept {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t mag = x & 0x7fffffffu;
  if (mag > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (mag >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u); // overflow -> inf
  if (mag < 0x38800000u) {                                              // subnormal or zero in half
    // Shift the float (with implicit bit) into half subnormal position, rounding to nearest even.
    if (mag < 0x33000000u) return static_cast<uint16_t>(sign);
    const uint32_t e = mag >> 23;
    uint32_t m = (mag & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;  // 14 + (113 - e) ... aligns to 2^-24 units
    const uint32_t half_m = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t mid = 1u << (shift - 1);
    uint32_t r = half_m + ((rem > mid || (rem == mid && (half_m & 1u))) ? 1u : 0u);
    return static_cast<uint16_t>(sign | r);
  }
  // Normal: rebias exponent 127 -> 15, round mantissa 23 -> 10 bits to nearest even.
  mag -= (112u << 23);
  const uint32_t rounded = mag + 0xfffu + ((mag >> 13) & 1u);
  return static_cast<uint16_t>(sign | (rounded >> 13));
}

float half_to_float(uint16_t h) noexcept {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 113;
      while ((man & 0x400u) == 0) { man <<= 1; --exp; }
      man &= 0x3ffu;
      bits = sign | (exp << 23) | (man << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

namespace {

template <typename T>
inline T apply(T a, T b, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: case ReduceOp::kAvg: return a + b;
    case ReduceOp::kMin: return std::min(a, b);
    case ReduceOp::kMax: return std::max(a, b);
    case ReduceOp::kProd: return a * b;
  }
  return a;
}

template <typename T>
void pair_native(T* __restrict d, const T* __restrict a, const T* __restrict b, size_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: case ReduceOp::kAvg:
      for (size_t i = 0; i < n; ++i) d[i] = a[i] + b[i];
      break;
    case ReduceOp::kMin:
      for (size_t i = 0; i < n; ++i) d[i] = std::min(a[i], b[i]);
      break;
    case ReduceOp::kMax:
      for (size_t i = 0; i < n; ++i) d[i] = std::max(a[i], b[i]);
      break;
    case ReduceOp::kProd:
      for (size_t i = 0; i < n; ++i) d[i] = a[i] * b[i];
      break;
  }
}

// dst may alias a (in-place accumulate); the restrict form is used only when it does not.
template <typename T>
void pair_typed(void* dst, const void* a, const void* b, size_t n, ReduceOp op) {
  T* d = static_cast<T*>(dst);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  if (d == x) {
    switch (op) {
      case ReduceOp::kSum: case ReduceOp::kAvg:
        for (size_t i = 0; i < n; ++i) d[i] += y[i];
        return;
      default:
        for (size_t i = 0; i < n; ++i) d[i] = apply(d[i], y[i], op);
        return;
    }
  }
  pair_native<T>(d, x, y, n, op);
}

template <uint16_t (*ToBits)(float), float (*FromBits)(uint16_t)>
void pair_16(void* dst, const void* a, const void* b, size_t n, ReduceOp op) {
  auto* d = static_cast<uint16_t*>(dst);
  const auto* x = static_cast<const uint16_t*>(a);
  const auto* y = static_cast<const uint16_t*>(b);
  for (size_t i = 0; i < n; ++i) d[i] = ToBits(apply(FromBits(x[i]), FromBits(y[i]), op));
}

}  // namespace

void reduce_pair(void* dst, const void* a, const void* b, size_t n, DType t, ReduceOp op) {
  switch (t) {
    case DType::kF32: pair_typed<float>(dst, a, b, n, op); return;
    case DType::kF64: pair_typed<double>(dst, a, b, n, op); return;
    case DType::kI32: pair_typed<int32_t>(dst, a, b, n, op); return;
    case DType::kI64: pair_typed<int64_t>(dst, a, b, n, op); return;
    case DType::kU8: pair_typed<uint8_t>(dst, a, b, n, op); return;
    case DType::kF16: pair_16<float_to_half, half_to_float>(dst, a, b, n, op); return;
    case DType::kBF16: pair_16<float_to_bf16, bf16_to_float>(dst, a, b, n, op); return;
  }
}

void reduce_into(void* dst, const void* src, size_t n, DType t, ReduceOp op) { reduce_pair(dst, dst, src, n, t, op); }

void divide_by(void* x, size_t n, DType t, double divisor) {
  switch (t) {
    case DType::kF32: {
      auto* p = static_cast<float*>(x);
      const float inv = static_cast<float>(1.0 / divisor);
      for (size_t i = 0; i < n; ++i) p[i] *= inv;
      return;
    }
    case DType::kF64: {
      auto* p = static_cast<double*>(x);
      for (size_t i = 0; i < n; ++i) p[i] /= divisor;
      return;
    }
    case DType::kI32: {
      auto* p = static_cast<int32_t*>(x);
      for (size_t i = 0; i < n; ++i) p[i] = static_cast<int32_t>(p[i] / static_cast<int64_t>(divisor));
      return;
    }
    case DType::kI64: {
      auto* p = static_cast<int64_t*>(x);
      for (size_t i = 0; i < n; ++i) p[i] /= static_cast<int64_t>(divisor);
      return;
    }
    case DType::kU8: {
      auto* p = static_cast<uint8_t*>(x);
      for (size_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(p[i] / static_cast<unsigned>(divisor));
      return;
    }
    case DType::kF16: {
      auto* p = static_cast<uint16_t*>(x);
      for (size_t i = 0; i < n; ++i) p[i] = float_to_half(static_cast<float>(half_to_float(p[i]) / divisor));
      return;
    }
    case DType::kBF16: {
      auto* p = static_cast<uint16_t*>(x);
      for (size_t i = 0; i < n; ++i) p[i] = float_to_bf16(static_cast<float>(bf16_to_float(p[i]) / divisor));
      return;
    }
  }
}

}  // namespace tandem
