// PlanCache: what keys a plan (and what does not), the cache's own rank and topology, its bound.
#include <boost/test/unit_test.hpp>

#include "engine/comm/plan_cache.hpp"

using namespace tandem::engine::comm;

namespace {

PlanRequest allreduce(uint64_t count) {
  PlanRequest r;
  r.collective = Collective::kAllreduce;
  r.algorithm = Algorithm::kRing;
  r.world = 4;
  r.count = count;
  r.elem_bytes = 4;
  return r;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(plan_cache)

BOOST_AUTO_TEST_CASE(a_built_plan_is_found_again_by_an_equal_request) {
  PlanCache cache(2, Topology{});
  const PlanRequest r = allreduce(1000);
  BOOST_TEST(cache.find(r) == nullptr);
  const CompiledPlan& built = cache.build(r);
  BOOST_TEST(built.rank == 2);
  BOOST_TEST(built.world == 4);
  BOOST_TEST((built.algorithm == Algorithm::kRing));
  BOOST_TEST(cache.find(r) == &built);
  BOOST_TEST(cache.size() == 1u);
}

BOOST_AUTO_TEST_CASE(every_field_that_shapes_a_plan_is_part_of_the_key) {
  PlanCache cache(0, Topology{});
  const PlanRequest base = allreduce(1024);
  cache.build(base);
  std::vector<PlanRequest> others(7, base);
  others[0].collective = Collective::kReduceScatter;
  others[1].algorithm = Algorithm::kTree;
  others[2].in_place = true;
  others[3].root = 1;
  others[4].count = 2048;
  others[5].elem_bytes = 8;
  others[6].chunk_bytes = 4096;
  for (size_t i = 0; i < others.size(); ++i) BOOST_TEST(cache.find(others[i]) == nullptr, "variant " << i);
  for (const auto& r : others) cache.build(r);
  BOOST_TEST(cache.size() == 1 + others.size());
  BOOST_TEST(cache.find(base) != cache.find(others[4]));
}

BOOST_AUTO_TEST_CASE(the_caches_topology_is_used_and_the_requests_ignored) {
  PlanCache cache(1, Topology{{0, 0, 1, 1}});
  PlanRequest r = allreduce(1 << 16);
  r.algorithm = Algorithm::kHierarchical;
  r.topology.host_of = {0, 1, 2, 3};  // not what the cache builds with, and not part of the key
  const CompiledPlan& built = cache.build(r);
  BOOST_TEST((built.algorithm == Algorithm::kHierarchical));
  PlanRequest same = r;
  same.topology = Topology{};
  BOOST_TEST(cache.find(same) == &built);
  // Built with the cache's topology: the same ops as make_plan with that topology.
  PlanRequest direct = r;
  direct.topology = Topology{{0, 0, 1, 1}};
  const auto expected = compile_plan(make_plan(direct), 1);
  BOOST_TEST(built.ops.size() == expected->ops.size());
  BOOST_TEST(built.description == expected->description);
}

BOOST_AUTO_TEST_CASE(a_full_cache_is_emptied_before_the_next_plan) {
  PlanCache cache(0, Topology{});
  for (uint64_t i = 0; i < PlanCache::kCapacity; ++i) cache.build(allreduce(4 * (i + 1)));
  BOOST_TEST(cache.size() == PlanCache::kCapacity);
  BOOST_TEST(cache.find(allreduce(4)) != nullptr);
  cache.build(allreduce(1 << 20));
  BOOST_TEST(cache.size() == 1u);
  BOOST_TEST(cache.find(allreduce(4)) == nullptr);
  BOOST_TEST(cache.find(allreduce(1 << 20)) != nullptr);
}

BOOST_AUTO_TEST_SUITE_END()
