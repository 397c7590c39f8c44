#pragma once
// What the step tests share: a star cluster and a data-parallel step whose only work is all-reducing
// one bucket.
#include <cstdint>
#include <vector>

#include "engine/comm/plan.hpp"
#include "simulator/step.hpp"

namespace tandem::simulator::testing {

inline std::vector<network::HostNet> star_hosts(int n, double bw, double lat) {
  std::vector<network::HostNet> h(n);
  for (auto& x : h) {
    x.nic_bytes_per_s = bw;
    x.nic_latency_s = lat;
  }
  return h;
}

// A fresh star of n NICs (bw bytes/s, one-way latency lat) to run one step on.
struct Bench {
  des::Simulator sim;
  network::Network net{sim};
  network::Topology topo;
  Bench(int n, double bw, double lat) : topo(network::TopologySpec{}, star_hosts(n, bw, lat), net) {}
  StepResult run(const StepSetup& s) { return simulate_step(s, topo, sim); }
};

// An in-place all-reduce of `bytes` of f32 over n ranks.
inline engine::comm::PlanRequest allreduce_request(int n, engine::comm::Algorithm algo, uint64_t bytes,
                                                   uint64_t chunk_bytes) {
  engine::comm::PlanRequest req;
  req.world = n;
  req.algorithm = algo;
  req.count = bytes / 4;
  req.chunk_bytes = chunk_bytes;
  req.in_place = true;
  return req;
}

// A data-parallel step with no compute: one bucket all-reduced with `plan` by its world of ranks, every
// rank starting it at time 0.
inline StepSetup ddp_allreduce_step(const CompiledPlan& plan) {
  engine::parallel::ScheduleRequest sr;
  sr.boundaries = {0, 1};
  sr.data_parallel = true;
  sr.layer_grad_bytes = {4};
  sr.bucket_bytes = 4;
  StepSetup s;
  s.pipeline = engine::parallel::make_pipeline_plan(sr);
  s.dp = plan.world;
  s.pp = 1;
  s.bucket_plans = {{&plan}};
  for (int r = 0; r < plan.world; ++r) {
    RankSetup rs;
    rs.forward_s = {0};
    rs.backward_s = {0};
    rs.bucket_backward_s = {0};
    s.ranks.push_back(rs);
  }
  return s;
}

}  // namespace tandem::simulator::testing
