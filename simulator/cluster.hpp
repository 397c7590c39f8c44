#pragma once
// A cluster to simulate: nodes (each a preset, possibly with fields overridden) and the network that
// joins them. Given as "PRESET:COUNT" (several joined by '+', e.g. "t2.micro:2+c5.large:2"), as a
// JSON file path, or as JSON text:
//   {"nodes": [{"preset": "t2.micro", "count": 4, "credit_mode": "standard", "initial_credits": 30,
//               "nic_mbps": 65, "nic_latency_us": 250, "memory_gib": 1, "swap_gib": 2, "swap_slowdown": 4,
//               "peak_gflops": 80, "efficiency": 0.25, "mem_gbps": 8, "usd_per_hour": 0.0116,
//               "vcpus": 1, "gpus": 0, "gpu_memory_gib": 16, "intra_gbps": 100, "intra_latency_us": 2,
//               "runtime_mib": 40, "name": "worker", "ranks_per_node": 4, "cpu_quota": 0.5,
//               "cpu_period_ms": 100}, ...],
//    "topology": {"kind": "star"} (see network/topology.hpp), "sharing": "max-min" | "rtt-weighted"}
// A node without "preset" must give vcpus, memory, peak FLOP/s, memory bandwidth and NIC bandwidth.
// Errors name the field: "cluster.nodes[1].nic_mbps: expected a finite number >= 0".
// CPU nodes: ranks_per_node ranks share the node's vcpus (each on max(1, vcpus / ranks) cores, time
// sliced when they are more than the cores); cpu_quota (cores, as cgroup cpu.max QUOTA / PERIOD) with
// cpu_period_s|_ms|_us (default 100 ms) is a CFS quota on the whole node (compute/node_cpu.hpp).
// Links (network/topology.hpp): "protocol": "tcp" | "rdma" (default: the preset's; custom nodes tcp),
// "tcp_goodput" (0, 1], "tcp_slow_start_after_idle" (tcp only; default true, as Linux's
// net.ipv4.tcp_slow_start_after_idle=1: a connection idle for more than its RTO -- RTT + 200 ms -- restarts
// from at most the initial window of 10 segments and doubles it every RTT; false turns it off, as
// `sysctl -w net.ipv4.tcp_slow_start_after_idle=0` does; see network/network.hpp), "tcp_two_way_factor" [1, 16] (tcp
// only; default 1: the fluid model's own two-way time): a simultaneous two-way exchange's time over a one-way
// transfer's of the same size, as `tandem calibrate --network` measures it between two hosts (its cluster_node has
// it); a gossip swap between two partners then takes max(the fluid two-way time, factor x the one-way flow time),
// other traffic unchanged (network/topology.hpp's two_way_bytes_factor; the larger of the two hosts' factors),
// "tcp_fanout_cv" [0, 1] (tcp only; default 0: equal shares): the CV of the shares of flows the node sends to
// several peers at once, and "tcp_fanout_corr" [0, 1) (default 0) the lag-one correlation of one connection's share
// from one such fan-out to the next, as bench/strategies/fanout_calibrate.py measures them; a parameter server on
// the node then posts its answers at once with seeded share weights of mean 1 and that CV, persisting with that
// correlation (Topology::fanout_cv, strategy.hpp's fanout_weight), and a token bucket on the NIC: bucket_mbps|_gbps|_bytes_per_s (below the NIC
// rate, which is then the line rate) with bucket_burst_bytes|_mib; "nic_queue_bytes|_mib" (tcp only; default
// none): the NIC's egress queue, a drop-tail FIFO such as a tbf's limit, in which the connections a sender posts
// at once queue their windows one after another (network/network.hpp's set_fifo_queue).
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "simulator/network/network.hpp"
#include "simulator/network/topology.hpp"
#include "simulator/presets.hpp"

namespace tandem::simulator {

// One-way latency between two ranks of one CPU node when intra_latency_us is not given: a loopback
// TCP message through the kernel (order of magnitude; give the measured figure where it matters).
constexpr double kCpuIntraLatencyS = 10e-6;

struct NodeSpec {
  std::string name;
  Preset hw;                               // the preset with the node's overrides applied
  CreditMode credit_mode = CreditMode::kNone;
  std::optional<double> initial_credits;   // default: launch credits in standard mode, else 0
  double swap_bytes = 0;
  double swap_slowdown = 4.0;              // compute slowdown of a node that swaps
  // Memory each rank's runtime holds beyond tensors (runtime_bytes|_mib|_gib); default: the profile's
  // runtime_rss_bytes (CPU nodes), else kDefaultCpuRuntimeBytes / kDefaultGpuRuntimeBytes (simulate.hpp). A Tandem
  // rank on a CPU node adds its stage's reordered convolution weights (StageMemory::conv_copy_bytes) to it, except to
  // a profile's measured figure of the job's model, which holds them already.
  std::optional<double> runtime_bytes;
  int32_t ranks_per_node = 1;              // CPU nodes only (a GPU node hosts one rank per GPU)
  double cpu_quota = 0;                    // CFS quota in cores; 0: none
  double cpu_period_s = 0.1;               // CFS period
  network::Protocol protocol = network::Protocol::kTcp;
  double tcp_goodput = 1.0;
  bool tcp_slow_start_after_idle = true;   // tcp only: the sender's connections slow start after idle
  double tcp_two_way_factor = 1.0;         // tcp only: a simultaneous exchange over a one-way transfer (measured)
  double tcp_fanout_cv = 0.0;              // tcp only: the CV of flows' shares fanning out of the node (measured)
  double tcp_fanout_corr = 0.0;            // tcp only: a connection's share's lag-one correlation (measured)
  double bucket_bytes_per_s = 0;           // NIC token bucket (0: none)
  double bucket_burst_bytes = 0;
  double nic_queue_bytes = 0;              // tcp only: the NIC's egress FIFO (0: not modelled)
  int32_t ranks() const noexcept { return hw.gpus > 0 ? hw.gpus : ranks_per_node; }
  // Cores one rank of this node computes on: all of them alone, its share with several, one when
  // they outnumber the cores. The roofline's per-rank peak is the node's over min(ranks, vcpus).
  double rank_cores() const noexcept;
};

struct ClusterSpec {
  std::vector<NodeSpec> nodes;
  network::TopologySpec topology;
  network::Sharing sharing = network::Sharing::kMaxMin;
  std::string text;                        // as given
  bool from_presets = false;               // PRESET:COUNT form (sweeps can resize it)

  int32_t endpoints() const;               // ranks the cluster can host
  int32_t node_of_endpoint(int32_t e) const;
  std::vector<network::HostNet> host_nets() const;
  std::string describe() const;            // "4 x t2.micro (star)"
};

ClusterSpec parse_cluster(const std::string& spec);
ClusterSpec cluster_from_json(const nlohmann::json& j, const std::string& where = "cluster");
// The same kind of node as the cluster's first, `count` times, same topology kind (sweeps).
ClusterSpec resize_cluster(const ClusterSpec& c, int32_t count);

}  // namespace tandem::simulator
