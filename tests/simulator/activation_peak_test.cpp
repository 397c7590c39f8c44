// The profile's measured activation peak (issue #16: activation_peak_bytes, what whole training steps at the
// profile's batch add to the process's peak resident size): parsed and validated, written back, and used for a Tandem
// CPU rank's activation memory when the profile describes the job's model -- else the fixed
// kTandemCpuActivationPeak, as for profiles written before the field existed.
#include <cstdio>

#include <boost/test/unit_test.hpp>

#include "engine/nn/zoo.hpp"
#include "simulator/compute/profile.hpp"
#include "simulator/simulate.hpp"
#include "tests/simulator/expect_error.hpp"
#include "tests/simulator/profile_fixture.hpp"

using namespace tandem::simulator;
namespace tt = boost::test_tools;

namespace {

constexpr double kMiB = 1048576.0;

nlohmann::json minimal_profile() {
  return {{"format", "tandem-calibration"}, {"version", 1}, {"model", "lenet5"}, {"batch", 64},
          {"optimizer_step_s", 0.001}, {"layers", {{{"name", "conv1"}, {"forward_s", 0.001}, {"backward_s", 0.002}}}}};
}

// One process of lenet5 on fashion-mnist at batch 64 (the fixture profile's batch), on one c5.large.
SimResult one_process(const std::string& profile, int64_t batch = 64) {
  JobSpec j;
  j.model = "lenet5";
  j.dataset = "fashion-mnist";
  j.batch = batch;
  j.epochs = 0.01;
  j.profile = profile;
  return simulate(parse_cluster("c5.large:1"), j, {.baseline = false});
}

// What the job compiler counts for lenet5 at `batch` in one process: the stored outputs and the input, per sample.
double counted_lenet5(int64_t batch) {
  const auto spec = tandem::engine::nn::zoo_model("lenet5", {1, 28, 28}, 10);
  return static_cast<double>(batch) *
         (static_cast<double>(spec.stored_activation_bytes(0, spec.layers.size())) + 4.0 * 28 * 28);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(activation_peak)

BOOST_AUTO_TEST_CASE(is_optional_and_round_trips) {
  nlohmann::json j = minimal_profile();
  BOOST_TEST(!profile_from_json(j).activation_peak_bytes.has_value());  // an old profile loads, without it
  BOOST_TEST(!profile_to_json(profile_from_json(j)).contains("activation_peak_bytes"));
  j["activation_peak_bytes"] = 61440000;
  const CalibrationProfile p = profile_from_json(j);
  BOOST_TEST(p.activation_peak_bytes.value_or(0) == 61440000.0);
  BOOST_TEST(profile_from_json(profile_to_json(p)).activation_peak_bytes.value_or(0) == 61440000.0);
}

BOOST_AUTO_TEST_CASE(a_malformed_negative_or_zero_value_is_refused_naming_the_field) {
  for (const nlohmann::json& bad : {nlohmann::json("60 MB"), nlohmann::json(-1.0), nlohmann::json(0),
                                    nlohmann::json::array({1, 2}), nlohmann::json(nullptr)}) {
    nlohmann::json j = minimal_profile();
    j["activation_peak_bytes"] = bad;
    BOOST_TEST_MESSAGE("value " << bad.dump());
    testing::expect_error([&] { profile_from_json(j, "p.json"); }, "p.json.activation_peak_bytes");
  }
}

BOOST_AUTO_TEST_CASE(replaces_the_fixed_factor_when_the_profile_is_of_the_jobs_model) {
  const std::string path = "/tmp/tandem_sim_activation_peak.json";
  // without the field: the fixed factor over the counted activations
  const SimResult old = one_process(testing::write_lenet5_profile(path));
  BOOST_TEST(old.memory.activation_bytes == kTandemCpuActivationPeak * counted_lenet5(64), tt::tolerance(1e-12));
  // with it, at the profile's batch in one process the rank's activations are the measured peak itself, and the
  // need moves by the difference, byte for byte
  const double measured = 3.5 * kMiB;
  const SimResult with = one_process(testing::write_lenet5_profile(path, {{"activation_peak_bytes", measured}}));
  BOOST_TEST(with.memory.activation_bytes == measured, tt::tolerance(1e-12));
  BOOST_TEST(old.memory_per_node_bytes - with.memory_per_node_bytes == old.memory.activation_bytes - measured,
             tt::tolerance(1e-9));
  // twice the samples: twice the factor's activations (the counted figure scales with the samples)
  BOOST_TEST(one_process(path, 128).memory.activation_bytes == 2 * measured, tt::tolerance(1e-12));
  std::remove(path.c_str());
}

BOOST_AUTO_TEST_CASE(falls_back_to_the_fixed_factor_for_another_model_or_input) {
  const auto spec = tandem::engine::nn::zoo_model("lenet5", {1, 28, 28}, 10);
  nlohmann::json j = minimal_profile();
  j["activation_peak_bytes"] = 2 * counted_lenet5(64);
  BOOST_TEST(tandem_cpu_activation_peak(spec, profile_from_json(j)) == 2.0, tt::tolerance(1e-12));
  BOOST_TEST(tandem_cpu_activation_peak(spec, std::nullopt) == kTandemCpuActivationPeak);
  j["model"] = "mlp";  // measured for another model
  BOOST_TEST(tandem_cpu_activation_peak(spec, profile_from_json(j)) == kTandemCpuActivationPeak);
  j.erase("model");  // a profile that does not say
  BOOST_TEST(tandem_cpu_activation_peak(spec, profile_from_json(j)) == kTandemCpuActivationPeak);
  j["model"] = "lenet5";
  j["input"] = {3, 32, 32};  // the same model on other inputs
  BOOST_TEST(tandem_cpu_activation_peak(spec, profile_from_json(j)) == kTandemCpuActivationPeak);
  j["input"] = {1, 28, 28};
  BOOST_TEST(tandem_cpu_activation_peak(spec, profile_from_json(j)) == 2.0, tt::tolerance(1e-12));
  // through simulate(): a profile of another model with the same layers prices the compute but not the memory
  const std::string path = "/tmp/tandem_sim_activation_peak_other.json";
  const SimResult other = one_process(
      testing::write_lenet5_profile(path, {{"model", "lenet5-variant"}, {"activation_peak_bytes", 1.0 * kMiB}}));
  BOOST_TEST(other.memory.activation_bytes == kTandemCpuActivationPeak * counted_lenet5(64), tt::tolerance(1e-12));
  std::remove(path.c_str());
}

BOOST_AUTO_TEST_CASE(gpu_ranks_and_pytorch_keep_their_counted_activations) {
  const std::string path = "/tmp/tandem_sim_activation_peak_gpu.json";
  testing::write_lenet5_profile(path, {{"activation_peak_bytes", 3.5 * kMiB}});
  JobSpec j;
  j.model = "lenet5";
  j.dataset = "fashion-mnist";
  j.batch = 64;
  j.epochs = 0.01;
  j.profile = path;
  BOOST_TEST(simulate(parse_cluster("g4dn.xlarge:1"), j, {.baseline = false}).memory.activation_bytes ==
                 counted_lenet5(64), tt::tolerance(1e-12));
  j.framework = Framework::kPytorchDdp;
  BOOST_TEST(simulate(parse_cluster("c5.large:1"), j, {.baseline = false}).memory.activation_bytes ==
                 counted_lenet5(64), tt::tolerance(1e-12));
  std::remove(path.c_str());
}

BOOST_AUTO_TEST_SUITE_END()
