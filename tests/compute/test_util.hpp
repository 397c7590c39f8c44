#pragma once
// Helpers for the compute tests: seeded random tensors, host copies as doubles, comparisons.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "engine/compute/backend.hpp"
#include "engine/core/error.hpp"

namespace tandem::engine::compute::testing {

// Uniform values in [lo, hi) on the host, f32 or f64.
inline Tensor random_tensor(const Shape& s, uint32_t seed, double lo = -1.0, double hi = 1.0,
                            DType dtype = DType::kF32) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  Tensor t = Tensor::empty(s, dtype);
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (dtype == DType::kF64) t.data<double>()[i] = u(rng);
    else t.data<float>()[i] = static_cast<float>(u(rng));
  }
  return t;
}

inline Tensor random_labels(int64_t n, int64_t k, uint32_t seed, DType dtype = DType::kI64) {
  std::mt19937 rng(seed);
  Tensor t = Tensor::empty({n}, dtype);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t l = static_cast<int64_t>(rng() % static_cast<uint32_t>(k));
    if (dtype == DType::kI32) t.data<int32_t>()[i] = static_cast<int32_t>(l);
    else t.data<int64_t>()[i] = l;
  }
  return t;
}

inline std::vector<double> values(Backend& b, const Tensor& t) {
  Tensor h = b.to_host(t);
  std::vector<double> v(static_cast<size_t>(h.numel()));
  for (int64_t i = 0; i < h.numel(); ++i)
    v[i] = h.dtype() == DType::kF64 ? h.data<double>()[i] : h.data<float>()[i];
  return v;
}

inline std::vector<double> values(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = t.dtype() == DType::kF64 ? t.data<double>()[i] : t.data<float>()[i];
  return v;
}

// Converts a host tensor to another float dtype (f32 <-> f64).
inline Tensor cast(const Tensor& t, DType to) {
  Tensor o = Tensor::empty(t.shape(), to);
  const std::vector<double> v = values(t);
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (to == DType::kF64) o.data<double>()[i] = v[i];
    else o.data<float>()[i] = static_cast<float>(v[i]);
  }
  return o;
}

// |a - b| <= atol + rtol * max|b| element-wise; reports the worst element.
inline void expect_close(const std::vector<double>& a, const std::vector<double>& b, double rtol, double atol,
                         const std::string& what) {
  BOOST_TEST_CONTEXT(what) {
    BOOST_TEST_REQUIRE(a.size() == b.size());
    double scale = 0;
    for (double x : b) scale = std::max(scale, std::abs(x));
    size_t worst = 0;
    double worst_err = -1;
    for (size_t i = 0; i < a.size(); ++i) {
      const double e = std::abs(a[i] - b[i]);
      if (!(e <= worst_err)) {
        worst_err = e;
        worst = i;
      }
    }
    const double tol = atol + rtol * scale;
    BOOST_TEST((a.empty() || worst_err <= tol), what << ": element " << worst << " is " << (a.empty() ? 0 : a[worst])
                                                     << ", expected " << (a.empty() ? 0 : b[worst]) << " (error "
                                                     << worst_err << " > tolerance " << tol << ")");
  }
}

template <typename F> Status status_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.status();
  }
  return Status::kOk;
}

}  // namespace tandem::engine::compute::testing
