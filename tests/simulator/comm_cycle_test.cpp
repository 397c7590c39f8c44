// A framework whose collectives start from a background loop running in cycles (StepSetup::comm_cycle_s, job JSON
// comm_cycle_ms; Horovod's HOROVOD_CYCLE_TIME): bucket all-reduces wait for the loop's next cycle, against the
// timeline worked out by hand from one bucket's measured all-reduce time X.
#include <boost/test/unit_test.hpp>

#include "engine/comm/plan.hpp"
#include "simulator/job.hpp"
#include "simulator/step.hpp"
#include "tests/simulator/expect_error.hpp"
#include "tests/simulator/step_fixture.hpp"

using namespace tandem::simulator;
using namespace tandem::engine;
namespace tt = boost::test_tools;

namespace {

constexpr int kRanks = 2;
constexpr double kBw = 1e9, kLat = 10e-6;  // bytes/s and one-way latency of each NIC
constexpr uint64_t kBytes = 1u << 20;       // one bucket's all-reduce: X = 2 L + S / B on two ranks

// Two ranks; backward in len(seg) segments, one gradient bucket each (bucket k ready once segments 0..k ran), every
// bucket all-reduced with the same plan.
StepSetup cycled_step(const CompiledPlan& plan, const std::vector<double>& seg, double cycle_s, double negotiation_s,
                      double staging_bytes_per_s = 0) {
  parallel::ScheduleRequest sr;
  sr.boundaries = {0, static_cast<int32_t>(seg.size())};
  sr.data_parallel = true;
  sr.layer_grad_bytes.assign(seg.size(), 4);
  sr.bucket_bytes = 4;  // a bucket per layer
  StepSetup s;
  s.pipeline = parallel::make_pipeline_plan(sr);
  s.dp = kRanks;
  s.pp = 1;
  s.bucket_plans = {std::vector<const CompiledPlan*>(seg.size(), &plan)};
  s.comm_cycle_s = cycle_s;
  s.comm_negotiation_s = negotiation_s;
  s.host_staging_bytes_per_s = staging_bytes_per_s;
  double total = 0;
  for (double x : seg) total += x;
  for (int r = 0; r < kRanks; ++r) {
    RankSetup rs;
    rs.forward_s = {0};
    rs.backward_s = {total};
    rs.bucket_backward_s = seg;
    s.ranks.push_back(rs);
  }
  return s;
}

double step_s(const std::vector<double>& seg, double cycle_s, double negotiation_s = 0, double staging = 0) {
  PlanCache cache;
  const CompiledPlan& plan = cache.get(testing::allreduce_request(kRanks, comm::Algorithm::kRing, kBytes, kBytes));
  testing::Bench b(kRanks, kBw, kLat);
  return b.run(cycled_step(plan, seg, cycle_s, negotiation_s, staging)).step_s;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(comm_cycle)

// No cycle: backward, then the bucket's all-reduce at once. A 5 ms cycle: the bucket, ready at 7 ms, waits for the
// tick at 10 ms. Ready exactly on a tick (10 ms): no wait.
BOOST_AUTO_TEST_CASE(a_ready_bucket_waits_for_the_next_tick) {
  const double X = step_s({0}, 0);
  BOOST_TEST(X == 2 * kLat + kBytes / kBw, tt::tolerance(1e-6));
  BOOST_TEST(step_s({7e-3}, 0) == 7e-3 + X, tt::tolerance(1e-6));
  BOOST_TEST(step_s({7e-3}, 5e-3) == 10e-3 + X, tt::tolerance(1e-6));
  BOOST_TEST(step_s({10e-3}, 5e-3) == 10e-3 + X, tt::tolerance(1e-6));
  BOOST_TEST(step_s({0}, 5e-3) == X, tt::tolerance(1e-6));  // the step starts at a tick
}

// Two buckets (X ~ 1.07 ms each). Bucket 1 ready before the cycle's tick (1 ms, 2 ms -> tick 5 ms): one cycle takes
// both, back to back. Bucket 1 ready during the cycle's first all-reduce (1 ms, 5.5 ms): the next cycle, a period
// after the first (10 ms). Without a cycle each starts when ready.
BOOST_AUTO_TEST_CASE(a_cycle_takes_the_buckets_ready_at_its_start) {
  const double X = step_s({0}, 0);
  BOOST_TEST(step_s({1e-3, 1e-3}, 5e-3) == 5e-3 + 2 * X, tt::tolerance(1e-6));
  BOOST_TEST(step_s({1e-3, 4.5e-3}, 5e-3) == 10e-3 + X, tt::tolerance(1e-6));
  BOOST_TEST(step_s({1e-3, 4.5e-3}, 0) == 5.5e-3 + X, tt::tolerance(1e-6));
}

// A cycle whose all-reduces outlast the period: the next starts when they end (the loop does not sleep), taking
// what became ready meanwhile. Cycle 0.5 ms < X: bucket 0 from the tick at 1 ms, bucket 1 (ready at 1.2 ms) when it
// ends.
BOOST_AUTO_TEST_CASE(a_long_cycle_is_followed_at_once) {
  const double X = step_s({0}, 0);
  BOOST_TEST(step_s({1e-3, 0.2e-3}, 0.5e-3) == 1e-3 + 2 * X, tt::tolerance(1e-6));
}

BOOST_AUTO_TEST_CASE(the_cycle_is_read_from_a_job_and_checked) {
  BOOST_TEST(parse_job_text(R"({"comm_cycle_ms": 5})").comm_cycle_ms == 5.0);
  BOOST_TEST(parse_job_text("{}").comm_cycle_ms == 0.0);
  JobSpec j;
  j.comm_cycle_ms = -1;
  testing::expect_error([&] { ranks_for(j, 4); }, "job.comm_cycle_ms");
}

// The coordinator's negotiation (N) at each cycle's start: the all-reduces start N after the tick. One bucket ready at
// 7 ms, 5 ms cycle, N = 0.5 ms: tick at 10 ms, all-reduce from 10.5 ms. Ready at once: the first tick (0) + N.
BOOST_AUTO_TEST_CASE(a_cycle_negotiates_before_its_allreduces) {
  const double X = step_s({0}, 0);
  BOOST_TEST(step_s({7e-3}, 5e-3, 0.5e-3) == 10.5e-3 + X, tt::tolerance(1e-6));
  BOOST_TEST(step_s({0}, 5e-3, 0.5e-3) == 0.5e-3 + X, tt::tolerance(1e-6));
  // two buckets taken by one cycle pay one negotiation: tick 5 ms, then both back to back
  BOOST_TEST(step_s({1e-3, 1e-3}, 5e-3, 0.5e-3) == 5.5e-3 + 2 * X, tt::tolerance(1e-6));
}

// The period runs from the tick, not from the negotiation's end: bucket 0 (ready 1 ms) from the tick at 5 ms, done at
// 5.3 ms + X; bucket 1 (ready 5.5 ms) waits for the tick at 10 ms and its negotiation: 10.3 ms + X.
BOOST_AUTO_TEST_CASE(the_period_counts_from_the_tick) {
  const double X = step_s({0}, 0);
  BOOST_TEST(step_s({1e-3, 4.5e-3}, 5e-3, 0.3e-3) == 10.3e-3 + X, tt::tolerance(1e-6));
}

// A bucket that becomes ready during a negotiation is not in that cycle's plan: cycle 0.5 ms, N = 0.2 ms, bucket 0
// ready on the tick at 1 ms (all-reduce 1.2 ms .. 1.2 ms + X), bucket 1 ready at 1.1 ms; the next cycle starts when
// bucket 0's all-reduce ends (later than 1.5 ms) and negotiates again: 1 ms + 2 N + 2 X.
BOOST_AUTO_TEST_CASE(a_bucket_ready_during_a_negotiation_waits_for_the_next_cycle) {
  const double X = step_s({0}, 0);
  BOOST_TEST(step_s({1e-3, 0.1e-3}, 0.5e-3, 0.2e-3) == 1e-3 + 2 * 0.2e-3 + 2 * X, tt::tolerance(1e-6));
  BOOST_TEST(step_s({1e-3, 0.1e-3}, 0.5e-3, 0) == 1e-3 + 2 * X, tt::tolerance(1e-6));  // without: back to back
}

BOOST_AUTO_TEST_CASE(the_negotiation_is_read_from_a_job_and_checked) {
  BOOST_TEST(parse_job_text(R"({"comm_cycle_ms": 5, "comm_negotiation_ms": 0.4})").comm_negotiation_ms == 0.4);
  BOOST_TEST(parse_job_text("{}").comm_negotiation_ms == 0.0);
  JobSpec j;
  j.comm_cycle_ms = 5;
  j.comm_negotiation_ms = -1;
  testing::expect_error([&] { ranks_for(j, 4); }, "job.comm_negotiation_ms: must be >= 0");
  j.comm_cycle_ms = 0;
  j.comm_negotiation_ms = 1;
  testing::expect_error([&] { ranks_for(j, 4); }, "comm_cycle_ms is 0");
  PlanCache cache;
  const CompiledPlan& plan = cache.get(testing::allreduce_request(kRanks, comm::Algorithm::kRing, kBytes, kBytes));
  testing::Bench b(kRanks, kBw, kLat);
  testing::expect_error([&] { b.run(cycled_step(plan, {1e-3}, 0, 1e-3)); }, "comm_negotiation_s");
}

// Host staging (Gloo's host workspace): each bucket (4 bytes of gradient here) goes to the host before its all-reduce
// and back after it at rate H, in series on the communication stream: a bucket ready at 1 ms ends at
// 1 ms + 4/H + X + 4/H. Two buckets (ready at 1 and 2 ms): the second starts staging when the first has come back
// (2.57 ms), so the step is 1 ms + 2 (2 · 4/H + X).
// With a 5 ms cycle the copies follow the tick.
BOOST_AUTO_TEST_CASE(host_staging_copies_each_bucket_down_and_back) {
  const double X = step_s({0}, 0);
  const double H = 4 / 0.25e-3;  // bytes/s: 0.25 ms per copy of a 4-byte bucket
  BOOST_TEST(step_s({1e-3}, 0, 0, H) == 1e-3 + 0.5e-3 + X, tt::tolerance(1e-6));
  BOOST_TEST(step_s({1e-3, 1e-3}, 0, 0, H) == 1e-3 + 2 * (0.5e-3 + X), tt::tolerance(1e-6));
  BOOST_TEST(step_s({1e-3}, 5e-3, 0, H) == 5e-3 + 0.5e-3 + X, tt::tolerance(1e-6));
  BOOST_TEST(parse_job_text(R"({"host_staging_gbps": 96})").host_staging_gbps == 96.0);
  JobSpec j;
  j.host_staging_gbps = -1;
  testing::expect_error([&] { ranks_for(j, 4); }, "job.host_staging_gbps");
}

BOOST_AUTO_TEST_SUITE_END()
