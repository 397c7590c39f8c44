#include "simulator/compute/step_noise.hpp"

#include <cmath>

#include "engine/core/error.hpp"
#include "engine/core/rng.hpp"

namespace tandem::simulator {

double compute_factor(double cv, uint64_t seed, int64_t rank, int64_t index, double steps) {
  TANDEM_REQUIRE(std::isfinite(cv) && cv >= 0 && cv <= kMaxComputeCv,
                 "compute variability: the coefficient of variation must be in [0, {}], got {}", kMaxComputeCv, cv);
  TANDEM_REQUIRE(std::isfinite(steps) && steps >= 1, "compute variability: steps summed must be >= 1, got {}", steps);
  if (cv == 0) return 1.0;
  // a generator of its own per (seed, rank, index): counter-based, so the event order does not matter
  Rng rng(mix64(mix64(seed ^ 0x73746570ull, static_cast<uint64_t>(rank)), static_cast<uint64_t>(index)));
  const double shape = steps / (cv * cv);
  return rng.gamma(shape) / shape;
}

}  // namespace tandem::simulator
