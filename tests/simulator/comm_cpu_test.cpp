// Communication costs CPU (RankSetup::net_cpu_s_per_byte, copy_cpu_s_per_byte; the profile's tcp_cpu_s_per_byte,
// copy_cpu_s_per_byte): every all-reduce transfer is CPU work on its sender and its receiver, run on their node's
// CPU model beside the compute, so on a quota-limited or core-shared node overlapped communication slows compute
// and CPU-bound communication takes the quota's time. Closed forms on links fast enough that the CPU is the bound.
#include <string>

#include <boost/test/unit_test.hpp>
#include <nlohmann/json.hpp>

#include "engine/comm/plan.hpp"
#include "simulator/cluster.hpp"
#include "simulator/compute/profile.hpp"
#include "simulator/simulate.hpp"
#include "tests/simulator/expect_error.hpp"
#include "tests/simulator/profile_fixture.hpp"
#include "tests/simulator/step_fixture.hpp"

using namespace tandem;
using namespace tandem::simulator;
using namespace tandem::simulator::testing;
namespace tt = boost::test_tools;

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

// A node of one core held to `quota` cores with a short CFS period (so long phases average quota / 1).
CpuShare quota_node(double quota) {
  CpuShare c;
  c.cores = 1;
  c.task_cores = 1;
  c.quota_cores = quota;
  c.period_s = 1e-4;
  return c;
}

// Two ranks on two nodes; two gradient buckets: the first (`big` bytes) all-reduced while the second's backward
// (`compute_s`) runs, the second 4 bytes.
struct OverlapStep {
  PlanCache cache;
  StepSetup s;
  OverlapStep(uint64_t big, double compute_s) {
    engine::parallel::ScheduleRequest sr;
    sr.boundaries = {0, 2};
    sr.data_parallel = true;
    sr.layer_grad_bytes = {4, big};
    sr.bucket_bytes = big;
    s.pipeline = engine::parallel::make_pipeline_plan(sr);
    s.dp = 2;
    s.pp = 1;
    const auto& buckets = s.pipeline.stage_plans[0].buckets;
    BOOST_REQUIRE_EQUAL(buckets.size(), 2u);
    BOOST_REQUIRE_EQUAL(buckets[0].bytes, big);  // backward order: the last layer's bucket first
    s.bucket_plans = {{&cache.get(allreduce_request(2, engine::comm::Algorithm::kRing, big, big)),
                       &cache.get(allreduce_request(2, engine::comm::Algorithm::kRing, 4, 4))}};
    for (int r = 0; r < 2; ++r) {
      RankSetup rs;
      rs.forward_s = {0};
      rs.backward_s = {compute_s};
      rs.bucket_backward_s = {0, compute_s};
      s.ranks.push_back(rs);
    }
    s.node_of_rank = {0, 1};
    s.host_of_rank = {0, 1};
  }
};

StepResult run(const StepSetup& s, int n = 2) {
  Bench b(n, 1e13, 1e-9);  // links far faster than the CPU: the CPU is the bound
  return b.run(s);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(comm_cpu)

// Ring of 2 over B bytes: each rank sends B/2 twice and receives B/2 twice, B bytes each way; at c CPU
// seconds per byte and side that is K = 2 B c of CPU. Alone on one core it takes K; under half a core 2K.
BOOST_AUTO_TEST_CASE(cpu_bound_transfers_take_their_cpu_over_the_quota) {
  const uint64_t B = 8 << 20;
  const double c = 1e-9, K = 2.0 * static_cast<double>(B) * c;  // 16.8 ms
  OverlapStep o(B, 0.0);
  for (RankSetup& rs : o.s.ranks) rs.net_cpu_s_per_byte = c;
  o.s.node_cpu = {quota_node(0), quota_node(0)};
  o.s.node_cpu[0].quota_cores = o.s.node_cpu[1].quota_cores = 0;  // one core, no quota
  const StepResult free_core = run(o.s);
  BOOST_TEST(free_core.ranks[0].comm_cpu_s == K, tt::tolerance(1e-6));
  BOOST_TEST(free_core.step_s == K, tt::tolerance(0.01));
  o.s.node_cpu = {quota_node(0.5), quota_node(0.5)};
  const StepResult half = run(o.s);
  BOOST_TEST(half.step_s == K / 0.5, tt::tolerance(0.01));
  BOOST_TEST(half.ranks[1].comm_exposed_s == K / 0.5, tt::tolerance(0.01));
}

// Compute C overlapped with transfers needing K of CPU on a node held to q cores: CPU-bound, the node does
// C + K of work at q, (C + K) / q; without the transfers' CPU it is C / q, and the compute's own phase is stretched
// by what the transfers took from it.
BOOST_AUTO_TEST_CASE(overlapped_transfers_slow_compute_under_a_quota) {
  const uint64_t B = 4 << 20;
  const double c = 2e-9, K = 2.0 * static_cast<double>(B) * c, C = 0.050, q = 0.5;
  OverlapStep o(B, C);
  o.s.node_cpu = {quota_node(q), quota_node(q)};
  const StepResult before = run(o.s);
  BOOST_TEST(before.step_s == C / q, tt::tolerance(0.01));
  for (RankSetup& rs : o.s.ranks) rs.net_cpu_s_per_byte = c;
  const StepResult after = run(o.s);
  BOOST_TEST(after.step_s == (C + K) / q, tt::tolerance(0.01));
  BOOST_TEST(after.ranks[0].compute_s == C, tt::tolerance(1e-6));
  BOOST_TEST(after.ranks[0].throttled_s > before.ranks[0].throttled_s + 0.5 * K / q);
  BOOST_TEST(after.ranks[0].comm_cpu_s == K, tt::tolerance(1e-6));
}

// Four ranks of one node on two cores all-reduce 16 MiB (ring): each sends and receives 2 x 3/4 x 16 MiB, every
// byte a copy at the copy cost (not the network's: same node), 48 MiB x c per rank; four ranks' copies on two
// cores take 2 x 48 MiB x c at least.
BOOST_AUTO_TEST_CASE(intra_node_allreduce_is_charged_its_copies) {
  PlanCache cache;
  const uint64_t bytes = 16 << 20;
  const CompiledPlan& plan = cache.get(allreduce_request(4, engine::comm::Algorithm::kRing, bytes, 1 << 20));
  StepSetup s = ddp_allreduce_step(plan);
  const double c = 1.0e-10;
  for (RankSetup& rs : s.ranks) {
    rs.copy_cpu_s_per_byte = c;
    rs.net_cpu_s_per_byte = 50 * c;  // never used: no transfer leaves the node
  }
  s.node_of_rank = s.host_of_rank = {0, 0, 0, 0};
  CpuShare two;
  two.cores = 2;
  s.node_cpu = {two};
  const StepResult r = run(s, 4);
  const double per_rank = 48 * kMiB * c;  // 5.03 ms
  for (const RankBreakdown& b : r.ranks) BOOST_TEST(b.comm_cpu_s == per_rank, tt::tolerance(1e-6));
  BOOST_TEST(r.step_s >= 2 * per_rank * 0.999);
  BOOST_TEST(r.step_s <= 2 * per_rank * 1.10);
  // free copies (the model before): the links alone
  for (RankSetup& rs : s.ranks) rs.copy_cpu_s_per_byte = rs.net_cpu_s_per_byte = 0;
  BOOST_TEST(run(s, 4).step_s < 0.1 * r.step_s);
}

// Symmetric execution (rank 0 standing for all) charges rank 0 its sends and its mirrored receives: the same step
// as the full model.
BOOST_AUTO_TEST_CASE(symmetric_and_full_execution_agree) {
  PlanCache cache;
  const CompiledPlan& plan = cache.get(allreduce_request(4, engine::comm::Algorithm::kRing, 4 << 20, 256 << 10));
  StepSetup s = ddp_allreduce_step(plan);
  for (RankSetup& rs : s.ranks) {
    rs.net_cpu_s_per_byte = 3e-10;
    rs.bucket_backward_s = rs.backward_s = {0.002};
  }
  s.host_of_rank = {0, 1, 2, 3};
  Bench a(4, 1.25e8, 50e-6), b(4, 1.25e8, 50e-6);
  StepResult sym = a.run(s);
  BOOST_TEST(sym.symmetric_used);
  s.symmetric = false;
  StepResult full = b.run(s);
  BOOST_TEST(!full.symmetric_used);
  BOOST_TEST(sym.step_s == full.step_s, tt::tolerance(1e-9));
  BOOST_TEST(sym.ranks[0].comm_cpu_s == full.ranks[2].comm_cpu_s, tt::tolerance(1e-9));
}

BOOST_AUTO_TEST_CASE(negative_costs_are_rejected) {
  PlanCache cache;
  StepSetup s = ddp_allreduce_step(cache.get(allreduce_request(2, engine::comm::Algorithm::kRing, 16, 16)));
  s.ranks[1].copy_cpu_s_per_byte = -1;
  tandem::simulator::testing::expect_error([&] { run(s); }, "transfer CPU costs must be >= 0");
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(comm_cpu_profile)

namespace {

nlohmann::json profile_json() {
  return {{"format", "tandem-calibration"}, {"version", 1}, {"batch", 64}, {"optimizer_step_s", 0.002},
          {"memory_bytes_per_s", 8e9},
          {"layers", {{{"name", "conv0"}, {"forward_s", 0.004}, {"backward_s", 0.008}}}}};
}

// lenet5 over one-core hosts held to half a core, 65 Mbit/s (bench/emu's case; DDP on 4, a strategy with servers
// on 4 workers + its server), with the fixture's lenet5 profile plus `extra`.
SimResult emu(const nlohmann::json& extra, const std::string& tag, Strategy strategy = Strategy::kDdp,
              bool profile_network = false) {
  const std::string path = write_lenet5_profile("/tmp/tandem_comm_cpu_profile_" + tag + ".json", extra);
  const bool servers = strategy == Strategy::kPs || strategy == Strategy::kPsAsync || strategy == Strategy::kSsp;
  nlohmann::json n = {{"name", "host"}, {"count", servers ? 5 : 4}, {"vcpus", 1}, {"memory_mib", 1024},
                      {"peak_gflops", 10}, {"mem_gbps", 8}, {"nic_mbps", 65}, {"cpu_quota", 0.5}};
  JobSpec j;
  j.model = "lenet5";
  j.dataset = "fashion-mnist";
  j.batch = 64;
  j.epochs = 0.01;
  j.strategy = strategy;
  j.dp = 4;
  j.profile = path;
  j.profile_network = profile_network;
  SimResult r = simulate(cluster_from_json({{"nodes", {n}}}), j, {.baseline = false});
  std::remove(path.c_str());
  return r;
}

}  // namespace

BOOST_AUTO_TEST_CASE(fields_round_trip_and_absent_means_none) {
  nlohmann::json j = profile_json();
  j["layers"][0]["name"] = "x";
  CalibrationProfile old = profile_from_json(j);
  BOOST_TEST(!old.tcp_cpu_s_per_byte.has_value());
  BOOST_TEST(!old.copy_cpu_s_per_byte.has_value());
  j["tcp_cpu_s_per_byte"] = 2e-10;
  j["copy_cpu_s_per_byte"] = 1e-10;
  j["cpu_quota"] = 0.5;
  CalibrationProfile p = full_speed_profile(profile_from_json(j));  // thread CPU time: a quota changes nothing
  BOOST_TEST(*p.tcp_cpu_s_per_byte == 2e-10);
  BOOST_TEST(*p.copy_cpu_s_per_byte == 1e-10);
  const nlohmann::json back = profile_to_json(p);
  BOOST_TEST(back.at("tcp_cpu_s_per_byte").get<double>() == 2e-10);
  BOOST_TEST(back.at("copy_cpu_s_per_byte").get<double>() == 1e-10);
  BOOST_TEST(!profile_to_json(old).contains("tcp_cpu_s_per_byte"));
  j["copy_cpu_s_per_byte"] = -1;
  tandem::simulator::testing::expect_error([&] { profile_from_json(j); }, "profile.copy_cpu_s_per_byte");
}

// A profile without the fields predicts what it did before (transfers cost no CPU); explicit zeros are the same;
// measured costs make the quota-limited DDP step slower.
BOOST_AUTO_TEST_CASE(old_profiles_behave_as_before) {
  const SimResult old = emu(nlohmann::json::object(), "old");
  const SimResult zero = emu({{"tcp_cpu_s_per_byte", 0.0}, {"copy_cpu_s_per_byte", 0.0}}, "zero");
  BOOST_TEST(zero.step_time_s == old.step_time_s);
  const SimResult costly = emu({{"tcp_cpu_s_per_byte", 5e-8}}, "costly");
  BOOST_TEST(costly.step_time_s > old.step_time_s * 1.05);
}

// The strategy executors charge it too (simulator/strategy.cpp), on TCP links also when --profile-network restates
// the link as the measured payload rate; a profile without the fields or with zeros predicts what it did before.
BOOST_AUTO_TEST_CASE(strategy_executors_charge_transfer_cpu) {
  const nlohmann::json p2p = {{"p2p", {{"bandwidth_bytes_per_s", 7.6e6}, {"latency_s", 5e-5}}}};
  for (const Strategy s : {Strategy::kPsAsync, Strategy::kPs, Strategy::kAsgd, Strategy::kFedAvg, Strategy::kDdp}) {
    for (const bool net : {false, true}) {
      const std::string tag = std::to_string(static_cast<int>(s)) + (net ? "n" : "");
      const SimResult old = emu(p2p, "s_old" + tag, s, net);
      nlohmann::json zero = p2p, costly = p2p;
      zero.update({{"tcp_cpu_s_per_byte", 0.0}, {"copy_cpu_s_per_byte", 0.0}});
      costly["tcp_cpu_s_per_byte"] = 5e-8;
      BOOST_TEST(emu(zero, "s_zero" + tag, s, net).step_time_s == old.step_time_s);
      const SimResult c = emu(costly, "s_costly" + tag, s, net);
      // ps's server and fedavg's rank 0 take it beside their link-bound transfers (hidden, or a round's small share);
      // ps-async, asgd and ddp workers take it from their compute's quota
      const bool hidden = s == Strategy::kPs || s == Strategy::kFedAvg;
      if (hidden) BOOST_TEST(c.step_time_s >= old.step_time_s, "strategy " << static_cast<int>(s) << " net " << net);
      else BOOST_TEST(c.step_time_s > old.step_time_s * 1.02, "strategy " << static_cast<int>(s) << " net " << net);
      BOOST_TEST(c.rank_step.at(0).comm_cpu_s > 0.0);
      BOOST_TEST(old.rank_step.at(0).comm_cpu_s == 0.0);
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
