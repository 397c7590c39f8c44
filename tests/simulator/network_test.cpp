#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "engine/core/error.hpp"
#include "simulator/network/network.hpp"
#include "simulator/network/topology.hpp"

using namespace tandem::simulator;
using namespace tandem::simulator::network;

namespace {
struct Done : FlowObserver {
  des::Simulator* sim = nullptr;
  std::map<uint64_t, double> at;  // tag -> completion time (s)
  void on_flow_done(uint64_t tag) override { at[tag] = des::to_seconds(sim->now()); }
};
// Starts a flow at time t through an event.
struct Starter : des::EventHandler {
  Network* net;
  std::vector<std::tuple<RouteId, double, uint64_t>> flows;
  Done* done;
  void on_event(uint64_t i) override {
    auto [r, b, tag] = flows[i];
    net->start_flow(r, b, done, tag);
  }
};
constexpr double kMiB = 1048576.0;
}  // namespace

BOOST_AUTO_TEST_SUITE(flow_model)

// One flow alone: latency + size / bandwidth.
BOOST_AUTO_TEST_CASE(single_flow_takes_latency_plus_size_over_bandwidth) {
  des::Simulator sim;
  Network net(sim);
  LinkId l = net.add_link(100e6 / 8, 1e-3);  // 100 Mbit/s, 1 ms
  RouteId r = net.add_route({l});
  Done d;
  d.sim = &sim;
  net.start_flow(r, kMiB, &d, 7);
  sim.run();
  // the same figure SimGrid 3.32 gives with CM02 and no cross-traffic (TESTBED.md): 0.084886 s
  BOOST_TEST(d.at.at(7) == 1e-3 + kMiB * 8 / 100e6, boost::test_tools::tolerance(1e-8));
  BOOST_TEST(std::abs(d.at.at(7) - 0.084886) < 1e-6);
}

// n flows on one link share it equally: each gets bandwidth/n, so all finish at n*S/B.
BOOST_AUTO_TEST_CASE(n_flows_on_one_link_get_an_equal_share) {
  for (int n : {2, 3, 8, 100}) {
    des::Simulator sim;
    Network net(sim);
    const double bw = 1e9;
    LinkId l = net.add_link(bw, 0);
    RouteId r = net.add_route({l});
    Done d;
    d.sim = &sim;
    for (int i = 0; i < n; ++i) net.start_flow(r, 1e6, &d, i);
    sim.run(0);  // rates are set at the end of instant 0
    for (double rate : net.current_rates()) BOOST_TEST(rate == bw / n, boost::test_tools::tolerance(1e-12));
    sim.run();
    for (int i = 0; i < n; ++i) BOOST_TEST(d.at.at(i) == n * 1e6 / bw, boost::test_tools::tolerance(1e-8));
  }
}

// When a flow leaves, the survivors speed up: two flows of 1 MB and 3 MB on 1 MB/s finish at 2 s
// (both at 0.5 MB/s) and 4 s (the rest, 2 MB, alone at 1 MB/s).
BOOST_AUTO_TEST_CASE(survivors_take_the_freed_bandwidth) {
  des::Simulator sim;
  Network net(sim);
  RouteId r = net.add_route({net.add_link(1e6, 0)});
  Done d;
  d.sim = &sim;
  net.start_flow(r, 1e6, &d, 0);
  net.start_flow(r, 3e6, &d, 1);
  sim.run();
  BOOST_TEST(d.at.at(0) == 2.0, boost::test_tools::tolerance(1e-9));
  BOOST_TEST(d.at.at(1) == 4.0, boost::test_tools::tolerance(1e-9));
}

// Max-min, not proportional: flows A (links 1,2), B (link 1), C (link 2); link 1 = 10, link 2 = 4.
// Link 2 is the bottleneck: A = C = 2; then B gets 10 - 2 = 8.
BOOST_AUTO_TEST_CASE(rates_are_max_min_fair_across_links) {
  des::Simulator sim;
  Network net(sim);
  LinkId l1 = net.add_link(10, 0), l2 = net.add_link(4, 0);
  Done d;
  d.sim = &sim;
  net.start_flow(net.add_route({l1, l2}), 1000, &d, 0);
  net.start_flow(net.add_route({l1}), 1000, &d, 1);
  net.start_flow(net.add_route({l2}), 1000, &d, 2);
  sim.run(0);
  auto rates = net.current_rates();
  std::sort(rates.begin(), rates.end());
  BOOST_TEST(rates == (std::vector<double>{2, 2, 8}), boost::test_tools::per_element());
}

// Latency is spent before the flow joins the link: a flow still in its latency does not slow others.
BOOST_AUTO_TEST_CASE(flows_in_latency_use_no_bandwidth) {
  des::Simulator sim;
  Network net(sim);
  LinkId fast = net.add_link(1e6, 0);
  LinkId slow_lat = net.add_link(1e6, 10.0);
  Done d;
  d.sim = &sim;
  net.start_flow(net.add_route({fast}), 1e6, &d, 0);            // alone on `fast` for 1 s
  net.start_flow(net.add_route({slow_lat, fast}), 1e6, &d, 1);  // joins at 10 s
  sim.run();
  BOOST_TEST(d.at.at(0) == 1.0, boost::test_tools::tolerance(1e-9));
  BOOST_TEST(d.at.at(1) == 11.0, boost::test_tools::tolerance(1e-9));
}

BOOST_AUTO_TEST_CASE(zero_byte_and_local_flows_finish_after_their_latency) {
  des::Simulator sim;
  Network net(sim);
  Done d;
  d.sim = &sim;
  net.start_flow(net.add_route({net.add_link(1e6, 0.25)}), 0, &d, 0);
  net.start_flow(net.add_route({}), 5e6, &d, 1);
  sim.run();
  BOOST_TEST(d.at.at(0) == 0.25);
  BOOST_TEST(d.at.at(1) == 0.0);
  BOOST_TEST(net.active_flows() == 0u);
}

// A flow's own share weight (start_flow's `weight`, a fan-out draw): two flows of B on one link of C with weights 1
// and 3 run at C / 4 and 3C / 4; the heavy one ends at 4B / 3C, having left the light one 2B / 3 to send alone,
// which ends at 2B / C. Equal weights other than 1 share equally, and a weight <= 0 or not finite is refused.
BOOST_AUTO_TEST_CASE(a_flow_weight_scales_its_share) {
  const double C = 1e6, B = 1e6;
  // two flows of B with weights wa and wb on a fresh link of C: their completion times, and the rates at the start
  const auto run = [&](double wa, double wb, std::vector<double>* rates = nullptr) {
    des::Simulator sim;
    Network net(sim);
    const RouteId r = net.add_route({net.add_link(C, 0)});
    Done d;
    d.sim = &sim;
    net.start_flow(r, B, &d, 0, -1, wa);
    net.start_flow(r, B, &d, 1, -1, wb);
    sim.run(0);
    if (rates) *rates = net.current_rates();
    sim.run();
    BOOST_CHECK_THROW(net.start_flow(r, B, &d, 2, -1, 0.0), tandem::Error);
    BOOST_CHECK_THROW(net.start_flow(r, B, &d, 2, -1, -1.0), tandem::Error);
    BOOST_CHECK_THROW(net.start_flow(r, B, &d, 2, -1, std::nan("")), tandem::Error);
    return std::pair(d.at.at(0), d.at.at(1));
  };
  std::vector<double> rates;
  const auto [light, heavy] = run(1.0, 3.0, &rates);
  std::sort(rates.begin(), rates.end());
  BOOST_TEST(rates.size() == 2u);
  BOOST_TEST(rates[0] == C / 4, boost::test_tools::tolerance(1e-12));
  BOOST_TEST(rates[1] == 3 * C / 4, boost::test_tools::tolerance(1e-12));
  BOOST_TEST(heavy == 4 * B / (3 * C), boost::test_tools::tolerance(1e-8));
  BOOST_TEST(light == 2 * B / C, boost::test_tools::tolerance(1e-8));
  const auto [a, b] = run(0.4, 0.4);
  BOOST_TEST(a == 2 * B / C, boost::test_tools::tolerance(1e-8));
  BOOST_TEST(b == 2 * B / C, boost::test_tools::tolerance(1e-8));
}

BOOST_AUTO_TEST_CASE(rejects_bad_links_and_flows) {
  des::Simulator sim;
  Network net(sim);
  BOOST_CHECK_THROW(net.add_link(0, 0), tandem::Error);
  BOOST_CHECK_THROW(net.add_link(1, -1), tandem::Error);
  BOOST_CHECK_THROW(net.add_route({3}), tandem::Error);
  Done d;
  BOOST_CHECK_THROW(net.start_flow(0, 10, &d, 0), tandem::Error);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(topologies)

std::vector<HostNet> hosts(int n, double bw, double lat, int devices = 1) {
  std::vector<HostNet> h(n);
  for (auto& x : h) {
    x.nic_bytes_per_s = bw;
    x.nic_latency_s = lat;
    x.devices = devices;
    x.intra_bytes_per_s = 100 * bw;
    x.intra_latency_s = lat / 100;
  }
  return h;
}

BOOST_AUTO_TEST_CASE(star_routes_through_both_nics_with_the_full_latency) {
  des::Simulator sim;
  Network net(sim);
  TopologySpec spec;
  Topology t(spec, hosts(4, 1e9, 1e-4), net);
  BOOST_TEST(t.path(0, 3).size() == 2u);
  BOOST_TEST(net.route_latency_s(t.route(0, 3)) == 1e-4, boost::test_tools::tolerance(1e-9));
  BOOST_TEST(t.route(0, 3) == t.route(0, 3));  // cached
  BOOST_TEST(t.path(2, 2).empty());
}

BOOST_AUTO_TEST_CASE(two_level_keeps_intra_host_traffic_off_the_nics) {
  des::Simulator sim;
  Network net(sim);
  TopologySpec spec;
  spec.kind = TopologyKind::kTwoLevel;
  Topology t(spec, hosts(2, 1e9, 1e-4, 4), net);
  BOOST_TEST(t.endpoints() == 8);
  BOOST_TEST(t.host_of(5) == 1);
  auto intra = t.path(0, 1), inter = t.path(0, 5);
  BOOST_TEST(net.link_bandwidth(intra[0]) == 100e9);
  BOOST_TEST(net.link_bandwidth(inter[0]) == 1e9);
  // devices of one host share its NIC: 4 flows host0 -> host1 each get a quarter
  Done d;
  d.sim = &sim;
  for (int i = 0; i < 4; ++i) net.start_flow(t.route(i, 4 + i), 1e9, &d, i);
  sim.run();
  for (int i = 0; i < 4; ++i) BOOST_TEST(d.at.at(i) == 4.0 + 1e-4, boost::test_tools::tolerance(1e-6));
}

BOOST_AUTO_TEST_CASE(fat_tree_paths_have_the_expected_hop_counts) {
  des::Simulator sim;
  Network net(sim);
  TopologySpec spec;
  spec.kind = TopologyKind::kFatTree;
  spec.fat_tree_k = 4;  // 16 host ports: 4 pods of 2 edges of 2 hosts
  Topology t(spec, hosts(16, 1e9, 0), net);
  BOOST_TEST(t.path(0, 1).size() == 2u);   // same edge switch
  BOOST_TEST(t.path(0, 2).size() == 4u);   // same pod
  BOOST_TEST(t.path(0, 15).size() == 6u);  // across the core
  // full bisection: 8 flows from pods 0,1 to pods 2,3 with distinct destinations all run at line rate
  Done d;
  d.sim = &sim;
  for (int i = 0; i < 8; ++i) net.start_flow(t.route(i, 8 + i), 1e9, &d, i);
  sim.run();
  for (int i = 0; i < 8; ++i) BOOST_TEST(d.at.at(i) == 1.0, boost::test_tools::tolerance(1e-9));
}

BOOST_AUTO_TEST_CASE(ring_takes_the_shorter_direction) {
  des::Simulator sim;
  Network net(sim);
  TopologySpec spec;
  spec.kind = TopologyKind::kRing;
  Topology t(spec, hosts(6, 1e9, 1e-5), net);
  BOOST_TEST(t.path(0, 2).size() == 2u);
  BOOST_TEST(t.path(0, 5).size() == 1u);
  BOOST_TEST(t.path(0, 3).size() == 3u);
  BOOST_TEST(net.route_latency_s(t.route(0, 3)) == 3e-5, boost::test_tools::tolerance(1e-9));
}

BOOST_AUTO_TEST_CASE(graph_from_json_routes_by_fewest_hops) {
  des::Simulator sim;
  Network net(sim);
  auto j = nlohmann::json::parse(R"({"kind": "graph", "switches": ["s0", "s1"], "links": [
      {"from": "n0", "to": "s0", "bandwidth_gbps": 10, "latency_us": 5},
      {"from": "n1", "to": "s0", "bandwidth_gbps": 10, "latency_us": 5},
      {"from": "n2", "to": "s1", "bandwidth_gbps": 1, "latency_us": 5},
      {"from": "s0", "to": "s1", "bandwidth_gbps": 40, "latency_us": 1}]})");
  Topology t(topology_from_json(j), hosts(3, 1e9, 0), net);
  BOOST_TEST(t.path(0, 1).size() == 2u);
  BOOST_TEST(t.path(0, 2).size() == 3u);
  BOOST_TEST(net.route_latency_s(t.route(0, 2)) == 11e-6, boost::test_tools::tolerance(1e-9));
}

BOOST_AUTO_TEST_CASE(bad_topology_json_names_the_field) {
  auto expect = [](const char* text, const char* needle) {
    try {
      des::Simulator sim;
      Network net(sim);
      Topology t(topology_from_json(nlohmann::json::parse(text)), hosts(2, 1e9, 0), net);
      BOOST_ERROR("no error for " << text);
    } catch (const tandem::Error& e) {
      BOOST_TEST(std::string(e.what()).find(needle) != std::string::npos, e.what() << " lacks " << needle);
    }
  };
  expect(R"({"kind": "torus"})", "torus");
  expect(R"({"kind": "fat-tree", "k": 3})", "topology.k");
  expect(R"({"kind": "star", "bogus": 1})", "bogus");
  expect(R"({"kind": "graph", "links": [{"from": "n0", "to": "x", "bandwidth_gbps": 1}]})", "links[0].to");
  expect(R"({"kind": "graph", "links": [{"from": "n0", "to": "n1"}]})", "links[0].bandwidth");
  expect(R"({"kind": "graph", "links": [{"from": "n0", "to": "n0", "bandwidth_gbps": 1}]})", "itself");
  expect(R"({"kind": "graph", "switches": ["s"], "links": [{"from": "n0", "to": "s", "bandwidth_gbps": 1}]})",
         "no path");
}

BOOST_AUTO_TEST_SUITE_END()
