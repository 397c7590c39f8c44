// calibrate_model: per-layer times for every layer in order, scaled to the measured whole step, the model left
// exactly as it was, costs that grow with the work, and field-named errors.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/allocator.hpp"
#include "engine/nn/model.hpp"
#include "engine/nn/zoo.hpp"
#include "engine/train/calibrate.hpp"
#include "tests/nn/expect_error.hpp"

using namespace tandem;
using namespace tandem::engine;
using tandem::testing::expect_error;
namespace tt = boost::test_tools;

namespace {

std::unique_ptr<compute::Backend> cpu_backend() {
  compute::BackendOptions o;
  o.num_threads = 1;
  return compute::make_backend("cpu", o);
}

// conv-bn-relu with a residual add and max pooling: every kind of crossing a layer-by-layer pass must carry.
nn::ModelSpec residual_net() {
  nn::ModelBuilder b("residual", nn::SampleShape{3, 16, 16});
  b.conv(8, 3, 1, 1, 1, false, nn::ModelBuilder::kPrev, "conv0");
  b.batchnorm(nn::ModelBuilder::kPrev, "bn0");
  const int32_t skip = b.relu(nn::ModelBuilder::kPrev, "relu0");
  b.conv(8, 3, 1, 1, 1, false, nn::ModelBuilder::kPrev, "conv1");
  b.batchnorm(nn::ModelBuilder::kPrev, "bn1");
  const int32_t y = b.relu(nn::ModelBuilder::kPrev, "relu1");
  b.add(skip, y, "add");
  b.maxpool(2, 2, 0, nn::ModelBuilder::kPrev, "pool");
  b.global_avgpool(nn::ModelBuilder::kPrev, "gap");
  b.flatten(nn::ModelBuilder::kPrev, "flatten");
  b.linear(10, true, nn::ModelBuilder::kPrev, "fc");
  return std::move(b).build();
}

std::vector<float> host(compute::Backend& be, const Tensor& t) {
  const Tensor h = be.to_host(be.to_plain(t));
  return std::vector<float>(h.data<float>(), h.data<float>() + h.numel());
}

// The options of a short calibration: `batch` samples a step, `warmup` untimed steps, then `iters` timed ones.
train::CalibrationOptions short_run(int64_t batch, int warmup, int iters) {
  train::CalibrationOptions o;
  o.batch = batch;
  o.warmup = warmup;
  o.iters = iters;
  return o;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(calibrate_model_suite)

BOOST_AUTO_TEST_CASE(times_every_layer_in_order_and_adds_up_to_the_measured_step) {
  auto be = cpu_backend();
  nn::Model model(residual_net(), *be, 7);
  train::CalibrationOptions o = short_run(8, 1, 3);
  const train::Calibration c = train::calibrate_model(model, o);
  BOOST_TEST(c.model == "residual");
  BOOST_TEST(c.backend == "cpu");
  BOOST_TEST(c.batch == 8);
  BOOST_TEST(c.threads == 1);
  BOOST_TEST(c.optimizer == "momentum");  // SGD with momentum 0.9 by default, as `tandem train`
  BOOST_REQUIRE(c.layers.size() == model.num_layers());
  for (size_t i = 0; i < c.layers.size(); ++i) {
    BOOST_TEST(c.layers[i].name == model.spec().layers[i].name);
    BOOST_TEST(c.layers[i].forward_s > 0);
    BOOST_TEST(c.layers[i].backward_s >= 0);
  }
  // The scaled layers plus the optimizer step are exactly the whole step's mean (the scale's definition).
  const double sum = c.forward_s() + c.backward_s() + c.optimizer_step_s;
  BOOST_TEST(std::abs(sum - c.step_mean_s) <= 1e-9 * c.step_mean_s);
  BOOST_TEST(c.scale == c.step_mean_s / c.unscaled_sum_s);
  BOOST_TEST(c.step_min_s <= c.step_median_s);
  BOOST_TEST(c.step_median_s <= c.step_max_s);
  BOOST_TEST(c.step_min_s <= c.step_mean_s);
  BOOST_TEST(c.step_mean_s <= c.step_max_s);
  // the passes' spread (the profile's compute_cv): a sample CV of 3 positive values lies in [0, sqrt(2)]
  for (const double cv : {c.pass_cv, c.pass_cpu_cv}) {
    BOOST_TEST(std::isfinite(cv));
    BOOST_TEST(cv >= 0);
    BOOST_TEST(cv <= std::sqrt(2.0));
  }
  BOOST_TEST(c.pass_cpu_cv > 0);  // three passes never take exactly the same CPU time
  o.iters = 1;  // one pass has no spread
  const train::Calibration one = train::calibrate_model(model, o);
  BOOST_TEST(one.pass_cv == 0.0);
  BOOST_TEST(one.pass_cpu_cv == 0.0);
}

// Under a CFS quota of q cores (below the backend's threads) the steps are timed by their CPU time over q, which
// does not depend on where in the quota's period a short pass falls. Unthrottled here, a one-thread pass uses about
// its wall time in CPU, so q = 0.5 about doubles the step; a quota at or above the threads is not binding and is
// ignored (it is then timed by the clock as without one).
BOOST_AUTO_TEST_CASE(under_a_quota_steps_are_their_cpu_time_over_the_quota) {
  auto be = cpu_backend();
  nn::Model model(residual_net(), *be, 7);
  train::CalibrationOptions o = short_run(16, 1, 9);
  const double clock = train::calibrate_model(model, o).step_min_s;  // the least disturbed pass
  o.cpu_quota = 0.5;
  const train::Calibration q = train::calibrate_model(model, o);
  const double ratio = q.step_median_s / clock;
  BOOST_TEST_MESSAGE("step " << clock * 1e3 << " ms by the clock, " << q.step_median_s * 1e3 << " ms as CPU / 0.5");
  BOOST_TEST(ratio > 1.5);  // about 2: a one-thread pass uses its undisturbed wall time in CPU
  BOOST_TEST(ratio < 3.0);
  // the layers still add up to the step
  BOOST_TEST(std::abs(q.forward_s() + q.backward_s() + q.optimizer_step_s - q.step_mean_s) <= 1e-9 * q.step_mean_s);
  // the cores the passes sustained (CPU over wall): nothing throttles them here, so the quota's 0.5 unless this
  // machine's other work took the core, and never above it
  BOOST_TEST_MESSAGE("sustained " << q.sustained_cores << " cores under the 0.5 quota");
  BOOST_TEST(q.sustained_cores > 0.1);
  BOOST_TEST(q.sustained_cores <= 0.5);
  o.cpu_quota = 1.0;  // one thread, one core: not binding
  const train::Calibration free = train::calibrate_model(model, o);
  BOOST_TEST(free.step_min_s < 1.5 * clock);
  BOOST_TEST(free.sustained_cores == 0.0);  // no quota: nothing to sustain
}

BOOST_AUTO_TEST_CASE(leaves_parameters_gradients_and_statistics_as_they_were) {
  auto be = cpu_backend();
  nn::Model model(residual_net(), *be, 3);
  model.zero_grads();
  const std::vector<float> p0 = host(*be, model.params()), b0 = host(*be, model.buffers());
  train::CalibrationOptions o = short_run(4, 0, 2);
  o.optimizer.lr = 0.5f;  // the calibration uses its own tiny rate, but a restore must not depend on that
  train::calibrate_model(model, o);
  const std::vector<float> p1 = host(*be, model.params()), b1 = host(*be, model.buffers()),
                           g1 = host(*be, model.grads());
  BOOST_TEST(std::memcmp(p0.data(), p1.data(), p0.size() * sizeof(float)) == 0);
  BOOST_TEST(std::memcmp(b0.data(), b1.data(), b0.size() * sizeof(float)) == 0);
  bool zero = true;
  for (float g : g1) zero = zero && g == 0.0f;
  BOOST_TEST(zero);
}

BOOST_AUTO_TEST_CASE(more_samples_cost_more) {
  // 16x the samples is 16x the arithmetic; even on a busy machine the mean step grows well beyond 2x.
  auto be = cpu_backend();
  nn::Model model(nn::zoo_model("lenet5", nn::SampleShape{1, 28, 28}, 10), *be, 1);
  train::CalibrationOptions o = short_run(4, 1, 3);
  const train::Calibration small = train::calibrate_model(model, o);
  o.batch = 64;
  const train::Calibration large = train::calibrate_model(model, o);
  BOOST_TEST(large.step_mean_s > 2 * small.step_mean_s,
             "batch 64: " << large.step_mean_s << " s, batch 4: " << small.step_mean_s << " s");
  BOOST_TEST(large.forward_s() + large.backward_s() > 2 * (small.forward_s() + small.backward_s()));
}

// The peak hooks (tandem_calibrate's activation_peak_bytes) bracket whole training steps at the batch, after the
// runtime hook: the caching allocator hands out blocks between them, more for more steps.
BOOST_AUTO_TEST_CASE(peak_hooks_bracket_whole_steps_after_the_runtime_hook) {
  auto be = cpu_backend();
  nn::Model model(residual_net(), *be, 5);
  train::CalibrationOptions o = short_run(4, 0, 1);
  std::vector<std::string> order;
  uint64_t at_start = 0;
  std::vector<uint64_t> handed_out;
  o.after_batch_passes = [&] { order.push_back("runtime"); };
  o.before_peak_steps = [&](int64_t) {
    order.push_back("before");
    at_start = host_allocator().stats().allocations;
  };
  o.after_peak_steps = [&](int64_t) {
    order.push_back("after");
    handed_out.push_back(host_allocator().stats().allocations - at_start);
  };
  for (int steps : {1, 3}) {
    o.peak_steps = steps;
    train::calibrate_model(model, o);
  }
  BOOST_TEST(order == (std::vector<std::string>{"runtime", "before", "after", "runtime", "before", "after"}),
             tt::per_element());
  BOOST_REQUIRE(handed_out.size() == 2u);
  BOOST_TEST(handed_out[0] > 2u);  // the input batch (images, labels), and forward, loss and backward's outputs
  BOOST_TEST(handed_out[1] - 2 >= 3 * (handed_out[0] - 2));  // three steps: three times the steps' allocations
  // one hook alone runs no steps
  o.after_peak_steps = nullptr;
  order.clear();
  train::calibrate_model(model, o);
  BOOST_TEST(order == (std::vector<std::string>{"runtime"}), tt::per_element());
}

// peak_batches: the hooks bracket the steps at the batch, then at each other batch once (the batch itself and
// repeats skipped), and are told which batch ran between them. The steps' input batch is made between the hooks, so
// the peak they measure holds it, as a training step holds its batch (issue #16: it was made before, and the
// profile's peak fell short of a training process's by that batch).
BOOST_AUTO_TEST_CASE(peak_hooks_run_at_each_peak_batch_once) {
  auto be = cpu_backend();
  nn::Model model(residual_net(), *be, 5);
  train::CalibrationOptions o = short_run(4, 0, 1);
  o.peak_steps = 1;
  o.peak_batches = {2, 4, 2, 8};
  std::vector<int64_t> before, after;
  size_t in_use = 0;
  std::vector<double> made;  // tensor bytes the window holds at its end beyond its start
  o.before_peak_steps = [&](int64_t b) {
    before.push_back(b);
    in_use = host_allocator().stats().bytes_in_use;
  };
  o.after_peak_steps = [&](int64_t b) {
    after.push_back(b);
    made.push_back(static_cast<double>(host_allocator().stats().bytes_in_use) - static_cast<double>(in_use));
  };
  const train::Calibration c = train::calibrate_model(model, o);
  BOOST_TEST(before == (std::vector<int64_t>{4, 2, 8}), tt::per_element());
  BOOST_TEST(after == before, tt::per_element());
  BOOST_REQUIRE(made.size() == before.size());
  for (size_t i = 0; i < made.size(); ++i) {  // the images (f32) and labels (int32) of that batch, still held
    const auto n = static_cast<double>(before[i]);
    BOOST_TEST(made[i] >= n * (4.0 * static_cast<double>(model.spec().input.numel()) + 4.0), "batch " << before[i]);
  }
  BOOST_TEST(c.batch == 4);  // the times stay the batch's
  o.peak_batches = {0};
  expect_error([&] { train::calibrate_model(model, o); }, Status::kInvalidArgument, {"calibrate.peak_batches", "0"});
}

// shape_batches (issue #16): the shape hooks bracket the first step at each batch size the process has not run --
// the peak batches' (before their peak steps) and then the shape batches' (once each, the batch, the peak batches and
// repeats skipped) -- and are told which batch ran between them; the backend builds that shape's primitives inside.
BOOST_AUTO_TEST_CASE(shape_hooks_bracket_the_first_step_at_each_new_batch) {
  auto be = cpu_backend();
  nn::Model model(residual_net(), *be, 5);
  train::CalibrationOptions o = short_run(4, 0, 1);
  o.peak_steps = 1;
  o.peak_batches = {2};
  o.shape_batches = {1, 4, 2, 1, 8};
  std::vector<std::string> order;
  int64_t open = 0;
  uint64_t at_start = 0;  // allocations inside the shape window: one whole step's (input, outputs, gradients)
  o.before_peak_steps = [&](int64_t b) { order.push_back("peak " + std::to_string(b)); };
  o.after_peak_steps = [&](int64_t) {};
  o.before_new_shape = [&](int64_t b) {
    order.push_back("shape " + std::to_string(b));
    open = b;
    at_start = host_allocator().stats().allocations;
  };
  o.after_new_shape = [&](int64_t b) {
    BOOST_TEST(b == open);
    BOOST_TEST(host_allocator().stats().allocations - at_start > 2u, "batch " << b);
    open = 0;
  };
  train::calibrate_model(model, o);
  BOOST_TEST(order == (std::vector<std::string>{"peak 4", "shape 2", "peak 2", "shape 1", "shape 8"}), tt::per_element());
  // without the peak hooks the shape batches still run, and one shape hook alone runs none
  o.before_peak_steps = nullptr;
  order.clear();
  train::calibrate_model(model, o);
  BOOST_TEST(order == (std::vector<std::string>{"shape 1", "shape 2", "shape 8"}), tt::per_element());
  o.after_new_shape = nullptr;
  order.clear();
  train::calibrate_model(model, o);
  BOOST_TEST(order.empty());
  o.shape_batches = {0};
  expect_error([&] { train::calibrate_model(model, o); }, Status::kInvalidArgument, {"calibrate.shape_batches", "0"});
}

BOOST_AUTO_TEST_CASE(optimizer_names_follow_the_simulator) {
  optim::OptimizerConfig c;
  BOOST_TEST(train::simulator_optimizer_name(c) == "sgd");
  c.momentum = 0.9f;
  BOOST_TEST(train::simulator_optimizer_name(c) == "momentum");
  c.kind = optim::OptimizerKind::kAdamW;
  BOOST_TEST(train::simulator_optimizer_name(c) == "adam");
}

BOOST_AUTO_TEST_CASE(bad_options_name_the_field) {
  auto be = cpu_backend();
  nn::Model model(nn::zoo_model("lenet5", nn::SampleShape{1, 28, 28}, 10), *be, 1);
  train::CalibrationOptions o;
  o.batch = 0;
  expect_error([&] { train::calibrate_model(model, o); }, Status::kInvalidArgument, {"calibrate.batch", "0"});
  o.batch = 2;
  o.iters = 0;
  expect_error([&] { train::calibrate_model(model, o); }, Status::kInvalidArgument, {"calibrate.iters"});
  o.iters = 1;
  o.peak_steps = 0;
  expect_error([&] { train::calibrate_model(model, o); }, Status::kInvalidArgument, {"calibrate.peak_steps", "0"});
}

BOOST_AUTO_TEST_SUITE_END()
