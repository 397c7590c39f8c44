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

comm::PlanRequest request(const Case& c, comm::Algorithm algo = comm::Algorithm::kRing) {
  comm::PlanRequest req;
  req.world = c.n;
  req.algorithm = algo;
  req.count = c.bucket_bytes / 4;
  req.chunk_bytes = c.chunk_bytes;
  req.in_place = true;
  return req;
}

StepResult run_plan(const Case& c, bool symmetric, const CompiledPlan& plan, double skew = 0) {
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

StepResult run(const Case& c, bool symmetric, comm::Algorithm algo = comm::Algorithm::kRing, double skew = 0) {
  PlanCache cache;
  return run_plan(c, symmetric, cache.get(request(c, algo)), skew);
}

void require_same_times(const StepResult& a, const StepResult& b) {
  BOOST_TEST(a.step_s == b.step_s);
  BOOST_REQUIRE(a.ranks.size() == b.ranks.size());
  for (size_t r = 0; r < a.ranks.size(); ++r) {
    BOOST_TEST(a.ranks[r].finish_s == b.ranks[r].finish_s);
    BOOST_TEST(a.ranks[r].comm_exposed_s == b.ranks[r].comm_exposed_s);
    BOOST_TEST(a.ranks[r].idle_s == b.ranks[r].idle_s);
    BOOST_TEST(a.ranks[r].cpu_busy_s == b.ranks[r].cpu_busy_s);
  }
  BOOST_TEST(a.events == b.events);
  BOOST_TEST(a.flows == b.flows);
}

// Two full forms hold the same ops, dependencies, matched transfers and mirrors.
void require_same_plan(const CompiledPlan& a, const CompiledPlan& b) {
  BOOST_TEST(a.world == b.world);
  BOOST_TEST(a.members == b.members);
  BOOST_TEST(a.first_op == b.first_op);
  BOOST_REQUIRE(a.ops.size() == b.ops.size());
  for (size_t i = 0; i < a.ops.size(); ++i) {
    const auto &x = a.ops[i], &y = b.ops[i];
    BOOST_TEST((x.bytes == y.bytes && x.succ_begin == y.succ_begin && x.deps == y.deps && x.fifo_next == y.fifo_next &&
                x.link == y.link && x.peer == y.peer && x.kind == y.kind),
               "op " << i);
  }
  BOOST_TEST(a.succs == b.succs);
  BOOST_TEST(a.rotation_symmetric == b.rotation_symmetric);
  BOOST_TEST(a.mirror_recv == b.mirror_recv);
  BOOST_TEST(a.total_bytes_sent() == b.total_bytes_sent());
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

// The symmetric form (member 0 alone, proven rank by rank) runs exactly as the full form does, in
// symmetric execution and, through full(), in the full model.
BOOST_DATA_TEST_CASE(symmetric_form_gives_the_full_forms_times, bdata::make({2, 3, 5, 16, 33}) * bdata::make({0, 1}),
                     n, variant) {
  Case c{n, 4ull * 2640 * 100, 2, variant == 1 ? 256 * 1024ull : 4096ull, network::Sharing::kMaxMin};
  const comm::PlanRequest req = request(c);
  const CompiledPlan old = compile_plan(comm::make_plan(req), 4);
  const auto sym = compile_symmetric(req);
  BOOST_REQUIRE(sym.has_value());
  BOOST_TEST(sym->members == 1);
  BOOST_TEST(sym->rotation_symmetric);
  BOOST_TEST(sym->total_bytes_sent() == old.total_bytes_sent());
  BOOST_TEST(sym->sends * static_cast<uint64_t>(n) == old.sends);
  const StepResult a = run_plan(c, true, old), b = run_plan(c, true, *sym);
  BOOST_TEST(b.symmetric_used);
  require_same_times(a, b);
  const StepResult fa = run_plan(c, false, old), fb = run_plan(c, false, *sym);  // full model from full()
  BOOST_TEST(!fb.symmetric_used);
  require_same_times(fa, fb);
  require_same_plan(sym->full(), old);
}

// Built rank by rank from make_rank_plan, the full form equals the one compiled from make_plan
// (algorithms 1 ring, 6 deterministic, 2 halving-doubling, 3 tree).
BOOST_DATA_TEST_CASE(full_form_by_rank_equals_the_whole_plans,
                     bdata::make({1, 6, 2, 3}) *
                         bdata::make({2, 7, 65, 300}),
                     algo, n) {
  comm::PlanRequest req;
  req.world = n;
  req.algorithm = static_cast<comm::Algorithm>(algo);
  req.count = 1000ull * 7 + 3;  // unequal segments: not symmetric
  req.chunk_bytes = 4 * 64;
  req.in_place = true;
  require_same_plan(compile_plan_by_rank(req), compile_plan(comm::make_plan(req), 4));
  req.count = 2100ull * 300;  // equal segments for every n here
  require_same_plan(compile_plan_by_rank(req), compile_plan(comm::make_plan(req), 4));
}

BOOST_AUTO_TEST_CASE(symmetric_form_is_refused_where_ranks_are_not_rotations) {
  comm::PlanRequest req;
  req.world = 8;
  req.algorithm = comm::Algorithm::kRing;
  req.count = 8 * 1000 + 1;  // one segment longer than the others
  BOOST_TEST(!compile_symmetric(req).has_value());
  req.count = 8 * 1000;
  BOOST_TEST(compile_symmetric(req).has_value());
  req.algorithm = comm::Algorithm::kHalvingDoubling;
  BOOST_TEST(!compile_symmetric(req).has_value());
  req.algorithm = comm::Algorithm::kDeterministic;  // owners gather in rank order: not a rotation
  BOOST_TEST(!compile_symmetric(req).has_value());
  req.algorithm = comm::Algorithm::kRing;
  req.world = 1;
  BOOST_TEST(!compile_symmetric(req).has_value());
}

// Above kRankByRankWorld the cache holds the symmetric form; its times are the full forms'.
BOOST_AUTO_TEST_CASE(large_worlds_get_the_symmetric_form_with_the_same_times) {
  Case c{300, 4ull * 300 * 64, 1, 0, network::Sharing::kMaxMin};
  PlanCache cache;
  const CompiledPlan& p = cache.get(request(c));
  BOOST_TEST(p.members == 1);
  const CompiledPlan old = compile_plan(comm::make_plan(request(c)), 4);
  BOOST_TEST(p.description == old.description);
  require_same_times(run_plan(c, true, p), run_plan(c, true, old));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(symmetric_execution_unequal_segments)

// A ring whose count the world does not divide gives segments one element apart: every rank runs
// rank 0's graph (proven rank by rank) but moves a little more or less. The bounded form times every
// rank as the most any rank moves op by op: never below the full model, and above it by at most the
// time of those extra elements (a few nanoseconds per step at 1 Gbit/s).
BOOST_DATA_TEST_CASE(bounded_form_bounds_the_full_model_tightly, bdata::make({3, 5, 8, 33}), n) {
  Case c{n, 4ull * (static_cast<uint64_t>(n) * 2640 + 7), 2, 0, network::Sharing::kMaxMin};
  const comm::PlanRequest req = request(c);
  BOOST_TEST(!compile_symmetric(req).has_value());  // sizes differ: not exact
  const auto sym = compile_symmetric(req, /*bound_sizes=*/true);
  BOOST_REQUIRE(sym.has_value());
  BOOST_TEST(sym->members == 1);
  BOOST_TEST(sym->sizes_bounded);
  const CompiledPlan old = compile_plan(comm::make_plan(req), 4);
  BOOST_TEST(!old.rotation_symmetric);
  BOOST_TEST(sym->total_bytes_sent() == old.total_bytes_sent());  // the true total, not the bound's
  BOOST_TEST(sym->transfers() == old.transfers());
  const StepResult full = run_plan(c, false, old), bound = run_plan(c, true, *sym);
  BOOST_TEST(!full.symmetric_used);
  BOOST_REQUIRE(bound.symmetric_used);
  BOOST_TEST(bound.step_s >= full.step_s);
  // one element more per transfer at 1.25e8 B/s is 32 ns; a rank's critical path crosses at most
  // 2(n - 1) steps of a bucket, two buckets
  BOOST_TEST(bound.step_s - full.step_s <= 4.0 * n * 40e-9, bound.step_s << " vs " << full.step_s);
}

// Segments cut into several chunks, one element apart, put chunk borders at different places on
// different ranks: which regions overlap is not rank 0's, so no symmetric form is claimed.
BOOST_AUTO_TEST_CASE(bounded_form_is_refused_where_overlaps_differ) {
  Case c{8, 4ull * (8 * 2640 + 7), 1, 4096, network::Sharing::kMaxMin};
  BOOST_TEST(!compile_symmetric(request(c), /*bound_sizes=*/true).has_value());
  c.bucket_bytes = 4ull * 8 * 2640;  // equal segments: exact
  BOOST_TEST(compile_symmetric(request(c), /*bound_sizes=*/true).has_value());
}

// The sampled proof (SymmetryProof::kRingSample, what the cache uses above kRankByRankWorld) reads about 80 ranks
// instead of all of them and must reach the every-rank proof's plan: the same ops, bounds, dependencies, mirrors and
// exact byte total, so the same step to the nanosecond. 300 ranks: vgg16's first bucket (7,087,626 elements: 26
// segments one element longer), one long segment, all but one long, and equal segments.
BOOST_DATA_TEST_CASE(the_sampled_proof_gives_the_every_rank_proofs_plan,
                     bdata::make({7087626ull, 300ull * 5000 + 1, 300ull * 5000 + 299, 300ull * 5000}), count) {
  Case c{300, 4 * count, 1, 0, network::Sharing::kMaxMin};
  const comm::PlanRequest req = request(c);
  const auto every = compile_symmetric(req, /*bound_sizes=*/true, SymmetryProof::kEveryRank);
  const auto sampled = compile_symmetric(req, /*bound_sizes=*/true, SymmetryProof::kRingSample);
  BOOST_REQUIRE(every.has_value());
  BOOST_REQUIRE(sampled.has_value());
  BOOST_TEST(sampled->sizes_bounded == (count % 300 != 0));
  BOOST_TEST(sampled->exact_bytes_sent == every->exact_bytes_sent);
  require_same_plan(*sampled, *every);
  require_same_times(run_plan(c, true, *sampled), run_plan(c, true, *every));
  // and the cache's plan is the sampled one
  PlanCache cache;
  require_same_plan(cache.get(req), *every);
}

// Where ranks are not rotations the sampled proof refuses as the every-rank one does: segments of several chunks
// one element apart (not whole-segment ops: every rank is read), and a plan that is not a ring.
BOOST_AUTO_TEST_CASE(the_sampled_proof_refuses_what_the_every_rank_proof_refuses) {
  Case c{300, 4ull * (300 * 2640 + 7), 1, 4096, network::Sharing::kMaxMin};
  BOOST_TEST(!compile_symmetric(request(c), true, SymmetryProof::kRingSample).has_value());
  Case hd{300, 4ull * 300 * 2640, 1, 0, network::Sharing::kMaxMin};
  BOOST_TEST(!compile_symmetric(request(hd, comm::Algorithm::kHalvingDoubling), true, SymmetryProof::kRingSample)
                  .has_value());
}

// Above kRankByRankWorld the cache keeps one rank's ops for such a ring, so memory and events grow
// with the ops of one rank (O(world)), not with every rank's (O(world^2)): a structural guard for
// the 1,024-rank vgg16 regression (issue #16), where the full form held 3.8 GB.
BOOST_AUTO_TEST_CASE(large_unequal_rings_keep_one_ranks_ops) {
  std::vector<size_t> held;
  std::vector<uint64_t> events;
  for (int n : {300, 600}) {
    Case c{n, 4ull * (static_cast<uint64_t>(n) * 64 + 5), 1, 0, network::Sharing::kMaxMin};
    PlanCache cache;
    const CompiledPlan& p = cache.get(request(c));
    BOOST_TEST(p.members == 1);
    BOOST_TEST(p.sizes_bounded);
    BOOST_TEST(p.transfers() == 2ull * n * (n - 1));  // every rank's transfers are still counted
    const StepResult r = run_plan(c, true, p);
    BOOST_TEST(r.symmetric_used);
    held.push_back(p.bytes_held());
    events.push_back(r.events);
  }
  // doubling the world doubles one rank's ops; the full form would hold and run four times as many
  BOOST_TEST(static_cast<double>(held[1]) <= 2.2 * static_cast<double>(held[0]), held[1] << " vs " << held[0]);
  BOOST_TEST(static_cast<double>(events[1]) <= 2.2 * static_cast<double>(events[0]), events[1] << " vs " << events[0]);
}

BOOST_AUTO_TEST_SUITE_END()
