// TANDEM_CPU_MAX_ISA and the per-ISA variants of the CPU backend's own kernels: every variant this
// CPU runs gives the baseline variant's bits, the cap picks the variant, and oneDNN's process-wide
// cap is refused, naming the setting, once oneDNN already runs above it.
#include <boost/test/unit_test.hpp>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/compute/cpu/cpu_backend.hpp"
#include "engine/compute/cpu/cpu_kernels.hpp"
#include "engine/core/cpu_isa.hpp"
#include "engine/core/error.hpp"
#include "engine/core/settings.hpp"

using namespace tandem;
namespace kernels = tandem::engine::compute::cpu::kernels;

namespace {

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

// Every ISA above the baseline that this CPU runs (the baseline is the reference).
std::vector<CpuIsa> vector_isas() {
  std::vector<CpuIsa> out;
  for (CpuIsa isa : {CpuIsa::kAvx2, CpuIsa::kAvx512})
    if (variant_cpu_isa(isa) == isa) out.push_back(isa);
  return out;
}

template <typename T> bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(cpu_isa)

BOOST_AUTO_TEST_CASE(variants_never_exceed_the_cpu) {
  const CpuIsa host = host_cpu_isa();
  BOOST_TEST_MESSAGE("host ISA: " << cpu_isa_name(host));
  for (CpuIsa isa : {CpuIsa::kBaseline, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    BOOST_TEST(static_cast<int>(variant_cpu_isa(isa)) <= static_cast<int>(host));
    BOOST_TEST(static_cast<int>(variant_cpu_isa(isa)) <= static_cast<int>(isa));
  }
#if defined(__x86_64__)
  BOOST_TEST((variant_cpu_isa(CpuIsa::kAvx512) == host));  // variants exist for every x86 level
#endif
}

BOOST_AUTO_TEST_CASE(sgd_variants_match_the_baseline_bit_for_bit) {
  constexpr int64_t n = 1037;  // not a whole number of vectors
  const auto g = random_floats(n, 2), w0 = random_floats(n, 1), b0 = random_floats(n, 3);
  const kernels::SgdStep steps[] = {
      {0.1f, 0.01f, 0.0f, 1.0f, false, false, false},   // plain
      {0.1f, 0.01f, 0.9f, 1.0f, true, true, false},     // first momentum step
      {0.1f, 0.01f, 0.9f, 1.0f, true, true, true},      // first, Nesterov
      {0.1f, 0.01f, 0.9f, 0.8f, true, false, false},    // momentum with dampening
      {0.1f, 0.01f, 0.9f, 1.0f, true, false, true},     // Nesterov
  };
  BOOST_TEST_MESSAGE("vector variants tested: " << vector_isas().size());
  for (const auto& s : steps) {
    auto w_ref = w0, b_ref = b0;
    kernels::sgd(CpuIsa::kBaseline, w_ref.data(), g.data(), b_ref.data(), n, s);
    BOOST_TEST(!same_bits(w_ref, w0));  // the step did something
    for (CpuIsa isa : vector_isas()) {
      auto w = w0, b = b0;
      kernels::sgd(isa, w.data(), g.data(), b.data(), n, s);
      BOOST_TEST(same_bits(w, w_ref), cpu_isa_name(isa) << " sgd weights");
      BOOST_TEST(same_bits(b, b_ref), cpu_isa_name(isa) << " sgd momentum");
    }
  }
}

BOOST_AUTO_TEST_CASE(max_pool_variants_match_the_baseline_bit_for_bit) {
  for (int64_t lanes : {1, 8, 16}) {
    // 2 images, 21 channels (a partial last block), 9x11 input, 3x3 window, stride 2, padding 1.
    kernels::MaxPoolGeometry g{2, 21, lanes, 9, 11, 5, 6, 3, 3, 2, 2, 1, 1};
    const int64_t planes = g.n * (lanes == 1 ? g.channels : g.blocks());
    auto x = random_floats(static_cast<size_t>(planes * g.h * g.w * lanes), 7);
    const size_t ys = static_cast<size_t>(planes * g.oh * g.ow * lanes);
    std::vector<float> y_ref(ys);
    std::vector<uint8_t> a_ref(ys);
    kernels::max_pool_forward(CpuIsa::kBaseline, x.data(), y_ref.data(), a_ref.data(), g, 1);
    for (CpuIsa isa : vector_isas()) {
      std::vector<float> y(ys, 5.0f);
      std::vector<uint8_t> a(ys, 77);
      kernels::max_pool_forward(isa, x.data(), y.data(), a.data(), g, 2);
      BOOST_TEST(same_bits(y, y_ref), cpu_isa_name(isa) << " max pool lanes " << lanes);
      BOOST_TEST(same_bits(a, a_ref), cpu_isa_name(isa) << " max pool taps lanes " << lanes);
    }
  }
}

BOOST_AUTO_TEST_CASE(bias_grad_variants_match_the_baseline_bit_for_bit) {
  const int64_t rows = 64, cols = 300;  // more than one 256-column block
  const auto dy = random_floats(static_cast<size_t>(rows * cols), 11), db0 = random_floats(cols, 12);
  for (bool accumulate : {false, true}) {
    auto ref = db0;
    kernels::bias_grad(CpuIsa::kBaseline, dy.data(), ref.data(), rows, cols, accumulate);
    for (CpuIsa isa : vector_isas()) {
      auto db = db0;
      kernels::bias_grad(isa, dy.data(), db.data(), rows, cols, accumulate);
      BOOST_TEST(same_bits(db, ref), cpu_isa_name(isa) << " bias_grad accumulate " << accumulate);
    }
  }
}

BOOST_AUTO_TEST_CASE(conv_weight_grad_variants_match_the_baseline_bit_for_bit) {
  // LeNet-5's second layer's shape class: 6 -> 16 channels, 5x5 kernel, at a small batch; plus a strided,
  // padded, dilated 3-wide case with 20 output channels (a partial lane block).
  struct Case {
    kernels::ConvWeightsGeometry g;
  };
  const Case cases[] = {
      {{4, 6, 14, 14, 16, 10, 10, 5, 5, 1, 1, 0, 0, 1, 1, 1, 8}},
      {{4, 6, 14, 14, 16, 10, 10, 5, 5, 1, 1, 0, 0, 1, 1, 1, 16}},
      {{3, 5, 13, 12, 20, 6, 6, 3, 3, 2, 2, 1, 1, 2, 2, 8, 8}},
      {{3, 5, 13, 12, 20, 6, 6, 3, 3, 2, 2, 1, 1, 2, 2, 1, 16}},
  };
  for (const auto& c : cases) {
    const auto& g = c.g;
    const int64_t xb = (g.c + g.x_lanes - 1) / g.x_lanes, ob = (g.o + g.dy_lanes - 1) / g.dy_lanes;
    const auto x = random_floats(static_cast<size_t>(g.n * xb * g.h * g.w * g.x_lanes), 21);
    const auto dy = random_floats(static_cast<size_t>(g.n * ob * g.oh * g.ow * g.dy_lanes), 22);
    const size_t nw = static_cast<size_t>(g.o * g.c * g.kh * g.kw);
    std::vector<float> dw_ref(nw), db_ref(static_cast<size_t>(g.o));
    kernels::conv_backward_weights_direct(CpuIsa::kBaseline, x.data(), dy.data(), dw_ref.data(), db_ref.data(), g,
                                          false, 1);
    for (CpuIsa isa : vector_isas()) {
      std::vector<float> dw(nw, 3.0f), db(static_cast<size_t>(g.o), 3.0f);
      kernels::conv_backward_weights_direct(isa, x.data(), dy.data(), dw.data(), db.data(), g, false, 2);
      BOOST_TEST(same_bits(dw, dw_ref), cpu_isa_name(isa) << " conv dw, dy lanes " << g.dy_lanes);
      BOOST_TEST(same_bits(db, db_ref), cpu_isa_name(isa) << " conv db, dy lanes " << g.dy_lanes);
    }
  }
}

BOOST_AUTO_TEST_CASE(the_setting_parses_and_caps) {
  settings::Settings s;
  BOOST_TEST(!cpu_isa_cap(s).has_value());
  s.set("TANDEM_CPU_MAX_ISA", "all");
  BOOST_TEST(!cpu_isa_cap(s).has_value());
  s.set("TANDEM_CPU_MAX_ISA", "avx2");
  BOOST_TEST((cpu_isa_cap(s) == CpuIsa::kAvx2));
  s.set("TANDEM_CPU_MAX_ISA", "sse41");
  BOOST_TEST((cpu_isa_cap(s) == CpuIsa::kBaseline));
  s.set("TANDEM_CPU_MAX_ISA", "avx512");
  BOOST_TEST((cpu_isa_cap(s) == CpuIsa::kAvx512));
  s.set("TANDEM_CPU_MAX_ISA", "avx-2");
  try {
    cpu_isa_cap(s);
    BOOST_ERROR("a bad TANDEM_CPU_MAX_ISA was accepted");
  } catch (const Error& e) {
    BOOST_TEST((e.status() == Status::kInvalidArgument));
    BOOST_TEST(std::string(e.what()).find("TANDEM_CPU_MAX_ISA") != std::string::npos, e.what());
  }
  for (const char* v : {"all", "avx512", "avx2", "sse41"}) {
    s.set("TANDEM_CPU_MAX_ISA", v);
    BOOST_TEST(cpu_isa_cap_name(cpu_isa_cap(s)) == v);  // the name round-trips
  }
  BOOST_TEST((effective_cpu_isa(CpuIsa::kBaseline) == CpuIsa::kBaseline));
  BOOST_TEST((effective_cpu_isa(std::nullopt) == host_cpu_isa()));
  const settings::ScopedProcessValue cap("TANDEM_CPU_MAX_ISA", "sse41");
  BOOST_TEST((active_cpu_isa() == CpuIsa::kBaseline));
}

// oneDNN's ISA is fixed for the process at its first primitive (earlier tests in this process made some): a
// backend whose cap is below it is refused, naming the setting; one whose cap covers it gets the capped kernels.
BOOST_AUTO_TEST_CASE(backend_obeys_the_cap_or_refuses_it) {
  const std::string onednn = engine::compute::cpu::onednn_isa_name();  // fixes oneDNN's ISA now
  BOOST_TEST_MESSAGE("oneDNN runs " << onednn);
  {
    const settings::ScopedProcessValue cap("TANDEM_CPU_MAX_ISA", "avx512");  // covers all oneDNN 2.6 runs
    engine::compute::cpu::CpuBackend be({});
    BOOST_TEST((be.kernel_isa() == effective_cpu_isa(CpuIsa::kAvx512)));
  }
  const bool above_avx2 = onednn.rfind("avx512", 0) == 0 || onednn == "avx2_vnni";
  const settings::ScopedProcessValue cap("TANDEM_CPU_MAX_ISA", "avx2");
  if (above_avx2) {
    try {
      engine::compute::cpu::CpuBackend be({});
      BOOST_ERROR("TANDEM_CPU_MAX_ISA=avx2 was accepted while oneDNN runs " << onednn);
    } catch (const Error& e) {
      BOOST_TEST((e.status() == Status::kUnsupported));
      BOOST_TEST(std::string(e.what()).find("TANDEM_CPU_MAX_ISA=avx2") != std::string::npos, e.what());
    }
  } else {
    engine::compute::cpu::CpuBackend be({});
    BOOST_TEST((be.kernel_isa() == effective_cpu_isa(CpuIsa::kAvx2)));
  }
}

BOOST_AUTO_TEST_SUITE_END()
