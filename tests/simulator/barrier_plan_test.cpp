// The simulator times the runtime's barrier plan as a barrier (issue #17): run as the one "bucket" of a step
// on a star of NICs, no rank finishes before the last rank has entered and its token has crossed the wire,
// and none waits longer than the plan's rounds of latency after that.
#include <algorithm>
#include <cmath>

#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include "engine/comm/plan.hpp"
#include "simulator/step.hpp"
#include "tests/simulator/step_fixture.hpp"

using namespace tandem::simulator;
using namespace tandem::engine;
namespace bdata = boost::unit_test::data;

namespace {

// The barrier over n ranks, rank `late` entering it after `late_s` of backward (the others at once).
StepResult barrier_step(const CompiledPlan& plan, int late, double late_s, double B, double L) {
  StepSetup s = testing::ddp_allreduce_step(plan);
  s.symmetric = false;
  s.ranks[static_cast<size_t>(late)].backward_s = {late_s};
  s.ranks[static_cast<size_t>(late)].bucket_backward_s = {late_s};
  testing::Bench b(plan.world, B, L);
  return b.run(s);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(barrier_plan)

// With one-way latency L and a 1-byte token (its wire time is B^-1 = 1 ns here, nothing beside L), each
// dissemination round costs one latency: a rank that everyone waits for at time D is heard by its
// neighbours at D + L at the earliest, and by the farthest rank after ceil(log2 n) hops, D + ceil(log2 n) L.
BOOST_DATA_TEST_CASE(no_rank_finishes_before_the_late_rank_entered, bdata::make({2, 3, 4, 5, 8, 13}) * bdata::make({0, 1}),
                     n, late_pick) {
  const int late = late_pick == 0 ? 0 : n - 1;
  const double L = 50e-6, D = 10e-3, B = 1e9;
  const comm::Plan plan = comm::make_plan({comm::Collective::kBarrier, comm::Algorithm::kAuto, n, 0, 0, 1, 0, {}});
  const CompiledPlan sim = compile_plan(plan, 1);
  const StepResult res = barrier_step(sim, late, D, B, L);
  int rounds = 0;
  while ((1 << rounds) < n) ++rounds;
  double latest = 0;
  for (int r = 0; r < n; ++r) {
    const double finish = res.ranks[static_cast<size_t>(r)].finish_s;
    latest = std::max(latest, finish);
    // Every rank hears from the late one (or, the late one, from a rank that heard it had entered) after D.
    BOOST_TEST(finish >= D + L * (1 - 1e-6), "world " << n << " rank " << r << " finished at " << finish);
  }
  BOOST_TEST(latest <= D + rounds * (L + 1e-6), "world " << n << ": the last rank finished at " << latest);
  // On time, the same barrier takes the rounds' latencies alone.
  const StepResult prompt = barrier_step(sim, late, 0.0, B, L);
  BOOST_TEST(prompt.step_s >= rounds * L * (1 - 1e-6));
  BOOST_TEST(prompt.step_s <= rounds * (L + 1e-6), "world " << n << ": " << prompt.step_s);
}

BOOST_AUTO_TEST_SUITE_END()
