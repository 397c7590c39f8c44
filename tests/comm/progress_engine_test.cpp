// ProgressEngine on its own (a PeerTable and inproc transports, no Communicator): queued
// collectives run in order with sequence numbers, point-to-point completes, and an abort fails
// this rank and its peer with the origin named.
#include <boost/test/unit_test.hpp>

#include "engine/comm/progress_engine.hpp"
#include "tests/comm/transport_harness.hpp"

using namespace tandem;
using namespace tandem::testing;
using namespace tandem::engine::comm;

namespace {

CommOptions quick() {
  CommOptions o;
  o.timeout = std::chrono::milliseconds(5000);
  return o;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(progress_engine)

BOOST_AUTO_TEST_CASE(queued_operations_run_in_order) {
  run_on_transports(2, [](int r, SharedTransport& shared) {
    PeerTable peers(shared, r, {0, 1}, 0);
    ProgressEngine engine(shared, peers, {0, 1}, 0, quick(), Topology{});
    int32_t a = r + 1, sum_a = 0, b = 10 * (r + 1), sum_b = 0;
    auto op_a = new_op(WireKind::kAllreduce, &a, &sum_a, 1, DType::kI32);
    auto op_b = new_op(WireKind::kAllreduce, &b, &sum_b, 1, DType::kI32);
    auto wa = engine.enqueue(op_a);
    auto wb = engine.enqueue(op_b);
    wb->wait();
    EXPECT(wa->test() && sum_a == 3 && sum_b == 30, "sums {} {}", sum_a, sum_b);
    EXPECT(op_a->seq == 1 && op_b->seq == 2, "seq {} {}", op_a->seq, op_b->seq);
    // Point-to-point: no sequence number, completes in the background.
    int32_t v = 100 + r, got = -1;
    auto s = new_op(WireKind::kSend, &v, nullptr, 1, DType::kI32);
    s->peer = 1 - r;
    s->tag = 9;
    auto rv = new_op(WireKind::kRecv, nullptr, &got, 1, DType::kI32);
    rv->peer = 1 - r;
    rv->tag = 9;
    auto ws = engine.enqueue(s);
    engine.enqueue(rv)->wait();
    ws->wait();
    EXPECT(got == 101 - r && s->seq == 0, "got {} seq {}", got, s->seq);
    auto bar = new_op(WireKind::kBarrier, nullptr, nullptr, 0, DType::kU8);
    engine.enqueue(bar)->wait();
    EXPECT(bar->seq == 3 && !peers.is_failed(), "barrier seq {}", bar->seq);
  });
}

BOOST_AUTO_TEST_CASE(an_abort_fails_both_ranks_naming_the_origin) {
  std::atomic<int> failed{0};
  run_on_transports(2, [&](int r, SharedTransport& shared) {
    PeerTable peers(shared, r, {0, 1}, 0);
    ProgressEngine engine(shared, peers, {0, 1}, 0, quick(), Topology{});
    if (r == 0) engine.request_abort("enough");
    peers.wait_failed(std::chrono::milliseconds(5000));
    const auto f = peers.failure_status();
    EXPECT(f.failed && f.status == Status::kPeerFailure && f.origin == 0 && f.aborted,
           "rank {}: failed {} status {} origin {} aborted {}", r, f.failed, status_name(f.status), f.origin, f.aborted);
    EXPECT(f.message.find("rank 0 aborted the communicator: enough") != std::string::npos, "rank {}: {}", r, f.message);
    std::string msg;
    const Status st = status_of([&] { engine.enqueue(new_op(WireKind::kBarrier, nullptr, nullptr, 0, DType::kU8)); }, &msg);
    EXPECT(st == Status::kPeerFailure && msg.find("communicator already failed") != std::string::npos, "{}", msg);
    ++failed;
    wait_for(failed, 2);
  });
}

BOOST_AUTO_TEST_CASE(an_abort_without_a_reason_blames_the_application) {
  run_on_transports(1, [](int, SharedTransport& shared) {
    PeerTable peers(shared, 0, {0}, 0);
    ProgressEngine engine(shared, peers, {0}, 0, quick(), Topology{});
    engine.request_abort("");
    peers.wait_failed(std::chrono::milliseconds(5000));
    EXPECT(peers.failure_message() == "rank 0 aborted the communicator: aborted by the application", "{}",
           peers.failure_message());
  });
}

BOOST_AUTO_TEST_SUITE_END()
