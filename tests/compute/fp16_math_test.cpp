// Emulated fp16 math on the host backends (TANDEM_CPU_MATH=fp16, engine/compute/fp16_math.hpp): the rounding to
// IEEE half against an independent reference conversion (the compiler's _Float16, or a table of known bit patterns
// where it has none), and every emulated op against the reference backend run on operands rounded by hand.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "engine/compute/fp16_math.hpp"
#include "engine/core/dtype.hpp"
#include "engine/core/settings.hpp"
#include "tests/compute/test_util.hpp"

using namespace tandem;
using namespace tandem::engine::compute;
using namespace tandem::engine::compute::testing;

namespace {

float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float rounded(float f) {
  float x = f;
  round_to_half(&x, 1);
  return x;
}

Tensor rounded_copy(const Tensor& t) {
  Tensor o = Tensor::empty(t.shape(), DType::kF32);
  std::memcpy(o.raw_data(), t.raw_data(), static_cast<size_t>(t.numel()) * 4);
  round_to_half(o.data<float>(), o.numel());
  return o;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(fp16_math)

// The edge cases named in issue #14 with the half values they must become (IEEE 754 binary16, round to nearest even).
BOOST_AUTO_TEST_CASE(rounding_matches_ieee_half_on_edge_cases) {
  struct Case {
    float in;
    float out;
    const char* what;
  };
  const float inf = std::numeric_limits<float>::infinity();
  const Case cases[] = {
      {65504.0f, 65504.0f, "max half"},
      {65519.99f, 65504.0f, "just below the overflow midpoint rounds down to max"},
      {65520.0f, inf, "the midpoint 65520 ties to even: overflows to inf"},
      {1e6f, inf, "overflow"},
      {-1e6f, -inf, "negative overflow"},
      {std::ldexp(1.0f, -24), std::ldexp(1.0f, -24), "min subnormal 2^-24"},
      {std::ldexp(1.0f, -25), 0.0f, "2^-25 ties to even: zero"},
      {std::ldexp(1.5f, -25), std::ldexp(1.0f, -24), "above the midpoint: min subnormal"},
      {std::ldexp(1.0f, -26), 0.0f, "underflow to zero"},
      {std::ldexp(3.0f, -25), std::ldexp(2.0f, -24), "1.5 ulp subnormal ties to even (2 ulps)"},
      {std::ldexp(1.0f, -14), std::ldexp(1.0f, -14), "min normal"},
      {std::ldexp(1023.0f, -24), std::ldexp(1023.0f, -24), "max subnormal"},
      {1.0f + std::ldexp(1.0f, -11), 1.0f, "1 + half ulp ties to even: 1"},
      {1.0f + std::ldexp(3.0f, -11), 1.0f + std::ldexp(1.0f, -9), "1 + 1.5 ulp ties to even: 1 + 2 ulp"},
      {0.1f, 0.0999755859375f, "0.1"},
      {-0.0f, -0.0f, "negative zero"},
      {inf, inf, "inf"},
  };
  for (const Case& c : cases) {
    const float got = rounded(c.in);
    BOOST_TEST(float_bits(got) == float_bits(c.out), c.what << ": " << c.in << " -> " << got << ", want " << c.out);
  }
  const float nan = rounded(std::numeric_limits<float>::quiet_NaN());
  BOOST_TEST(std::isnan(nan));
  BOOST_TEST(std::isnan(rounded(-std::numeric_limits<float>::quiet_NaN())));
  BOOST_TEST((float_to_half(65504.0f) == 0x7bff));
  BOOST_TEST((float_to_half(std::ldexp(1.0f, -24)) == 0x0001));
  BOOST_TEST((float_to_half(inf) == 0x7c00));
  BOOST_TEST(((float_to_half(std::numeric_limits<float>::quiet_NaN()) & 0x7c00) == 0x7c00 &&
              (float_to_half(std::numeric_limits<float>::quiet_NaN()) & 0x3ff) != 0));
}

#if defined(__FLT16_MAX__)
// Against the compiler's own conversion (GCC/Clang _Float16: IEEE binary16, round to nearest even) over every
// exponent and random mantissas, subnormals and overflow included.
BOOST_AUTO_TEST_CASE(rounding_matches_the_compilers_float16_everywhere) {
  std::mt19937 rng(14);
  int64_t checked = 0, mismatches = 0;
  for (uint32_t e = 0; e < 256; ++e) {
    for (int k = 0; k < 2000; ++k) {
      const uint32_t u = (rng() & 0x80000000u) | (e << 23) | (rng() & 0x7fffffu);
      const float f = bits_to_float(u);
      const float want = static_cast<float>(static_cast<_Float16>(f));
      const float got = rounded(f);
      ++checked;
      if (std::isnan(want) ? !std::isnan(got) : float_bits(got) != float_bits(want)) {
        if (++mismatches <= 5) BOOST_TEST(false, "bits " << std::hex << u << ": got " << got << ", _Float16 " << want);
      }
    }
  }
  BOOST_TEST(mismatches == 0, mismatches << " of " << checked << " differ");
}
#endif

// Each emulated op equals the reference backend run on operands rounded to half by hand (results of convolutions
// rounded too), to f32 accumulation-order differences; and differs from plain f32 (the emulation did something).
BOOST_AUTO_TEST_CASE(emulated_ops_equal_the_reference_on_half_operands) {
  for (const char* inner : {"reference", "cpu"}) {
    BOOST_TEST_CONTEXT(inner) {
      const settings::ScopedProcessValue math("TANDEM_CPU_MATH", "fp16");
      auto be = make_backend(inner);
      BOOST_TEST(is_fp16_emulation(*be));
      BOOST_TEST(std::string(be->name()) == inner);
      ConvParams p;
      p.pad_h = p.pad_w = 1;
      p.stride_h = p.stride_w = 2;
      const Tensor x = random_tensor({2, 3, 9, 9}, 1), w = random_tensor({4, 3, 3, 3}, 2), b = random_tensor({4}, 3);
      const settings::ScopedProcessValue plain("TANDEM_CPU_MATH", "f32");
      auto f32 = make_backend("reference");
      BOOST_TEST(!is_fp16_emulation(*f32));
      const Tensor xr = rounded_copy(x), wr = rounded_copy(w);
      // forward: conv(x~, w~) rounded, + bias in f32
      Tensor want = rounded_copy(f32->to_plain(f32->conv_forward(xr, wr, Tensor(), p)));
      for (int64_t n = 0; n < 2; ++n)
        for (int64_t o = 0; o < 4; ++o)
          for (int64_t s = 0; s < want.numel() / 8; ++s) want.data<float>()[(n * 4 + o) * (want.numel() / 8) + s] += b.data<float>()[o];
      const Tensor y = be->conv_forward(x, w, b, p);
      expect_close(values(*be, y), values(want), 1e-6, 1e-6, "conv forward");
      const double diff_f32 = [&] {
        const auto a = values(*be, y), c = values(*f32, f32->conv_forward(x, w, b, p));
        double d = 0;
        for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(a[i] - c[i]));
        return d;
      }();
      BOOST_TEST(diff_f32 > 1e-5, "the emulation matches plain f32 (" << diff_f32 << "): nothing was rounded");
      const Tensor dy = random_tensor(y.shape(), 4);
      const Tensor dyr = rounded_copy(dy);
      expect_close(values(*be, be->conv_backward_data(dy, w, x.shape(), p)),
                   values(rounded_copy(f32->to_plain(f32->conv_backward_data(dyr, wr, x.shape(), p)))), 1e-6, 1e-6,
                   "conv backward data");
      Tensor dw = random_tensor(w.shape(), 5), db = random_tensor({4}, 6);
      Tensor dw_want = random_tensor(w.shape(), 5), db_want = random_tensor({4}, 6), none;
      Tensor g = f32->empty(w.shape());
      f32->conv_backward_weights(xr, dyr, g, none, p, false);
      g = rounded_copy(g);
      for (int64_t i = 0; i < g.numel(); ++i) dw_want.data<float>()[i] += g.data<float>()[i];
      Tensor dw_scratch = f32->empty(w.shape());
      f32->conv_backward_weights(x, dy, dw_scratch, db_want, p, true);  // the bias gradient from f32 dy
      be->conv_backward_weights(x, dy, dw, db, p, true);
      expect_close(values(*be, dw), values(dw_want), 1e-6, 1e-6, "conv backward weights (accumulated)");
      expect_close(values(*be, db), values(db_want), 1e-6, 1e-6, "conv bias gradient (f32)");
      // linear: half operands, f32 result
      const Tensor lx = random_tensor({5, 7}, 7), lw = random_tensor({3, 7}, 8), lb = random_tensor({3}, 9);
      expect_close(values(*be, be->linear_forward(lx, lw, lb)),
                   values(*f32, f32->linear_forward(rounded_copy(lx), rounded_copy(lw), lb)), 1e-6, 1e-6,
                   "linear forward");
      const Tensor ldy = random_tensor({5, 3}, 10);
      expect_close(values(*be, be->linear_backward_data(ldy, lw, lx.shape())),
                   values(*f32, f32->linear_backward_data(rounded_copy(ldy), rounded_copy(lw), lx.shape())), 1e-6,
                   1e-6, "linear backward data");
      Tensor ldw = f32->zeros({3, 7}), ldb = f32->zeros({3}), ldw_want = f32->zeros({3, 7}), ldb_want = f32->zeros({3});
      be->linear_backward_weights(lx, ldy, ldw, ldb, false);
      f32->linear_backward_weights(rounded_copy(lx), rounded_copy(ldy), ldw_want, none, false);
      Tensor scratch = f32->zeros({3, 7});
      f32->linear_backward_weights(lx, ldy, scratch, ldb_want, false);
      expect_close(values(*be, ldw), values(ldw_want), 1e-6, 1e-6, "linear backward weights");
      expect_close(values(*be, ldb), values(ldb_want), 1e-6, 1e-6, "linear bias gradient (f32)");
    }
  }
}

// A grouped (depthwise) convolution stays f32 in 16-bit math unless TANDEM_HALF_GROUPED_CONV=1, as on the GPU
// (half_math_for_conv): by default the emulation's forward and backward passes equal plain f32 exactly; with the
// setting they are rounded.
BOOST_AUTO_TEST_CASE(emulated_grouped_convolutions_follow_the_gpus_rule) {
  ConvParams p;
  p.pad_h = p.pad_w = 1;
  p.groups = 3;
  const Tensor x = random_tensor({2, 3, 7, 7}, 11), w = random_tensor({3, 1, 3, 3}, 12), dy = random_tensor({2, 3, 7, 7}, 13);
  auto f32 = make_backend("reference");
  auto passes = [&](Backend& be) {
    Tensor dw = be.zeros(w.shape()), db;
    be.conv_backward_weights(x, dy, dw, db, p, false);
    std::vector<double> all = values(be, be.conv_forward(x, w, Tensor(), p));
    for (const Tensor& t : {be.conv_backward_data(dy, w, x.shape(), p), dw}) {
      const std::vector<double> v = values(be, t);
      all.insert(all.end(), v.begin(), v.end());
    }
    return all;
  };
  const std::vector<double> plain = passes(*f32);
  for (const char* grouped : {"0", "1"}) {
    const settings::ScopedProcessValue math("TANDEM_CPU_MATH", "fp16");
    const settings::ScopedProcessValue g("TANDEM_HALF_GROUPED_CONV", grouped);
    auto be = make_backend("reference");
    const std::vector<double> got = passes(*be);
    BOOST_REQUIRE(got.size() == plain.size());
    double d = 0;
    for (size_t i = 0; i < got.size(); ++i) d = std::max(d, std::abs(got[i] - plain[i]));
    if (grouped[0] == '0') {
      BOOST_TEST(d == 0.0, "grouped convolution rounded by default (max difference " << d << ")");
    } else {
      BOOST_TEST(d > 1e-5, "TANDEM_HALF_GROUPED_CONV=1 left the grouped convolution in f32");
    }
  }
}

// Half's range is what the emulation is for: a value past 65504 becomes inf, one below 2^-25 vanishes.
BOOST_AUTO_TEST_CASE(emulated_convolution_overflows_and_underflows_as_half_does) {
  const settings::ScopedProcessValue math("TANDEM_CPU_MATH", "fp16");
  auto be = make_backend("cpu");
  ConvParams p;
  Tensor x = Tensor::full({1, 1, 2, 2}, 300.0), w = Tensor::full({1, 1, 2, 2}, 100.0);  // 4 x 30000 = 120000
  const std::vector<double> y = values(*be, be->conv_forward(x, w, Tensor(), p));
  BOOST_TEST(std::isinf(y[0]));
  Tensor tiny = Tensor::full({1, 1, 2, 2}, 1e-8), one = Tensor::full({1, 1, 2, 2}, 1.0);
  BOOST_TEST(values(*be, be->conv_forward(tiny, one, Tensor(), p))[0] == 0.0);  // 1e-8 rounds to 0 in half
  const settings::ScopedProcessValue plain("TANDEM_CPU_MATH", "f32");
  auto f32 = make_backend("cpu");
  BOOST_TEST(values(*f32, f32->conv_forward(x, w, Tensor(), p))[0] == 120000.0);
}

BOOST_AUTO_TEST_CASE(the_setting_is_checked) {
  const settings::ScopedProcessValue math("TANDEM_CPU_MATH", "fp8");
  try {
    (void)make_backend("cpu");
    BOOST_FAIL("no throw");
  } catch (const Error& e) {
    BOOST_TEST(std::string(e.what()).find("TANDEM_CPU_MATH") != std::string::npos, e.what());
  }
}

BOOST_AUTO_TEST_SUITE_END()
