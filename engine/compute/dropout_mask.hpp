#pragma once
// Counter-based dropout mask shared by every backend (host and device code): element i of a
// dropout call with `seed` is kept when a splitmix64 hash of (seed, i) maps to u >= p. The same
// (seed, index) thus gives the same mask everywhere, which the cross-backend tests rely on.
#include <cstdint>

#if defined(__CUDACC__)
#define TANDEM_HOST_DEVICE __host__ __device__
#else
#define TANDEM_HOST_DEVICE
#endif

namespace tandem::engine::compute {

TANDEM_HOST_DEVICE inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Keep threshold: p scaled to 2^24 so the comparison is exact in integers.
TANDEM_HOST_DEVICE inline bool dropout_keep(uint64_t seed, uint64_t index, uint32_t threshold24) {
  const uint32_t u = static_cast<uint32_t>(splitmix64(seed * 0x2545f4914f6cdd1dull + index) >> 40);
  return u >= threshold24;
}

inline uint32_t dropout_threshold24(float p) { return static_cast<uint32_t>(static_cast<double>(p) * (1u << 24)); }

}  // namespace tandem::engine::compute
