// The collectives' reduction kernels per ISA (TANDEM_CPU_MAX_ISA): every variant this CPU runs gives
// the baseline variant's bits and tandem::reduce_into's, and an executor takes its variant from the cap.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "engine/comm/executor.hpp"
#include "engine/comm/reduce_kernels.hpp"
#include "engine/core/cpu_isa.hpp"
#include "engine/core/dtype.hpp"
#include "engine/core/settings.hpp"

using namespace tandem;
using namespace tandem::engine::comm;

namespace {

// n elements of type t as bytes, from a seed: floats in [-2, 2] (a NaN and an infinity among the f32s and
// bf16s, so min/max and the bf16 rounding meet them), small integers (products stay in range).
std::vector<unsigned char> random_bytes(DType t, size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<unsigned char> out(n * dtype_size(t));
  for (size_t i = 0; i < n; ++i) {
    unsigned char* p = out.data() + i * dtype_size(t);
    const float f = i == 5 ? std::numeric_limits<float>::quiet_NaN() : i == 9 ? INFINITY : u(rng);
    switch (t) {
      case DType::kF32: std::memcpy(p, &f, 4); break;
      case DType::kF64: { const double d = f * 1.000001; std::memcpy(p, &d, 8); break; }
      case DType::kBF16: { uint32_t b; std::memcpy(&b, &f, 4); const uint16_t h = static_cast<uint16_t>(b >> 16); std::memcpy(p, &h, 2); break; }
      case DType::kF16: { const uint16_t h = static_cast<uint16_t>(rng() & 0x3bff); std::memcpy(p, &h, 2); break; }
      case DType::kI32: { const int32_t v = static_cast<int32_t>(rng() % 201) - 100; std::memcpy(p, &v, 4); break; }
      case DType::kI64: { const int64_t v = static_cast<int64_t>(rng() % 201) - 100; std::memcpy(p, &v, 8); break; }
      case DType::kU8: *p = static_cast<unsigned char>(rng()); break;
    }
  }
  return out;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(reduce_kernels_per_isa)

BOOST_AUTO_TEST_CASE(every_variant_matches_the_baseline_and_reduce_into) {
  const DType types[] = {DType::kF32, DType::kF64, DType::kI32, DType::kI64, DType::kU8, DType::kBF16, DType::kF16};
  const ReduceOp ops[] = {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax};
  constexpr size_t n = 1031;  // not a whole number of vectors
  int variants = 0;
  for (CpuIsa isa : {CpuIsa::kBaseline, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (variant_cpu_isa(isa) != isa) continue;  // this CPU lacks it
    ++variants;
    for (DType t : types)
      for (ReduceOp op : ops) {
        const auto src = random_bytes(t, n, 2);
        auto want = random_bytes(t, n, 1), got = want;
        reduce_into(want.data(), src.data(), n, t, op);
        reduce_kernel(isa, got.data(), src.data(), n, t, op);
        BOOST_TEST((got == want), cpu_isa_name(isa) << " dtype " << static_cast<int>(t) << " op "
                                                    << static_cast<int>(op));
      }
  }
  BOOST_TEST_MESSAGE("variants tested: " << variants << " (host " << cpu_isa_name(host_cpu_isa()) << ")");
  BOOST_TEST(variants >= 1);
}

BOOST_AUTO_TEST_CASE(an_executor_takes_the_cap) {
  for (const char* cap : {"sse41", "avx2", "avx512"}) {
    const settings::ScopedProcessValue v("TANDEM_CPU_MAX_ISA", cap);
    const PlanExecutor ex;
    const CpuIsa want = effective_cpu_isa(cpu_isa_cap(*settings::current()));
    BOOST_TEST((ex.reduce_isa() == want), cap);
  }
  const settings::ScopedProcessValue v("TANDEM_CPU_MAX_ISA", "sse41");
  BOOST_TEST((PlanExecutor().reduce_isa() == CpuIsa::kBaseline));
}

BOOST_AUTO_TEST_SUITE_END()
