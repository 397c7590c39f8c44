// One execution semantics: the simulator runs a collective plan with the runtime executor's
// dependencies (engine/comm/executor.hpp), not round by round.
#include <algorithm>
#include <map>

#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include "engine/comm/executor.hpp"
#include "engine/comm/plan.hpp"
#include "simulator/step.hpp"
#include "tests/simulator/step_fixture.hpp"

using namespace tandem::simulator;
using namespace tandem::engine;
namespace bdata = boost::unit_test::data;
namespace tt = boost::test_tools;

namespace {

comm::PlanRequest allreduce(int n, comm::Algorithm algo, uint64_t bytes, uint64_t chunk_bytes) {
  return testing::allreduce_request(n, algo, bytes, chunk_bytes);
}

// The all-reduce of `plan` alone on a star of NICs (B bytes/s, one-way latency L).
StepResult run_allreduce(const CompiledPlan& plan, double B, double L, double local_bytes_per_s, bool symmetric,
                         std::vector<OpSpan>* log = nullptr) {
  StepSetup s = testing::ddp_allreduce_step(plan);
  s.symmetric = symmetric;
  s.op_log = log;
  for (RankSetup& rs : s.ranks) rs.local_bytes_per_s = local_bytes_per_s;
  testing::Bench b(plan.world, B, L);
  return b.run(s);
}

CompiledPlan::Kind kind_of(comm::OpKind k) {
  switch (k) {
    case comm::OpKind::kSend: return CompiledPlan::Kind::kSend;
    case comm::OpKind::kRecv: return CompiledPlan::Kind::kRecv;
    default: return CompiledPlan::Kind::kLocal;
  }
}

// Ring with several chunks per step, halving-doubling (whole buffers and Rabenseifner), tree.
struct PlanCase {
  comm::Algorithm algo;
  uint64_t bytes, chunk_bytes;
};
const PlanCase kPlans[] = {
    {comm::Algorithm::kRing, 4ull * 840 * 12, 4 * 120},            // 11 to 42 chunks per ring segment
    {comm::Algorithm::kHalvingDoubling, 4ull * 1000, 0},          // recursive doubling
    {comm::Algorithm::kHalvingDoubling, 4ull * 840 * 1024, 0},    // Rabenseifner
    {comm::Algorithm::kTree, 4ull * 840 * 100, 4 * 840 * 10},     // chunked tree
};

}  // namespace

BOOST_AUTO_TEST_SUITE(execution_semantics)

// The simulator's compiled plan holds, for every member and op, exactly the runtime's ops, dependency
// sets and per-peer posting order (comm::compile_plan of the same plan, rank by rank).
BOOST_DATA_TEST_CASE(simulator_enforces_the_runtime_executors_order_constraints,
                     bdata::make({0, 1, 2, 3}) * bdata::make({2, 3, 4, 5, 7, 8}), which, n) {
  const PlanCase& pc = kPlans[which];
  const comm::Plan plan = comm::make_plan(allreduce(n, pc.algo, pc.bytes, pc.chunk_bytes));
  const CompiledPlan sim = tandem::simulator::compile_plan(plan, 4);
  BOOST_REQUIRE(sim.members == n);
  for (int m = 0; m < n; ++m) {
    const auto rt = comm::compile_plan(plan, m);
    BOOST_REQUIRE(sim.op_count(m) == rt->ops.size());
    std::map<uint32_t, uint32_t> fifo_prev;  // op -> previous transfer to its peer of its kind
    for (const auto& q : rt->queues)
      for (const auto* list : {&q.sends, &q.recvs})
        for (size_t k = 1; k < list->size(); ++k) fifo_prev[(*list)[k]] = (*list)[k - 1];
    for (uint32_t i = 0; i < rt->ops.size(); ++i) {
      const auto& r = rt->ops[i];
      const auto& s = sim.op(m, i);
      BOOST_TEST((s.kind == kind_of(r.kind)), "member " << m << " op " << i);
      if (s.kind != CompiledPlan::Kind::kLocal) BOOST_TEST(s.peer == r.peer);
      std::vector<uint32_t> a(rt->succs.begin() + r.succ_begin, rt->succs.begin() + r.succ_end);
      std::vector<uint32_t> b(sim.succ_begin(m, i), sim.succ_end(m, i));
      std::sort(a.begin(), a.end());
      std::sort(b.begin(), b.end());
      BOOST_TEST(a == b, "member " << m << " op " << i << ": dependents differ");
      const bool has_prev = fifo_prev.count(i) > 0;
      BOOST_TEST(s.deps == r.deps + (has_prev ? 1u : 0u));
      if (has_prev) BOOST_TEST(sim.op(m, fifo_prev[i]).fifo_next == i);
    }
  }
}

// In a simulated step, every edge of the runtime's dependency graph is honoured (an op starts after
// the ops it depends on end; a transfer is posted after the previous one to its peer), every op runs
// once, and nothing else holds a transfer back: it starts the instant its last constraint is met.
BOOST_DATA_TEST_CASE(simulated_schedule_is_the_runtime_graphs, bdata::make({0, 1, 2, 3}) * bdata::make({3, 4, 6}),
                     which, n) {
  const PlanCase& pc = kPlans[which];
  const comm::Plan plan = comm::make_plan(allreduce(n, pc.algo, pc.bytes, pc.chunk_bytes));
  const CompiledPlan sim = tandem::simulator::compile_plan(plan, 4);
  std::vector<OpSpan> log;
  const StepResult res = run_allreduce(sim, 1.25e8, 20e-6, 2e9, false, &log);  // reductions take time
  BOOST_TEST(!res.symmetric_used);
  std::vector<std::vector<const OpSpan*>> at(n);
  for (int m = 0; m < n; ++m) at[m].assign(sim.op_count(m), nullptr);
  for (const OpSpan& o : log) {
    BOOST_REQUIRE(o.member >= 0 && o.member < n);
    BOOST_REQUIRE(o.op < at[o.member].size());
    BOOST_TEST(at[o.member][o.op] == nullptr, "op run twice");
    at[o.member][o.op] = &o;
  }
  for (int m = 0; m < n; ++m) {
    const auto rt = comm::compile_plan(plan, m);
    std::vector<double> ready(rt->ops.size(), 0.0);  // when the runtime's executor may start each op
    for (uint32_t i = 0; i < rt->ops.size(); ++i) {
      BOOST_REQUIRE(at[m][i] != nullptr);
      for (uint32_t k = rt->ops[i].succ_begin; k < rt->ops[i].succ_end; ++k)
        ready[rt->succs[k]] = std::max(ready[rt->succs[k]], at[m][i]->end_s);
    }
    for (const auto& q : rt->queues)
      for (const auto* list : {&q.sends, &q.recvs})
        for (size_t k = 1; k < list->size(); ++k)
          ready[(*list)[k]] = std::max(ready[(*list)[k]], at[m][(*list)[k - 1]]->start_s);
    for (uint32_t i = 0; i < rt->ops.size(); ++i) {
      BOOST_TEST(at[m][i]->start_s >= ready[i], "member " << m << " op " << i << " starts early");
      BOOST_TEST(at[m][i]->end_s >= at[m][i]->start_s);
      if (rt->ops[i].kind == comm::OpKind::kSend || rt->ops[i].kind == comm::OpKind::kRecv)
        BOOST_TEST(at[m][i]->start_s == ready[i], "member " << m << " op " << i << " held back");
    }
  }
}

// Rank 0's rounds that move data.
size_t data_rounds(const comm::Plan& plan) {
  size_t rounds = 0;
  for (const auto& rd : plan.ranks[0].rounds)
    rounds += std::any_of(rd.ops.begin(), rd.ops.end(), [](const comm::Op& o) { return o.kind == comm::OpKind::kSend; });
  return rounds;
}

// A chunked ring's rounds overlap. Run round by round, a ring of C chunks per step pays the latency
// once per round, R = 2(n - 2 + C) rounds (reduce-scatter, then allgather): R L + 2(n-1) S/(nB). The
// runtime posts a send once its data is there and the previous send to that neighbour is posted, and a
// member's sends to one neighbour leave one behind the other on its one connection (chunk time c = chunk/B;
// a send posted while the previous one is on the wire arrives c after it). With C = 2 and L >= c the step-s
// chunk 1 leaves behind chunk 0, and the step-(s+1) chunk 0 as soon as the step-s chunk 0 has arrived: step s
// sends at s(L + c), and the last chunk arrives at 2(n-1)(L + c) + c. With n = 2 each half (reduce-scatter,
// allgather) is one step, C chunks back to back: the link's 2C chunks after one latency, L + 2Cc, or the last
// reduce-scatter chunk's arrival L + Cc and its allgather's L + c, whichever is later. Free reductions;
// symmetric and full execution alike.
BOOST_DATA_TEST_CASE(chunked_ring_is_timed_overlapped,
                     bdata::make({3, 4, 8}) * bdata::make({2}) + bdata::make({2}) * bdata::make({2, 4, 8}), n, C) {
  const double B = 1e9, L = 10e-6;
  const uint64_t chunk = 4 * 1024, S = static_cast<uint64_t>(n) * C * chunk;
  const comm::Plan plan = comm::make_plan(allreduce(n, comm::Algorithm::kRing, S, chunk));
  BOOST_REQUIRE(data_rounds(plan) == static_cast<size_t>(2 * (n - 2 + C)));
  const double seg_s = static_cast<double>(S) / n / B, c = chunk / B;
  BOOST_REQUIRE(L >= c);
  const double overlapped =
      n == 2 ? std::max(2 * L + (C + 1) * c, L + 2 * C * c) : 2.0 * (n - 1) * (L + c) + c;
  const double by_round = 2.0 * (n - 2 + C) * L + 2.0 * (n - 1) * seg_s;
  const CompiledPlan sim = tandem::simulator::compile_plan(plan, 4);
  for (bool symmetric : {false, true}) {
    const StepResult r = run_allreduce(sim, B, L, 0, symmetric);
    BOOST_TEST(r.symmetric_used == symmetric);
    BOOST_TEST(r.step_s == overlapped, tt::tolerance(1e-6));
    BOOST_TEST(r.step_s < by_round);
  }
}

// Longer pipelines overlap too: faster than round by round, never faster than the NIC's bytes with
// one latency, nor than one chunk's 2(n-1) transfers one after another.
BOOST_DATA_TEST_CASE(longer_chunked_rings_beat_round_by_round, bdata::make({3, 4, 8}) * bdata::make({3, 4, 8}), n, C) {
  const double B = 1e9, L = 10e-6;
  const uint64_t chunk = 4 * 1024, S = static_cast<uint64_t>(n) * C * chunk;
  const comm::Plan plan = comm::make_plan(allreduce(n, comm::Algorithm::kRing, S, chunk));
  const double seg_s = static_cast<double>(S) / n / B;
  const double by_round = static_cast<double>(data_rounds(plan)) * L + 2.0 * (n - 1) * seg_s;
  const CompiledPlan sim = tandem::simulator::compile_plan(plan, 4);
  const StepResult r = run_allreduce(sim, B, L, 0, true);
  BOOST_TEST(r.step_s < by_round);
  BOOST_TEST(r.step_s >= L + 2.0 * (n - 1) * seg_s);
  BOOST_TEST(r.step_s >= 2.0 * (n - 1) * (L + chunk / B));
}

// (Times are whole nanoseconds, each duration rounded up: hence the 1e-6 tolerances.)
// Two ranks, C chunks, reductions costing rho = 3x/b each (x bytes a chunk, b the memory bandwidth,
// rho >= x/B). The reduce-scatter's C chunks leave one behind the other on the rank's connection to its peer
// (chunk k arrives at L + (k+1)x/B); the reductions, slower than the link, run back to back from L + x/B, and
// each chunk's allgather send leaves as soon as its reduction is done, the link free by then: the last arrives
// at L + x/B + C rho + L + x/B. Round by round would take 2C(L + x/B) + C rho.
BOOST_DATA_TEST_CASE(ring_reductions_pipeline_with_transfers, bdata::make({2, 4, 8}), C) {
  const double B = 1e9, L = 10e-6, b = 1e9;
  const uint64_t x = 64 * 1024, S = 2ull * C * x;
  const CompiledPlan sim = tandem::simulator::compile_plan(comm::make_plan(allreduce(2, comm::Algorithm::kRing, S, x)), 4);
  const double rho = 3.0 * x / b;
  const double expect = 2 * L + 2 * (x / B) + C * rho;
  const double by_round = 2 * C * (L + x / B) + C * rho;
  for (bool symmetric : {false, true}) {
    const StepResult r = run_allreduce(sim, B, L, b, symmetric);
    BOOST_TEST(r.symmetric_used == symmetric);
    BOOST_TEST(r.step_s == expect, tt::tolerance(1e-6));
    BOOST_TEST(r.step_s < by_round);
    BOOST_TEST(r.ranks[0].cpu_busy_s == C * rho, tt::tolerance(1e-6));
  }
}

BOOST_AUTO_TEST_SUITE_END()
