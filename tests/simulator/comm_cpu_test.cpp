// Communication costs CPU (RankSetup::net_cpu_s_per_byte, copy_cpu_s_per_byte; the profile's tcp_cpu_s_per_byte,
// copy_cpu_s_per_byte): every all-reduce transfer is CPU work on its sender and its receiver, run on their node's
// CPU model beside the compute, so on a quota-limited or core-shared node overlapped communication slows compute
// and CPU-bound communication takes the quota's time. Closed forms on links fast enough that the CPU is the bound.
// Network transfers also cost per wake-up (RankSetup::net_cpu_s_per_wakeup, the profile's tcp_cpu_s_per_wakeup),
// their wake-ups set by the link's pace (simulator/comm_cpu.hpp): bytes / max(2 segments, pace x 100 us).
#include <cmath>
#include <string>

#include <boost/test/unit_test.hpp>
#include <nlohmann/json.hpp>

#include "engine/comm/plan.hpp"
#include "simulator/cluster.hpp"
#include "simulator/comm_cpu.hpp"
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
    rs.net_cpu_s_per_wakeup = 1e-3;   // nor this: copies within a node take no wake-ups
    rs.net_pace_bytes_per_s = 1e6;
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
  for (RankSetup& rs : s.ranks) rs.copy_cpu_s_per_byte = rs.net_cpu_s_per_byte = rs.net_cpu_s_per_wakeup = 0;
  BOOST_TEST(run(s, 4).step_s < 0.1 * r.step_s);
}

// Four ranks of one node on two cores pay a wake-up per message and side besides their copies (the waiter spins,
// then sleeps until the peer's socket wake-up); on four cores, or with no per-message cost, only the copies.
BOOST_AUTO_TEST_CASE(oversubscribed_node_pays_a_wakeup_per_message) {
  PlanCache cache;
  const uint64_t bytes = 1 << 20;
  const CompiledPlan& plan = cache.get(allreduce_request(4, engine::comm::Algorithm::kRing, bytes, 256 << 10));
  const CompiledPlan& full = plan.full();
  double sends = 0, recvs = 0;  // member 2's messages
  for (uint32_t g = full.first_op[2]; g < full.first_op[3]; ++g) {
    sends += full.ops[g].kind == CompiledPlan::Kind::kSend;
    recvs += full.ops[g].kind == CompiledPlan::Kind::kRecv;
  }
  BOOST_REQUIRE(sends >= 6);  // reduce-scatter and all-gather: 3 steps each, in 256 KiB pieces
  StepSetup s = ddp_allreduce_step(plan);
  const double c = 1.0e-10, m = 20e-6;
  for (RankSetup& rs : s.ranks) {
    rs.copy_cpu_s_per_byte = c;
    rs.copy_cpu_s_per_message = m;
  }
  s.node_of_rank = s.host_of_rank = {0, 0, 0, 0};
  CpuShare two;
  two.cores = 2;
  s.node_cpu = {two};
  const StepResult r = run(s, 4);
  const double copies = 2 * 2 * 0.75 * static_cast<double>(bytes) * c;
  BOOST_TEST(r.ranks[2].comm_cpu_s == copies + (sends + recvs) * m, tt::tolerance(1e-6));
  for (RankSetup& rs : s.ranks) rs.copy_cpu_s_per_message = 0;
  const StepResult plain = run(s, 4);
  BOOST_TEST(plain.ranks[2].comm_cpu_s == copies, tt::tolerance(1e-6));
  BOOST_TEST(r.step_s > plain.step_s);
}

// Ring of 2 over B bytes on a slow link's pace (65 Mbit/s of payload: two segments arrive every ~370 us, far apart
// from the 100 us a wake-up gathers): every side wakes once per 2,896 bytes, K = 2 B / 2896 w per rank. CPU-bound
// (the links themselves are far faster), the step takes K on a free core and K / q under a quota of q.
BOOST_AUTO_TEST_CASE(slow_link_transfers_cost_their_wakeups) {
  const uint64_t B = 8 << 20;
  const double w = 40e-6, pace = 65e6 / 8 * network::kTcpMssBytes / network::kTcpFrameBytes;
  BOOST_TEST(kTcpWakeupBatchBytes == 2896.0);
  BOOST_TEST(pace * kTcpMinWakeIntervalS < kTcpWakeupBatchBytes);
  const double K = 2.0 * static_cast<double>(B) / 2896.0 * w;  // 0.232 s
  OverlapStep o(B, 0.0);
  for (RankSetup& rs : o.s.ranks) {
    rs.net_cpu_s_per_wakeup = w;
    rs.net_pace_bytes_per_s = pace;
  }
  o.s.node_cpu = {quota_node(0), quota_node(0)};
  o.s.node_cpu[0].quota_cores = o.s.node_cpu[1].quota_cores = 0;
  const StepResult free_core = run(o.s);
  BOOST_TEST(free_core.ranks[0].comm_cpu_s == K, tt::tolerance(1e-6));
  BOOST_TEST(free_core.ranks[1].comm_cpu_s == K, tt::tolerance(1e-6));
  BOOST_TEST(free_core.step_s == K, tt::tolerance(0.01));
  o.s.node_cpu = {quota_node(0.5), quota_node(0.5)};
  BOOST_TEST(run(o.s).step_s == K / 0.5, tt::tolerance(0.01));
  // the per-byte cost adds to it: K + 2 B c
  const double c = 1e-9;
  for (RankSetup& rs : o.s.ranks) rs.net_cpu_s_per_byte = c;
  const StepResult both = run(o.s);
  BOOST_TEST(both.ranks[0].comm_cpu_s == K + 2.0 * static_cast<double>(B) * c, tt::tolerance(1e-6));
  // a transfer goes at the slower end's pace: a fast peer leaves the count as it was
  o.s.ranks[1].net_pace_bytes_per_s = 1e10;
  BOOST_TEST(run(o.s).ranks[1].comm_cpu_s == both.ranks[1].comm_cpu_s, tt::tolerance(1e-9));
}

// On a fast link a wake-up gathers what arrives in 100 us: at 10 Gbit/s (1.25e9 B/s) 125,000 bytes, so the same
// transfer costs 125000 / 2896 = 43 times fewer wake-ups; below the crossover (2,896 B / 100 us = 29 MB/s) the
// count is the slow link's.
BOOST_AUTO_TEST_CASE(fast_links_take_fewer_wakeups_per_byte) {
  const uint64_t B = 8 << 20;
  const double w = 40e-6;
  OverlapStep o(B, 0.0);
  auto comm_cpu_at = [&](double pace) {
    for (RankSetup& rs : o.s.ranks) {
      rs.net_cpu_s_per_wakeup = w;
      rs.net_pace_bytes_per_s = pace;
    }
    return run(o.s).ranks[0].comm_cpu_s;
  };
  const double slow = comm_cpu_at(8e6), mid = comm_cpu_at(20e6), fast = comm_cpu_at(1.25e9);
  BOOST_TEST(mid == slow, tt::tolerance(1e-9));
  BOOST_TEST(fast == 2.0 * static_cast<double>(B) / 125000.0 * w, tt::tolerance(1e-6));
  BOOST_TEST(slow / fast == 125000.0 / 2896.0, tt::tolerance(1e-6));
  BOOST_TEST(tcp_wakeups(2896.0 * 10, 8e6) == 10.0, tt::tolerance(1e-12));
  BOOST_TEST(tcp_wakeups(1e6, 1e9) == 10.0, tt::tolerance(1e-12));
}

// Symmetric execution (rank 0 standing for all) charges rank 0 its sends and its mirrored receives, per byte and per
// wake-up, as the full model charges each rank: the same step on plain nodes; under a quota the
// two agree to within one link latency (50 us of 0.5 s; the per-byte model alone differs the same way, the wake-ups
// add nothing to it -- the executor's timing of transfer CPU under quota windows, not investigated).
BOOST_AUTO_TEST_CASE(symmetric_and_full_execution_agree) {
  PlanCache cache;
  const CompiledPlan& plan = cache.get(allreduce_request(4, engine::comm::Algorithm::kRing, 4 << 20, 256 << 10));
  StepSetup s = ddp_allreduce_step(plan);
  for (RankSetup& rs : s.ranks) {
    rs.net_cpu_s_per_byte = 3e-10;
    rs.net_cpu_s_per_wakeup = 30e-6;
    rs.net_pace_bytes_per_s = 1.2e7;
    rs.bucket_backward_s = rs.backward_s = {0.002};
  }
  s.host_of_rank = {0, 1, 2, 3};
  // 3/4 x 4 MiB sent and received twice, at 2,896 bytes per wake-up
  const double bytes = 2 * 2 * 0.75 * 4 * kMiB, per_rank = bytes * 3e-10 + bytes / 2896.0 * 30e-6;
  for (const bool quota : {false, true}) {
    if (quota) {
      s.node_of_rank = {0, 1, 2, 3};
      s.node_cpu = {quota_node(0.5), quota_node(0.5), quota_node(0.5), quota_node(0.5)};
    }
    s.symmetric = true;
    Bench a(4, 1.25e7, 50e-6), b(4, 1.25e7, 50e-6);
    StepResult sym = a.run(s);
    BOOST_TEST(sym.symmetric_used);
    s.symmetric = false;
    StepResult full = b.run(s);
    BOOST_TEST(!full.symmetric_used);
    BOOST_TEST(sym.step_s == full.step_s, tt::tolerance(quota ? 2e-4 : 1e-9));
    BOOST_TEST(sym.ranks[0].comm_cpu_s == per_rank, tt::tolerance(1e-6));
    BOOST_TEST(full.ranks[2].comm_cpu_s == per_rank, tt::tolerance(1e-6));
  }
}

BOOST_AUTO_TEST_CASE(a_wakeup_cost_needs_the_pace) {
  PlanCache cache;
  StepSetup s = ddp_allreduce_step(cache.get(allreduce_request(2, engine::comm::Algorithm::kRing, 16, 16)));
  s.ranks[0].net_cpu_s_per_wakeup = 1e-5;
  tandem::simulator::testing::expect_error([&] { run(s); }, "net_pace_bytes_per_s > 0");
  s.ranks[0].net_pace_bytes_per_s = 1e6;
  s.ranks[1].net_cpu_s_per_wakeup = -1e-5;
  tandem::simulator::testing::expect_error([&] { run(s); }, "transfer CPU costs must be >= 0");
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
// on 4 workers + its server), with the fixture's lenet5 profile plus `extra` and the node's fields overridden by
// `node`.
SimResult emu(const nlohmann::json& extra, const std::string& tag, Strategy strategy = Strategy::kDdp,
              bool profile_network = false, const nlohmann::json& node = nlohmann::json::object()) {
  const std::string path = write_lenet5_profile("/tmp/tandem_comm_cpu_profile_" + tag + ".json", extra);
  const bool servers = strategy == Strategy::kPs || strategy == Strategy::kPsAsync || strategy == Strategy::kSsp;
  nlohmann::json n = {{"name", "host"}, {"count", servers ? 5 : 4}, {"vcpus", 1}, {"memory_mib", 1024},
                      {"peak_gflops", 10}, {"mem_gbps", 8}, {"nic_mbps", 65}, {"cpu_quota", 0.5}, {"protocol", "tcp"}};
  n.update(node);
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

BOOST_AUTO_TEST_CASE(wakeup_field_round_trips) {
  nlohmann::json j = profile_json();
  BOOST_TEST(!profile_from_json(j).tcp_cpu_s_per_wakeup.has_value());
  BOOST_TEST(!profile_to_json(profile_from_json(j)).contains("tcp_cpu_s_per_wakeup"));
  j["tcp_cpu_s_per_wakeup"] = 3.5e-5;
  j["cpu_quota"] = 0.5;
  const CalibrationProfile p = full_speed_profile(profile_from_json(j));  // thread CPU time: the quota leaves it
  BOOST_TEST(*p.tcp_cpu_s_per_wakeup == 3.5e-5);
  BOOST_TEST(profile_to_json(p).at("tcp_cpu_s_per_wakeup").get<double>() == 3.5e-5);
  j["tcp_cpu_s_per_wakeup"] = -1e-6;
  tandem::simulator::testing::expect_error([&] { profile_from_json(j); }, "profile.tcp_cpu_s_per_wakeup");
  j["tcp_cpu_s_per_wakeup"] = 0.5;
  tandem::simulator::testing::expect_error([&] { profile_from_json(j); }, "profile.tcp_cpu_s_per_wakeup");
}

// A profile without the fields predicts what it did before (transfers cost no CPU); explicit zeros are the same;
// measured costs make the quota-limited DDP step slower.
BOOST_AUTO_TEST_CASE(old_profiles_behave_as_before) {
  const SimResult old = emu(nlohmann::json::object(), "old");
  const SimResult zero =
      emu({{"tcp_cpu_s_per_byte", 0.0}, {"copy_cpu_s_per_byte", 0.0}, {"tcp_cpu_s_per_wakeup", 0.0}}, "zero");
  BOOST_TEST(zero.step_time_s == old.step_time_s);
  const SimResult costly = emu({{"tcp_cpu_s_per_byte", 5e-8}}, "costly");
  BOOST_TEST(costly.step_time_s > old.step_time_s * 1.05);
  // the per-byte model alone is what it was before the wake-up field existed: a 0 wake-up cost changes no bit
  const SimResult per_byte = emu({{"tcp_cpu_s_per_byte", 5e-8}, {"tcp_cpu_s_per_wakeup", 0.0}}, "per_byte");
  BOOST_TEST(per_byte.step_time_s == costly.step_time_s);
  BOOST_TEST(per_byte.rank_step[0].comm_cpu_s == costly.rank_step[0].comm_cpu_s);
}

// Through simulate(): a rank's wake-ups follow its node's NIC (line rate less TCP's headers, times the goodput):
// at 65 Mbit/s every 2,896 bytes sent or received wake it once; at 10 Gbit/s every 1.25e9 x 1448/1514 x 100 us.
// A node without TCP (rdma) pays none.
// Through simulate(): four ranks on one node pay the profile's wake-up cost per intra-node message and side only
// where they outnumber its cores (two vcpus), not with a core each (four).
BOOST_AUTO_TEST_CASE(intra_node_messages_wake_ranks_only_on_shared_cores) {
  const nlohmann::json one = {{"count", 1}, {"ranks_per_node", 4}, {"memory_mib", 8192}};
  auto node = [&](int vcpus) {
    nlohmann::json n = one;
    n["vcpus"] = vcpus;
    return n;
  };
  const nlohmann::json per_byte = {{"copy_cpu_s_per_byte", 1e-10}};
  nlohmann::json woken = per_byte;
  woken["tcp_cpu_s_per_wakeup"] = 2e-5;
  const SimResult own_cores = emu(woken, "own", Strategy::kDdp, false, node(4));
  const SimResult own_plain = emu(per_byte, "own_plain", Strategy::kDdp, false, node(4));
  BOOST_TEST(own_cores.rank_step[1].comm_cpu_s == own_plain.rank_step[1].comm_cpu_s, tt::tolerance(1e-12));
  const SimResult shared = emu(woken, "shared", Strategy::kDdp, false, node(2));
  const SimResult shared_plain = emu(per_byte, "shared_plain", Strategy::kDdp, false, node(2));
  const double extra = shared.rank_step[1].comm_cpu_s - shared_plain.rank_step[1].comm_cpu_s;
  const double messages = extra / 2e-5;  // sent and received, a whole number
  BOOST_TEST(messages >= 2);
  BOOST_TEST(std::abs(messages - std::round(messages)) < 1e-6);
  BOOST_TEST(shared.step_time_s > shared_plain.step_time_s);
}

BOOST_AUTO_TEST_CASE(wakeups_follow_the_nodes_link) {
  const double w = 40e-6;
  const SimResult slow = emu({{"tcp_cpu_s_per_wakeup", w}}, "slow");
  const double moved = 2 * slow.allreduce_bytes_per_rank;  // a ring rank receives what it sends
  BOOST_REQUIRE(moved > 0);
  for (const RankBreakdown& b : slow.rank_step) BOOST_TEST(b.comm_cpu_s == moved / 2896.0 * w, tt::tolerance(1e-6));
  const SimResult fast = emu({{"tcp_cpu_s_per_wakeup", w}}, "fast", Strategy::kDdp, false, {{"nic_mbps", 10000}});
  const double batch = 10e9 / 8 * 1448.0 / 1514.0 * 100e-6;
  BOOST_TEST(fast.rank_step[0].comm_cpu_s == moved / batch * w, tt::tolerance(1e-6));
  const SimResult rdma = emu({{"tcp_cpu_s_per_wakeup", w}}, "rdma", Strategy::kDdp, false, {{"protocol", "rdma"}});
  BOOST_TEST(rdma.rank_step[0].comm_cpu_s == 0.0);
  BOOST_TEST(slow.step_time_s > emu(nlohmann::json::object(), "none").step_time_s);
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
      // the wake-up term reaches them through the one cost function (transfer_cpu_s)
      nlohmann::json woken = p2p;
      woken["tcp_cpu_s_per_wakeup"] = 4e-5;
      BOOST_TEST(emu(woken, "s_woken" + tag, s, net).rank_step.at(0).comm_cpu_s > 0.0);
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
