// A calibration profile measured under a CFS quota (`cpu_quota` in the profile): its times are the quota's
// average, so the simulator takes the quota out (full_speed_profile) and lets a node's own quota apply it again
// as on/off windows -- a profile measured at 0.5 core predicts full speed on a node without a quota, and the
// measured speed again on a node with the same quota (bench/emu/validate_bench.py calibrates this way).
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

CalibrationProfile measured(double quota, int64_t threads) {
  nlohmann::json p = {{"format", "tandem-calibration"}, {"version", 1}, {"batch", 64}, {"optimizer_step_s", 0.004},
                      {"layers", {{{"name", "fc"}, {"forward_s", 0.010}, {"backward_s", 0.020}}}},
                      {"batch_curve", {{1, 0.002}, {64, 0.030}}}, {"fp16_convert_s", {2e-9, 4e-9}},
                      {"threads", threads}, {"cpu_quota", quota}};
  return profile_from_json(p);
}

// One lenet5 step on a one-node cluster (`node` = that node's JSON fields).
SimResult one_node(const std::string& profile, const nlohmann::json& node) {
  nlohmann::json n = {{"name", "host"}, {"count", 1}, {"vcpus", 1}, {"memory_mib", 1024}, {"peak_gflops", 10},
                      {"mem_gbps", 8}, {"nic_mbps", 1000}};
  n.update(node);
  JobSpec j;
  j.model = "lenet5";
  j.dataset = "fashion-mnist";
  j.batch = 64;
  j.epochs = 0.01;
  j.strategy = Strategy::kSingle;
  j.profile = profile;
  return simulate(cluster_from_json({{"nodes", {n}}}), j, {.baseline = false});
}

}  // namespace

BOOST_AUTO_TEST_SUITE(profile_quota)

BOOST_AUTO_TEST_CASE(a_quota_is_taken_out_of_every_measured_time) {
  const CalibrationProfile p = full_speed_profile(measured(0.5, 1));
  BOOST_TEST(!p.cpu_quota.has_value());
  BOOST_TEST(p.layers[0].forward_s == 0.005, tt::tolerance(1e-12));
  BOOST_TEST(p.layers[0].backward_s == 0.010, tt::tolerance(1e-12));
  BOOST_TEST(p.optimizer_step_s == 0.002, tt::tolerance(1e-12));
  BOOST_TEST(p.batch_curve[0].second == 0.001, tt::tolerance(1e-12));
  BOOST_TEST(p.batch_curve[1].second == 0.015, tt::tolerance(1e-12));
  BOOST_TEST(p.fp16_convert_s->first == 1e-9, tt::tolerance(1e-12));
  // Two threads under half a core ran at a quarter of their full speed.
  BOOST_TEST(full_speed_profile(measured(0.5, 2)).layers[0].forward_s == 0.0025, tt::tolerance(1e-12));
  // A quota the threads never reached changed nothing.
  BOOST_TEST(full_speed_profile(measured(2.0, 1)).layers[0].forward_s == 0.010, tt::tolerance(1e-12));
  BOOST_TEST(full_speed_profile(measured(1.0, 1)).layers[0].forward_s == 0.010, tt::tolerance(1e-12));
  // Written back as read (the conversion is the simulator's, not the file's).
  const nlohmann::json j = profile_to_json(measured(0.5, 1));
  BOOST_TEST(j["cpu_quota"].get<double>() == 0.5);
  BOOST_TEST(j["threads"].get<int64_t>() == 1);
}

BOOST_AUTO_TEST_CASE(measured_at_half_a_core_predicts_full_speed_there_and_the_quota_where_it_holds) {
  const std::string plain = testing::write_lenet5_profile("/tmp/tandem_sim_quota_plain.json");
  const std::string at_quota = testing::write_lenet5_profile("/tmp/tandem_sim_quota_half.json", {{"cpu_quota", 0.5}});
  // lenet5's fixture: 12 layers x 3 ms + 1 ms optimizer = 37 ms as measured.
  const SimResult free_plain = one_node(plain, nlohmann::json::object());
  const SimResult free_half = one_node(at_quota, nlohmann::json::object());
  BOOST_TEST(free_plain.step_time_s == 0.037, tt::tolerance(1e-6));
  BOOST_TEST(free_half.step_time_s == 0.5 * free_plain.step_time_s, tt::tolerance(1e-6));
  // On a node with the measuring host's quota (5 ms periods), the 18.5 ms of full-speed work runs 2.5 ms per
  // period: the measured 37 ms again, to within the last period's unused part.
  const SimResult q = one_node(at_quota, {{"cpu_quota", 0.5}, {"cpu_period_ms", 5}});
  const double work = free_half.step_time_s;
  BOOST_TEST(q.step_time_s >= 2.0 * work - 0.0025 - 1e-6);
  BOOST_TEST(q.step_time_s <= 2.0 * work + 1e-6);
  std::remove(plain.c_str());
  std::remove(at_quota.c_str());
}

// The cores the calibrating host really sustained under its quota (cpu_quota_sustained, tandem calibrate: the timed
// passes' process CPU time over their wall time): every quota'd node gets that fraction of its quota.
BOOST_AUTO_TEST_CASE(a_quota_yields_what_it_yielded_the_calibrating_host) {
  nlohmann::json m = {{"format", "tandem-calibration"}, {"version", 1}, {"batch", 64}, {"optimizer_step_s", 0.004},
                      {"layers", {{{"name", "fc"}, {"forward_s", 0.010}, {"backward_s", 0.020}}}},
                      {"cpu_quota", 0.5}, {"cpu_quota_sustained", 0.4}};
  const CalibrationProfile read = profile_from_json(m);
  BOOST_TEST(*read.cpu_quota_sustained == 0.4);
  BOOST_TEST(profile_to_json(read)["cpu_quota_sustained"].get<double>() == 0.4);
  const CalibrationProfile p = full_speed_profile(read);
  BOOST_TEST(*p.quota_efficiency == 0.8, tt::tolerance(1e-12));
  BOOST_TEST(!p.cpu_quota_sustained.has_value());
  BOOST_TEST(p.layers[0].forward_s == 0.005, tt::tolerance(1e-12));  // the work is the CPU time, as without it
  BOOST_TEST(!full_speed_profile(measured(0.5, 1)).quota_efficiency.has_value());
  // lenet5's fixture measured at 0.5 core: 18.5 ms of full-speed work. Its host sustained 0.4 core, so a node with
  // the same 0.5-core quota (5 ms periods) runs 0.8 x 2.5 = 2 ms of it per period: 9 whole periods and 0.5 ms.
  const std::string sustained = testing::write_lenet5_profile(
      "/tmp/tandem_sim_quota_sustained.json", {{"cpu_quota", 0.5}, {"cpu_quota_sustained", 0.4}});
  const std::string full = testing::write_lenet5_profile("/tmp/tandem_sim_quota_full.json", {{"cpu_quota", 0.5}});
  const nlohmann::json node = {{"cpu_quota", 0.5}, {"cpu_period_ms", 5}};
  BOOST_TEST(one_node(sustained, node).step_time_s == 9 * 0.005 + 0.0005, tt::tolerance(1e-6));
  BOOST_TEST(one_node(full, node).step_time_s == 7 * 0.005 + 0.0010, tt::tolerance(1e-6));  // 7 x 2.5 + 1 ms
  // a node without a quota computes at full speed either way
  BOOST_TEST(one_node(sustained, nlohmann::json::object()).step_time_s == 0.0185, tt::tolerance(1e-6));
  std::remove(sustained.c_str());
  std::remove(full.c_str());
}

BOOST_AUTO_TEST_CASE(bad_quota_fields_name_the_field) {
  auto with = [](const nlohmann::json& extra) {
    nlohmann::json p = {{"format", "tandem-calibration"}, {"version", 1}, {"batch", 64}, {"optimizer_step_s", 0.001},
                        {"layers", {{{"name", "fc"}, {"forward_s", 0.001}, {"backward_s", 0.002}}}}};
    p.update(extra);
    profile_from_json(p);
  };
  testing::expect_error([&] { with({{"cpu_quota", 0}}); }, "profile.cpu_quota");
  testing::expect_error([&] { with({{"cpu_quota", "half"}}); }, "cpu_quota");
  testing::expect_error([&] { with({{"threads", 0}}); }, "profile.threads");
  testing::expect_error([&] { with({{"cpu_quota_sustained", 0.4}}); }, "profile.cpu_quota_sustained");
  testing::expect_error([&] { with({{"cpu_quota", 0.5}, {"cpu_quota_sustained", 0.6}}); }, "profile.cpu_quota_sustained");
  testing::expect_error([&] { with({{"cpu_quota", 0.5}, {"cpu_quota_sustained", 0}}); }, "profile.cpu_quota_sustained");
}

BOOST_AUTO_TEST_SUITE_END()
