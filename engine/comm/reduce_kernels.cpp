// Built at -O3 whatever the build type: GCC's -O2 cost model leaves these loops scalar, and
// reductions of in-cache chunks are a large share of an allreduce's time.
#pragma GCC optimize("O3")
#include "engine/comm/reduce_kernels.hpp"

#include <cstdint>
#include <cstring>

#define TANDEM_ISA_VARIANTS_FILE "engine/comm/reduce_kernels_isa.inc"
#include "engine/core/cpu_isa_variants.inc"

namespace tandem::engine::comm {

void reduce_kernel(CpuIsa isa, void* dst, const void* src, size_t n, DType t, ReduceOp op) {
  bool done = false;
  switch (variant_cpu_isa(isa)) {
#if defined(TANDEM_CPU_ISA_VARIANTS)
    case CpuIsa::kAvx512: done = isa_avx512::reduce(dst, src, n, t, op); break;
    case CpuIsa::kAvx2: done = isa_avx2::reduce(dst, src, n, t, op); break;
#endif
    default: done = isa_baseline::reduce(dst, src, n, t, op); break;
  }
  if (!done) reduce_into(dst, src, n, t, op);
}

}  // namespace tandem::engine::comm
