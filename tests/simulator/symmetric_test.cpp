// Symmetric execution (rank 0 standing for every rank) gives the same times as the full model, and is
// used only where the ranks are provably identical.
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include "engine/comm/plan.hpp"
#include "simulator/step.hpp"

using namespace tandem::simulator;
using namespace tandem::engine;
namespace bdata = boost::unit_test::data;

namespace {
struct Case {
  int n;
  uint64_t bucket_bytes;
  int buckets;
  uint64_t chunk_bytes;
  network::Sharing sharing;
};

StepResult run(const Case& c, bool symmetric, comm::Algorithm algo = comm::Algorithm::kRing, double skew = 0) {
  PlanCache cache;
  comm::PlanRequest req;
  req.world = c.n;
  req.algorithm = algo;
  req.count = c.bucket_bytes / 4;
  req.chunk_bytes = c.chunk_bytes;
  req.in_place = true;
  const CompiledPlan& plan = cache.get(req);
  parallel::ScheduleRequest sr;
  sr.boundaries = {0, c.buckets};
  sr.data_parallel = true;
  sr.layer_grad_bytes.assign(c.buckets, c.bucket_bytes);
  sr.bucket_bytes = c.bucket_bytes;
  StepSetup s;
  s.pipeline = parallel::make_pipeline_plan(sr);
  s.dp = c.n;
  s.symmetric = symmetric;
  s.bucket_plans = {std::vector<const CompiledPlan*>(c.buckets, &plan)};
  for (int r = 0; r < c.n; ++r) {
    RankSetup rs;
    rs.forward_s = {0.003};
    rs.backward_s = {0.006 + (r == 1 ? skew : 0)};
    rs.bucket_backward_s.assign(c.buckets, 0.006 / c.buckets + (r == 1 ? skew / c.buckets : 0));
    rs.optimizer_s = 0.001;
    rs.local_bytes_per_s = 2e9;  // reductions take time too
    s.ranks.push_back(rs);
  }
  std::vector<network::HostNet> hosts(c.n);
  for (auto& h : hosts) {
    h.nic_bytes_per_s = 1.25e8;
    h.nic_latency_s = 40e-6;
  }
  des::Simulator sim;
  network::Network net(sim, c.sharing);
  network::Topology topo(network::TopologySpec{}, hosts, net);
  return simulate_step(s, topo, sim);
}
}  // namespace

BOOST_AUTO_TEST_SUITE(symmetric_execution)

// Ring plans (2640 * 100 elements: equal segments for every n below) with one or several chunks per step (several concurrent flows per NIC), one to three
// buckets overlapping backward, local reductions, both sharing rules.
BOOST_DATA_TEST_CASE(gives_the_same_times_as_the_full_model,
                     bdata::make({2, 3, 4, 5, 8, 16, 33}) * bdata::make({0, 1, 2}), n, variant) {
  Case c{n, 4ull * 2640 * 100, 1 + variant, variant == 1 ? 256 * 1024ull : 0,
         variant == 2 ? network::Sharing::kRttWeighted : network::Sharing::kMaxMin};
  StepResult full = run(c, false), sym = run(c, true);
  BOOST_TEST(!full.symmetric_used);
  BOOST_REQUIRE(sym.symmetric_used);
  BOOST_TEST(sym.step_s == full.step_s);
  for (int r = 0; r < n; ++r) {
    BOOST_TEST(sym.ranks[r].finish_s == full.ranks[r].finish_s);
    BOOST_TEST(sym.ranks[r].comm_exposed_s == full.ranks[r].comm_exposed_s);
    BOOST_TEST(sym.ranks[r].cpu_busy_s == full.ranks[r].cpu_busy_s);
  }
  BOOST_TEST(sym.flows * n == full.flows);  // one rank's flows stand for all of them
}

BOOST_AUTO_TEST_CASE(is_not_used_when_ranks_differ_or_plans_are_not_rotations) {
  Case c{8, 4ull * 8 * 1000, 1, 0, network::Sharing::kMaxMin};
  BOOST_TEST(!run(c, true, comm::Algorithm::kRing, 0.001).symmetric_used);          // one slower rank
  BOOST_TEST(!run(c, true, comm::Algorithm::kHalvingDoubling).symmetric_used);      // XOR, not rotation
  BOOST_TEST(!run(c, true, comm::Algorithm::kTree).symmetric_used);
  Case uneven{8, 4ull * 8 * 1000 + 4, 1, 0, network::Sharing::kMaxMin};            // unequal ring segments
  BOOST_TEST(!run(uneven, true).symmetric_used);
}

BOOST_AUTO_TEST_SUITE_END()
