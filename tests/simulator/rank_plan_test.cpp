// engine::comm::make_rank_plan yields exactly make_plan's list for that rank, for every collective
// and algorithm, in- and out-of-place, on worlds with and without equal segments.
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include <fmt/format.h>

#include "engine/comm/plan.hpp"
#include "engine/core/error.hpp"

using namespace tandem::engine::comm;
namespace bdata = boost::unit_test::data;

namespace {

std::string op_text(const Op& op) {
  return fmt::format("{}:{}:{}/{}+{}:{}/{}+{}", static_cast<int>(op.kind), op.peer, static_cast<int>(op.src.buffer),
                     op.src.offset, op.src.count, static_cast<int>(op.dst.buffer), op.dst.offset, op.dst.count);
}

// Empty when equal, else where the first difference is.
std::string first_difference(const RankPlan& a, const RankPlan& b) {
  if (a.rounds.size() != b.rounds.size()) return fmt::format("{} vs {} rounds", a.rounds.size(), b.rounds.size());
  for (size_t t = 0; t < a.rounds.size(); ++t) {
    const auto& x = a.rounds[t].ops;
    const auto& y = b.rounds[t].ops;
    if (x.size() != y.size()) return fmt::format("round {}: {} vs {} ops", t, x.size(), y.size());
    for (size_t i = 0; i < x.size(); ++i)
      if (op_text(x[i]) != op_text(y[i])) return fmt::format("round {} op {}: {} vs {}", t, i, op_text(x[i]), op_text(y[i]));
  }
  return {};
}

struct Kind {
  Collective collective;
  Algorithm algorithm;
};

const Kind kKinds[] = {
    {Collective::kAllreduce, Algorithm::kRing},          {Collective::kAllreduce, Algorithm::kHalvingDoubling},
    {Collective::kAllreduce, Algorithm::kTree},          {Collective::kAllreduce, Algorithm::kHierarchical},
    {Collective::kAllreduce, Algorithm::kDeterministic}, {Collective::kReduceScatter, Algorithm::kRing},
    {Collective::kReduceScatter, Algorithm::kDeterministic}, {Collective::kAllgather, Algorithm::kRing},
    {Collective::kBroadcast, Algorithm::kTree},          {Collective::kBroadcast, Algorithm::kRing},
    {Collective::kReduce, Algorithm::kTree},             {Collective::kReduce, Algorithm::kRing},
    {Collective::kReduce, Algorithm::kDeterministic},    {Collective::kBarrier, Algorithm::kDirect},
    {Collective::kSend, Algorithm::kDirect},
};

}  // namespace

BOOST_AUTO_TEST_SUITE(rank_plans)

// counts: 0, a few elements (fewer than ranks), uneven segments, several chunks per segment
BOOST_DATA_TEST_CASE(equal_make_plans_rank_lists,
                     bdata::xrange(static_cast<int>(std::size(kKinds))) * bdata::make({1, 2, 3, 5, 8, 13}) *
                         bdata::make({0, 1, 0}) * bdata::make({0ull, 3ull, 1000ull, 4099ull * 13}),
                     kind, world, in_place, count) {
  PlanRequest req;
  req.collective = kKinds[kind].collective;
  req.algorithm = kKinds[kind].algorithm;
  req.world = world;
  req.root = world > 2 ? 2 : 0;
  req.peer = world > 1 ? (req.root + 1) % world : -1;
  if (req.collective == Collective::kSend && world < 2) return;  // needs two ranks
  req.count = count;
  if (req.collective == Collective::kReduceScatter || req.collective == Collective::kAllgather)
    req.count = count * static_cast<uint64_t>(world);
  req.in_place = in_place != 0;
  req.chunk_bytes = 4 * 256;  // several chunks per segment for the larger counts
  for (int r = 0; r < world; ++r) req.topology.host_of.push_back(r / 3);  // hosts of up to three ranks
  const Plan plan = make_plan(req);
  RankPlan reused;  // storage carried from rank to rank, last to first (more rounds, then fewer)
  for (int r = 0; r < world; ++r) {
    const std::string diff = first_difference(make_rank_plan(req, r), plan.ranks[r]);
    BOOST_TEST(diff.empty(), plan.describe() << " rank " << r << ": " << diff);
    make_rank_plan(req, world - 1 - r, reused);
    const std::string rdiff = first_difference(reused, plan.ranks[world - 1 - r]);
    BOOST_TEST(rdiff.empty(), plan.describe() << " rank " << world - 1 - r << " (storage reused): " << rdiff);
  }
}

BOOST_AUTO_TEST_CASE(equal_make_plans_rank_lists_on_a_large_ring) {
  PlanRequest req;
  req.world = 300;
  req.algorithm = Algorithm::kRing;
  req.count = 300 * 7 + 11;
  req.in_place = true;
  const Plan plan = make_plan(req);
  PlanRequest other = req;  // storage left by another plan (more rounds: smaller chunks)
  other.chunk_bytes = 4 * 3;
  RankPlan reused = make_rank_plan(other, 7);
  for (int r : {0, 1, 150, 298, 299}) {
    BOOST_TEST(first_difference(make_rank_plan(req, r), plan.ranks[r]).empty());
    make_rank_plan(req, r, reused);
    BOOST_TEST(first_difference(reused, plan.ranks[r]).empty());
  }
}

BOOST_AUTO_TEST_CASE(rejects_a_rank_outside_the_world) {
  PlanRequest req;
  req.world = 4;
  req.count = 16;
  BOOST_CHECK_THROW(make_rank_plan(req, 4), tandem::Error);
  BOOST_CHECK_THROW(make_rank_plan(req, -1), tandem::Error);
}

BOOST_AUTO_TEST_SUITE_END()
