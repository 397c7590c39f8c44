// Gradient compression (fp16/bf16 on the wire, engine/parallel/grad_reducer.cpp): half the all-reduced
// bytes, each bucket converted on the training thread before its all-reduce and all of them back
// before the optimizer.
#include <algorithm>
#include <cstdio>

#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include "engine/core/error.hpp"
#include "engine/nn/zoo.hpp"
#include "simulator/compute/workload.hpp"
#include "simulator/presets.hpp"
#include "simulator/simulate.hpp"
#include "tests/simulator/profile_fixture.hpp"

using namespace tandem::simulator;
using namespace tandem::engine;
namespace tt = boost::test_tools;
namespace bdata = boost::unit_test::data;

namespace {

// Two ranks, one bucket of 100,000 f32 gradients, 1 Gbit/s NICs without latency, free reductions.
StepResult two_rank_step(bool compress, bool overlap, bool symmetric = true) {
  PlanCache cache;
  comm::PlanRequest req;
  req.world = 2;
  req.algorithm = comm::Algorithm::kRing;
  req.count = 100000;
  req.elem_bytes = compress ? 2 : 4;
  req.in_place = true;
  parallel::ScheduleRequest sr;
  sr.boundaries = {0, 1};
  sr.data_parallel = true;
  sr.layer_grad_bytes = {400000};
  sr.bucket_bytes = 400000;
  StepSetup s;
  s.pipeline = parallel::make_pipeline_plan(sr);
  s.dp = 2;
  s.overlap = overlap;
  s.symmetric = symmetric;
  s.bucket_plans = {{&cache.get(req)}};
  for (int r = 0; r < 2; ++r) {
    RankSetup rs;
    rs.forward_s = {0.003};
    rs.backward_s = {0.006};
    rs.bucket_backward_s = {0.006};
    rs.optimizer_s = 0.001;
    if (compress) {
      rs.bucket_compress_s = {0.0005};
      rs.decompress_s = 0.0007;
    }
    s.ranks.push_back(rs);
  }
  std::vector<network::HostNet> hosts(2);
  for (auto& h : hosts) h.nic_bytes_per_s = 1.25e8;
  des::Simulator sim;
  network::Network net(sim);
  network::Topology topo(network::TopologySpec{}, hosts, net);
  return simulate_step(s, topo, sim);
}

JobSpec ddp_job(const std::string& compression) {
  JobSpec j;
  j.model = "resnet18";
  j.batch = 64;
  j.epochs = 0.05;
  j.strategy = Strategy::kDdp;
  j.compression = parallel::parse_compression(compression);
  return j;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(gradient_compression)

// Ring all-reduce on 2 ranks moves S/B (two steps of S/2 each way): 3.2 ms for 400 kB at 125 MB/s,
// 1.6 ms for the 200 kB of fp16. The conversions sit on the training thread, in series with it.
BOOST_DATA_TEST_CASE(halves_the_wire_time_and_adds_the_conversions, bdata::make({false, true}), overlap) {
  const StepResult f32 = two_rank_step(false, overlap), f16 = two_rank_step(true, overlap);
  BOOST_TEST(f32.step_s == 0.003 + 0.006 + 0.0032 + 0.001, tt::tolerance(1e-9));
  BOOST_TEST(f16.step_s == 0.003 + 0.006 + 0.0005 + 0.0016 + 0.0007 + 0.001, tt::tolerance(1e-9));
  BOOST_TEST(f16.symmetric_used);  // equal ranks, equal segments
  BOOST_TEST(two_rank_step(true, overlap, false).step_s == f16.step_s);
  for (const RankBreakdown& r : f16.ranks) {
    BOOST_TEST(r.comm_exposed_s == 0.0016, tt::tolerance(1e-9));
    BOOST_TEST(r.compute_s == 0.003 + 0.006 + 0.0005 + 0.0007 + 0.001, tt::tolerance(1e-9));
  }
}

// End to end: the runtime's bucket plans in 2-byte elements, a conversion pass per gradient element
// each way (the runtime's per-element cost, or 6 bytes at the node's memory bandwidth if slower), and
// every bucket's 16-bit copy in the memory need.
BOOST_AUTO_TEST_CASE(jobs_compress_from_the_job_option) {
  const ClusterSpec c = parse_cluster("c5.large:4");
  const SimResult none = simulate(c, ddp_job("none"), {.baseline = false});
  const SimResult fp16 = simulate(c, ddp_job("fp16"), {.baseline = false});
  const SimResult bf16 = simulate(c, ddp_job("bf16"), {.baseline = false});
  BOOST_TEST(none.compression == "none");
  BOOST_TEST(fp16.compression == "fp16");
  BOOST_TEST(fp16.to_json()["compression"] == "fp16");
  const Workload w = make_workload(nn::zoo_model("resnet18", {3, 32, 32}, 10));
  const double params = w.param_bytes(0, w.layers.size());
  const double byte_s = 6 / find_preset("c5.large").mem_bytes_per_s;  // a memory-bound pass, per element
  const double fp16_pass = std::max(byte_s, kDefaultFp16ToS) + std::max(byte_s, kDefaultFp16BackS);
  const double bf16_pass = std::max(byte_s, kDefaultBf16ToS) + std::max(byte_s, kDefaultBf16BackS);
  BOOST_TEST(fp16.compute_s - none.compute_s == params / 4 * fp16_pass * fp16.total_steps, tt::tolerance(1e-4));
  BOOST_TEST(bf16.compute_s - none.compute_s == params / 4 * bf16_pass * bf16.total_steps, tt::tolerance(1e-4));
  BOOST_TEST(fp16.comm_exposed_s < none.comm_exposed_s);
  BOOST_TEST(fp16.memory_per_node_bytes - none.memory_per_node_bytes == params / 2, tt::tolerance(1e-9));
  BOOST_TEST(bf16.memory_per_node_bytes == fp16.memory_per_node_bytes);
  BOOST_TEST(fp16.symmetric_used == none.symmetric_used, fp16.symmetric_used << " vs " << none.symmetric_used);
  JobSpec full = ddp_job("fp16");
  full.symmetric = false;
  BOOST_TEST(simulate(c, full, {.baseline = false}).step_time_s == fp16.step_time_s);
  // a single replica has nothing to all-reduce: compression changes nothing
  JobSpec one = ddp_job("fp16");
  one.strategy = Strategy::kSingle;
  JobSpec one_none = ddp_job("none");
  one_none.strategy = Strategy::kSingle;
  BOOST_TEST(simulate(c, one, {.baseline = false}).step_time_s == simulate(c, one_none, {.baseline = false}).step_time_s);
}

// A profile's measured conversion replaces the defaults (10 ns to, 20 ns back per element: slower
// than any memory pass here).
BOOST_AUTO_TEST_CASE(profiles_give_the_conversion_cost) {
  JobSpec j;
  j.model = "lenet5";
  j.dataset = "fashion-mnist";
  j.batch = 64;
  j.epochs = 0.05;
  j.strategy = Strategy::kDdp;
  j.profile = testing::write_lenet5_profile("/tmp/tandem_sim_convert_profile.json",
                                            {{"fp16_convert_s", {1e-8, 2e-8}}});
  const ClusterSpec c = parse_cluster("c5.large:2");
  const SimResult none = simulate(c, j, {.baseline = false});
  j.compression = parallel::GradCompression::kF16;
  const SimResult fp16 = simulate(c, j, {.baseline = false});
  const Workload w = make_workload(nn::zoo_model("lenet5", {1, 28, 28}, 10));
  const double elements = w.param_bytes(0, w.layers.size()) / 4;
  BOOST_TEST(fp16.compute_s - none.compute_s == elements * 3e-8 * fp16.total_steps, tt::tolerance(1e-4));
  testing::write_lenet5_profile("/tmp/tandem_sim_convert_profile.json", {{"fp16_convert_s", {1e-8}}});
  try {
    simulate(c, j, {.baseline = false});
    BOOST_ERROR("a one-element fp16_convert_s was accepted");
  } catch (const tandem::Error& e) {
    BOOST_TEST(std::string(e.what()).find("fp16_convert_s") != std::string::npos, e.what());
  }
  std::remove("/tmp/tandem_sim_convert_profile.json");
}

BOOST_AUTO_TEST_CASE(job_json_takes_compression_and_names_bad_values) {
  BOOST_TEST((parse_job_text(R"({"compression": "bf16"})").compression == parallel::GradCompression::kBF16));
  BOOST_TEST((parse_job_text(R"({"compression": "none"})").compression == parallel::GradCompression::kNone));
  try {
    parse_job_text(R"({"compression": "int8"})");
    BOOST_ERROR("int8 was accepted");
  } catch (const tandem::Error& e) {
    BOOST_TEST(std::string(e.what()).find("job.compression") != std::string::npos, e.what());
  }
}

BOOST_AUTO_TEST_SUITE_END()
