#include <boost/test/unit_test.hpp>
#include <cmath>
#include <limits>

#include "engine/core/dtype.hpp"
#include "engine/core/error.hpp"

using namespace tandem;

BOOST_AUTO_TEST_SUITE(dtype)

BOOST_AUTO_TEST_CASE(half_round_trips_every_finite_value) {
  // Every finite half converts to float and back to the same bits.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if (((h >> 10) & 0x1f) == 0x1f) continue;  // inf/nan
    BOOST_TEST_REQUIRE(float_to_half(half_to_float(static_cast<uint16_t>(h))) == h);
  }
}

BOOST_AUTO_TEST_CASE(half_rounds_to_nearest_even) {
  BOOST_TEST(half_to_float(float_to_half(1.0f + 1.0f / 2048)) == 1.0f);          // tie -> even (down)
  BOOST_TEST(half_to_float(float_to_half(1.0f + 3.0f / 2048)) == 1.0f + 2.0f / 1024);  // tie -> even (up)
  BOOST_TEST(std::isinf(half_to_float(float_to_half(70000.0f))));
  BOOST_TEST(half_to_float(float_to_half(5.96e-8f)) > 0.0f);  // smallest subnormal survives
}

BOOST_AUTO_TEST_CASE(bf16_rounds_to_nearest_even) {
  BOOST_TEST(bf16_to_float(float_to_bf16(1.0f)) == 1.0f);
  BOOST_TEST(bf16_to_float(float_to_bf16(1.00390625f)) == 1.0f);    // exactly half an ulp -> even
  BOOST_TEST(bf16_to_float(float_to_bf16(1.01171875f)) == 1.015625f);  // 1.5 ulp -> up to even
  BOOST_TEST(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
}

BOOST_AUTO_TEST_CASE(reductions_per_op) {
  float a[3] = {1, -2, 3}, b[3] = {4, 5, -6};
  float d[3];
  reduce_pair(d, a, b, 3, DType::kF32, ReduceOp::kSum);
  BOOST_TEST(d[0] == 5.0f); BOOST_TEST(d[1] == 3.0f); BOOST_TEST(d[2] == -3.0f);
  reduce_pair(d, a, b, 3, DType::kF32, ReduceOp::kMin);
  BOOST_TEST(d[1] == -2.0f); BOOST_TEST(d[2] == -6.0f);
  reduce_pair(d, a, b, 3, DType::kF32, ReduceOp::kMax);
  BOOST_TEST(d[0] == 4.0f);
  reduce_pair(d, a, b, 3, DType::kF32, ReduceOp::kProd);
  BOOST_TEST(d[2] == -18.0f);
  int64_t x[2] = {7, 9}, y[2] = {1, 1};
  reduce_into(x, y, 2, DType::kI64, ReduceOp::kSum);
  divide_by(x, 2, DType::kI64, 2);
  BOOST_TEST(x[0] == 4); BOOST_TEST(x[1] == 5);
  uint16_t h[1] = {float_to_half(1.5f)}, g[1] = {float_to_half(2.25f)};
  reduce_into(h, g, 1, DType::kF16, ReduceOp::kSum);
  BOOST_TEST(half_to_float(h[0]) == 3.75f);
}

BOOST_AUTO_TEST_CASE(parse_rejects_unknown_names) {
  BOOST_TEST(static_cast<int>(parse_dtype("bfloat16")) == static_cast<int>(DType::kBF16));
  BOOST_CHECK_EXCEPTION(parse_dtype("f8"), Error, [](const Error& e) {
    return e.status() == Status::kInvalidArgument && std::string(e.what()).find("'f8'") != std::string::npos;
  });
  BOOST_CHECK_THROW(parse_reduce_op("xor"), Error);
}

BOOST_AUTO_TEST_SUITE_END()
