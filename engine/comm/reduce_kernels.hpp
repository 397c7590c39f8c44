#pragma once
// Reduction kernels for the executor's hot path: dst[i] = dst[i] op src[i] over non-overlapping
// ranges (plans never reduce a region into itself). Same results as tandem::reduce_into, but
// vectorised: compiled at -O3 with clones for AVX-512/AVX2 picked at load time.
#include <cstddef>

#include "engine/core/dtype.hpp"

namespace tandem::engine::comm {

void reduce_kernel(void* dst, const void* src, size_t n, DType t, ReduceOp op);

}  // namespace tandem::engine::comm
