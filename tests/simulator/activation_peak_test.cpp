// The profile's measured activation peak (issue #16: activation_peak_bytes, what whole training steps at the
// profile's batch add to the process's peak resident size): parsed and validated, written back, and used for a Tandem
// CPU rank's activation memory when the profile describes the job's model -- else the job compiler's derived peak
// (StageMemory::cpu_activation_peak_bytes), as for profiles written before the field existed. With activation_peak_curve (the peak at
// several batches) the peak at a rank's micro-batch is read off the curve: interpolated between its points, the end
// segments' lines beyond them.
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

// The peak it derives for them on the cpu backend (padded, with scratch): a Tandem CPU rank's figure without a
// measurement.
double derived_lenet5(int64_t batch) {
  tandem::engine::parallel::Job j;
  j.model = tandem::engine::nn::zoo_model("lenet5", {1, 28, 28}, 10);
  j.batch = batch;
  return tandem::engine::parallel::compile_job(j, 1).stages.front().memory.cpu_activation_peak_bytes();
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
  // without the field: the derived peak (lenet5's 6- and 16-channel outputs padded to 16 weigh: > 2x counted)
  const SimResult old = one_process(testing::write_lenet5_profile(path));
  BOOST_TEST(old.memory.activation_bytes == derived_lenet5(64), tt::tolerance(1e-12));
  BOOST_TEST(old.memory.activation_bytes > 2 * counted_lenet5(64));
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

BOOST_AUTO_TEST_CASE(falls_back_to_the_derived_peak_for_another_model_or_input) {
  const auto spec = tandem::engine::nn::zoo_model("lenet5", {1, 28, 28}, 10);
  nlohmann::json j = minimal_profile();
  j["activation_peak_bytes"] = 2 * derived_lenet5(64);
  BOOST_TEST(tandem_cpu_activation_peak(spec, profile_from_json(j)) == 2.0, tt::tolerance(1e-12));
  BOOST_TEST(tandem_cpu_activation_peak(spec, std::nullopt) == 1.0);
  j["model"] = "mlp";  // measured for another model
  BOOST_TEST(tandem_cpu_activation_peak(spec, profile_from_json(j)) == 1.0);
  j.erase("model");  // a profile that does not say
  BOOST_TEST(tandem_cpu_activation_peak(spec, profile_from_json(j)) == 1.0);
  j["model"] = "lenet5";
  j["input"] = {3, 32, 32};  // the same model on other inputs
  BOOST_TEST(tandem_cpu_activation_peak(spec, profile_from_json(j)) == 1.0);
  j["input"] = {1, 28, 28};
  BOOST_TEST(tandem_cpu_activation_peak(spec, profile_from_json(j)) == 2.0, tt::tolerance(1e-12));
  // through simulate(): a profile of another model with the same layers prices the compute but not the memory
  const std::string path = "/tmp/tandem_sim_activation_peak_other.json";
  const SimResult other = one_process(
      testing::write_lenet5_profile(path, {{"model", "lenet5-variant"}, {"activation_peak_bytes", 1.0 * kMiB}}));
  BOOST_TEST(other.memory.activation_bytes == derived_lenet5(64), tt::tolerance(1e-12));
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

BOOST_AUTO_TEST_CASE(the_curve_is_optional_and_round_trips) {
  nlohmann::json j = minimal_profile();
  BOOST_TEST(profile_from_json(j).activation_peak_curve.empty());
  BOOST_TEST(!profile_to_json(profile_from_json(j)).contains("activation_peak_curve"));
  j["activation_peak_bytes"] = 64e6;
  j["activation_peak_curve"] = {{32, 40e6}, {64, 64e6}};
  const CalibrationProfile p = profile_from_json(j);
  BOOST_REQUIRE(p.activation_peak_curve.size() == 2u);
  BOOST_TEST(p.activation_peak_curve[0].first == 32);
  BOOST_TEST(p.activation_peak_curve[1].second == 64e6);
  BOOST_TEST(profile_from_json(profile_to_json(p)).activation_peak_curve == p.activation_peak_curve);
  j.erase("activation_peak_bytes");  // the curve alone, a point at the batch or not, is a profile too
  j["activation_peak_curve"] = {{8, 10e6}, {16, 18e6}};
  BOOST_TEST(profile_from_json(j).activation_peak_curve.size() == 2u);
}

BOOST_AUTO_TEST_CASE(a_malformed_curve_is_refused_naming_the_field) {
  const nlohmann::json bads[] = {
      nlohmann::json("big"),                                      // not an array
      nlohmann::json::array(),                                    // no point
      nlohmann::json::array({nlohmann::json::array({32})}),       // a point without bytes
      {{0, 1e6}},                                                 // batch 0
      {{2.5, 1e6}},                                               // a fractional batch
      {{32, 0}},                                                  // nothing measured
      {{32, -1e6}},                                               // negative
      {{32, "1e6"}},                                              // a string
      {{32, 1e16}},                                               // past any memory
      {{64, 2e6}, {32, 1e6}},                                     // descending
      {{32, 1e6}, {32, 2e6}},                                     // a batch twice
      {{32, 1e6}, {64, 5e6}},                                     // disagrees with activation_peak_bytes at 64
  };
  for (const nlohmann::json& bad : bads) {
    nlohmann::json j = minimal_profile();
    j["activation_peak_bytes"] = 4e6;
    j["activation_peak_curve"] = bad;
    BOOST_TEST_MESSAGE("curve " << bad.dump());
    testing::expect_error([&] { profile_from_json(j, "p.json"); }, "p.json.activation_peak_curve");
  }
}

BOOST_AUTO_TEST_CASE(the_peak_at_a_batch_is_read_off_the_curve) {
  CalibrationProfile p;
  p.batch = 32;
  BOOST_TEST(!activation_peak_at(p, 8).has_value());  // nothing measured
  // one measurement: in proportion to the samples (the behaviour of profiles without a curve)
  p.activation_peak_bytes = 32e6;
  BOOST_TEST(activation_peak_at(p, 8).value_or(0) == 8e6, tt::tolerance(1e-12));
  BOOST_TEST(activation_peak_at(p, 0).value_or(0) == 32e6, tt::tolerance(1e-12));  // < 1: the profile's batch
  p.activation_peak_curve = {{64, 48e6}};  // a one-point curve: the same rule, from its point
  BOOST_TEST(activation_peak_at(p, 128).value_or(0) == 96e6, tt::tolerance(1e-12));
  // an affine peak, 10 MB fixed + 1 MB a sample, measured at 16 and 32, and a bend to 0.5 MB a sample past 64
  p.activation_peak_curve = {{16, 26e6}, {32, 42e6}, {64, 74e6}, {128, 106e6}};
  BOOST_TEST(activation_peak_at(p, 16).value_or(0) == 26e6, tt::tolerance(1e-12));   // on a point
  BOOST_TEST(activation_peak_at(p, 24).value_or(0) == 34e6, tt::tolerance(1e-12));   // between
  BOOST_TEST(activation_peak_at(p, 96).value_or(0) == 90e6, tt::tolerance(1e-12));   // on the bend's segment
  BOOST_TEST(activation_peak_at(p, 8).value_or(0) == 18e6, tt::tolerance(1e-12));    // below: the first segment
  BOOST_TEST(activation_peak_at(p, 256).value_or(0) == 170e6, tt::tolerance(1e-12)); // above: the last segment
  // a line falling below zero under its first point is floored, never a negative need
  p.activation_peak_curve = {{16, 2e6}, {32, 18e6}};
  BOOST_TEST(activation_peak_at(p, 1).value_or(-1) == 0.0);
}

BOOST_AUTO_TEST_CASE(a_rank_is_charged_the_curves_peak_at_its_micro_batch) {
  const std::string path = "/tmp/tandem_sim_activation_peak_curve.json";
  // the peak has a fixed part: 1 MiB, plus 40 KiB a sample (points at 32 and the profile's 64)
  const auto peak = [](int64_t b) { return 1.0 * kMiB + 40.0 * 1024 * static_cast<double>(b); };
  testing::write_lenet5_profile(path, {{"activation_peak_bytes", peak(64)},
                                       {"activation_peak_curve", {{32, peak(32)}, {64, peak(64)}}}});
  for (int64_t b : {8, 32, 64, 128}) {
    BOOST_TEST_MESSAGE("batch " << b);
    BOOST_TEST(one_process(path, b).memory.activation_bytes == peak(b), tt::tolerance(1e-9));
  }
  // the factor over the derived peak falls with the micro-batch as the measured fixed part weighs less
  const auto spec = tandem::engine::nn::zoo_model("lenet5", {1, 28, 28}, 10);
  const auto profile = load_profile(path);
  BOOST_TEST(tandem_cpu_activation_peak(spec, profile, 8) > tandem_cpu_activation_peak(spec, profile, 128));
  BOOST_TEST(tandem_cpu_activation_peak(spec, profile, 0) == peak(64) / derived_lenet5(64), tt::tolerance(1e-12));
  // the single figure alone (an old profile) scales it in proportion: too little at 8, too much at 128
  testing::write_lenet5_profile(path, {{"activation_peak_bytes", peak(64)}});
  BOOST_TEST(one_process(path, 8).memory.activation_bytes == peak(64) / 8, tt::tolerance(1e-9));
  BOOST_TEST(one_process(path, 128).memory.activation_bytes == 2 * peak(64), tt::tolerance(1e-9));
  std::remove(path.c_str());
}

BOOST_AUTO_TEST_SUITE_END()
