// One simulated training step against closed forms.
#include <cmath>

#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include "engine/comm/plan.hpp"
#include "simulator/step.hpp"
#include "tests/simulator/printers.hpp"
#include "tests/simulator/step_fixture.hpp"

using namespace tandem::simulator;
using namespace tandem::engine;
namespace bdata = boost::unit_test::data;
namespace tt = boost::test_tools;

namespace {
using testing::Bench;

// A data-parallel step with no compute: one bucket of `bytes` all-reduced with `algo`.
StepSetup ddp_allreduce_only(int n, uint64_t bytes, comm::Algorithm algo, PlanCache& cache, uint64_t chunk_bytes) {
  return testing::ddp_allreduce_step(cache.get(testing::allreduce_request(n, algo, bytes, chunk_bytes)));
}
}  // namespace

BOOST_AUTO_TEST_SUITE(step_closed_forms)

// Ring all-reduce of S bytes over n ranks with per-node bandwidth B and one-way latency L: 2(n-1)
// rounds, each moving S/n bytes over every NIC at full rate: 2(n-1)/n * S/B + 2(n-1) * L.
BOOST_DATA_TEST_CASE(ring_allreduce_matches_the_textbook_formula, bdata::make({2, 3, 4, 8, 16}), n) {
  const double B = 1e9 / 8, L = 50e-6;
  const uint64_t S = 4ull * 1000 * 1000 * 48;  // divisible by 4 * n for every n above (symmetric execution is checked separately)
  PlanCache cache;
  Bench b(n, B, L);
  StepResult r = b.run(ddp_allreduce_only(n, S, comm::Algorithm::kRing, cache, S));  // one chunk per step
  const double expect = 2.0 * (n - 1) / n * S / B + 2.0 * (n - 1) * L;
  BOOST_TEST(r.step_s == expect, tt::tolerance(1e-6));
  for (const RankBreakdown& rk : r.ranks) BOOST_TEST(rk.comm_exposed_s == expect, tt::tolerance(1e-6));
}

// The bubble of a pipeline with S equal stages and M micro-batches is (S-1)/(M+S-1) of the step,
// and the step is (M+S-1)(tf+tb), for GPipe and for 1F1B alike (free communication).
BOOST_DATA_TEST_CASE(pipeline_bubble_is_s_minus_1_over_m_plus_s_minus_1,
                     bdata::make({parallel::ScheduleKind::kGPipe, parallel::ScheduleKind::kOneFOneB}) *
                         bdata::make({2, 4, 5}) * bdata::make({1, 4, 8}),
                     kind, S, M) {
  const double tf = 0.010, tb = 0.020;
  parallel::ScheduleRequest sr;
  sr.kind = kind;
  sr.micro_batches = M;
  for (int s = 0; s <= S; ++s) sr.boundaries.push_back(s);
  StepSetup st;
  st.pipeline = parallel::make_pipeline_plan(sr);
  st.dp = 1;
  st.pp = S;
  st.boundary_bytes.assign(S - 1, std::vector<double>(M, 0.0));
  for (int s = 0; s < S; ++s) {
    RankSetup rs;
    rs.forward_s.assign(M, tf);
    rs.backward_s.assign(M, tb);
    st.ranks.push_back(rs);
  }
  Bench b(S, 1e9, 0);
  StepResult r = b.run(st);
  BOOST_TEST(r.step_s == (M + S - 1) * (tf + tb), tt::tolerance(1e-6));
  double bubble = 0;
  for (const RankBreakdown& rk : r.ranks) {
    bubble += rk.bubble_s;
    BOOST_TEST(rk.compute_s + rk.bubble_s + rk.comm_exposed_s + rk.idle_s + rk.throttled_s == r.step_s,
               tt::tolerance(1e-6));
  }
  BOOST_TEST(bubble / (S * r.step_s) == double(S - 1) / (M + S - 1), tt::tolerance(1e-6));
}

// Messages from one stage to the next travel in order, one at a time, as over the runtime's single
// connection per peer: with 10 ms per activation and 1 ms forwards, stage 1 starts micro-batch m at
// 11 + 10m ms (concurrent flows sharing the link would deliver micro-batch 0 only at ~31 ms).
// Gradients likewise (GPipe: backward m = 3..0 on stage 1 at 42..46 ms, arriving at 53, 63, 73, 83).
BOOST_AUTO_TEST_CASE(messages_to_one_neighbour_arrive_in_order_one_at_a_time) {
  const int M = 4;
  parallel::ScheduleRequest sr;
  sr.kind = parallel::ScheduleKind::kGPipe;
  sr.micro_batches = M;
  sr.boundaries = {0, 1, 2};
  StepSetup st;
  st.pipeline = parallel::make_pipeline_plan(sr);
  st.dp = 1;
  st.pp = 2;
  st.record_trace = true;
  st.boundary_bytes.assign(1, std::vector<double>(M, 1e6));  // 10 ms at 100 MB/s
  for (int s = 0; s < 2; ++s) {
    RankSetup rs;
    rs.forward_s.assign(M, 0.001);
    rs.backward_s.assign(M, 0.001);
    st.ranks.push_back(rs);
  }
  Bench b(2, 1e8, 0);
  StepResult r = b.run(st);
  for (int m = 0; m < M; ++m) {
    bool found = false;
    for (const TraceSpan& t : r.trace)
      if (t.rank == 1 && t.name == "forward mb" + std::to_string(m)) {
        BOOST_TEST(t.start_s == 0.011 + 0.010 * m, tt::tolerance(1e-9));
        found = true;
      }
    BOOST_TEST(found, "no forward of micro-batch " << m << " on stage 1");
  }
  BOOST_TEST(r.step_s == 0.084, tt::tolerance(1e-9));
}

// Overlap: with backward much longer than the all-reduce of each bucket, only the last bucket's
// all-reduce is exposed; without overlap, all of them are.
BOOST_AUTO_TEST_CASE(bucketed_allreduce_overlaps_backward) {
  const int n = 4, buckets = 4;
  const double B = 1e9 / 8, L = 0;
  const uint64_t bucket = 4ull * 1000 * 1000;  // 4 MB: 2*3/4*4e6/1.25e8 = 48 ms per bucket
  PlanCache cache;
  parallel::ScheduleRequest sr;
  sr.boundaries = {0, buckets};
  sr.data_parallel = true;
  sr.layer_grad_bytes.assign(buckets, bucket);
  sr.bucket_bytes = bucket;
  comm::PlanRequest req;
  req.world = n;
  req.algorithm = comm::Algorithm::kRing;
  req.count = bucket / 4;
  req.chunk_bytes = bucket;
  req.in_place = true;
  const CompiledPlan* plan = &cache.get(req);
  const double t_ar = 2.0 * (n - 1) / n * bucket / B;
  for (bool overlap : {true, false}) {
    StepSetup s;
    s.pipeline = parallel::make_pipeline_plan(sr);
    BOOST_REQUIRE_EQUAL(s.pipeline.stage_plans[0].buckets.size(), size_t(buckets));
    s.dp = n;
    s.bucket_plans = {std::vector<const CompiledPlan*>(buckets, plan)};
    s.overlap = overlap;
    for (int r = 0; r < n; ++r) {
      RankSetup rs;
      rs.forward_s = {0.1};
      rs.backward_s = {0.4};
      rs.bucket_backward_s.assign(buckets, 0.1);
      s.ranks.push_back(rs);
    }
    Bench b(n, B, L);
    StepResult r = b.run(s);
    const double expect = overlap ? 0.5 + t_ar : 0.5 + buckets * t_ar;
    BOOST_TEST(r.step_s == expect, tt::tolerance(1e-6));
    BOOST_TEST(r.ranks[0].comm_exposed_s == expect - 0.5, tt::tolerance(1e-5));
  }
}

BOOST_AUTO_TEST_CASE(slower_cpus_show_up_as_throttled_time) {
  parallel::ScheduleRequest sr;
  sr.boundaries = {0, 1};
  StepSetup s;
  s.pipeline = parallel::make_pipeline_plan(sr);
  RankSetup rs;
  rs.speed = 0.1;  // a t2.micro held to its 10% baseline
  rs.forward_s = {1};
  rs.backward_s = {2};
  rs.optimizer_s = 0.5;
  s.ranks = {rs};
  Bench b(1, 1e9, 0);
  StepResult r = b.run(s);
  BOOST_TEST(r.step_s == 35.0, tt::tolerance(1e-9));
  BOOST_TEST(r.ranks[0].compute_s == 3.5, tt::tolerance(1e-9));
  BOOST_TEST(r.ranks[0].throttled_s == 31.5, tt::tolerance(1e-9));
}

BOOST_AUTO_TEST_CASE(runs_are_reproducible_to_the_bit) {
  auto once = [] {
    PlanCache cache;
    Bench b(6, 1e8, 1e-4);
    StepSetup s = ddp_allreduce_only(6, 6ull * 4 * 100003, comm::Algorithm::kHalvingDoubling, cache, 0);
    for (int r = 0; r < 6; ++r) s.ranks[r].local_bytes_per_s = 5e9 + r * 1e8;  // uneven reductions
    return b.run(s);
  };
  StepResult a = once(), c = once();
  BOOST_TEST(a.step_s == c.step_s);
  BOOST_TEST(a.events == c.events);
  for (size_t r = 0; r < a.ranks.size(); ++r) BOOST_TEST(a.ranks[r].finish_s == c.ranks[r].finish_s);
}

BOOST_AUTO_TEST_SUITE_END()
