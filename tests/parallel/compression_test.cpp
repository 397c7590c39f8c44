// The 16-bit gradient wire form (the reducer's compress/decompress, also timed by `tandem calibrate`): values
// scaled and rounded to the format's precision, back to f32 within that precision; the formats' ranges differ.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdint>
#include <vector>

#include "engine/core/error.hpp"
#include "engine/parallel/grad_reducer.hpp"

using tandem::engine::parallel::GradCompression;
using tandem::engine::parallel::compress_gradients;
using tandem::engine::parallel::decompress_gradients;

BOOST_AUTO_TEST_SUITE(gradient_compression)

BOOST_AUTO_TEST_CASE(round_trip_keeps_each_formats_precision) {
  std::vector<float> g;
  for (int i = -500; i <= 500; ++i) g.push_back(static_cast<float>(i) * 0.0137f);
  for (auto [c, rel] : {std::pair{GradCompression::kF16, 1.0 / 1024}, std::pair{GradCompression::kBF16, 1.0 / 128}}) {
    std::vector<uint16_t> wire(g.size());
    std::vector<float> back(g.size());
    compress_gradients(c, g.data(), 0.25f, wire.data(), g.size());
    decompress_gradients(c, wire.data(), back.data(), g.size());
    for (size_t i = 0; i < g.size(); ++i) {
      const double want = 0.25 * g[i];
      BOOST_TEST(std::abs(back[i] - want) <= rel * std::abs(want) + 1e-7, "element " << i << ": " << back[i]
                                                                                     << " vs " << want);
    }
  }
}

BOOST_AUTO_TEST_CASE(bf16_keeps_the_range_fp16_loses) {
  const float big = 1e6f;  // beyond fp16's 65504
  uint16_t w = 0;
  float back = 0;
  compress_gradients(GradCompression::kBF16, &big, 1.0f, &w, 1);
  decompress_gradients(GradCompression::kBF16, &w, &back, 1);
  BOOST_TEST(std::abs(back - big) <= big / 128);
  compress_gradients(GradCompression::kF16, &big, 1.0f, &w, 1);
  decompress_gradients(GradCompression::kF16, &w, &back, 1);
  BOOST_TEST(std::isinf(back));
}

BOOST_AUTO_TEST_CASE(no_format_is_refused) {
  float x = 1;
  uint16_t w = 0;
  BOOST_CHECK_THROW(compress_gradients(GradCompression::kNone, &x, 1.0f, &w, 1), tandem::Error);
  BOOST_CHECK_THROW(decompress_gradients(GradCompression::kNone, &w, &x, 1), tandem::Error);
}

BOOST_AUTO_TEST_SUITE_END()
