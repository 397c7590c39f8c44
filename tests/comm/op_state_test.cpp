// OpState and the plan request an operation asks for: per-rank counts, in-place layouts, the
// deterministic override, and completion.
#include <boost/test/unit_test.hpp>

#include "engine/comm/op_state.hpp"
#include "engine/core/error.hpp"

using namespace tandem;
using namespace tandem::engine::comm;

BOOST_AUTO_TEST_SUITE(op_state)

BOOST_AUTO_TEST_CASE(allreduce_requests_follow_the_options) {
  float buf[8] = {};
  auto op = new_op(WireKind::kAllreduce, buf, buf, 8, DType::kF32);
  CommOptions o;
  o.allreduce_algorithm = Algorithm::kTree;
  PlanRequest r = plan_request_for(*op, 1, 4, o);
  BOOST_TEST((r.collective == Collective::kAllreduce && r.algorithm == Algorithm::kTree));
  BOOST_TEST(r.in_place);
  BOOST_TEST(r.count == 8u);
  BOOST_TEST(r.world == 4);
  BOOST_TEST(r.elem_bytes == 4u);
  BOOST_TEST(r.chunk_bytes == effective_chunk_bytes(0, 32));
  o.deterministic = true;
  BOOST_TEST((plan_request_for(*op, 1, 4, o).algorithm == Algorithm::kDeterministic));
  // An empty buffer is never in place.
  op->count = 0;
  BOOST_TEST(!plan_request_for(*op, 1, 4, o).in_place);
}

BOOST_AUTO_TEST_CASE(reduce_scatter_and_allgather_count_the_full_buffer_and_spot_in_place) {
  double big[12] = {};
  CommOptions o;
  // reduce_scatter: in place when recv == send + rank * count.
  auto rs = new_op(WireKind::kReduceScatter, big, big + 2 * 3, 3, DType::kF64);
  PlanRequest r = plan_request_for(*rs, 2, 4, o);
  BOOST_TEST(r.count == 12u);
  BOOST_TEST(r.in_place);
  BOOST_TEST(!plan_request_for(*rs, 1, 4, o).in_place);
  // allgather: in place when send == recv + rank * count.
  auto ag = new_op(WireKind::kAllgather, big + 3, big, 3, DType::kF64);
  r = plan_request_for(*ag, 1, 4, o);
  BOOST_TEST((r.collective == Collective::kAllgather));
  BOOST_TEST(r.count == 12u);
  BOOST_TEST(r.in_place);
  BOOST_TEST(!plan_request_for(*ag, 0, 4, o).in_place);
  // split exchanges as an allgather.
  auto sp = new_op(WireKind::kSplit, big, big + 3, 3, DType::kI64);
  BOOST_TEST((plan_request_for(*sp, 0, 4, o).collective == Collective::kAllgather));
}

BOOST_AUTO_TEST_CASE(point_to_point_has_no_plan) {
  auto op = new_op(WireKind::kSend, nullptr, nullptr, 0, DType::kU8);
  Status st = Status::kOk;
  try {
    plan_request_for(*op, 0, 2, CommOptions{});
  } catch (const Error& e) {
    st = e.status();
  }
  BOOST_TEST((st == Status::kInternal));
}

BOOST_AUTO_TEST_CASE(describe_names_the_call) {
  auto op = new_op(WireKind::kBroadcast, nullptr, nullptr, 1024, DType::kF32, ReduceOp::kSum, 2);
  BOOST_TEST(describe_op(*op) == "broadcast(f32, 1024, root 2)");
  auto send = new_op(WireKind::kSend, nullptr, nullptr, 10, DType::kF32);
  send->tag = 3;
  BOOST_TEST(describe_op(*send) == "send(f32, 10, tag 3)");
}

BOOST_AUTO_TEST_CASE(complete_records_the_outcome) {
  OpState ok, bad;
  ok.complete(Status::kOk, "");
  BOOST_TEST(ok.state.load() == 1);
  bad.complete(Status::kTimeout, "late");
  BOOST_TEST(bad.state.load() == 2);
  BOOST_TEST((bad.status == Status::kTimeout));
  BOOST_TEST(bad.message == "late");
}

BOOST_AUTO_TEST_SUITE_END()
