#include <vector>

#include <boost/test/unit_test.hpp>

#include "engine/core/error.hpp"
#include "simulator/des/simulator.hpp"

using namespace tandem::simulator::des;

namespace {
struct Recorder : EventHandler {
  Simulator* sim = nullptr;
  std::vector<std::pair<TimeNs, uint64_t>> seen;
  void on_event(uint64_t arg) override { seen.emplace_back(sim->now(), arg); }
};
struct Chain : EventHandler {  // each event schedules the next one `step` ns later, n times
  Simulator* sim = nullptr;
  uint64_t left = 0;
  void on_event(uint64_t) override {
    if (left-- > 0) sim->schedule_in(7, this, 0);
  }
};
}  // namespace

BOOST_AUTO_TEST_SUITE(event_core)

BOOST_AUTO_TEST_CASE(runs_events_in_time_order_and_breaks_ties_by_insertion) {
  Simulator sim;
  Recorder r;
  r.sim = &sim;
  // same instants scheduled out of order: ties must come out in scheduling order
  sim.schedule_at(50, &r, 1);
  sim.schedule_at(10, &r, 2);
  sim.schedule_at(50, &r, 3);
  sim.schedule_at(10, &r, 4);
  sim.schedule_at(0, &r, 5);
  for (uint64_t i = 0; i < 100; ++i) sim.schedule_at(30, &r, 100 + i);
  sim.run();
  BOOST_REQUIRE_EQUAL(r.seen.size(), 105u);
  BOOST_TEST(r.seen[0].second == 5u);
  BOOST_TEST(r.seen[1].second == 2u);
  BOOST_TEST(r.seen[2].second == 4u);
  for (uint64_t i = 0; i < 100; ++i) BOOST_TEST(r.seen[3 + i].second == 100 + i);
  BOOST_TEST(r.seen[103].second == 1u);
  BOOST_TEST(r.seen[104].second == 3u);
  BOOST_TEST(sim.now() == 50);
}

BOOST_AUTO_TEST_CASE(stops_at_the_horizon_and_resumes) {
  Simulator sim;
  Chain c;
  c.sim = &sim;
  c.left = 10;
  sim.schedule_at(0, &c, 0);
  sim.run(20);  // events at 0, 7, 14
  BOOST_TEST(sim.now() == 14);
  BOOST_TEST(sim.events_processed() == 3u);
  sim.run();
  BOOST_TEST(sim.now() == 70);
  BOOST_TEST(sim.events_processed() == 11u);
}

BOOST_AUTO_TEST_CASE(refuses_events_in_the_past) {
  Simulator sim;
  Recorder r;
  r.sim = &sim;
  sim.schedule_at(100, &r, 0);
  sim.run();
  BOOST_CHECK_THROW(sim.schedule_at(99, &r, 0), tandem::Error);
}

BOOST_AUTO_TEST_CASE(instant_hook_runs_once_per_instant_after_its_events) {
  struct Hook : InstantHook {
    Simulator* sim;
    std::vector<TimeNs> at;
    void on_instant_end() override { at.push_back(sim->now()); }
  } hook;
  Simulator sim;
  hook.sim = &sim;
  sim.add_instant_hook(&hook);
  Recorder r;
  r.sim = &sim;
  sim.schedule_at(5, &r, 0);
  sim.schedule_at(5, &r, 1);
  sim.schedule_at(9, &r, 2);
  sim.run();
  // before the first event (instant 0 ends), after instant 5 and after instant 9
  BOOST_TEST(hook.at == (std::vector<TimeNs>{0, 5, 9}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(converts_seconds_exactly_enough) {
  BOOST_TEST(to_ns(1.5) == 1500000000);
  BOOST_TEST(ceil_ns(1e-9 * 0.2) == 1);
  BOOST_TEST(to_ns(0.0) == 0);
  BOOST_CHECK_THROW(to_ns(-1.0), tandem::Error);
}

BOOST_AUTO_TEST_SUITE_END()
