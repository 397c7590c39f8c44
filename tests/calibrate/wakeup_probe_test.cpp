// The wake-up probe (engine/train/wakeup_probe): the estimator on synthetic latencies in closed form, and the ring
// of rank-like threads on real cores -- that it ends, counts what it measured, and that on one shared core a woken
// rank does wait for its peer's burst (what a spinning competitor could not show under EEVDF).
#include "engine/train/wakeup_probe.hpp"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <boost/test/unit_test.hpp>
#include <vector>

#include "tests/nn/expect_error.hpp"

using namespace tandem::engine::train;
using tandem::testing::expect_error;

namespace {

int first_allowed_cpu() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return 0;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) return c;
  return 0;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(wakeup_estimator)

BOOST_AUTO_TEST_CASE(the_wait_is_the_shared_mean_less_the_baseline_mean) {
  // half of the wake-ups wait a 1 ms slice, half none, beside a 10 us wake-up cost: 10 + 500 - 10 us
  const std::vector<double> shared = {10e-6, 1010e-6, 10e-6, 1010e-6}, alone = {10e-6, 10e-6};
  BOOST_TEST(wakeup_wait_s({shared}, {alone}) == 500e-6, boost::test_tools::tolerance(1e-12));
}

BOOST_AUTO_TEST_CASE(one_disturbed_repetition_does_not_move_the_median) {
  // repetitions' differences 100, 120 and 5,000 us (the last with a build beside it): the median, 120 us
  const std::vector<std::vector<double>> shared = {{110e-6}, {130e-6}, {5010e-6}}, alone = {{10e-6}, {10e-6}, {10e-6}};
  BOOST_TEST(wakeup_wait_s(shared, alone) == 120e-6, boost::test_tools::tolerance(1e-12));
  // an even count: the mean of the middle two (100 and 120 us)
  BOOST_TEST(wakeup_wait_s({{110e-6}, {130e-6}, {10e-6}, {5010e-6}}, {{10e-6}, {10e-6}, {0}, {10e-6}}) == 110e-6,
             boost::test_tools::tolerance(1e-12));
}

BOOST_AUTO_TEST_CASE(never_below_zero_and_empty_repetitions_skipped) {
  BOOST_TEST(wakeup_wait_s({{5e-6}}, {{20e-6}}) == 0.0);           // the shared ring was faster: no wait
  BOOST_TEST(wakeup_wait_s({{}, {50e-6}}, {{10e-6}, {}}) == 0.0);  // no repetition with both sides
  BOOST_TEST(wakeup_wait_s({{}, {50e-6}}, {{10e-6}, {20e-6}}) == 30e-6, boost::test_tools::tolerance(1e-12));
  BOOST_TEST(wakeup_wait_s({}, {}) == 0.0);
}

BOOST_AUTO_TEST_CASE(unpaired_repetitions_are_an_error) {
  expect_error(
      [] {
        wakeup_wait_s({{1e-6}, {2e-6}}, {{1e-6}});
      },
      tandem::Status::kInvalidArgument, {"2 shared repetitions against 1 baseline"});
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(wakeup_ring)

BOOST_AUTO_TEST_CASE(bad_options_are_named) {
  WakeupRingOptions o;
  o.ranks = 1;
  expect_error([&] { sample_wakeups(o); }, tandem::Status::kInvalidArgument, {"ranks must be in [2, 64], got 1"});
  o.ranks = 2;
  o.burst_s = -1;
  expect_error([&] { sample_wakeups(o); }, tandem::Status::kInvalidArgument, {"burst_s must be in [0, 0.1] s, got -1"});
  o.burst_s = 1e-4;
  o.window_s = 0;
  expect_error([&] { sample_wakeups(o); }, tandem::Status::kInvalidArgument, {"window_s must be in (0, 10] s, got 0"});
}

BOOST_AUTO_TEST_CASE(a_ring_ends_and_counts_its_messages) {
  WakeupRingOptions o;
  o.ranks = 3;
  o.burst_s = 1e-4;
  o.window_s = 0.05;
  const WakeupSamples s = sample_wakeups(o);
  BOOST_TEST(s.messages >= 2 * o.ranks);  // every thread takes at least two rounds
  BOOST_TEST(static_cast<int64_t>(s.latency_s.size()) <= s.messages);
  BOOST_TEST(s.throttled == 0);  // no counter given
  for (double l : s.latency_s) BOOST_TEST((l >= 0 && l < 10));
}

BOOST_AUTO_TEST_CASE(a_moving_throttle_counter_leaves_every_wakeup_out) {
  WakeupRingOptions o;
  o.ranks = 2;
  o.burst_s = 1e-4;
  o.window_s = 0.05;
  std::atomic<long> n{0};
  o.throttles = [&] { return n.fetch_add(1); };  // moves between any two reads
  const WakeupSamples s = sample_wakeups(o);
  BOOST_TEST(s.latency_s.empty());
  BOOST_TEST(s.throttled >= 1);
}

// Two rank-like threads on one core, 2 ms bursts: the one that wakes its peer finds the peer's message already
// there, so it does not block and computes its next burst while the peer, woken, waits for the core. A scheduler
// that let every woken thread preempt at once (what the spinner calibration saw) would keep every wait near the
// wake-up cost; the probe must see at least one wait of half a burst among ~100 wake-ups. Other work on the machine
// only lengthens waits, so this does not flake with load.
BOOST_AUTO_TEST_CASE(on_one_shared_core_a_woken_rank_waits_for_its_peers_burst) {
  WakeupRingOptions o;
  o.ranks = 2;
  o.cpus = {first_allowed_cpu()};
  o.burst_s = 2e-3;
  o.window_s = 0.4;
  const WakeupSamples s = sample_wakeups(o);
  BOOST_TEST_REQUIRE(!s.latency_s.empty());
  BOOST_TEST(*std::max_element(s.latency_s.begin(), s.latency_s.end()) >= 0.5 * o.burst_s);
}

BOOST_AUTO_TEST_SUITE_END()
