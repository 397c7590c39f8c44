// The job's data path beyond the calibrated pass (the profile's step_overhead_cpu_s): every rank that loads
// batches pays it once per step, scaled with the step's samples, as compute on its node -- so a quota pays for it at
// its duty cycle, and local SGD, EASGD and FedAvg pay it on every local step. Closed forms on lenet5's fixture
// profile (12 layers x 3 ms + 1 ms optimizer at batch 64).
#include <cstdio>
#include <string>

#include <boost/test/unit_test.hpp>
#include <nlohmann/json.hpp>

#include "simulator/cluster.hpp"
#include "simulator/compute/profile.hpp"
#include "simulator/simulate.hpp"
#include "tests/simulator/expect_error.hpp"
#include "tests/simulator/profile_fixture.hpp"

using namespace tandem::simulator;
namespace tt = boost::test_tools;

namespace {

constexpr double kOverhead = 0.005;  // CPU seconds a step of the profile's 64 samples costs beyond the pass

struct Profiles {
  std::string plain = testing::write_lenet5_profile("/tmp/tandem_sim_overhead_plain.json");
  std::string with = testing::write_lenet5_profile("/tmp/tandem_sim_overhead_with.json",
                                                   {{"step_overhead_cpu_s", kOverhead}});
  ~Profiles() {
    std::remove(plain.c_str());
    std::remove(with.c_str());
  }
};

ClusterSpec nodes(int32_t count, const nlohmann::json& extra = nlohmann::json::object()) {
  nlohmann::json n = {{"name", "host"}, {"count", count}, {"vcpus", 1}, {"memory_mib", 4096}, {"peak_gflops", 10},
                      {"mem_gbps", 1e6}, {"nic_mbps", 100000}, {"nic_latency_us", 0}, {"protocol", "rdma"}};
  n.update(extra);
  return cluster_from_json({{"nodes", {n}}});
}

JobSpec lenet5(Strategy s, const std::string& profile, int64_t batch = 64) {
  JobSpec j;
  j.model = "lenet5";
  j.dataset = "fashion-mnist";
  j.batch = batch;
  j.epochs = 0.01;
  j.strategy = s;
  j.profile = profile;
  return j;
}

double step_s(const ClusterSpec& c, const JobSpec& j) { return simulate(c, j, {.baseline = false}).step_time_s; }

}  // namespace

BOOST_AUTO_TEST_SUITE(step_overhead)

BOOST_AUTO_TEST_CASE(a_step_pays_the_data_path_once_scaled_with_its_samples) {
  const Profiles p;
  const ClusterSpec one = nodes(1);
  BOOST_TEST(step_s(one, lenet5(Strategy::kSingle, p.plain)) == 0.037, tt::tolerance(1e-6));
  BOOST_TEST(step_s(one, lenet5(Strategy::kSingle, p.with)) == 0.037 + kOverhead, tt::tolerance(1e-6));
  // half the profile's batch: the layers and the overhead halve, the optimizer step does not
  BOOST_TEST(step_s(one, lenet5(Strategy::kSingle, p.with, 32)) == 0.018 + 0.001 + kOverhead / 2, tt::tolerance(1e-6));
  // DDP on four nodes: each replica's step is longer by the same amount (the links are far from binding)
  JobSpec d = lenet5(Strategy::kDdp, p.plain);
  d.dp = 4;
  const double ddp = step_s(nodes(4), d);
  d.profile = p.with;
  BOOST_TEST(step_s(nodes(4), d) - ddp == kOverhead, tt::tolerance(1e-3));
}

BOOST_AUTO_TEST_CASE(it_is_full_speed_cpu_that_a_quota_stretches) {
  // Measured under a 0.5-core quota: the layers are the quota's average (halved by full_speed_profile), the
  // overhead is CPU time already (not halved). On a node with that quota (5 ms periods) the step's 18.5 + 5 ms of
  // full-speed work runs 2.5 ms per period: twice the work, less at most the last period's unused part.
  const std::string at_quota = testing::write_lenet5_profile("/tmp/tandem_sim_overhead_quota.json",
                                                             {{"cpu_quota", 0.5}, {"step_overhead_cpu_s", kOverhead}});
  const double work = 0.0185 + kOverhead;
  BOOST_TEST(step_s(nodes(1), lenet5(Strategy::kSingle, at_quota)) == work, tt::tolerance(1e-6));
  const double q = step_s(nodes(1, {{"cpu_quota", 0.5}, {"cpu_period_ms", 5}}), lenet5(Strategy::kSingle, at_quota));
  BOOST_TEST(q >= 2.0 * work - 0.0025 - 1e-6);
  BOOST_TEST(q <= 2.0 * work + 1e-6);
  std::remove(at_quota.c_str());
}

BOOST_AUTO_TEST_CASE(local_steps_pay_it_every_step) {
  const Profiles p;
  const ClusterSpec c = nodes(4);
  for (Strategy s : {Strategy::kLocalSgd, Strategy::kEasgd}) {
    JobSpec j = lenet5(s, p.plain);
    j.dp = 4;
    j.servers = 0;
    const double before = step_s(c, j);
    j.profile = p.with;
    BOOST_TEST(step_s(c, j) - before == kOverhead, tt::tolerance(1e-3));
  }
  // FedAvg: a round is each client's local epoch, here --limit-batches 5 steps
  JobSpec f = lenet5(Strategy::kFedAvg, p.plain);
  f.dp = 4;
  f.limit_batches = 5;
  const double round = step_s(c, f);
  f.profile = p.with;
  BOOST_TEST(step_s(c, f) - round == 5 * kOverhead, tt::tolerance(1e-3));
}

BOOST_AUTO_TEST_CASE(bad_values_name_the_field) {
  auto with = [](const nlohmann::json& v) {
    nlohmann::json p = {{"format", "tandem-calibration"}, {"version", 1}, {"batch", 64}, {"optimizer_step_s", 0.001},
                        {"layers", {{{"name", "fc"}, {"forward_s", 0.001}, {"backward_s", 0.002}}}},
                        {"step_overhead_cpu_s", v}};
    return profile_from_json(p);
  };
  BOOST_TEST(*with(2.5e-4).step_overhead_cpu_s == 2.5e-4);
  BOOST_TEST(profile_to_json(with(2.5e-4))["step_overhead_cpu_s"].get<double>() == 2.5e-4);
  testing::expect_error([&] { with(-1e-4); }, "profile.step_overhead_cpu_s");
  testing::expect_error([&] { with(1.5); }, "profile.step_overhead_cpu_s");
  testing::expect_error([&] { with("fast"); }, "step_overhead_cpu_s");
}

BOOST_AUTO_TEST_SUITE_END()
