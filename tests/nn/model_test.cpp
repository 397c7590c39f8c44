// Model execution on the reference backend: gradients through the whole graph (every layer kind, a residual add, a
// shared input) against finite differences, stage-by-stage execution against the whole model, seeded initialisation.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <vector>

#include "engine/compute/backend.hpp"
#include "engine/compute/forwarding_backend.hpp"
#include "engine/core/allocator.hpp"
#include "engine/core/rng.hpp"
#include "engine/nn/model.hpp"
#include "engine/nn/zoo.hpp"
#include "tests/nn/expect_error.hpp"
#include "tests/nn/gradcheck.hpp"

using namespace tandem;
using namespace tandem::engine;
using namespace tandem::engine::nn;
namespace tt = boost::test_tools;

namespace {

std::unique_ptr<compute::Backend> reference() { return compute::make_backend("reference"); }

using testing::random_tensor;

// Every layer kind once, with a residual add whose branches share an input.
ModelSpec every_layer_kind() {
  ModelBuilder b("all", SampleShape{2, 6, 6});
  b.conv(4, 3, 1, 1, 1, true, ModelBuilder::kPrev, "c1");
  const int32_t bn = b.batchnorm(ModelBuilder::kPrev, "bn");
  const int32_t r = b.relu(bn, "r");
  b.conv(4, 3, 1, 1, 4, false, r, "dw");  // depthwise
  const int32_t r6 = b.relu6(ModelBuilder::kPrev, "r6");
  const int32_t sum = b.add(r6, r, "sum");
  const int32_t mp = b.maxpool(2, 2, 0, sum, "mp");           // 4x3x3
  b.avgpool(3, 1, 1, mp, "ap");                               // 4x3x3
  const int32_t g = b.global_avgpool(ModelBuilder::kPrev, "gap");
  const int32_t f = b.flatten(mp, "flat");                    // 36
  const int32_t l1 = b.linear(4, true, f, "fc1");
  b.add(l1, g, "join");
  b.linear(3, true, ModelBuilder::kPrev, "fc2");
  return std::move(b).build();
}

}  // namespace

BOOST_AUTO_TEST_SUITE(model_execution)

BOOST_AUTO_TEST_CASE(gradients_match_finite_differences_for_every_layer_kind) {
  auto be = reference();
  Model m(every_layer_kind(), *be, 3);
  const Tensor x = random_tensor(tandem::Shape{3, 2, 6, 6}, 10);
  const Tensor r = random_tensor(tandem::Shape{3, 3}, 11);
  BOOST_TEST((m.forward(x, true).shape() == tandem::Shape{3, 3}));
  const auto count = testing::check_param_gradients(m, x, r, 12, [](size_t, double, double) {});
  BOOST_TEST(count.checked > 60);
  // Max-pool and ReLU kinks can flip under a finite step; allow a couple of such points, no more.
  BOOST_TEST(count.close >= count.checked - 2, count.close << " of " << count.checked << " gradients agree");
}

namespace counting {
using namespace tandem::engine::compute;
// The reference backend, counting the data-gradient (dx) convolutions and matmuls it is asked for.
class CountingBackend final : public ForwardingBackend {
 public:
  CountingBackend() : ForwardingBackend(make_backend("reference")) {}
  int data_grads = 0;

  Tensor conv_backward_data(const Tensor& dy, const Tensor& w, const tandem::Shape& x_shape,
                            const ConvParams& p) override {
    ++data_grads;
    return inner().conv_backward_data(dy, w, x_shape, p);
  }
  Tensor linear_backward_data(const Tensor& dy, const Tensor& w, const tandem::Shape& x_shape) override {
    ++data_grads;
    return inner().linear_backward_data(dy, w, x_shape);
  }
};
}  // namespace counting
using counting::CountingBackend;

// Backward computes no dx that nothing reads: the MLP's first linear layer follows a flatten of
// the input, so only the second one's dx is needed; a stage whose input crosses from an earlier
// stage still returns that input's gradient.
BOOST_AUTO_TEST_CASE(backward_skips_data_gradients_nobody_reads) {
  ModelBuilder b("mlp2", SampleShape{1, 4, 4});
  b.flatten();
  b.linear(6, true, ModelBuilder::kPrev, "fc1");
  b.relu();
  b.linear(3, true, ModelBuilder::kPrev, "fc2");
  const ModelSpec spec = std::move(b).build();
  const Tensor x = random_tensor(tandem::Shape{2, 1, 4, 4}, 20);
  const Tensor r = random_tensor(tandem::Shape{2, 3}, 21);
  CountingBackend counting;
  Model m(spec, counting, 5);
  m.forward(x, true);
  m.backward(r);
  BOOST_TEST(counting.data_grads == 1);
  auto be = reference();
  Model plain(spec, *be, 5);
  plain.forward(x, true);
  plain.backward(r);
  for (int64_t i = 0; i < plain.grads().numel(); ++i)
    BOOST_TEST(m.grads().data<float>()[i] == plain.grads().data<float>()[i]);
  Activations a1, a2;  // stages [flatten] and [fc1, relu, fc2]
  const auto mid = m.forward_range(0, 1, {x}, a1);
  m.forward_range(1, m.num_layers(), mid, a2);
  const auto back = m.backward_range({r}, a2);
  BOOST_TEST_REQUIRE(back.size() == 1u);
  BOOST_TEST((back[0].defined() && back[0].shape() == mid[0].shape()));
}

BOOST_AUTO_TEST_CASE(stages_compose_to_the_whole_model) {
  auto be = reference();
  Model whole(zoo_model("resnet18", SampleShape{3, 8, 8}, 5), *be, 7);
  const Tensor x = random_tensor(tandem::Shape{2, 3, 8, 8}, 1);
  const Tensor r = random_tensor(tandem::Shape{2, 5}, 2);
  const Tensor y = whole.forward(x, true).clone();
  whole.backward(r);
  const Tensor g_whole = whole.grads().clone();

  // Cut inside a residual block, so two tensors cross the boundary (the branch and the skip).
  Model staged(zoo_model("resnet18", SampleShape{3, 8, 8}, 5), *be, 7);
  const size_t cut = static_cast<size_t>(staged.spec().find("layer2.0.b.conv"));
  BOOST_TEST(staged.spec().crossing(cut).size() == 2u);
  Activations a1, a2;
  const auto mid = staged.forward_range(0, cut, {x}, a1);
  BOOST_TEST(mid.size() == 2u);
  const auto out = staged.forward_range(cut, staged.num_layers(), mid, a2);
  const Tensor y2 = out[0];
  for (int64_t i = 0; i < y.numel(); ++i) BOOST_TEST(y.data<float>()[i] == y2.data<float>()[i]);
  const auto back = staged.backward_range({r}, a2);
  BOOST_TEST(back.size() == 2u);
  const auto front = staged.backward_range(back, a1);
  BOOST_TEST(front.size() == 1u);
  BOOST_TEST(!front[0].defined());  // the model input needs no gradient
  const Tensor g = staged.grads();
  double worst = 0;
  for (int64_t i = 0; i < g.numel(); ++i) {
    worst = std::max(worst, std::abs(double(g.data<float>()[i]) - g_whole.data<float>()[i]));
  }
  BOOST_TEST(worst == 0.0);  // the same operations in the same order
  // Accumulation: a second backward with accumulate doubles the gradients.
  staged.forward(x, true);
  staged.backward(r, true);
  worst = 0;
  for (int64_t i = 0; i < g.numel(); ++i) {
    worst = std::max(worst, std::abs(double(g.data<float>()[i]) - 2.0 * g_whole.data<float>()[i]));
  }
  BOOST_TEST(worst < 1e-4);
}

BOOST_AUTO_TEST_CASE(inference_uses_running_statistics_and_keeps_nothing) {
  auto be = reference();
  Model m(every_layer_kind(), *be, 4);
  const Tensor x = random_tensor(tandem::Shape{4, 2, 6, 6}, 5, 3.0);
  const Tensor before = m.buffers().clone();
  const Tensor eval1 = m.forward(x, false).clone();
  for (int64_t i = 0; i < before.numel(); ++i) BOOST_TEST(m.buffers().data<float>()[i] == before.data<float>()[i]);
  m.forward(x, true);  // updates the running statistics
  bool moved = false;
  for (int64_t i = 0; i < before.numel(); ++i) moved |= m.buffers().data<float>()[i] != before.data<float>()[i];
  BOOST_TEST(moved);
  const Tensor eval2 = m.forward(x, false);
  bool differs = false;
  for (int64_t i = 0; i < eval1.numel(); ++i) differs |= eval1.data<float>()[i] != eval2.data<float>()[i];
  BOOST_TEST(differs);
  int kept = 0;
  for (const Tensor& t : m.activations().out) kept += t.defined();
  BOOST_TEST(kept == 1);  // only the logits
}

BOOST_AUTO_TEST_CASE(same_seed_same_weights_and_stage_views) {
  auto be = reference();
  Model a(zoo_model("lenet5", SampleShape{1, 28, 28}, 10), *be, 42);
  Model b(zoo_model("lenet5", SampleShape{1, 28, 28}, 10), *be, 42);
  Model c(zoo_model("lenet5", SampleShape{1, 28, 28}, 10), *be, 43);
  BOOST_TEST(a.params().numel() == 61706);
  int same = 0, diff = 0;
  for (int64_t i = 0; i < a.params().numel(); ++i) {
    same += a.params().data<float>()[i] == b.params().data<float>()[i];
    diff += a.params().data<float>()[i] != c.params().data<float>()[i];
  }
  BOOST_TEST(same == 61706);
  BOOST_TEST(diff > 60000);
  // Kaiming: conv1 weights have variance 2 / fan_in = 2 / 25.
  const Tensor w = a.layer_params(0);
  double ss = 0;
  for (int64_t i = 0; i < 150; ++i) ss += std::pow(w.data<float>()[i], 2);
  BOOST_TEST(ss / 150 == 2.0 / 25, tt::tolerance(0.35));
  BOOST_TEST(a.range_params(0, 3).numel() == 156);
  BOOST_TEST(a.param_offset(a.num_layers()) == 61706);
}

BOOST_AUTO_TEST_CASE(wrong_inputs_are_refused) {
  auto be = reference();
  Model m(zoo_model("mlp", SampleShape{1, 28, 28}, 10), *be, 1);
  Activations a;
  tandem::testing::expect_error([&] { m.forward_range(0, 3, {}, a); }, Status::kInvalidArgument, {"1 input"});
  tandem::testing::expect_error([&] { m.backward(Tensor::zeros(tandem::Shape{2, 10})); }, Status::kInvalidArgument,
                                {"training forward"});
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(held_layers)

std::vector<float> values(const Tensor& t) { return {t.data<float>(), t.data<float>() + t.numel()}; }

BOOST_AUTO_TEST_CASE(a_stage_holds_the_whole_models_seeded_values_for_its_layers_and_runs_them_alike) {
  auto be = reference();
  const ModelSpec spec = zoo_model("resnet18", SampleShape{3, 8, 8}, 5);
  Model whole(spec, *be, 7);
  const size_t a = static_cast<size_t>(spec.find("layer2.0.b.conv")), b = static_cast<size_t>(spec.find("layer3.0.a.conv"));
  Model stage(spec, *be, 7);
  stage.hold(a, b);
  BOOST_TEST(stage.held_begin() == a);
  BOOST_TEST(stage.held_end() == b);
  BOOST_TEST(!stage.holds_all());
  BOOST_TEST(stage.params().numel() == spec.totals(a, b).params);
  BOOST_TEST(stage.grads().numel() == spec.totals(a, b).params);
  BOOST_TEST(stage.buffers().numel() == spec.totals(a, b).buffers);
  BOOST_TEST(stage.total_params() == whole.params().numel());
  BOOST_TEST((values(stage.params()) == values(whole.range_params(a, b))));   // bit-identical initial weights
  BOOST_TEST((values(stage.buffers()) == values(whole.range_buffers(a, b))));
  // Offsets stay those of the whole model; views over held layers line up with it.
  const size_t l = static_cast<size_t>(spec.find("layer2.1.a.conv"));
  BOOST_TEST((values(stage.layer_params(l)) == values(whole.layer_params(l))));

  // Forward and backward over the held range match the whole model's over the same range.
  const Tensor x = random_tensor(tandem::Shape{2, 3, 8, 8}, 1);
  Activations w1, w2, s2;
  const auto mid = whole.forward_range(0, a, {x}, w1);
  const auto y_whole = whole.forward_range(a, b, mid, w2);
  const auto y_stage = stage.forward_range(a, b, mid, s2);
  BOOST_REQUIRE(y_whole.size() == y_stage.size());
  for (size_t k = 0; k < y_whole.size(); ++k)
    BOOST_TEST((values(be->to_plain(y_whole[k])) == values(be->to_plain(y_stage[k]))));
  std::vector<Tensor> dy;
  for (size_t k = 0; k < y_whole.size(); ++k) dy.push_back(random_tensor(be->to_plain(y_whole[k]).shape(), 10 + k));
  whole.backward_range(dy, w2);
  stage.backward_range(dy, s2);
  BOOST_TEST((values(stage.grads()) == values(whole.range_grads(a, b))));

  // Layers outside the range are refused, naming what the model holds.
  Activations bad;
  tandem::testing::expect_error([&] { stage.forward(x); }, Status::kInvalidArgument, {"holds only layers"});
  tandem::testing::expect_error([&] { stage.range_params(0, a); }, Status::kInvalidArgument,
                                {"holds only layers", "pipeline stage"});
  tandem::testing::expect_error([&] { stage.hold(b, a); }, Status::kInvalidArgument, {"cannot hold"});
}

BOOST_AUTO_TEST_CASE(holding_another_range_keeps_the_values_of_layers_held_before) {
  auto be = reference();
  const ModelSpec spec = zoo_model("lenet5", SampleShape{1, 28, 28}, 10);
  Model m(spec, *be, 5);
  Model fresh(spec, *be, 5);
  be->fill(m.params(), 0.25f);  // "trained" values
  m.hold(0, 4);
  BOOST_TEST(m.params().numel() == spec.totals(0, 4).params);
  for (float v : values(m.params())) BOOST_REQUIRE(v == 0.25f);
  m.hold(2, spec.layers.size());  // layers 2, 3 kept; the rest start from their seeded values
  const std::vector<float> kept = values(m.range_params(2, 4));
  for (float v : kept) BOOST_REQUIRE(v == 0.25f);
  BOOST_TEST((values(m.range_params(4, spec.layers.size())) == values(fresh.range_params(4, spec.layers.size()))));
  for (float g : values(m.grads())) BOOST_REQUIRE(g == 0.0f);
}

BOOST_AUTO_TEST_CASE(storage_is_allocated_only_for_the_held_layers) {
  auto be = reference();
  const ModelSpec spec = zoo_model("resnet18", SampleShape{3, 32, 32}, 10);  // 11.2 M parameters: 2 x 45 MB whole
  const size_t L = spec.layers.size();
  const size_t a = static_cast<size_t>(spec.find("layer2.0.a.conv"));
  host_allocator().empty_cache();
  const size_t before = host_allocator().stats().bytes_in_use;
  Model m(spec, *be, 1);
  m.hold(0, a);
  BOOST_TEST(host_allocator().stats().bytes_in_use == before);  // nothing until first use
  m.params();
  const double held = static_cast<double>(host_allocator().stats().bytes_in_use - before);
  const double want = 4.0 * (2.0 * static_cast<double>(spec.totals(0, a).params) + static_cast<double>(spec.totals(0, a).buffers));
  BOOST_TEST(held >= want);
  BOOST_TEST(held <= want * 1.13 + 4096);  // size-class rounding only
  BOOST_TEST(held < 0.05 * 8.0 * static_cast<double>(spec.totals(0, L).params));  // the stem holds < 5% of the model
}

BOOST_AUTO_TEST_SUITE_END()
