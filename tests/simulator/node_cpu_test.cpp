// The node CPU model (simulator/compute/node_cpu.hpp): CFS quota windows, cores shared by time
// slicing, and both through the step executor and the cluster JSON.
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>
#include <nlohmann/json.hpp>

#include "engine/comm/plan.hpp"
#include "engine/core/error.hpp"
#include "simulator/cluster.hpp"
#include "simulator/compute/node_cpu.hpp"
#include "simulator/compute/profile.hpp"
#include "simulator/simulate.hpp"
#include "tests/simulator/profile_fixture.hpp"
#include "tests/simulator/step_fixture.hpp"
#include "tests/simulator/expect_error.hpp"

using namespace tandem::simulator;
namespace tt = boost::test_tools;

namespace {

// Records when each task of a NodeCpu is done.
struct Done final : des::EventHandler {
  des::Simulator& sim;
  std::vector<double> at;
  explicit Done(des::Simulator& s) : sim(s) {}
  void on_event(uint64_t arg) override {
    if (at.size() <= arg) at.resize(arg + 1, -1);
    at[arg] = des::to_seconds(sim.now());
  }
};

// Starts task `arg` of `work_s` on `cpu` at absolute time `t_s`.
struct Starter final : des::EventHandler {
  NodeCpu& cpu;
  Done& done;
  std::vector<double> work;
  Starter(NodeCpu& c, Done& d) : cpu(c), done(d) {}
  void on_event(uint64_t arg) override { cpu.start(work[arg], &done, arg); }
};

std::vector<double> run_tasks(const CpuShare& share, const std::vector<std::pair<double, double>>& start_work) {
  des::Simulator sim;
  NodeCpu cpu(sim, share);
  Done done(sim);
  Starter st(cpu, done);
  for (size_t i = 0; i < start_work.size(); ++i) {
    st.work.push_back(start_work[i].second);
    sim.schedule_at(des::to_ns(start_work[i].first), &st, i);
  }
  sim.run();
  return done.at;
}

CpuShare quota(double cores, double period_s) {
  CpuShare s;
  s.cores = 1;
  s.task_cores = 1;
  s.quota_cores = cores;
  s.period_s = period_s;
  return s;
}

using tandem::simulator::testing::expect_error;

}  // namespace

BOOST_AUTO_TEST_SUITE(cfs_quota)

// 30 ms of work fits in the 50 ms quota of the first 100 ms period: full speed
BOOST_AUTO_TEST_CASE(a_phase_within_the_quota_runs_at_full_speed) {
  auto t = run_tasks(quota(0.5, 0.1), {{0.0, 0.030}});
  BOOST_TEST(t.at(0) == 0.030, tt::tolerance(1e-9));
}

// 1 s of work at 50 ms per 100 ms: 20 windows, the last ends 50 ms into the 20th period
BOOST_AUTO_TEST_CASE(a_long_phase_runs_at_quota_over_period) {
  auto t = run_tasks(quota(0.5, 0.1), {{0.0, 1.0}});
  BOOST_TEST(t.at(0) == 1.95, tt::tolerance(1e-9));
  // a short period gives the same average: 1 s at 0.5 ms per 1 ms ends at 1.9995 s
  auto s = run_tasks(quota(0.5, 0.001), {{0.0, 1.0}});
  BOOST_TEST(s.at(0) == 1.9995, tt::tolerance(1e-9));
}

// 60 ms from time 0: 50 ms, off until 100 ms, 10 ms more. 40 ms from 80 ms: 20 ms to the period's end
// (quota left), then 20 ms of the next period.
BOOST_AUTO_TEST_CASE(the_quota_refills_at_each_period_start) {
  auto a = run_tasks(quota(0.5, 0.1), {{0.0, 0.060}});
  BOOST_TEST(a.at(0) == 0.110, tt::tolerance(1e-9));
  auto b = run_tasks(quota(0.5, 0.1), {{0.080, 0.040}});
  BOOST_TEST(b.at(0) == 0.120, tt::tolerance(1e-9));
}

// Two tasks on one core under the quota share both the core and the quota: 2 x 20 ms of work is
// 40 ms of CPU, within 50 ms, done together at 40 ms; 2 x 40 ms needs 80: 50 ms, pause, 30 ms
BOOST_AUTO_TEST_CASE(tasks_share_the_quota_of_their_node) {
  auto a = run_tasks(quota(0.5, 0.1), {{0.0, 0.020}, {0.0, 0.020}});
  BOOST_TEST(a.at(0) == 0.040, tt::tolerance(1e-9));
  BOOST_TEST(a.at(1) == 0.040, tt::tolerance(1e-9));
  auto b = run_tasks(quota(0.5, 0.1), {{0.0, 0.040}, {0.0, 0.040}});
  BOOST_TEST(b.at(0) == 0.130, tt::tolerance(1e-9));
}

// A cancelled task stops taking its share: two 20 ms tasks under half a core share the quota until the first is
// cancelled at 20 ms (10 ms done each); the other then has the core alone: its last 10 ms end at 30 ms (within
// the period's 50 ms of quota). Cancelling a task that is not running does nothing.
BOOST_AUTO_TEST_CASE(a_cancelled_task_gives_its_share_back) {
  des::Simulator sim;
  NodeCpu cpu(sim, quota(0.5, 0.1));
  Done done(sim);
  struct Cancel final : des::EventHandler {
    NodeCpu& cpu;
    Done& done;
    bool found = false, again = true;
    Cancel(NodeCpu& c, Done& d) : cpu(c), done(d) {}
    void on_event(uint64_t) override {
      found = cpu.cancel(&done, 0);
      again = cpu.cancel(&done, 0);
    }
  } cancel(cpu, done);
  cpu.start(0.020, &done, 0);
  cpu.start(0.020, &done, 1);
  sim.schedule_at(des::to_ns(0.020), &cancel, 0);
  sim.run();
  BOOST_TEST(cancel.found);
  BOOST_TEST(!cancel.again);
  BOOST_TEST(done.at.at(0) == -1.0);
  BOOST_TEST(done.at.at(1) == 0.030, tt::tolerance(1e-9));
  BOOST_TEST(cpu.running() == 0u);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(shared_cores)

// 4 tasks of 10 ms on 2 cores run at half speed: 20 ms; on 4 cores 10 ms. When two finish early the
// others speed up: tasks of 10, 10, 30, 30 ms on 2 cores: the short ones end at 20 ms, the long
// ones have 20 ms left at full speed: 40 ms
BOOST_AUTO_TEST_CASE(more_tasks_than_cores_share_them_fairly) {
  CpuShare two;
  two.cores = 2;
  auto a = run_tasks(two, {{0, 0.01}, {0, 0.01}, {0, 0.01}, {0, 0.01}});
  for (double t : a) BOOST_TEST(t == 0.020, tt::tolerance(1e-9));
  CpuShare four;
  four.cores = 4;
  auto b = run_tasks(four, {{0, 0.01}, {0, 0.01}, {0, 0.01}, {0, 0.01}});
  for (double t : b) BOOST_TEST(t == 0.010, tt::tolerance(1e-9));
  auto c = run_tasks(two, {{0, 0.01}, {0, 0.01}, {0, 0.03}, {0, 0.03}});
  BOOST_TEST(c.at(0) == 0.020, tt::tolerance(1e-9));
  BOOST_TEST(c.at(3) == 0.040, tt::tolerance(1e-9));
}

// Through the step executor: 4 data-parallel ranks on one node computing 10 ms each, then a 4-byte
// all-reduce. On 2 cores every compute phase takes twice as long as on 4 (10 ms more, throttled).
BOOST_AUTO_TEST_CASE(four_ranks_on_two_cores_take_twice_as_long_per_phase) {
  using namespace tandem::simulator::testing;
  PlanCache cache;
  const CompiledPlan& plan = cache.get(allreduce_request(4, tandem::engine::comm::Algorithm::kRing, 16, 16));
  auto step = [&](double cores) {
    StepSetup s = ddp_allreduce_step(plan);
    for (RankSetup& rs : s.ranks) rs.bucket_backward_s = rs.backward_s = rs.forward_s = {0.010};
    s.node_of_rank = {0, 0, 0, 0};
    CpuShare c;
    c.cores = cores;
    s.node_cpu = {c};
    Bench b(4, 1e9, 1e-6);
    return b.run(s);
  };
  StepResult four = step(4), two = step(2);
  for (int r = 0; r < 4; ++r) {
    BOOST_TEST(four.ranks[r].compute_s == 0.020, tt::tolerance(1e-6));
    BOOST_TEST(four.ranks[r].throttled_s == 0.0, tt::tolerance(1e-6));
    BOOST_TEST(two.ranks[r].compute_s == 0.020, tt::tolerance(1e-6));
    BOOST_TEST(two.ranks[r].throttled_s == 0.020, tt::tolerance(1e-6));  // each phase doubled
  }
  BOOST_TEST(two.step_s - four.step_s == 0.020, tt::tolerance(1e-3));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(node_cpu_cluster)

BOOST_AUTO_TEST_CASE(cluster_json_reads_quota_period_and_ranks_per_node) {
  ClusterSpec c = parse_cluster(R"({"nodes": [{"preset": "c5.large", "count": 2, "ranks_per_node": 4,
                                    "cpu_quota": 1.5, "cpu_period_ms": 10}]})");
  BOOST_TEST(c.endpoints() == 8);
  BOOST_TEST(c.nodes[1].cpu_quota == 1.5);
  BOOST_TEST(c.nodes[1].cpu_period_s == 0.010, tt::tolerance(1e-12));
  BOOST_TEST(c.nodes[0].rank_cores() == 1.0);           // 4 ranks on 2 vCPUs: one core each at most
  BOOST_TEST(c.node_of_endpoint(5) == 1);
  const auto nets = c.host_nets();
  BOOST_TEST(nets[0].devices == 4);
  BOOST_TEST(nets[0].intra_bytes_per_s > 0);            // ranks of a node talk through its memory
}

BOOST_AUTO_TEST_CASE(bad_cpu_fields_name_the_field) {
  expect_error([] { parse_cluster(R"({"nodes": [{"preset": "t2.micro", "cpu_quota": 2}]})"); },
               "cluster.nodes[0].cpu_quota");
  expect_error([] { parse_cluster(R"({"nodes": [{"preset": "t2.micro", "cpu_quota": 0}]})"); }, "cpu_quota");
  expect_error([] { parse_cluster(R"({"nodes": [{"preset": "t2.micro", "cpu_period_ms": 100}]})"); },
               "without cpu_quota");
  expect_error([] { parse_cluster(R"({"nodes": [{"preset": "t2.micro", "cpu_quota": 0.5, "cpu_period_s": 5}]})"); },
               "cpu_period");
  expect_error([] { parse_cluster(R"({"nodes": [{"preset": "p3.2xlarge", "ranks_per_node": 2}]})"); },
               "ranks_per_node");
  expect_error([] { parse_cluster(R"({"nodes": [{"preset": "t2.micro", "ranks_per_node": 0}]})"); },
               "ranks_per_node");
}

// A long step on a node held to half a core takes about twice as long (the quota's average); the
// same node without a quota is unchanged by the model.
BOOST_AUTO_TEST_CASE(a_quota_halves_a_long_single_node_step) {
  JobSpec j;
  j.model = "lenet5";
  j.dataset = "fashion-mnist";
  j.batch = 4096;
  j.epochs = 1;
  SimResult full = simulate(parse_cluster(R"({"nodes": [{"preset": "c5.large"}]})"), j);
  SimResult half = simulate(parse_cluster(R"({"nodes": [{"preset": "c5.large", "cpu_quota": 1,
                                            "cpu_period_ms": 1}]})"), j);
  BOOST_TEST(full.step_time_s > 0.05);  // many periods long
  BOOST_TEST(half.step_time_s / full.step_time_s == 2.0, tt::tolerance(0.02));
}

BOOST_AUTO_TEST_SUITE_END()

// Co-run contention (CpuShare::corun, the profile's corun_slowdown): tasks sharing a node's cores run slower per CPU
// second by the calibrated table at their tasks per core; a task alone, and a node without the table, as before.
BOOST_AUTO_TEST_SUITE(corun_slowdown)

namespace {
CpuShare two_cores_with_table() {
  CpuShare c;
  c.cores = 2;
  c.corun = {{0.5, 1.0}, {1.0, 1.1}, {2.0, 1.3}};
  return c;
}
}  // namespace

BOOST_AUTO_TEST_CASE(the_table_is_read_at_tasks_per_core_and_held_at_its_ends) {
  const CpuShare c = two_cores_with_table();
  BOOST_TEST(c.slowdown(1) == 1.0);                            // alone: no co-run
  BOOST_TEST(c.slowdown(2) == 1.1);                            // 1 per core
  BOOST_TEST(c.slowdown(3) == 1.2, tt::tolerance(1e-12));      // 1.5 per core: between the points
  BOOST_TEST(c.slowdown(4) == 1.3);
  BOOST_TEST(c.slowdown(16) == 1.3);                           // held past the last point
  CpuShare wide = c;
  wide.cores = 8;
  BOOST_TEST(wide.slowdown(2) == 1.0);                         // 0.25 per core: before the first point
  BOOST_TEST(CpuShare{}.slowdown(4) == 1.0);                   // no table
  BOOST_TEST(!CpuShare{}.needs_model(1));
  CpuShare big = c;
  big.cores = 4;
  BOOST_TEST(big.needs_model(4));                              // 4 tasks on 4 cores: only the table slows them
  BOOST_TEST(!big.needs_model(1));
}

// 4 tasks of 10 ms on 2 cores: 20 ms by fair share, x 1.3 by the table (2 per core) = 26 ms. When two end, the other
// two run at 1 per core: tasks of 10, 10, 30, 30 ms: the short end at 26 ms; the long have 20 ms left at 1/1.1.
BOOST_AUTO_TEST_CASE(tasks_sharing_cores_run_slower_by_the_table) {
  const CpuShare c = two_cores_with_table();
  const auto a = run_tasks(c, {{0, 0.01}, {0, 0.01}, {0, 0.01}, {0, 0.01}});
  for (double t : a) BOOST_TEST(t == 0.026, tt::tolerance(1e-7));  // to the nanosecond
  const auto b = run_tasks(c, {{0, 0.01}, {0, 0.01}, {0, 0.03}, {0, 0.03}});
  BOOST_TEST(b.at(0) == 0.026, tt::tolerance(1e-7));
  BOOST_TEST(b.at(3) == 0.026 + 0.020 * 1.1, tt::tolerance(1e-7));
  const auto alone = run_tasks(c, {{0, 0.01}});
  BOOST_TEST(alone.at(0) == 0.010, tt::tolerance(1e-9));
}

// The table applies to compute only: of 4 tasks of 10 ms on 2 cores, the two not contended (copies, reductions, a
// transfer's CPU) run at their fair share (half a core) and end at 20 ms; the two compute tasks have then done
// 20 x 0.5 / 1.3 ms of work and run on at 1 per core for the rest: 20 + (10 - 20 x 0.5 / 1.3) x 1.1 ms.
BOOST_AUTO_TEST_CASE(tasks_not_contended_run_at_their_fair_share) {
  des::Simulator sim;
  NodeCpu cpu(sim, two_cores_with_table());
  Done done(sim);
  struct Post final : des::EventHandler {
    NodeCpu* cpu;
    des::EventHandler* done;
    void on_event(uint64_t i) override { cpu->start(0.01, done, i, /*contended=*/i >= 2); }
  } post;
  post.cpu = &cpu;
  post.done = &done;
  for (uint64_t i = 0; i < 4; ++i) sim.schedule_at(0, &post, i);
  sim.run();
  BOOST_TEST(done.at.at(0) == 0.020, tt::tolerance(1e-7));
  BOOST_TEST(done.at.at(1) == 0.020, tt::tolerance(1e-7));
  BOOST_TEST(done.at.at(2) == 0.020 + (0.010 - 0.020 * 0.5 / 1.3) * 1.1, tt::tolerance(1e-7));
  BOOST_TEST(done.at.at(3) == done.at.at(2));
}

BOOST_AUTO_TEST_CASE(a_table_must_ascend) {
  des::Simulator sim;
  CpuShare c = two_cores_with_table();
  c.corun = {{1.0, 1.1}, {1.0, 1.2}};
  expect_error([&] { NodeCpu cpu(sim, c); }, "co-run point 1");
  c.corun.clear();
  c.wakeup_s = -1;
  expect_error([&] { NodeCpu cpu(sim, c); }, "wake-up latency");
}

BOOST_AUTO_TEST_SUITE_END()

// A message to a rank blocked in a receive on a node with more ranks than cores waits for the receiver's slice
// (CpuShare::wakeup_s, the profile's wakeup_latency_s). Closed forms with no compute, no CPU costs and links far
// faster than the latency: a ring all-reduce of n ranks in one piece per step is 2 (n - 1) receives in a row.
BOOST_AUTO_TEST_SUITE(wakeup_latency)

namespace {
StepResult ring_on_one_node(int n, double cores, double wakeup_s) {
  using namespace tandem::simulator::testing;
  PlanCache cache;
  const uint64_t bytes = 4096;
  const CompiledPlan& plan = cache.get(allreduce_request(n, tandem::engine::comm::Algorithm::kRing, bytes, bytes));
  StepSetup s = ddp_allreduce_step(plan);
  s.node_of_rank.assign(static_cast<size_t>(n), 0);
  CpuShare c;
  c.cores = cores;
  c.wakeup_s = wakeup_s;
  s.node_cpu = {c};
  Bench b(n, 1e13, 1e-9);
  return b.run(s);
}
}  // namespace

BOOST_AUTO_TEST_CASE(a_ring_among_more_ranks_than_cores_pays_a_wakeup_per_hop) {
  const double L = 1e-3;
  for (int n : {3, 4}) {
    const StepResult plain = ring_on_one_node(n, 2, 0);
    const StepResult woken = ring_on_one_node(n, 2, L);
    BOOST_TEST(plain.step_s < 1e-6);
    BOOST_TEST(woken.step_s - plain.step_s == 2 * (n - 1) * L, tt::tolerance(1e-6));
  }
}

BOOST_AUTO_TEST_CASE(ranks_within_the_cores_pay_nothing) {
  const StepResult plain = ring_on_one_node(4, 4, 0);
  const StepResult woken = ring_on_one_node(4, 4, 1e-3);
  BOOST_TEST(woken.step_s == plain.step_s);  // bit-identical
  BOOST_TEST(ring_on_one_node(2, 2, 1e-3).step_s == ring_on_one_node(2, 2, 0).step_s);
}

BOOST_AUTO_TEST_SUITE_END()

// The profile's shared-core fields through simulate(): 4 ranks of lenet5 on one node of 2 vCPUs. A profile without
// them predicts exactly as one whose table is all ones and whose latency is 0; the measured figures make the step
// slower; on a node with a core per rank the latency changes nothing.
BOOST_AUTO_TEST_SUITE(shared_core_profile)

namespace {
SimResult four_ranks(const nlohmann::json& extra, const std::string& tag, int vcpus = 2) {
  const std::string path =
      tandem::simulator::testing::write_lenet5_profile("/tmp/tandem_shared_core_profile_" + tag + ".json", extra);
  nlohmann::json n = {{"name", "host"},      {"count", 1},          {"vcpus", vcpus}, {"memory_mib", 8192},
                      {"peak_gflops", 10},   {"mem_gbps", 8},       {"nic_mbps", 10000},
                      {"ranks_per_node", 4}, {"protocol", "tcp"}};
  SimResult r = simulate(cluster_from_json({{"nodes", {n}}}), tandem::simulator::testing::lenet5_ddp(4, path),
                         {.baseline = false});
  std::remove(path.c_str());
  return r;
}
}  // namespace

BOOST_AUTO_TEST_CASE(fields_round_trip_and_bad_ones_are_named) {
  nlohmann::json j = {{"format", "tandem-calibration"}, {"version", 1}, {"batch", 8}, {"optimizer_step_s", 0.001},
                      {"layers", {{{"name", "x"}, {"forward_s", 0.001}, {"backward_s", 0.002}}}}};
  const CalibrationProfile old = profile_from_json(j);
  BOOST_TEST(old.corun_slowdown.empty());
  BOOST_TEST(!old.wakeup_latency_s.has_value());
  BOOST_TEST(!profile_to_json(old).contains("corun_slowdown"));
  BOOST_TEST(!profile_to_json(old).contains("wakeup_latency_s"));
  j["corun_slowdown"] = {{0.5, 1.0}, {1, 1.05}, {2, 1.3}};
  j["wakeup_latency_s"] = 4e-4;
  const CalibrationProfile p = full_speed_profile(profile_from_json(j));
  BOOST_TEST(p.corun_slowdown.size() == 3u);
  BOOST_TEST(p.corun_slowdown[2].second == 1.3);
  BOOST_TEST(*p.wakeup_latency_s == 4e-4);
  const nlohmann::json back = profile_to_json(p);
  BOOST_TEST(back.at("corun_slowdown") == j["corun_slowdown"]);
  BOOST_TEST(back.at("wakeup_latency_s").get<double>() == 4e-4);
  j["corun_slowdown"] = {{1, 1.05}, {0.5, 1.0}};
  expect_error([&] { profile_from_json(j); }, "profile.corun_slowdown[1]");
  j["corun_slowdown"] = {{1, 0.1}};
  expect_error([&] { profile_from_json(j); }, "profile.corun_slowdown[0]");
  j.erase("corun_slowdown");
  j["wakeup_latency_s"] = -1;
  expect_error([&] { profile_from_json(j); }, "profile.wakeup_latency_s");
}

BOOST_AUTO_TEST_CASE(without_the_fields_predictions_are_unchanged_and_with_them_slower) {
  const SimResult none = four_ranks(nlohmann::json::object(), "none");
  const SimResult neutral =
      four_ranks({{"corun_slowdown", {{0.5, 1.0}, {2, 1.0}}}, {"wakeup_latency_s", 0.0}}, "neutral");
  BOOST_TEST(neutral.step_time_s == none.step_time_s);  // bit-identical
  const SimResult slow = four_ranks({{"corun_slowdown", {{0.5, 1.0}, {1, 1.1}, {2, 1.3}}}}, "slow");
  BOOST_TEST(slow.step_time_s > 1.2 * none.step_time_s);  // the step is compute: 4 ranks on 2 cores, x 1.3
  BOOST_TEST(slow.step_time_s < 1.31 * none.step_time_s);
  const SimResult woken = four_ranks({{"wakeup_latency_s", 1e-3}}, "woken");
  BOOST_TEST(woken.step_time_s > none.step_time_s + 1e-3);  // the all-reduce's receives wait
  // a core per rank: the latency is never paid
  BOOST_TEST(four_ranks({{"wakeup_latency_s", 1e-3}}, "woken4", 4).step_time_s ==
             four_ranks(nlohmann::json::object(), "none4", 4).step_time_s);
}

// The bottleneck names what holds the CPU below full speed: four ranks on two vCPUs without credits were reported as
// "CPU credits (throttled to the baseline share)" (a t2 node's words for every slowdown).
BOOST_AUTO_TEST_CASE(the_bottleneck_names_shared_cores_a_quota_or_credits_not_always_credits) {
  const SimResult shared = four_ranks(nlohmann::json::object(), "cause");
  BOOST_TEST(shared.cpu_slowdown == "4 ranks time-sliced on 2 vCPU(s)");
  BOOST_TEST(shared.throttled_s > shared.comm_exposed_s);  // the step is compute: the CPU line is the bottleneck
  BOOST_TEST(shared.bottleneck.find("CPU below full speed (4 ranks time-sliced on 2 vCPU(s))") == 0u, shared.bottleneck);
  BOOST_TEST(shared.bottleneck.find("credits") == std::string::npos, shared.bottleneck);
  BOOST_TEST(four_ranks(nlohmann::json::object(), "cause4", 4).cpu_slowdown.empty());
  const auto causes = [](const std::string& node) {
    return simulate(parse_cluster(R"({"nodes": [)" + node + "]}"), tandem::simulator::testing::lenet5_ddp(2, ""),
                    {.baseline = false})
        .cpu_slowdown;
  };
  BOOST_TEST(causes(R"({"preset": "t2.micro", "count": 2, "credit_mode": "standard"})") ==
             "CPU credits: throttled to the baseline share");
  BOOST_TEST(causes(R"({"preset": "t2.micro", "count": 2, "credit_mode": "unlimited"})").empty());
  BOOST_TEST(causes(R"({"preset": "c5.large", "count": 2, "cpu_quota": 0.5})") ==
             "a CFS quota of 0.5 core(s) on 2 vCPU(s)");
}

BOOST_AUTO_TEST_SUITE_END()
