// Tandem's flow model against SimGrid 3.32's max-min model (CM02, no cross-traffic, TCP window
// bound disabled): the same random flows on the same links must finish within 1% of each other.
// CM02 weighs each flow by 1/(route latency); Tandem's kRttWeighted mode does the same and is
// compared on topologies with unequal latencies; the default equal-weight max-min is compared
// where every route has the same latency (or none), which makes CM02's weights equal too.
#ifdef TANDEM_SIMGRID_FLOWS
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "simulator/network/network.hpp"
#include "simulator/network/topology.hpp"

using namespace tandem::simulator;
using namespace tandem::simulator::network;

namespace {
struct FlowIn {
  int src, dst;
  double start, bytes;
};

struct Runner : des::EventHandler, FlowObserver {
  explicit Runner(Sharing s) : net(sim, s) {}
  des::Simulator sim;
  Network net;
  std::vector<RouteId> routes;
  std::vector<double> bytes, done;
  void on_event(uint64_t i) override { net.start_flow(routes[i], bytes[i], this, i); }
  void on_flow_done(uint64_t i) override { done[i] = des::to_seconds(sim.now()); }
};

std::vector<double> run_simgrid(const std::string& input) {
  char path[] = "/tmp/tandem_simgrid_XXXXXX";
  int fd = mkstemp(path);
  BOOST_REQUIRE(fd >= 0);
  BOOST_REQUIRE(write(fd, input.data(), input.size()) == static_cast<ssize_t>(input.size()));
  close(fd);
  std::string cmd = std::string(TANDEM_SIMGRID_FLOWS) +
                    " --cfg=network/model:CM02 --cfg=network/crosstraffic:0 --cfg=network/TCP-gamma:1e30"
                    " --log=root.thres:critical < " + path;
  FILE* p = popen(cmd.c_str(), "r");
  BOOST_REQUIRE(p != nullptr);
  std::vector<double> out;
  double t;
  while (std::fscanf(p, "%lf", &t) == 1) out.push_back(t);
  int rc = pclose(p);
  unlink(path);
  BOOST_REQUIRE_EQUAL(rc, 0);
  return out;
}

// Runs `flows` on a topology through Tandem and SimGrid and compares each flow's duration.
void compare(const TopologySpec& spec, const std::vector<HostNet>& hosts, const std::vector<FlowIn>& flows,
             Sharing sharing = Sharing::kRttWeighted) {
  Runner r(sharing);
  Topology topo(spec, hosts, r.net);
  std::ostringstream in;
  in.precision(17);
  in << r.net.num_links() << "\n";
  for (LinkId l = 0; l < r.net.num_links(); ++l) {
    double lat = 0;
    RouteId probe = r.net.add_route({l});
    lat = r.net.route_latency_s(probe);
    in << r.net.link_bandwidth(l) << " " << lat << "\n";
  }
  in << flows.size() << "\n";
  r.done.assign(flows.size(), -1);
  for (size_t i = 0; i < flows.size(); ++i) {
    const FlowIn& f = flows[i];
    RouteId rt = topo.route(f.src, f.dst);
    r.routes.push_back(rt);
    r.bytes.push_back(f.bytes);
    auto links = r.net.route_links(rt);
    in << f.start << " " << f.bytes << " " << links.size();
    for (LinkId l : links) in << " " << l;
    in << "\n";
    r.sim.schedule_at(des::to_ns(f.start), &r, i);
  }
  r.sim.run();
  std::vector<double> ref = run_simgrid(in.str());
  BOOST_REQUIRE_EQUAL(ref.size(), flows.size());
  double worst = 0;
  for (size_t i = 0; i < flows.size(); ++i) {
    double mine = r.done[i] - flows[i].start, theirs = ref[i] - flows[i].start;
    double err = std::abs(mine - theirs) / theirs;
    worst = std::max(worst, err);
    BOOST_TEST(err < 0.01, "flow " << i << " (" << flows[i].src << "->" << flows[i].dst << ", " << flows[i].bytes
                                   << " B at " << flows[i].start << " s): tandem " << mine << " s, simgrid " << theirs
                                   << " s");
  }
  BOOST_TEST_MESSAGE(topo.describe() << ": " << flows.size() << " flows, worst relative difference " << worst);
}

std::vector<FlowIn> random_flows(std::mt19937_64& rng, int endpoints, int n) {
  std::uniform_int_distribution<int> ep(0, endpoints - 1);
  std::uniform_real_distribution<double> start(0, 0.2), logsize(3, 7.5);
  std::vector<FlowIn> out;
  while (static_cast<int>(out.size()) < n) {
    int s = ep(rng), d = ep(rng);
    if (s == d) continue;
    out.push_back({s, d, std::round(start(rng) * 1e6) / 1e6, std::round(std::pow(10.0, logsize(rng)))});
  }
  return out;
}

// fixed_latency_s < 0: random latencies
std::vector<HostNet> random_hosts(std::mt19937_64& rng, int n, int devices, double fixed_latency_s = -1) {
  std::uniform_real_distribution<double> gbps(0.05, 10), lat_us(5, 500);
  std::vector<HostNet> hosts(n);
  for (auto& h : hosts) {
    h.nic_bytes_per_s = gbps(rng) * 1e9 / 8;
    h.nic_latency_s = fixed_latency_s >= 0 ? fixed_latency_s : lat_us(rng) * 1e-6;
    h.devices = devices;
    h.intra_bytes_per_s = 50e9;
    h.intra_latency_s = 2e-6;
  }
  return hosts;
}
}  // namespace

BOOST_AUTO_TEST_SUITE(against_simgrid)

BOOST_AUTO_TEST_CASE(star_with_heterogeneous_nics) {
  std::mt19937_64 rng(1);
  for (int rep = 0; rep < 3; ++rep) {
    auto hosts = random_hosts(rng, 8, 1);
    TopologySpec spec;
    if (rep == 2) spec.switch_bytes_per_s = 1.5e9 / 8;  // an oversubscribed backplane couples every flow
    compare(spec, hosts, random_flows(rng, 8, 80));
  }
}

BOOST_AUTO_TEST_CASE(two_level_hosts_with_four_devices) {
  std::mt19937_64 rng(2);
  TopologySpec spec;
  spec.kind = TopologyKind::kTwoLevel;
  compare(spec, random_hosts(rng, 4, 4), random_flows(rng, 16, 80));
}

BOOST_AUTO_TEST_CASE(fat_tree_k4) {
  std::mt19937_64 rng(3);
  TopologySpec spec;
  spec.kind = TopologyKind::kFatTree;
  spec.fat_tree_k = 4;
  spec.fabric_bytes_per_s = 1e9 / 8;  // a slower fabric than some NICs: core links become bottlenecks
  spec.fabric_latency_s = 2e-6;
  compare(spec, random_hosts(rng, 16, 1), random_flows(rng, 16, 100));
}

BOOST_AUTO_TEST_CASE(ring_of_hosts) {
  std::mt19937_64 rng(4);
  TopologySpec spec;
  spec.kind = TopologyKind::kRing;
  compare(spec, random_hosts(rng, 7, 1), random_flows(rng, 7, 60));
}

BOOST_AUTO_TEST_CASE(json_graph_with_a_slow_trunk) {
  std::mt19937_64 rng(5);
  auto j = nlohmann::json::parse(R"({"kind": "graph", "switches": ["a", "b"], "links": [
      {"from": "n0", "to": "a", "bandwidth_gbps": 1, "latency_us": 20},
      {"from": "n1", "to": "a", "bandwidth_gbps": 2, "latency_us": 20},
      {"from": "n2", "to": "a", "bandwidth_gbps": 1, "latency_us": 20},
      {"from": "n3", "to": "b", "bandwidth_gbps": 1, "latency_us": 20},
      {"from": "n4", "to": "b", "bandwidth_gbps": 10, "latency_us": 20},
      {"from": "a", "to": "b", "bandwidth_mbps": 800, "latency_us": 100, "duplex": true}]})");
  compare(topology_from_json(j), random_hosts(rng, 5, 1), random_flows(rng, 5, 60));
}

BOOST_AUTO_TEST_CASE(equal_weight_max_min_on_a_star_with_equal_latencies) {
  std::mt19937_64 rng(6);
  TopologySpec spec;
  spec.switch_bytes_per_s = 4e9 / 8;
  compare(spec, random_hosts(rng, 8, 1, 1e-4), random_flows(rng, 8, 80), Sharing::kMaxMin);
}

BOOST_AUTO_TEST_CASE(equal_weight_max_min_on_a_fat_tree) {
  std::mt19937_64 rng(7);
  TopologySpec spec;
  spec.kind = TopologyKind::kFatTree;
  spec.fabric_bytes_per_s = 0.5e9 / 8;
  compare(spec, random_hosts(rng, 16, 1, 5e-5), random_flows(rng, 16, 100), Sharing::kMaxMin);
}

BOOST_AUTO_TEST_CASE(equal_weight_max_min_on_a_ring_without_latency) {
  std::mt19937_64 rng(8);
  TopologySpec spec;
  spec.kind = TopologyKind::kRing;
  compare(spec, random_hosts(rng, 6, 1, 0), random_flows(rng, 6, 60), Sharing::kMaxMin);
}

BOOST_AUTO_TEST_SUITE_END()
#endif
