#pragma once
// Reduction kernels for the executor's hot path: dst[i] = dst[i] op src[i] over non-overlapping
// ranges (plans never reduce a region into itself). Same results as tandem::reduce_into, but
// vectorised: compiled at -O3 once per ISA (AVX-512F, AVX2, baseline); the caller names the ISA
// (the executor's: TANDEM_CPU_MAX_ISA capped by the CPU, when its communicator was created).
#include <cstddef>

#include "engine/core/cpu_isa.hpp"
#include "engine/core/dtype.hpp"

namespace tandem::engine::comm {

// Runs variant_cpu_isa(isa)'s kernel (never above the CPU).
void reduce_kernel(CpuIsa isa, void* dst, const void* src, size_t n, DType t, ReduceOp op);

}  // namespace tandem::engine::comm
