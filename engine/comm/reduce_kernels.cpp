// Built at -O3 whatever the build type: GCC's -O2 cost model leaves these loops scalar, and
// reductions of in-cache chunks are a large share of an allreduce's time.
#pragma GCC optimize("O3")
#include "engine/comm/reduce_kernels.hpp"

#include <cstdint>
#include <cstring>

namespace tandem::engine::comm {
namespace {

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__) && \
    !defined(__SANITIZE_ADDRESS__)
#define TANDEM_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TANDEM_CLONES
#endif

// std::min / std::max semantics (first argument = dst), so results equal tandem::reduce_into's.
#define TANDEM_KERNELS(NAME, T)                                                                                     \
  TANDEM_CLONES void sum_##NAME(T* __restrict d, const T* __restrict s, size_t n) {                               \
    for (size_t i = 0; i < n; ++i) d[i] = static_cast<T>(d[i] + s[i]);                                            \
  }                                                                                                               \
  TANDEM_CLONES void prod_##NAME(T* __restrict d, const T* __restrict s, size_t n) {                              \
    for (size_t i = 0; i < n; ++i) d[i] = static_cast<T>(d[i] * s[i]);                                            \
  }                                                                                                               \
  TANDEM_CLONES void min_##NAME(T* __restrict d, const T* __restrict s, size_t n) {                               \
    for (size_t i = 0; i < n; ++i) d[i] = (s[i] < d[i]) ? s[i] : d[i];                                            \
  }                                                                                                               \
  TANDEM_CLONES void max_##NAME(T* __restrict d, const T* __restrict s, size_t n) {                               \
    for (size_t i = 0; i < n; ++i) d[i] = (d[i] < s[i]) ? s[i] : d[i];                                            \
  }                                                                                                               \
  void apply_##NAME(void* d, const void* s, size_t n, ReduceOp op) {                                              \
    T* dd = static_cast<T*>(d);                                                                                   \
    const T* ss = static_cast<const T*>(s);                                                                       \
    switch (op) {                                                                                                 \
      case ReduceOp::kSum:                                                                                        \
      case ReduceOp::kAvg: sum_##NAME(dd, ss, n); return;                                                         \
      case ReduceOp::kProd: prod_##NAME(dd, ss, n); return;                                                       \
      case ReduceOp::kMin: min_##NAME(dd, ss, n); return;                                                         \
      case ReduceOp::kMax: max_##NAME(dd, ss, n); return;                                                         \
    }                                                                                                             \
  }

TANDEM_KERNELS(f32, float)
TANDEM_KERNELS(f64, double)
TANDEM_KERNELS(i32, int32_t)
TANDEM_KERNELS(i64, int64_t)
TANDEM_KERNELS(u8, uint8_t)

// bfloat16 sum through f32, rounding to nearest even as tandem::float_to_bf16 does (branch-free so
// it vectorises). The other bf16 ops and f16 take tandem::reduce_into.
TANDEM_CLONES void sum_bf16(uint16_t* __restrict d, const uint16_t* __restrict s, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const uint32_t ua = static_cast<uint32_t>(d[i]) << 16, ub = static_cast<uint32_t>(s[i]) << 16;
    float fa, fb;
    std::memcpy(&fa, &ua, 4);
    std::memcpy(&fb, &ub, 4);
    const float r = fa + fb;
    uint32_t u;
    std::memcpy(&u, &r, 4);
    const uint16_t nan = static_cast<uint16_t>((u >> 16) | 0x40);
    const uint16_t rounded = static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    d[i] = (u & 0x7fffffffu) > 0x7f800000u ? nan : rounded;
  }
}

}  // namespace

void reduce_kernel(void* dst, const void* src, size_t n, DType t, ReduceOp op) {
  switch (t) {
    case DType::kF32: return apply_f32(dst, src, n, op);
    case DType::kF64: return apply_f64(dst, src, n, op);
    case DType::kI32: return apply_i32(dst, src, n, op);
    case DType::kI64: return apply_i64(dst, src, n, op);
    case DType::kU8: return apply_u8(dst, src, n, op);
    case DType::kBF16:
      if (op == ReduceOp::kSum || op == ReduceOp::kAvg)
        return sum_bf16(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), n);
      break;
    case DType::kF16: break;
  }
  reduce_into(dst, src, n, t, op);
}

}  // namespace tandem::engine::comm
