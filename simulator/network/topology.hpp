#pragma once
// Cluster topologies built as links of a Network. Endpoints are devices (ranks): a host with g
// devices has g endpoints. Devices of one host talk over intra-host links (NVLink, PCIe or shared
// memory: one up and one down link per device); devices of different hosts go through the hosts'
// NICs, shared by the host's devices, and the inter-host fabric:
//   star / two-level  NIC up -> (optional switch backplane) -> NIC down; non-blocking by default
//   fat-tree          k-ary fat-tree (k pods, k^3/4 host ports), deterministic D-mod-k up-routing
//   ring              hosts wired in a ring, shortest direction (clockwise on ties)
//   graph             explicit switches and links from JSON, shortest hop path (lowest index on ties)
// All links are unidirectional: a full-duplex cable is two links.
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "simulator/network/network.hpp"

namespace tandem::simulator::network {

enum class TopologyKind : uint8_t { kStar = 0, kTwoLevel = 1, kFatTree = 2, kRing = 3, kGraph = 4 };
const char* topology_kind_name(TopologyKind k) noexcept;
TopologyKind parse_topology_kind(const std::string& s);  // star, two-level, fat-tree, ring, graph

// How a host's NIC moves data to other hosts. kRdma: the plain flow model (RDMA, InfiniBand, EFA:
// no per-packet cost the link rate does not already hold). kTcp (Ethernet, MTU 1500, timestamps):
// each payload byte costs kTcpFrameBytes / kTcpMssBytes on the data path, divided by the goodput
// factor (1: what the headers allow; `tandem calibrate --network` or a measurement gives less), and
// a delayed ACK (one kTcpAckBytes frame per kTcpSegmentsPerAck segments) loads the reverse path.
enum class Protocol : uint8_t { kRdma = 0, kTcp = 1 };
const char* protocol_name(Protocol p) noexcept;
constexpr double kTcpMssBytes = 1448;     // 1500 - 20 (IP) - 20 (TCP) - 12 (timestamps)
constexpr double kTcpFrameBytes = 1514;   // + 14 (Ethernet header); what tbf and a NIC's rate count
constexpr double kTcpAckBytes = 66;       // an ACK frame: 14 + 20 + 20 + 12
constexpr double kTcpSegmentsPerAck = 2;  // delayed ACKs (RFC 1122, RFC 5681)
// Wire bytes a link carries per payload byte when it carries one TCP stream's data and the ACKs of another of the
// same rate (a ring's uplink, a full-duplex exchange): 1514/1448 + 66/2896 = 1.0684, i.e. 93.6% payload. A goodput
// measured that way, times this, is the line rate the link model wants.
constexpr double kTcpDuplexWirePerPayload = kTcpFrameBytes / kTcpMssBytes + kTcpAckBytes / (kTcpSegmentsPerAck * kTcpMssBytes);

struct HostNet {
  std::string name;
  int32_t devices = 1;
  double nic_bytes_per_s = 0;     // each direction
  double nic_latency_s = 0;       // one-way host-to-host latency through a star (split over up/down)
  double intra_bytes_per_s = 0;   // per device link to the host fabric (devices > 1)
  double intra_latency_s = 0;     // one-way device-to-device inside the host
  Protocol protocol = Protocol::kRdma;
  double tcp_goodput = 1.0;       // kTcp: the fraction of the header-limited rate reached, (0, 1]
  // kTcp: the sender's connections restart slow start after idle (Linux's net.ipv4.tcp_slow_start_after_idle,
  // default 1; network.hpp's SlowStart): one connection per ordered pair of endpoints on different hosts
  bool tcp_slow_start_after_idle = true;
  // kTcp: a simultaneous two-way exchange's time over a one-way transfer's, as `tandem calibrate --network` measures
  // it (>= 1; 1: the fluid model's own two-way time); see Topology::two_way_bytes_factor
  double tcp_two_way_factor = 1.0;
  // kTcp: the coefficient of variation of one flow's time when the host sends to several peers at once (flows
  // fanning out of one host through its NIC's FIFO are not served alike), as `tandem calibrate --network
  // --fanout-peers N` measures it (0: the fluid model's equal shares); see Topology::fanout_cv
  double tcp_fanout_cv = 0.0;
  // kTcp: the lag-one correlation of one connection's share from one such fan-out to the next (a connection's share
  // persists: [0, 1), 0: drawn afresh each time), measured with it
  double tcp_fanout_corr = 0.0;
  double bucket_bytes_per_s = 0;  // a token bucket on the NIC, each direction (tbf, cloud bursts); 0: none
  double bucket_burst_bytes = 0;
  // the NIC's egress FIFO, wire bytes (Network::set_fifo_queue); 0: none. Its windows are TCP's: the cluster
  // refuses it on an rdma node, but keeps it where a measured payload rate stands for TCP (profile_network)
  double nic_queue_bytes = 0;
};

struct TopologySpec {
  TopologyKind kind = TopologyKind::kStar;
  double switch_bytes_per_s = kUnlimited;  // star: shared backplane capacity (unlimited = non-blocking)
  int32_t fat_tree_k = 0;                  // 0: the smallest even k that has a port for every host
  double fabric_bytes_per_s = 0;           // fat-tree/ring links; 0: the first host's NIC bandwidth
  double fabric_latency_s = 0;             // per fabric hop (fat-tree, ring)
  nlohmann::json graph;                    // kGraph: {"switches": [...], "links": [...]} (see topology.cpp)
};

// Parses {"kind": "...", ...}; errors name the field ("topology.k: ...").
TopologySpec topology_from_json(const nlohmann::json& j, const std::string& where = "topology");

class Topology {
 public:
  Topology(const TopologySpec& spec, const std::vector<HostNet>& hosts, Network& net);

  int32_t endpoints() const noexcept { return static_cast<int32_t>(host_of_.size()); }
  int32_t hosts() const noexcept { return static_cast<int32_t>(hosts_.size()); }
  int32_t host_of(int32_t endpoint) const { return host_of_.at(endpoint); }
  const std::vector<int32_t>& host_of_all() const noexcept { return host_of_; }
  // The route from src to dst (endpoints), built once and cached.
  RouteId route(int32_t src, int32_t dst);
  std::vector<LinkId> path(int32_t src, int32_t dst) const;  // the links route() uses
  std::string describe() const;
  Network& network() noexcept { return net_; }
  // A non-blocking star of hosts with one device each and identical NICs: every endpoint is like every
  // other (the condition for symmetric execution of ring-like collectives).
  bool uniform_star() const;
  // Symmetric execution simulates one rank's flows only, so the ACKs its uplink carries (those of the
  // flow it receives) are not there: with fold set, a TCP route charges its ACK cost on its own data
  // path instead, which in a rotation-symmetric step loads every link exactly as the full model.
  void fold_acks(bool fold) noexcept { fold_acks_ = fold; }
  // A simultaneous two-way exchange of equal messages between src and dst (a gossip swap), both on TCP hosts
  // measured with tcp_two_way_factor f > 1 (the larger of the two hosts'): the factor on the bytes of the flow that
  // starts second, so that with both flows alone on their links the exchange ends at max(the fluid two-way time,
  // f x the one-way time). In TCP one direction of such an exchange loses (it leaves slow start early while the
  // other's data delays its ACKs) and the other runs at line rate, so the second flow plays the loser: both run at
  // C / (d + a) (data cost d, the reverse flow's ACK cost a) until the first is done, then it alone at C / d, which
  // ends at f S d / C for k = f - a / d (folded ACKs: both at C / (d + a) throughout, k = f; a payload-rate route
  // without TCP costs, as profile_network makes a TCP node's, k = f). 1 for a host with itself and f = 1; a cluster
  // JSON refuses the factor on an rdma node, so only a TCP node's measured factor reaches here.
  double two_way_bytes_factor(int32_t src, int32_t dst) const;
  // The measured CV of a flow's time among flows fanning out of src's host (HostNet::tcp_fanout_cv; 0 between ranks of
  // one host): an executor whose server answers several workers at once draws each
  // answer's wire bytes with mean 1 and this CV (strategy.cpp's AsyncExecutor).
  double fanout_cv(int32_t src, int32_t dst) const;
  double fanout_corr(int32_t src, int32_t dst) const;  // HostNet::tcp_fanout_corr of src's host (0 within a host)
  // Slow start after idle counted from the previous step's tail: every connection this topology's routes used, with
  // the window it held and how long before `end` (the step's end) it went idle; and, on a fresh topology, those
  // connections started as if that idle had passed by time 0 (applied when route() builds each route, so that its
  // costs follow fold_acks as set then).
  struct ConnectionTail {
    int32_t src = 0, dst = 0;
    double held = 0;
    des::TimeNs idle_ns = 0;
  };
  std::vector<ConnectionTail> connection_tails(des::TimeNs end) const;
  void resume_connections(const std::vector<ConnectionTail>& tails);

 private:
  std::vector<LinkId> host_path(int32_t hs, int32_t hd) const;
  void build_star();
  void build_fat_tree();
  void build_ring();
  void build_graph();

  TopologySpec spec_;
  std::vector<HostNet> hosts_;
  Network& net_;
  std::vector<int32_t> host_of_;
  std::vector<LinkId> dev_up_, dev_down_;   // per endpoint (devices > 1 only; else unused)
  std::vector<LinkId> nic_up_, nic_down_;   // per host
  LinkId backplane_ = 0;
  bool has_backplane_ = false;
  // fat-tree
  int32_t k_ = 0;
  std::vector<LinkId> edge_up_, edge_down_;  // [pod][edge][agg]: edge->agg, agg->edge
  std::vector<LinkId> agg_up_, agg_down_;    // [pod][agg][j]: agg->core(agg,j), core->agg
  // ring: cw_[h] = h -> h+1, ccw_[h] = h -> h-1
  std::vector<LinkId> cw_, ccw_;
  // graph: next hop tables over nodes (hosts first, then switches)
  std::vector<std::vector<std::pair<int32_t, LinkId>>> adj_;
  std::vector<std::vector<LinkId>> graph_paths_;  // [hs * hosts + hd]
  std::unordered_map<uint64_t, RouteId> routes_;
  std::unordered_map<uint64_t, ConnectionState> resume_;  // resume_connections' states, by route key
  bool fold_acks_ = false;
};

}  // namespace tandem::simulator::network
