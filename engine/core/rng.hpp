#pragma once
// A small, fully specified random generator (xoshiro256** seeded through splitmix64), so that seeded runs give the
// same numbers on every platform and standard library, and its state can be saved in a checkpoint.
#include <array>
#include <cmath>
#include <cstdint>

namespace tandem {

// splitmix64 finaliser: a good 64-bit mix; also derives independent seeds from (seed, counter) pairs.
constexpr uint64_t mix64(uint64_t x) noexcept {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
constexpr uint64_t mix64(uint64_t a, uint64_t b) noexcept { return mix64(mix64(a) ^ (b * 0xd1342543de82ef95ull)); }

class Rng {
 public:
  using State = std::array<uint64_t, 4>;
  explicit Rng(uint64_t seed = 0) noexcept { reseed(seed); }
  void reseed(uint64_t seed) noexcept {
    for (auto& s : s_) s = seed = mix64(seed);
  }
  uint64_t next_u64() noexcept {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  // Uniform integer in [0, n) without modulo bias (n > 0).
  uint64_t below(uint64_t n) noexcept {
    const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do x = next_u64();
    while (x >= limit);
    return x % n;
  }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() noexcept { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }
  // Standard normal (Box-Muller; no cached spare, so the state alone determines the sequence).
  double normal() noexcept {
    const double u1 = 1.0 - uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  // Gamma(shape, 1), shape > 0 (Marsaglia and Tsang 2000; shape < 1 boosted by U^(1/shape)): specified here, as
  // std::gamma_distribution is implementation-defined. Used by the Dirichlet split and the simulator's step noise.
  double gamma(double shape) noexcept {
    if (shape < 1.0) {
      double u = uniform();
      if (u < 1e-300) u = 1e-300;
      return gamma(shape + 1.0) * std::pow(u, 1.0 / shape);
    }
    const double d = shape - 1.0 / 3.0, c = 1.0 / std::sqrt(9.0 * d);
    for (int guard = 0; guard < 1000; ++guard) {
      double x, v;
      do {
        x = normal();
        v = 1.0 + c * x;
      } while (v <= 0.0);
      v = v * v * v;
      const double u = uniform();
      if (u < 1.0 - 0.0331 * x * x * x * x || std::log(u < 1e-300 ? 1e-300 : u) < 0.5 * x * x + d * (1.0 - v + std::log(v)))
        return d * v;
    }
    return d;  // practically unreachable (acceptance is above 95% per try)
  }
  State state() const noexcept { return s_; }
  void set_state(const State& s) noexcept { s_ = s; }

 private:
  static constexpr uint64_t rotl(uint64_t x, int k) noexcept { return (x << k) | (x >> (64 - k)); }
  State s_{};
};

}  // namespace tandem
