#include "simulator/broadcast.hpp"

#include "engine/core/error.hpp"

namespace tandem::simulator {

double pytorch_buffer_bytes(const engine::nn::ModelSpec& model, size_t begin, size_t end) {
  TANDEM_REQUIRE(begin <= end && end <= model.layers.size(), "buffer bytes of layers [{}, {}): the model has {}", begin,
                 end, model.layers.size());
  double bytes = 4.0 * static_cast<double>(model.totals(begin, end).buffers);
  for (size_t i = begin; i < end; ++i)
    if (model.layers[i].kind == engine::nn::LayerKind::kBatchNorm2d) bytes += 8;
  return bytes;
}

namespace {

class TreeBroadcast final : public network::FlowObserver {
 public:
  TreeBroadcast(network::Topology& topo, const std::vector<BroadcastGroup>& groups) : topo_(topo), groups_(groups) {}

  // Virtual rank v of group g has the buffer: its sends to v + 2^j, j above its highest set bit.
  void holds(size_t g, uint32_t v) {
    const BroadcastGroup& gr = groups_[g];
    const auto n = static_cast<uint32_t>(gr.members.size());
    uint32_t j = 0;
    while (v >> j) ++j;  // the first bit above v's highest
    for (; j < 32 && v + (uint32_t{1} << j) < n; ++j) {
      const uint32_t to = v + (uint32_t{1} << j);
      topo_.network().start_flow(topo_.route(gr.members[v], gr.members[to]), gr.bytes, this, (uint64_t{g} << 32) | to);
    }
  }
  void on_flow_done(uint64_t tag) override { holds(static_cast<size_t>(tag >> 32), static_cast<uint32_t>(tag)); }

 private:
  network::Topology& topo_;
  const std::vector<BroadcastGroup>& groups_;
};

}  // namespace

double simulate_tree_broadcast(network::Topology& topo, des::Simulator& sim, const std::vector<BroadcastGroup>& groups) {
  TreeBroadcast b(topo, groups);
  const des::TimeNs t0 = sim.now();
  for (size_t g = 0; g < groups.size(); ++g) {
    const BroadcastGroup& gr = groups[g];
    TANDEM_REQUIRE(gr.bytes >= 0, "broadcast group {}: bytes must be >= 0, got {}", g, gr.bytes);
    for (int32_t m : gr.members)
      TANDEM_REQUIRE(m >= 0 && m < topo.endpoints(), "broadcast group {}: endpoint {} out of range [0, {})", g, m,
                     topo.endpoints());
    if (gr.members.size() > 1 && gr.bytes > 0) b.holds(g, 0);
  }
  sim.run();
  return des::to_seconds(sim.now() - t0);
}

}  // namespace tandem::simulator
