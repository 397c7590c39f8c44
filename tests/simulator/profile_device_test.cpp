// A calibration profile times the device it was measured on (`tandem calibrate --device cpu|cuda`): the
// simulator uses a cuda profile on GPU nodes and a host profile on CPU nodes, and refuses the other pairings
// naming the node and the command that measures its kind (a CPU's layer times on a V100 predict another machine).
#include <cstdio>
#include <string>

#include <boost/test/unit_test.hpp>

#include "engine/core/error.hpp"
#include "simulator/cluster.hpp"
#include "simulator/simulate.hpp"
#include "tests/simulator/profile_fixture.hpp"

using namespace tandem::simulator;

namespace {

JobSpec lenet_job(const std::string& profile) {
  JobSpec j;
  j.model = "lenet5";
  j.dataset = "fashion-mnist";
  j.batch = 64;
  j.epochs = 0.01;
  j.profile = profile;
  return j;
}

std::string refusal(const std::string& cluster, const JobSpec& j) {
  try {
    simulate(parse_cluster(cluster), j, {.baseline = false});
  } catch (const tandem::Error& e) {
    BOOST_TEST((e.status() == tandem::Status::kInvalidArgument));
    return e.what();
  }
  return "";
}

}  // namespace

BOOST_AUTO_TEST_SUITE(profile_device)

BOOST_AUTO_TEST_CASE(a_profile_serves_nodes_of_its_own_kind_only) {
  const std::string cpu = testing::write_lenet5_profile("/tmp/tandem_sim_profile_cpu.json", {{"backend", "cpu"}});
  const std::string gpu = testing::write_lenet5_profile("/tmp/tandem_sim_profile_gpu.json", {{"backend", "cuda"}});
  // Its own kind: the measured layer times are used (3 ms per layer and step at batch 64, whatever the node).
  const SimResult on_gpu = simulate(parse_cluster("p3.2xlarge:2"), lenet_job(gpu), {.baseline = false});
  const SimResult on_cpu = simulate(parse_cluster("c5.large:2"), lenet_job(cpu), {.baseline = false});
  BOOST_TEST(on_gpu.compute_s > 0);
  BOOST_TEST(on_gpu.compute_s == on_cpu.compute_s, boost::test_tools::tolerance(1e-9));
  // The other kind: refused, naming the node and how to measure one of its kind.
  const std::string a = refusal("p3.2xlarge:2", lenet_job(cpu));
  BOOST_TEST(a.find("measured on the 'cpu' backend") != std::string::npos, a);
  BOOST_TEST(a.find("GPU node") != std::string::npos, a);
  BOOST_TEST(a.find("tandem calibrate --device cuda") != std::string::npos, a);
  const std::string b = refusal("c5.large:2", lenet_job(gpu));
  BOOST_TEST(b.find("CPU node") != std::string::npos, b);
  BOOST_TEST(b.find("--device cpu") != std::string::npos, b);
  std::remove(cpu.c_str());
  std::remove(gpu.c_str());
}

BOOST_AUTO_TEST_SUITE_END()
