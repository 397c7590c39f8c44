// The per-sample cost curve of a calibration profile (`tandem calibrate --curve`): a micro-batch of m samples
// costs what m cost on the measured machine, interpolated between the curve's points, not m/batch of the
// profile's pass -- so a pipeline of tiny micro-batches is predicted as slow as it runs.
#include <cstdio>
#include <fstream>
#include <string>

#include <boost/test/unit_test.hpp>
#include <nlohmann/json.hpp>

#include "engine/core/error.hpp"
#include "engine/nn/zoo.hpp"
#include "simulator/cluster.hpp"
#include "simulator/compute/compute_model.hpp"
#include "simulator/compute/profile.hpp"
#include "simulator/compute/workload.hpp"
#include "simulator/simulate.hpp"
#include "tests/simulator/profile_fixture.hpp"

using namespace tandem::simulator;
namespace tt = boost::test_tools;

namespace {

// Batch 64 at 1 ms per sample; 10x per sample at 1, 6x at 2.
const nlohmann::json kCurve = nlohmann::json::array({{1, 0.010}, {2, 0.012}, {64, 0.064}});

std::string expect_invalid(const nlohmann::json& curve) {
  nlohmann::json p = {{"format", "tandem-calibration"}, {"version", 1}, {"batch", 64}, {"optimizer_step_s", 0.001},
                      {"layers", {{{"name", "fc"}, {"forward_s", 0.001}, {"backward_s", 0.002}}}},
                      {"batch_curve", curve}};
  try {
    profile_from_json(p);
  } catch (const tandem::Error& e) {
    BOOST_TEST((e.status() == tandem::Status::kInvalidArgument));
    return e.what();
  }
  return "";
}

}  // namespace

BOOST_AUTO_TEST_SUITE(batch_curve)

BOOST_AUTO_TEST_CASE(micro_batches_cost_what_the_curve_says) {
  const std::string path =
      testing::write_lenet5_profile("/tmp/tandem_sim_curve.json", {{"batch_curve", kCurve}});
  const CalibrationProfile p = load_profile(path);
  BOOST_TEST(p.batch_curve.size() == 3u);
  BOOST_TEST(profile_to_json(p)["batch_curve"] == kCurve);  // written back as read
  const Workload w = make_workload(tandem::engine::nn::zoo_model("lenet5", {1, 28, 28}, 10));
  const ComputeModel m = ComputeModel::from_profile(w, p);
  BOOST_TEST(m.batch_factor(64) == 1.0, tt::tolerance(1e-12));
  BOOST_TEST(m.batch_factor(1) == 10.0, tt::tolerance(1e-12));
  BOOST_TEST(m.batch_factor(2) == 6.0, tt::tolerance(1e-12));
  // Between points the pass time is interpolated: 33 samples take 0.012 + 0.052 * 31/62 = 0.038 s.
  BOOST_TEST(m.batch_factor(33) == 0.038 / 33 / 0.001, tt::tolerance(1e-12));
  BOOST_TEST(m.batch_factor(256) == 1.0, tt::tolerance(1e-12));  // beyond the last point: its per-sample cost
  const size_t L = w.layers.size();
  // Every layer is 1 ms forward at batch 64 in the fixture: 2 samples cost 2/64 ms x 6 per layer.
  BOOST_TEST(m.forward_s(0, L, 2) == static_cast<double>(L) * 0.001 * 2.0 / 64.0 * 6.0, tt::tolerance(1e-12));
  const ComputeModel linear = ComputeModel::from_profile(w, load_profile(testing::write_lenet5_profile(path)));
  BOOST_TEST(linear.batch_factor(2) == 1.0);
  std::remove(path.c_str());
}

BOOST_AUTO_TEST_CASE(a_pipeline_of_tiny_micro_batches_is_predicted_slower_with_the_curve) {
  const std::string with = testing::write_lenet5_profile("/tmp/tandem_sim_curve_with.json", {{"batch_curve", kCurve}});
  const std::string without = testing::write_lenet5_profile("/tmp/tandem_sim_curve_without.json");
  JobSpec j;
  j.model = "lenet5";
  j.dataset = "fashion-mnist";
  j.batch = 64;
  j.epochs = 0.01;
  j.strategy = Strategy::kPipeline;
  j.pp = 2;
  auto step = [&](const std::string& profile, int32_t micro) {
    j.profile = profile;
    j.micro_batches = micro;
    return simulate(parse_cluster("c5.large:2"), j, {.baseline = false});
  };
  // One micro-batch of 64: the curve's own batch, nothing changes.
  BOOST_TEST(step(with, 1).compute_s == step(without, 1).compute_s, tt::tolerance(1e-9));
  // 32 micro-batches of 2: each pass costs 6x its linear share; the optimizer step (once per step) does not
  // change, so the compute is a little under 6x.
  const SimResult curved = step(with, 32), linear = step(without, 32);
  BOOST_TEST(curved.compute_s > 5.5 * linear.compute_s);
  BOOST_TEST(curved.compute_s < 6.0 * linear.compute_s);
  BOOST_TEST(curved.step_time_s > 3.0 * linear.step_time_s);
  std::remove(with.c_str());
  std::remove(without.c_str());
}

BOOST_AUTO_TEST_CASE(malformed_curves_name_the_point) {
  BOOST_TEST(expect_invalid(nlohmann::json::array({{2, 0.1}, {1, 0.1}, {64, 1.0}})).find("must ascend") !=
             std::string::npos);
  BOOST_TEST(expect_invalid(nlohmann::json::array({{1, 0.1}, {32, 1.0}})).find("at the profile's batch 64") !=
             std::string::npos);
  BOOST_TEST(expect_invalid(nlohmann::json::array({{0, 0.1}, {64, 1.0}})).find("batch_curve[0]") != std::string::npos);
  BOOST_TEST(expect_invalid(nlohmann::json::array({{1, -0.1}, {64, 1.0}})).find("seconds > 0") != std::string::npos);
  BOOST_TEST(expect_invalid(nlohmann::json::object()).find("[[batch, seconds], ...]") != std::string::npos);
}

BOOST_AUTO_TEST_SUITE_END()
