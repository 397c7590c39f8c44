// The per-rank runtime allowance in the memory check: a node's own figure (cluster JSON runtime_mib),
// else the calibration profile's measured runtime_rss_bytes (CPU nodes), else the defaults.
#include <cstdio>
#include <fstream>

#include <boost/test/unit_test.hpp>

#include "engine/core/error.hpp"
#include "engine/data/dataset.hpp"
#include "engine/nn/zoo.hpp"
#include "simulator/compute/workload.hpp"
#include "simulator/presets.hpp"
#include "simulator/simulate.hpp"
#include "tests/simulator/profile_fixture.hpp"

using namespace tandem::simulator;
namespace tt = boost::test_tools;

namespace {

constexpr double kMiB = 1048576.0;

JobSpec lenet_job() {
  JobSpec j;
  j.model = "lenet5";
  j.dataset = "fashion-mnist";
  j.batch = 64;
  j.epochs = 0.01;
  return j;
}

// A lenet5 profile, with runtime_rss_bytes when given.
std::string write_profile(const std::string& path, std::optional<double> runtime_rss_bytes) {
  nlohmann::json extra = nlohmann::json::object();
  if (runtime_rss_bytes) extra["runtime_rss_bytes"] = *runtime_rss_bytes;
  return testing::write_lenet5_profile(path, extra);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(runtime_allowance)

BOOST_AUTO_TEST_CASE(comes_from_the_node_then_the_profile_then_the_default) {
  JobSpec j = lenet_job();
  const SimResult def = simulate(parse_cluster("c5.large:1"), j, {.baseline = false});
  BOOST_TEST(def.nodes[0].runtime_bytes == kDefaultCpuRuntimeBytes);
  // the profile's measured figure replaces the default, byte for byte in the need (one rank per node)
  j.profile = write_profile("/tmp/tandem_sim_runtime_profile.json", 40 * kMiB);
  const SimResult prof = simulate(parse_cluster("c5.large:1"), j, {.baseline = false});
  BOOST_TEST(prof.nodes[0].runtime_bytes == 40 * kMiB);
  // the rank's reordered convolution weights (StageMemory::conv_copy_bytes) are in the measured figure of its model,
  // and added to the default and to a node's figure
  tandem::engine::parallel::Job one;
  one.model = tandem::engine::nn::zoo_model("lenet5", {1, 28, 28}, 10);
  one.batch = j.batch;
  one.train_samples = 60000;  // fashion-mnist's 60,000 end each epoch with a batch of 32: its shape's primitives too
  const tandem::engine::parallel::StageMemory m = tandem::engine::parallel::compile_job(one, 1).stages[0].memory;
  const double copies = m.conv_copy_bytes;
  BOOST_TEST(copies > 0);
  BOOST_TEST(m.short_batch_bytes > 0);
  BOOST_TEST(prof.memory.runtime_bytes == 40 * kMiB + m.short_batch_bytes, tt::tolerance(1e-12));
  BOOST_TEST(def.memory.runtime_bytes == kDefaultCpuRuntimeBytes + copies + m.short_batch_bytes, tt::tolerance(1e-12));
  BOOST_TEST(def.memory_per_node_bytes - prof.memory_per_node_bytes == kDefaultCpuRuntimeBytes + copies - 40 * kMiB,
             tt::tolerance(1e-9));
  // a node's own figure wins over the profile
  const SimResult node = simulate(parse_cluster(R"({"nodes": [{"preset": "c5.large", "runtime_mib": 70}]})"), j,
                                  {.baseline = false});
  BOOST_TEST(node.nodes[0].runtime_bytes == 70 * kMiB);
  BOOST_TEST(node.memory_per_node_bytes - prof.memory_per_node_bytes == 30 * kMiB + copies, tt::tolerance(1e-9));
  // an old profile without the field keeps the default
  j.profile = write_profile("/tmp/tandem_sim_runtime_profile.json", std::nullopt);
  BOOST_TEST(simulate(parse_cluster("c5.large:1"), j, {.baseline = false}).nodes[0].runtime_bytes ==
             kDefaultCpuRuntimeBytes);
  std::remove("/tmp/tandem_sim_runtime_profile.json");
}

// A host sized between the two needs fits with the measured allowance and not with the default.
BOOST_AUTO_TEST_CASE(decides_whether_a_job_fits) {
  JobSpec j = lenet_job();
  const SimResult def = simulate(parse_cluster("c5.large:1"), j, {.baseline = false});
  // capacity = memory - the OS reserve
  const double reserve = find_preset("c5.large").memory_bytes - def.nodes[0].memory_capacity_bytes;
  const double usable = def.memory_per_node_bytes - 50 * kMiB;  // 50 MiB short with the default
  const std::string cluster = R"({"nodes": [{"preset": "c5.large", "memory_bytes": )" +
                              std::to_string(static_cast<int64_t>(usable + reserve)) + "}]}";
  BOOST_TEST(!simulate(parse_cluster(cluster), j, {.baseline = false}).fits);
  j.profile = write_profile("/tmp/tandem_sim_runtime_fit.json", 40 * kMiB);  // 110 MiB less: fits
  BOOST_TEST(simulate(parse_cluster(cluster), j, {.baseline = false}).fits);
  std::remove("/tmp/tandem_sim_runtime_fit.json");
}

BOOST_AUTO_TEST_CASE(gpu_nodes_keep_their_own_default_or_figure) {
  JobSpec j = lenet_job();
  j.profile = write_profile("/tmp/tandem_sim_runtime_gpu.json", 40 * kMiB);  // a host process's RSS
  BOOST_TEST(simulate(parse_cluster("g4dn.xlarge:1"), j, {.baseline = false}).nodes[0].runtime_bytes ==
             kDefaultGpuRuntimeBytes);
  BOOST_TEST(simulate(parse_cluster(R"({"nodes": [{"preset": "g4dn.xlarge", "runtime_gib": 1}]})"), j,
                      {.baseline = false})
                 .nodes[0]
                 .runtime_bytes == 1073741824.0);
  std::remove("/tmp/tandem_sim_runtime_gpu.json");
}

// A profile calibrated on a GPU (tandem calibrate --device cuda) measures a rank's device memory besides its tensors:
// a Tandem rank on a GPU node is charged that figure instead of the default; a PyTorch job keeps the default, and a
// node's own figure still wins. A nonsensical figure is refused naming the field.
BOOST_AUTO_TEST_CASE(gpu_nodes_take_a_profiles_measured_device_runtime) {
  JobSpec j = lenet_job();
  j.profile = testing::write_lenet5_profile("/tmp/tandem_sim_runtime_dev.json",
                                            {{"runtime_device_bytes", 520 * kMiB}, {"runtime_rss_bytes", 40 * kMiB}});
  const SimResult measured = simulate(parse_cluster("g4dn.xlarge:1"), j, {.baseline = false});
  BOOST_TEST(measured.nodes[0].runtime_bytes == 520 * kMiB);
  j.profile.clear();
  const SimResult def = simulate(parse_cluster("g4dn.xlarge:1"), j, {.baseline = false});
  BOOST_TEST(def.memory_per_node_bytes - measured.memory_per_node_bytes == kDefaultGpuRuntimeBytes - 520 * kMiB,
             tt::tolerance(1e-9));
  j.profile = "/tmp/tandem_sim_runtime_dev.json";
  BOOST_TEST(simulate(parse_cluster(R"({"nodes": [{"preset": "g4dn.xlarge", "runtime_mib": 700}]})"), j,
                      {.baseline = false})
                 .nodes[0]
                 .runtime_bytes == 700 * kMiB);
  j.framework = Framework::kPytorchDdp;
  BOOST_TEST(simulate(parse_cluster("g4dn.xlarge:1"), j, {.baseline = false}).nodes[0].runtime_bytes ==
             kDefaultGpuRuntimeBytes);
  j.framework = Framework::kTandem;
  j.profile = testing::write_lenet5_profile("/tmp/tandem_sim_runtime_dev.json", {{"runtime_device_bytes", -1}});
  try {
    simulate(parse_cluster("g4dn.xlarge:1"), j, {.baseline = false});
    BOOST_ERROR("a negative runtime_device_bytes was accepted");
  } catch (const tandem::Error& e) {
    BOOST_TEST(std::string(e.what()).find("runtime_device_bytes") != std::string::npos, e.what());
  }
  std::remove("/tmp/tandem_sim_runtime_dev.json");
}

BOOST_AUTO_TEST_CASE(bad_values_name_the_field) {
  try {
    parse_cluster(R"({"nodes": [{"preset": "c5.large", "runtime_mib": -1}]})");
    BOOST_ERROR("a negative runtime_mib was accepted");
  } catch (const tandem::Error& e) {
    BOOST_TEST(std::string(e.what()).find("cluster.nodes[0].runtime_mib") != std::string::npos, e.what());
  }
}

BOOST_AUTO_TEST_SUITE_END()

// The data sets a rank holds (issue: a profile's runtime_rss_bytes is measured before any data set is loaded, so the
// need must add them): the loader's own description (engine::data::resident_bytes) of the whole training set and the
// test set, every rank, on CPU nodes.
BOOST_AUTO_TEST_SUITE(data_set_bytes)

BOOST_AUTO_TEST_CASE(are_the_loaders_train_and_test_sets_per_rank) {
  // the description matches what a loaded set stores: one byte per value, an int32 label per sample
  const tandem::engine::data::Dataset d = tandem::engine::data::make_synthetic(3, 5, 7, 4, 11, 1);
  BOOST_TEST(d.resident_bytes() == static_cast<double>(d.pixels.size() + d.labels.size() * sizeof(int32_t)));
  JobSpec j = lenet_job();
  const SimResult r = simulate(parse_cluster("c5.large:1"), j, {.baseline = false});
  // Fashion-MNIST: 60,000 training and 10,000 test samples of 1x28x28 bytes plus a 4-byte label each
  const double expected = (60000.0 + 10000.0) * (28 * 28 + 4);
  BOOST_TEST(r.memory.data_bytes == expected);
  BOOST_TEST(r.memory.total() == r.memory_per_node_bytes, tt::tolerance(1e-12));
  // a trainer's own figure (tandem_trainer_predict passes its loaded sets) replaces the dataset's, byte for byte
  j.data_bytes = 0.0;
  const SimResult none = simulate(parse_cluster("c5.large:1"), j, {.baseline = false});
  BOOST_TEST(r.memory_per_node_bytes - none.memory_per_node_bytes == expected, tt::tolerance(1e-12));
  // every rank holds both sets: two ranks on one host count them twice
  j.data_bytes.reset();
  j.strategy = Strategy::kDdp;
  const SimResult two = simulate(parse_cluster(R"({"nodes": [{"preset": "c5.large", "ranks_per_node": 2}]})"), j,
                                 {.baseline = false});
  BOOST_TEST(two.ranks == 2);
  BOOST_TEST(two.nodes[0].memory_bytes >= 2 * expected);
  BOOST_TEST(two.memory.data_bytes == expected);
  // ImageNet is streamed from disk, never held: a rank is charged nothing for it
  j.dataset = "imagenet";
  BOOST_TEST(simulate(parse_cluster("c5.large:1"), j, {.baseline = false}).memory.data_bytes == 0.0);
}

// Issue #16: what the runtime loads for the job, from the function the trainer's figure is tested against
// (engine::parallel::rank_data_bytes): --samples N is `tandem train --train-limit N` -- the first N training samples
// (never more than the set has) and the whole test set --; a FedAvg rank adds its clients' subsets (one more copy
// of its training set).
BOOST_AUTO_TEST_CASE(follow_the_sample_limit_and_fedavgs_client_subsets) {
  constexpr double kSample = 28 * 28 + 4;
  JobSpec j = lenet_job();
  j.samples = 1000;
  BOOST_TEST(simulate(parse_cluster("c5.large:1"), j, {.baseline = false}).memory.data_bytes == (1000 + 10000) * kSample);
  j.samples = 100000;  // Fashion-MNIST has 60,000: the reader keeps them all, no more
  BOOST_TEST(simulate(parse_cluster("c5.large:1"), j, {.baseline = false}).memory.data_bytes == (60000 + 10000) * kSample);
  j.samples = 0;
  j.strategy = Strategy::kFedAvg;
  j.clients = 8;
  const SimResult fed = simulate(parse_cluster("c5.large:2"), j, {.baseline = false});
  BOOST_TEST(fed.memory.data_bytes == (2 * 60000 + 10000) * kSample);
  j.samples = 3000;
  BOOST_TEST(simulate(parse_cluster("c5.large:2"), j, {.baseline = false}).memory.data_bytes == (2 * 3000 + 10000) * kSample);
  j.strategy = Strategy::kDdp;
  BOOST_TEST(simulate(parse_cluster("c5.large:2"), j, {.baseline = false}).memory.data_bytes == (3000 + 10000) * kSample);
}

BOOST_AUTO_TEST_CASE(are_not_charged_to_a_gpu_or_pytorch) {
  JobSpec j = lenet_job();
  BOOST_TEST(simulate(parse_cluster("g4dn.xlarge:1"), j, {.baseline = false}).memory.data_bytes == 0.0);
  j.framework = Framework::kPytorchDdp;
  BOOST_TEST(simulate(parse_cluster("c5.large:1"), j, {.baseline = false}).memory.data_bytes == 0.0);
}

BOOST_AUTO_TEST_SUITE_END()

// A directory given as the cluster file or the calibration profile is named as such, not as a JSON parse error.
BOOST_AUTO_TEST_SUITE(json_file_readers)

BOOST_AUTO_TEST_CASE(name_a_directory_given_as_the_file) {
  const auto says_directory = [](const std::string& what) {
    return [what](const tandem::Error& e) {
      const std::string m = e.what();
      BOOST_TEST_MESSAGE(m);
      return m.find(what + " \"/tmp\" is a directory") != std::string::npos && m.find("parse") == std::string::npos;
    };
  };
  BOOST_CHECK_EXCEPTION(parse_cluster("/tmp"), tandem::Error, says_directory("cluster file"));
  BOOST_CHECK_EXCEPTION(load_profile("/tmp"), tandem::Error, says_directory("calibration profile"));
  JobSpec j = lenet_job();
  j.profile = "/tmp";
  BOOST_CHECK_EXCEPTION(simulate(parse_cluster("c5.large:1"), j, {.baseline = false}), tandem::Error,
                        says_directory("calibration profile"));
}

BOOST_AUTO_TEST_SUITE_END()
