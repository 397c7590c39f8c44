// Reference completion times from SimGrid for a set of flows, to validate Tandem's flow model.
// Reads from stdin:
//   <L>                          number of links, then L lines: <bandwidth bytes/s> <latency s>
//   <F>                          number of flows, then F lines: <start s> <bytes> <n> <link>... (n >= 1)
// Prints one completion time (seconds since 0) per flow, in input order.
// Each flow gets its own pair of hosts and its own route over the shared links, so any topology
// (star, fat-tree, ring, graph) is expressed exactly. Run with --cfg=network/model:CM02
// --cfg=network/crosstraffic:0 (max-min sharing without SimGrid's correction factors).
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include <simgrid/s4u.hpp>

namespace sg4 = simgrid::s4u;

int main(int argc, char** argv) {
  sg4::Engine engine(&argc, argv);
  size_t nl = 0;
  if (!(std::cin >> nl)) return 2;
  auto* zone = sg4::create_full_zone("world");
  std::vector<sg4::Link*> links;
  for (size_t i = 0; i < nl; ++i) {
    double bw = 0, lat = 0;
    if (!(std::cin >> bw >> lat)) return 2;
    links.push_back(zone->create_link("l" + std::to_string(i), bw)->set_latency(lat)->seal());
  }
  size_t nf = 0;
  if (!(std::cin >> nf)) return 2;
  struct Flow {
    double start, bytes;
    sg4::Host *src, *dst;
  };
  std::vector<Flow> flows;
  for (size_t i = 0; i < nf; ++i) {
    Flow f{};
    size_t n = 0;
    if (!(std::cin >> f.start >> f.bytes >> n) || n == 0) return 2;
    std::vector<sg4::LinkInRoute> route;
    for (size_t k = 0; k < n; ++k) {
      size_t l = 0;
      if (!(std::cin >> l) || l >= links.size()) return 2;
      route.emplace_back(links[l]);
    }
    f.src = zone->create_host("s" + std::to_string(i), 1.0);
    f.dst = zone->create_host("d" + std::to_string(i), 1.0);
    zone->add_route(f.src->get_netpoint(), f.dst->get_netpoint(), nullptr, nullptr, route, false);
    flows.push_back(f);
  }
  zone->seal();
  std::vector<double> done(nf, -1);
  for (size_t i = 0; i < nf; ++i) {
    sg4::Actor::create("flow" + std::to_string(i), flows[i].src, [&flows, &done, i] {
      sg4::this_actor::sleep_until(flows[i].start);
      sg4::Comm::sendto(flows[i].src, flows[i].dst, static_cast<uint64_t>(flows[i].bytes));
      done[i] = sg4::Engine::get_clock();
    });
  }
  engine.run();
  for (double t : done) std::printf("%.12g\n", t);
  return 0;
}
