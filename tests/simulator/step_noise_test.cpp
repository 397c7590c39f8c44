// Step-to-step compute variability (simulator/compute/step_noise.hpp): the seeded factors' statistics, the profile
// field, and the executors' closed forms -- a barrier waits for the slowest of its ranks' sampled steps.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "engine/nn/zoo.hpp"
#include "simulator/compute/profile.hpp"
#include "simulator/compute/step_noise.hpp"
#include "simulator/compute/workload.hpp"
#include "simulator/simulate.hpp"
#include "simulator/strategy.hpp"
#include "tests/simulator/expect_error.hpp"
#include "tests/simulator/profile_fixture.hpp"

using namespace tandem::simulator;
using namespace tandem::engine;
namespace tt = boost::test_tools;

BOOST_AUTO_TEST_SUITE(step_noise)

BOOST_AUTO_TEST_CASE(zero_cv_is_exactly_one) {
  for (int64_t r : {0, 1, 7})
    for (int64_t i : {-1, 0, 5, 1000}) BOOST_TEST(compute_factor(0.0, 42, r, i, 1 + r) == 1.0);
}

BOOST_AUTO_TEST_CASE(factors_are_seeded_and_independent_of_call_order) {
  const double a = compute_factor(0.5, 1, 2, 3);
  BOOST_TEST(compute_factor(0.5, 1, 2, 3) == a);  // a pure function: the same on every call
  BOOST_TEST(compute_factor(0.5, 2, 2, 3) != a);  // another seed
  BOOST_TEST(compute_factor(0.5, 1, 3, 3) != a);  // another rank
  BOOST_TEST(compute_factor(0.5, 1, 2, 4) != a);  // another step
  BOOST_TEST(compute_factor(0.5, 1, 3, 2) != compute_factor(0.5, 1, 2, 3));  // rank and step are not symmetric
}

// Over N draws the factors' mean is 1 and their CV the given one (cv / sqrt(steps) for a sum of steps): the mean
// within 5 standard errors, the sample CV within 6% (a Gamma's sample sd over 40,000 draws is good to ~1-2%).
BOOST_AUTO_TEST_CASE(factors_reproduce_mean_and_cv) {
  constexpr int N = 40000;
  for (const double cv : {0.1, 0.6, 1.5}) {
    for (const double steps : {1.0, 8.0}) {
      double s = 0, ss = 0, lo = std::numeric_limits<double>::max();
      for (int i = 0; i < N; ++i) {
        const double f = compute_factor(cv, 11, i % 4, i / 4, steps);
        s += f, ss += f * f, lo = std::min(lo, f);
      }
      const double mean = s / N, sd = std::sqrt((ss - N * mean * mean) / (N - 1)), want = cv / std::sqrt(steps);
      BOOST_TEST_CONTEXT("cv " << cv << ", steps " << steps) {
        BOOST_TEST(std::abs(mean - 1) < 5 * want / std::sqrt(N));
        BOOST_TEST(sd / mean == want, tt::tolerance(0.06));
        BOOST_TEST(lo > 0);  // a step never takes negative time
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(bad_input_is_named) {
  using tandem::simulator::testing::expect_error;
  expect_error([] { compute_factor(-0.1, 0, 0, 0); }, "coefficient of variation must be in [0, 10]");
  expect_error([] { compute_factor(std::nan(""), 0, 0, 0); }, "coefficient of variation");
  expect_error([] { compute_factor(11, 0, 0, 0); }, "coefficient of variation");
  expect_error([] { compute_factor(0.2, 0, 0, 0, 0.5); }, "steps summed must be >= 1");
  nlohmann::json p = {{"format", "tandem-calibration"}, {"version", 1}, {"batch", 64}, {"optimizer_step_s", 0.001},
                      {"layers", {{{"name", "x"}, {"forward_s", 0.001}, {"backward_s", 0.002}}}}};
  BOOST_TEST(!profile_from_json(p).compute_cv.has_value());  // absent: none
  p["compute_cv"] = 0.25;
  const CalibrationProfile q = profile_from_json(p);
  BOOST_TEST(*q.compute_cv == 0.25);
  BOOST_TEST(profile_to_json(q)["compute_cv"].get<double>() == 0.25);
  BOOST_TEST(*full_speed_profile(q).compute_cv == 0.25);  // a ratio: a quota's scaling leaves it alone
  p["compute_cv"] = -0.5;
  expect_error([&] { profile_from_json(p, "prof"); }, "prof.compute_cv");
  p["compute_cv"] = 12.0;
  expect_error([&] { profile_from_json(p, "prof"); }, "prof.compute_cv: expected the passes' coefficient of variation");
  p["compute_cv"] = "big";
  expect_error([&] { profile_from_json(p, "prof"); }, "compute_cv");
}

namespace {

// lenet5 (the fixture's profile plus `extra`: every layer 0.5 ms forward, 1 ms backward at batch 32, optimizer 1 ms)
// on `n` nodes of a fast star (the all-reduce is tiny against compute).
SimResult fast_star(int32_t n, Strategy strategy, const nlohmann::json& extra, const std::string& tag,
                    int32_t average_every = 1) {
  const std::string path = testing::write_lenet5_profile("/tmp/tandem_step_noise_" + tag + ".json", extra);
  JobSpec j;
  j.model = "lenet5";
  j.dataset = "fashion-mnist";
  j.batch = 32;
  j.epochs = 0.01;
  j.strategy = strategy;
  j.dp = n;
  j.seed = 3;
  j.bucket_mb = 1000;
  j.average_every = average_every;
  j.profile = path;
  const nlohmann::json node = {{"preset", "c5.large"}, {"count", n}, {"nic_gbps", 1000}, {"nic_latency_us", 0},
                               {"mem_gbps", 1e6}, {"kernel_overhead_us", 0}, {"protocol", "rdma"}};
  SimResult r = simulate(cluster_from_json({{"nodes", {node}}}), j, {.baseline = false});
  std::remove(path.c_str());
  return r;
}

}  // namespace

// A synchronous step (DDP: the all-reduce after the last backward) waits for the slowest rank: over the executor's
// draws d, the step grows by c_fb (mean_d max_r f(r, d) - 1) where c_fb is a rank's forward + backward. A period of
// H local steps (local SGD) samples its sum, of CV cv / sqrt(H). Without the field, or with 0, nothing moves.
BOOST_AUTO_TEST_CASE(synchronous_step_waits_for_the_slowest_rank) {
  const double layers = static_cast<double>(make_workload(nn::zoo_model("lenet5", {1, 28, 28}, 10)).layers.size());
  const double c_fb = layers * 1.5e-3;
  const SimResult none = fast_star(4, Strategy::kDdp, nlohmann::json::object(), "none");
  const SimResult zero = fast_star(4, Strategy::kDdp, {{"compute_cv", 0.0}}, "zero");
  BOOST_TEST(zero.step_time_s == none.step_time_s);  // bit-identical
  const SimResult noisy = fast_star(4, Strategy::kDdp, {{"compute_cv", 0.3}}, "noisy");
  constexpr int kDraws = 32;  // simulate.cpp's compute_draws for 4 ranks
  for (const int32_t H : {1, 8}) {
    double mean_max = 0;
    for (int d = 0; d < kDraws; ++d) {
      double m = 0;
      for (int r = 0; r < 4; ++r) m = std::max(m, compute_factor(0.3, 3, r, d, H));
      mean_max += m / kDraws;
    }
    if (H == 1) {
      BOOST_TEST(noisy.step_time_s - none.step_time_s == c_fb * (mean_max - 1), tt::tolerance(0.02));
    } else {
      const SimResult l0 = fast_star(4, Strategy::kLocalSgd, nlohmann::json::object(), "l0", H);
      const SimResult l1 = fast_star(4, Strategy::kLocalSgd, {{"compute_cv", 0.3}}, "l1", H);
      // a period: H steps of c_fb each (and their optimizer steps) summed, one factor for the sum; per step
      BOOST_TEST(l1.step_time_s - l0.step_time_s == (mean_max - 1) * (c_fb + (H - 1.0) / H * 1e-3), tt::tolerance(0.05));
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
