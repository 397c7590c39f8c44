// Concat layers and branches: shapes and costs of the spec, JSON, and a tiny Inception-like block (four branches, one
// with 1x3 / 3x1 convolutions and asymmetric padding, a side branch nobody reads) run on the reference and CPU
// backends with gradients against finite differences.
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/compute/backend.hpp"
#include "engine/core/error.hpp"
#include "engine/nn/model.hpp"
#include "engine/nn/model_spec.hpp"
#include "tests/nn/expect_error.hpp"
#include "tests/nn/gradcheck.hpp"

using namespace tandem;
using namespace tandem::engine;
using namespace tandem::engine::nn;
namespace bdata = boost::unit_test::data;

namespace {

using B = ModelBuilder;

// in 3x5x5 -> branches 1x1 (2), 1x3 then 3x1 (3), 3x3/1 avg pool + 1x1 (2), max pool 3x3/1 p1 (3 = input) -> concat
// 10x5x5 -> side branch (global pool + linear, unread) and main head (batch norm, relu, global pool, linear).
ModelSpec inception_block() {
  B b("mini_inception", SampleShape{3, 5, 5});
  const int32_t stem = b.conv(3, 3, 1, 1, 1, true, kModelInput, "stem");
  const int32_t b1 = b.conv(2, 1, 1, 0, 1, true, stem, "b1");
  b.conv2(3, 1, 3, 1, 0, 1, false, stem, "b2.1x3");
  const int32_t b2 = b.conv2(3, 3, 1, 1, 1, 0, true, B::kPrev, "b2.3x1");
  b.avgpool(3, 1, 1, stem, "b3.pool");
  const int32_t b3 = b.conv(2, 1, 1, 0, 1, true, B::kPrev, "b3.1x1");
  const int32_t b4 = b.maxpool(3, 1, 1, stem, "b4.pool");
  const int32_t cat = b.concat({b1, b2, b3, b4}, "cat");
  b.global_avgpool(cat, "aux.pool");
  b.linear(4, true, B::kPrev, "aux.fc");
  b.batchnorm(cat, "bn", 1e-3f);
  b.relu(B::kPrev, "relu");
  b.global_avgpool(B::kPrev, "pool");
  b.linear(4, true, B::kPrev, "fc");
  return std::move(b).build();
}

using testing::random_tensor;

}  // namespace

BOOST_AUTO_TEST_SUITE(concat_layer)

BOOST_AUTO_TEST_CASE(sums_channels_and_costs_no_arithmetic) {
  const ModelSpec m = inception_block();
  const LayerSpec& cat = m.layers[static_cast<size_t>(m.find("cat"))];
  BOOST_TEST(to_string(cat.out_shape) == "10x5x5");
  BOOST_TEST(cat.params == 0);
  BOOST_TEST(cat.fwd_flops == 0.0);
  BOOST_TEST(cat.activation_bytes == 10 * 5 * 5 * 4);
  const LayerSpec& wide = m.layers[static_cast<size_t>(m.find("b2.1x3"))];
  BOOST_TEST(to_string(wide.out_shape) == "3x5x5");
  BOOST_TEST(wide.params == 3 * 3 * 1 * 3);
  BOOST_TEST(wide.macs == 3 * 5 * 5 * 3 * 3);
}

BOOST_AUTO_TEST_CASE(refuses_mismatched_maps_and_single_inputs) {
  B b("bad", SampleShape{2, 6, 6});
  const int32_t a = b.conv(2, 3, 1, 1, 1, true, kModelInput, "a");
  const int32_t s = b.conv(2, 3, 2, 1, 1, true, kModelInput, "s");
  testing::expect_error([&] { b.concat({a, s}, "cat"); }, Status::kInvalidArgument, {"cat", "height and width"});
  testing::expect_error([&] { b.concat({a}, "one"); }, Status::kInvalidArgument, {"one", "2 or more"});
}

BOOST_AUTO_TEST_CASE(json_reads_concat_and_asymmetric_padding) {
  const ModelSpec m = model_from_json_text(R"({"name": "j", "input": [2, 4, 4], "layers": [
      {"type": "conv2d", "name": "a", "out_channels": 3, "kernel": [1, 3], "padding": [0, 1], "inputs": ["input"]},
      {"type": "conv2d", "name": "b", "out_channels": 5, "kernel": 1, "inputs": ["input"]},
      {"type": "maxpool2d", "name": "p", "kernel": 3, "stride": 1, "padding": 1, "inputs": ["input"]},
      {"type": "concat", "name": "cat", "inputs": ["a", "b", "p"]},
      {"type": "global_avgpool"}, {"type": "linear", "out_features": 2}]})");
  BOOST_TEST(to_string(m.layers[3].out_shape) == "10x4x4");
  const ModelSpec back = model_from_json(model_to_json(inception_block()));
  BOOST_TEST(back.totals().params == inception_block().totals().params);
  BOOST_TEST(back.totals().macs == inception_block().totals().macs);
  testing::expect_error(
      [] {
        model_from_json_text(R"({"input": [2, 4, 4], "layers": [{"type": "concat", "inputs": ["input"]}]})");
      },
      Status::kInvalidArgument, {"layers[0].inputs", "2 or more"});
}

BOOST_DATA_TEST_CASE(inception_block_gradients_match_finite_differences, bdata::make({"reference", "cpu"}), name) {
  auto be = compute::make_backend(name);
  Model m(inception_block(), *be, 5);
  const Tensor x = random_tensor(tandem::Shape{2, 3, 5, 5}, 21);
  const Tensor r = random_tensor(tandem::Shape{2, 4}, 22);
  const auto count = testing::check_param_gradients(m, x, r, 6, [&](size_t layer, double, double analytic) {
    // The side branch's logits feed no loss: its gradients are zero.
    if (m.spec().layers[layer].name.rfind("aux.", 0) == 0) BOOST_TEST(analytic == 0.0);
  });
  BOOST_TEST(count.checked > 40);
  // Max-pool and ReLU kinks can flip under a finite step; allow one such point.
  BOOST_TEST(count.close >= count.checked - 1, count.close << " of " << count.checked << " gradients agree");
}

BOOST_AUTO_TEST_CASE(cpu_and_reference_backends_agree_on_the_forward_pass) {
  auto ref = compute::make_backend("reference"), cpu = compute::make_backend("cpu");
  Model a(inception_block(), *ref, 9), b(inception_block(), *cpu, 9);
  const Tensor x = random_tensor(tandem::Shape{3, 3, 5, 5}, 4);
  const Tensor ya = ref->to_host(a.forward(x, true)), yb = cpu->to_host(b.forward(x, true));
  BOOST_REQUIRE(ya.numel() == yb.numel());
  for (int64_t i = 0; i < ya.numel(); ++i) {
    BOOST_TEST(std::abs(ya.data<float>()[i] - yb.data<float>()[i]) <= 1e-4f * std::max(1.0f, std::abs(ya.data<float>()[i])));
  }
}

BOOST_AUTO_TEST_SUITE_END()
