// Pipeline schedules as plans (engine/parallel/schedule.hpp), which the simulator and the runtime
// both execute.
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include "engine/core/error.hpp"
#include "engine/parallel/schedule.hpp"
#include "tests/simulator/printers.hpp"

using namespace tandem::engine::parallel;
namespace bdata = boost::unit_test::data;

BOOST_AUTO_TEST_SUITE(pipeline_schedules)

BOOST_DATA_TEST_CASE(plans_are_valid_for_every_shape, bdata::make({ScheduleKind::kGPipe, ScheduleKind::kOneFOneB}) *
                                                          bdata::xrange(1, 7) * bdata::make({1, 2, 3, 8}),
                     kind, stages, micro) {
  ScheduleRequest r;
  r.kind = kind;
  r.micro_batches = micro;
  for (int s = 0; s <= stages; ++s) r.boundaries.push_back(2 * s);
  r.data_parallel = true;
  r.layer_grad_bytes.assign(2 * stages, 100);
  r.bucket_bytes = 150;
  PipelinePlan p = make_pipeline_plan(r);
  BOOST_REQUIRE_NO_THROW(validate_pipeline_plan(p));
  for (const StagePlan& sp : p.stage_plans) {
    // two layers of 100 bytes with 150-byte buckets: one bucket per stage holding both
    BOOST_TEST(sp.buckets.size() == 1u);
    BOOST_TEST(sp.ops.back().kind == StageOpKind::kOptimizerStep);
    BOOST_TEST(sp.ops[sp.last_backward_op].kind == StageOpKind::kBackward);
  }
}

// 1F1B keeps at most S - s micro-batches alive on stage s: it runs min(S - s - 1, M) forwards before
// its first backward.
BOOST_AUTO_TEST_CASE(one_f_one_b_warms_up_with_s_minus_stage_minus_one_forwards) {
  ScheduleRequest r;
  r.kind = ScheduleKind::kOneFOneB;
  r.micro_batches = 8;
  r.boundaries = {0, 1, 2, 3, 4};
  PipelinePlan p = make_pipeline_plan(r);
  for (int s = 0; s < 4; ++s) {
    int forwards = 0;
    for (const StageOp& op : p.stage_plans[s].ops) {
      if (op.kind == StageOpKind::kBackward) break;
      forwards += op.kind == StageOpKind::kForward;
    }
    BOOST_TEST(forwards == 4 - s, "stage " << s);
  }
}

BOOST_AUTO_TEST_CASE(gpipe_runs_all_forwards_before_any_backward) {
  ScheduleRequest r;
  r.kind = ScheduleKind::kGPipe;
  r.micro_batches = 4;
  r.boundaries = {0, 3, 5};
  PipelinePlan p = make_pipeline_plan(r);
  for (const StagePlan& sp : p.stage_plans) {
    bool seen_backward = false;
    for (const StageOp& op : sp.ops) {
      if (op.kind == StageOpKind::kBackward) seen_backward = true;
      BOOST_TEST(!(seen_backward && op.kind == StageOpKind::kForward));
    }
  }
  BOOST_TEST(p.stage_plans[1].first_layer == 3);
  BOOST_TEST(p.stage_plans[1].end_layer == 5);
}

BOOST_AUTO_TEST_CASE(validation_finds_a_deadlock) {
  ScheduleRequest r;
  r.kind = ScheduleKind::kGPipe;
  r.micro_batches = 2;
  r.boundaries = {0, 1, 2};
  PipelinePlan p = make_pipeline_plan(r);
  // stage 1 waits for micro-batch 1 first while stage 0 sends 0 then 1: order mismatch
  auto& ops = p.stage_plans[1].ops;
  std::swap(ops[0].micro_batch, ops[3].micro_batch);
  BOOST_CHECK_THROW(validate_pipeline_plan(p), tandem::Error);
  // a receive that no one ever sends
  PipelinePlan q = make_pipeline_plan(r);
  q.stage_plans[0].ops.erase(q.stage_plans[0].ops.begin() + 1);  // drop stage 0's first send
  BOOST_CHECK_THROW(validate_pipeline_plan(q), tandem::Error);
}

BOOST_AUTO_TEST_CASE(partition_minimises_the_largest_stage) {
  BOOST_TEST(partition_layers({1, 1, 1, 1}, 2) == (std::vector<int32_t>{0, 2, 4}), boost::test_tools::per_element());
  BOOST_TEST(partition_layers({5, 1, 1, 1, 1, 1}, 2) == (std::vector<int32_t>{0, 1, 6}),
             boost::test_tools::per_element());
  BOOST_TEST(partition_layers({1, 2, 3, 4, 5, 6, 7, 8, 9}, 3) == (std::vector<int32_t>{0, 5, 7, 9}),
             boost::test_tools::per_element());  // 15 / 13 / 17: the best largest stage is 17
  BOOST_TEST(partition_layers({3, 3, 3}, 3) == (std::vector<int32_t>{0, 1, 2, 3}), boost::test_tools::per_element());
  BOOST_TEST(partition_layers({0, 0, 0, 7}, 2).size() == 3u);
  BOOST_CHECK_THROW(partition_layers({1, 1}, 3), tandem::Error);
  BOOST_CHECK_THROW(partition_layers({1, -1}, 1), tandem::Error);
}

BOOST_AUTO_TEST_CASE(buckets_fill_from_the_last_layer_backwards) {
  // layers 0..4 with gradient bytes 10, 0, 30, 20, 25; 40-byte buckets
  auto b = make_buckets(0, 5, {10, 0, 30, 20, 25}, 40);
  BOOST_REQUIRE_EQUAL(b.size(), 2u);
  BOOST_TEST(b[0].first_layer == 3);  // 25 + 20 = 45 >= 40
  BOOST_TEST(b[0].end_layer == 5);
  BOOST_TEST(b[0].bytes == 45u);
  BOOST_TEST(b[1].first_layer == 0);  // the rest: 30 + 0 + 10
  BOOST_TEST(b[1].end_layer == 3);
  BOOST_TEST(b[1].bytes == 40u);
  BOOST_TEST(make_buckets(0, 2, {0, 0}, 40).empty());
}

BOOST_AUTO_TEST_CASE(explicit_caps_close_the_first_buckets_then_bucket_bytes_the_rest) {
  // layers 0..5 with gradient bytes 10, 0, 30, 20, 25, 5; caps {28, 20}, then 40-byte buckets
  auto b = make_buckets(0, 6, {10, 0, 30, 20, 25, 5}, 40, {28, 20});
  BOOST_REQUIRE_EQUAL(b.size(), 3u);
  BOOST_TEST(b[0].first_layer == 4);  // 5 + 25 = 30 >= 28 (5 alone is not)
  BOOST_TEST(b[0].bytes == 30u);
  BOOST_TEST(b[1].first_layer == 3);  // 20 >= 20
  BOOST_TEST(b[1].bytes == 20u);
  BOOST_TEST(b[2].first_layer == 0);  // 30 + 0 + 10 = 40 >= 40, the cap after the list
  BOOST_TEST(b[2].end_layer == 3);
  // one cap: PyTorch DDP's first-bucket rule; more caps than buckets: the list is cut short by the layers
  auto one = make_buckets(0, 6, {10, 0, 30, 20, 25, 5}, 40, {1});
  BOOST_REQUIRE_EQUAL(one.size(), 3u);
  BOOST_TEST(one[0].bytes == 5u);
  BOOST_TEST(one[1].bytes == 45u);  // 25 + 20 at the 40-byte cap
  BOOST_TEST(make_buckets(0, 6, {10, 0, 30, 20, 25, 5}, 40, {1, 1, 1, 1, 1, 1, 1, 1}).size() == 5u);
  BOOST_CHECK_THROW(make_buckets(0, 6, {10, 0, 30, 20, 25, 5}, 40, {8, 0}), tandem::Error);
}

BOOST_AUTO_TEST_CASE(micro_batches_split_as_evenly_as_possible) {
  BOOST_TEST(micro_batch_sizes(10, 4) == (std::vector<int64_t>{3, 3, 2, 2}), boost::test_tools::per_element());
  BOOST_CHECK_THROW(micro_batch_sizes(3, 4), tandem::Error);
}

BOOST_AUTO_TEST_CASE(bad_requests_are_refused) {
  ScheduleRequest r;
  r.boundaries = {0, 2, 2};
  BOOST_CHECK_THROW(make_pipeline_plan(r), tandem::Error);
  r.boundaries = {0, 2};
  r.micro_batches = 0;
  BOOST_CHECK_THROW(make_pipeline_plan(r), tandem::Error);
  r.micro_batches = 1;
  r.data_parallel = true;  // no gradient sizes
  BOOST_CHECK_THROW(make_pipeline_plan(r), tandem::Error);
  BOOST_CHECK_THROW(parse_schedule("zigzag"), tandem::Error);
}

BOOST_AUTO_TEST_SUITE_END()
