#pragma once
// Shared by the nn suites: parameter gradients of a Model against central finite differences of
// loss = sum(logits * R), whose gradient w.r.t. the logits is R.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/core/rng.hpp"
#include "engine/nn/model.hpp"

namespace tandem::testing {

inline Tensor random_tensor(const tandem::Shape& s, uint64_t seed, double scale = 1.0) {
  Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(s.numel()));
  for (auto& x : v) x = static_cast<float>(rng.normal() * scale);
  return Tensor::from_vector(s, v);
}

inline double weighted_logits(engine::nn::Model& m, const Tensor& x, const Tensor& r) {
  const Tensor y = m.backend().to_host(m.forward(x, true));
  double s = 0;
  for (int64_t i = 0; i < y.numel(); ++i) s += static_cast<double>(y.data<float>()[i]) * r.data<float>()[i];
  return s;
}

struct GradcheckCount {
  int checked = 0, close = 0;  // parameters compared; those within 2% (relative, or absolute below 1)
};

// Runs forward and backward once, then perturbs about `per_layer` parameters of every layer by +-h (host-resident
// parameters: reference and cpu backends). `each(layer, numeric, analytic)` sees every comparison.
template <typename F>
GradcheckCount check_param_gradients(engine::nn::Model& m, const Tensor& x, const Tensor& r, int64_t per_layer, F&& each) {
  m.forward(x, true);
  m.backward(r);
  const Tensor analytic = m.backend().to_host(m.grads()).clone();
  Tensor params = m.params();
  float* p = params.data<float>();
  const double h = 2e-3;
  GradcheckCount count;
  for (size_t layer = 0; layer < m.num_layers(); ++layer) {
    const int64_t n = m.spec().layers[layer].params;
    for (int64_t k = 0; k < n; k += std::max<int64_t>(1, n / per_layer)) {
      const int64_t idx = m.param_offset(layer) + k;
      const float saved = p[idx];
      p[idx] = saved + static_cast<float>(h);
      const double up = weighted_logits(m, x, r);
      p[idx] = saved - static_cast<float>(h);
      const double down = weighted_logits(m, x, r);
      p[idx] = saved;
      const double numeric = (up - down) / (2 * h), got = analytic.data<float>()[idx];
      ++count.checked;
      const bool ok = std::abs(numeric - got) <= 2e-2 * std::max(1.0, std::abs(numeric));
      count.close += ok;
      BOOST_TEST_MESSAGE(m.spec().layers[layer].name << "[" << k << "] numeric " << numeric << " analytic " << got);
      BOOST_WARN(ok);
      each(layer, numeric, got);
    }
  }
  return count;
}

}  // namespace tandem::testing
