#pragma once
// Step-to-step variability of a rank's compute. A real worker's forward + backward does not take the same time
// every step (caches, the OS, other tenants of the machine); `tandem calibrate` records how much it varies on the
// measuring host as the coefficient of variation of its whole passes (`compute_cv` in the profile,
// simulator/compute/profile.hpp). The simulator then times each rank's step with its compute multiplied by a
// seeded factor of mean 1 and that CV: a Gamma(k, 1/k) variate with k = 1 / cv^2 (positive, right-skewed as step
// times are). H independent steps summed -- a local SGD period, a FedAvg client's local epoch -- are one factor of
// CV cv / sqrt(H): the mean of H Gamma(k, 1/k) variates is Gamma(H k, 1 / (H k)), exactly.
//
// Factors are a pure function of (seed, rank, index) -- a counter-based generator, not a stream -- so they do not
// depend on the order in which the event core runs ranks, and a run is reproducible. cv = 0 gives exactly 1.
#include <cstdint>

namespace tandem::simulator {

// The factor of rank `rank`'s compute at `index` (a step, a round, a draw) for `steps` summed steps of CV `cv`:
// 1 when cv is 0; else a Gamma(steps / cv^2) variate over its shape (mean 1, CV cv / sqrt(steps)).
// kInvalidArgument for cv < 0 or not finite, steps < 1.
double compute_factor(double cv, uint64_t seed, int64_t rank, int64_t index, double steps = 1);

// The largest CV a profile may give (a compute time whose sd is 10x its mean is a broken measurement).
constexpr double kMaxComputeCv = 10.0;

}  // namespace tandem::simulator
