#pragma once
// PyTorch DDP's per-step buffer broadcast (issue #16). With broadcast_buffers=True (DDP's default) every forward
// pass starts with rank 0's module buffers -- BatchNorm's running mean and variance (f32) and num_batches_tracked
// (one i64 per BatchNorm layer) -- broadcast to the other ranks (DistributedDataParallel._sync_buffers); the forward
// waits for it, so it is not overlapped with anything. On CPU tensors PyTorch's gloo process group runs gloo's
// broadcast (gloo/broadcast.cc): a binomial tree over virtual ranks (the root is 0). Virtual rank v receives the
// whole buffer from v - 2^h (h: its highest set bit), then sends it to v + 2^j for every j > h below the group's
// size, all at once (gloo queues sends without waiting; only receives block); the root sends to 1, 2, 4, ... at
// once. (PyTorch coalesces the f32 and i64 buffers into two messages and keeps both in flight: one broadcast of
// their sum is the model here.)
#include <cstdint>
#include <vector>

#include "engine/nn/model_spec.hpp"
#include "simulator/des/simulator.hpp"
#include "simulator/network/topology.hpp"

namespace tandem::simulator {

// The bytes PyTorch broadcasts for layers [begin, end) of `model`: 4 per running statistic, 8 per BatchNorm layer.
double pytorch_buffer_bytes(const engine::nn::ModelSpec& model, size_t begin, size_t end);

struct BroadcastGroup {
  std::vector<int32_t> members;  // endpoints; members[0] is the root
  double bytes = 0;
};

// Runs the groups' tree broadcasts at once from time 0 on `topo` (a fresh network on `sim`); returns when the last
// member has the buffer and the last send is done (s). Groups of one member or no bytes take no time.
double simulate_tree_broadcast(network::Topology& topo, des::Simulator& sim, const std::vector<BroadcastGroup>& groups);

}  // namespace tandem::simulator
