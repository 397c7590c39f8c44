#include "simulator/network/topology.hpp"

#include <algorithm>
#include <cmath>
#include <deque>

#include <fmt/format.h>

#include "engine/core/error.hpp"
#include "simulator/units.hpp"

namespace tandem::simulator::network {

const char* topology_kind_name(TopologyKind k) noexcept {
  switch (k) {
    case TopologyKind::kStar: return "star";
    case TopologyKind::kTwoLevel: return "two-level";
    case TopologyKind::kFatTree: return "fat-tree";
    case TopologyKind::kRing: return "ring";
    case TopologyKind::kGraph: return "graph";
  }
  return "?";
}

TopologyKind parse_topology_kind(const std::string& s) {
  if (s == "star") return TopologyKind::kStar;
  if (s == "two-level" || s == "two_level") return TopologyKind::kTwoLevel;
  if (s == "fat-tree" || s == "fat_tree" || s == "fattree") return TopologyKind::kFatTree;
  if (s == "ring") return TopologyKind::kRing;
  if (s == "graph") return TopologyKind::kGraph;
  TANDEM_THROW(Status::kInvalidArgument, "unknown topology kind \"{}\" (star, two-level, fat-tree, ring, graph)", s);
}

TopologySpec topology_from_json(const nlohmann::json& j, const std::string& where) {
  TopologySpec s;
  if (j.is_string()) {
    s.kind = parse_topology_kind(j.get<std::string>());
    return s;
  }
  json_check_keys(j, {"kind", "k", "switch_bytes_per_s", "switch_gbps", "switch_mbps", "fabric_bytes_per_s",
                      "fabric_gbps", "fabric_mbps", "fabric_latency_s", "fabric_latency_ms", "fabric_latency_us",
                      "switches", "links"},
                  where);
  TANDEM_REQUIRE(j.contains("kind") && j["kind"].is_string(), "{}.kind: required string (star, two-level, "
                 "fat-tree, ring, graph)", where);
  s.kind = parse_topology_kind(j["kind"].get<std::string>());
  if (auto v = json_bandwidth(j, "switch", where)) s.switch_bytes_per_s = *v;
  if (auto v = json_bandwidth(j, "fabric", where)) s.fabric_bytes_per_s = *v;
  if (auto v = json_seconds(j, "fabric_latency", where)) s.fabric_latency_s = *v;
  if (auto v = json_number(j, "k", where)) {
    TANDEM_REQUIRE(*v >= 2 && *v <= 128 && static_cast<int>(*v) % 2 == 0 && *v == static_cast<int>(*v),
                   "{}.k: fat-tree arity must be an even integer in [2, 128], got {}", where, *v);
    s.fat_tree_k = static_cast<int32_t>(*v);
  }
  if (s.kind == TopologyKind::kGraph) {
    TANDEM_REQUIRE(j.contains("links") && j["links"].is_array() && !j["links"].empty(),
                   "{}.links: a graph topology needs a non-empty array of links", where);
    s.graph = j;
  } else {
    TANDEM_REQUIRE(!j.contains("links") && !j.contains("switches"), "{}: links/switches are only for kind \"graph\"",
                   where);
  }
  return s;
}

const char* protocol_name(Protocol p) noexcept { return p == Protocol::kTcp ? "tcp" : "rdma"; }

Topology::Topology(const TopologySpec& spec, const std::vector<HostNet>& hosts, Network& net)
    : spec_(spec), hosts_(hosts), net_(net) {
  TANDEM_REQUIRE(!hosts_.empty(), "topology: the cluster has no hosts");
  for (size_t h = 0; h < hosts_.size(); ++h) {
    const HostNet& hn = hosts_[h];
    TANDEM_REQUIRE(hn.devices >= 1, "host {} ({}): devices must be >= 1, got {}", h, hn.name, hn.devices);
    for (int32_t d = 0; d < hn.devices; ++d) {
      host_of_.push_back(static_cast<int32_t>(h));
      if (hn.devices > 1) {
        TANDEM_REQUIRE(hn.intra_bytes_per_s > 0, "host {} ({}): {} devices need an intra-host bandwidth", h, hn.name,
                       hn.devices);
        dev_up_.push_back(net_.add_link(hn.intra_bytes_per_s, hn.intra_latency_s / 2));
        dev_down_.push_back(net_.add_link(hn.intra_bytes_per_s, hn.intra_latency_s / 2));
      } else {
        dev_up_.push_back(0);
        dev_down_.push_back(0);
      }
    }
  }
  if (spec_.fabric_bytes_per_s <= 0) spec_.fabric_bytes_per_s = hosts_[0].nic_bytes_per_s;
  switch (spec_.kind) {
    case TopologyKind::kStar:
    case TopologyKind::kTwoLevel: build_star(); break;
    case TopologyKind::kFatTree: build_fat_tree(); break;
    case TopologyKind::kRing: build_ring(); break;
    case TopologyKind::kGraph: build_graph(); break;
  }
  for (size_t h = 0; h < hosts_.size(); ++h) {
    const HostNet& hn = hosts_[h];
    TANDEM_REQUIRE(hn.tcp_goodput > 0 && hn.tcp_goodput <= 1, "host {} ({}): TCP goodput factor must be in (0, 1], got {}",
                   h, hn.name, hn.tcp_goodput);
    TANDEM_REQUIRE(hn.tcp_two_way_factor >= 1 && hn.tcp_two_way_factor <= 16, "host {} ({}): TCP two-way factor must be "
                   "in [1, 16], got {}", h, hn.name, hn.tcp_two_way_factor);
    TANDEM_REQUIRE(std::isfinite(hn.tcp_fanout_cv) && hn.tcp_fanout_cv >= 0 && hn.tcp_fanout_cv <= 1,
                   "host {} ({}): TCP fan-out CV must be in [0, 1], got {}", h, hn.name, hn.tcp_fanout_cv);
    TANDEM_REQUIRE(std::isfinite(hn.tcp_fanout_corr) && hn.tcp_fanout_corr >= 0 && hn.tcp_fanout_corr < 1,
                   "host {} ({}): TCP fan-out correlation must be in [0, 1), got {}", h, hn.name, hn.tcp_fanout_corr);
    if (hn.nic_queue_bytes > 0) {
      TANDEM_REQUIRE(h < nic_up_.size(), "host {} ({}): a NIC queue needs a topology with NIC links (star, "
                     "two-level or fat-tree), not {}", h, hn.name, topology_kind_name(spec_.kind));
      net_.set_fifo_queue(nic_up_[h], hn.nic_queue_bytes);
    }
    if (hn.bucket_bytes_per_s <= 0) continue;
    TANDEM_REQUIRE(h < nic_up_.size(), "host {} ({}): a token bucket needs a star or two-level topology (NIC links), "
                   "not {}", h, hn.name, topology_kind_name(spec_.kind));
    net_.set_token_bucket(nic_up_[h], hn.bucket_bytes_per_s, hn.bucket_burst_bytes);
    net_.set_token_bucket(nic_down_[h], hn.bucket_bytes_per_s, hn.bucket_burst_bytes);
  }
}

void Topology::build_star() {
  for (size_t h = 0; h < hosts_.size(); ++h) {
    TANDEM_REQUIRE(hosts_[h].nic_bytes_per_s > 0, "host {} ({}): NIC bandwidth must be > 0", h, hosts_[h].name);
    nic_up_.push_back(net_.add_link(hosts_[h].nic_bytes_per_s, hosts_[h].nic_latency_s / 2));
    nic_down_.push_back(net_.add_link(hosts_[h].nic_bytes_per_s, hosts_[h].nic_latency_s / 2));
  }
  if (std::isfinite(spec_.switch_bytes_per_s)) {
    backplane_ = net_.add_link(spec_.switch_bytes_per_s, 0);
    has_backplane_ = true;
  }
}

void Topology::build_fat_tree() {
  const int32_t H = hosts();
  int32_t k = spec_.fat_tree_k;
  if (k == 0) {
    k = 2;
    while (k * k * k / 4 < H) k += 2;
  }
  TANDEM_REQUIRE(k * k * k / 4 >= H, "topology.k: a {}-ary fat-tree has {} host ports, the cluster has {} hosts", k,
                 k * k * k / 4, H);
  k_ = k;
  const int32_t half = k / 2;
  const double bw = spec_.fabric_bytes_per_s;
  TANDEM_REQUIRE(bw > 0, "topology: fat-tree fabric bandwidth must be > 0");
  for (int32_t h = 0; h < H; ++h) {
    TANDEM_REQUIRE(hosts_[h].nic_bytes_per_s > 0, "host {} ({}): NIC bandwidth must be > 0", h, hosts_[h].name);
    nic_up_.push_back(net_.add_link(hosts_[h].nic_bytes_per_s, hosts_[h].nic_latency_s / 2));
    nic_down_.push_back(net_.add_link(hosts_[h].nic_bytes_per_s, hosts_[h].nic_latency_s / 2));
  }
  const int32_t n = k * half * half;  // pods * edges (or aggs) per pod * ports per switch
  for (int32_t i = 0; i < n; ++i) {
    edge_up_.push_back(net_.add_link(bw, spec_.fabric_latency_s));
    edge_down_.push_back(net_.add_link(bw, spec_.fabric_latency_s));
    agg_up_.push_back(net_.add_link(bw, spec_.fabric_latency_s));
    agg_down_.push_back(net_.add_link(bw, spec_.fabric_latency_s));
  }
}

void Topology::build_ring() {
  const int32_t H = hosts();
  for (int32_t h = 0; h < H && H > 1; ++h) {
    double bw = std::min(hosts_[h].nic_bytes_per_s, hosts_[(h + 1) % H].nic_bytes_per_s);
    if (spec_.fabric_bytes_per_s > 0) bw = std::min(bw, spec_.fabric_bytes_per_s);
    double lat = spec_.fabric_latency_s > 0 ? spec_.fabric_latency_s : hosts_[h].nic_latency_s;
    TANDEM_REQUIRE(bw > 0, "host {} ({}): NIC bandwidth must be > 0", h, hosts_[h].name);
    cw_.push_back(net_.add_link(bw, lat));
  }
  for (int32_t h = 0; h < H && H > 1; ++h) {
    int32_t prev = (h + H - 1) % H;
    double bw = std::min(hosts_[h].nic_bytes_per_s, hosts_[prev].nic_bytes_per_s);
    if (spec_.fabric_bytes_per_s > 0) bw = std::min(bw, spec_.fabric_bytes_per_s);
    double lat = spec_.fabric_latency_s > 0 ? spec_.fabric_latency_s : hosts_[h].nic_latency_s;
    ccw_.push_back(net_.add_link(bw, lat));
  }
}

// Graph JSON: {"switches": ["s0", ...], "links": [{"from": "n0", "to": "s0", "bandwidth_gbps": 10,
// "latency_us": 5, "duplex": true}, ...]}. Hosts are named "n<index>" or by their cluster name.
void Topology::build_graph() {
  const nlohmann::json& g = spec_.graph;
  const int32_t H = hosts();
  std::unordered_map<std::string, int32_t> index;
  for (int32_t h = 0; h < H; ++h) {
    index[fmt::format("n{}", h)] = h;
    if (!hosts_[h].name.empty()) index.emplace(hosts_[h].name, h);
  }
  int32_t nodes = H;
  if (g.contains("switches")) {
    TANDEM_REQUIRE(g["switches"].is_array(), "topology.switches: expected an array of names");
    for (size_t i = 0; i < g["switches"].size(); ++i) {
      const auto& s = g["switches"][i];
      TANDEM_REQUIRE(s.is_string(), "topology.switches[{}]: expected a name string", i);
      TANDEM_REQUIRE(!index.count(s.get<std::string>()), "topology.switches[{}]: name \"{}\" is already used", i,
                     s.get<std::string>());
      index[s.get<std::string>()] = nodes++;
    }
  }
  adj_.assign(nodes, {});
  const auto& links = g["links"];
  for (size_t i = 0; i < links.size(); ++i) {
    std::string where = fmt::format("topology.links[{}]", i);
    const auto& l = links[i];
    json_check_keys(l, {"from", "to", "bandwidth_bytes_per_s", "bandwidth_gbps", "bandwidth_mbps", "latency_s",
                        "latency_ms", "latency_us", "duplex"},
                    where);
    auto end = [&](const char* key) {
      TANDEM_REQUIRE(l.contains(key) && l[key].is_string(), "{}.{}: required node name", where, key);
      auto it = index.find(l[key].get<std::string>());
      TANDEM_REQUIRE(it != index.end(), "{}.{}: unknown node \"{}\" (hosts are n0..n{}, or declare it in switches)",
                     where, key, l[key].get<std::string>(), H - 1);
      return it->second;
    };
    int32_t a = end("from"), b = end("to");
    TANDEM_REQUIRE(a != b, "{}: a link cannot connect \"{}\" to itself", where, l["from"].get<std::string>());
    auto bw = json_bandwidth(l, "bandwidth", where);
    TANDEM_REQUIRE(bw && *bw > 0, "{}.bandwidth_gbps (or _mbps, _bytes_per_s): required, > 0", where);
    double lat = json_seconds(l, "latency", where).value_or(0.0);
    bool duplex = true;
    if (l.contains("duplex")) {
      TANDEM_REQUIRE(l["duplex"].is_boolean(), "{}.duplex: expected true or false", where);
      duplex = l["duplex"].get<bool>();
    }
    adj_[a].emplace_back(b, net_.add_link(*bw, lat));
    if (duplex) adj_[b].emplace_back(a, net_.add_link(*bw, lat));
  }
  graph_paths_.assign(static_cast<size_t>(H) * H, {});
  // BFS from every host; ties go to the neighbour reached through the earliest-declared link.
  for (int32_t s = 0; s < H; ++s) {
    std::vector<int32_t> parent(nodes, -2);
    std::vector<LinkId> via(nodes, 0);
    std::deque<int32_t> q{s};
    parent[s] = -1;
    while (!q.empty()) {
      int32_t u = q.front();
      q.pop_front();
      if (u < H && u != s) continue;  // hosts do not forward traffic
      for (auto [v, lid] : adj_[u]) {
        if (parent[v] != -2) continue;
        parent[v] = u;
        via[v] = lid;
        q.push_back(v);
      }
    }
    for (int32_t d = 0; d < H; ++d) {
      if (d == s) continue;
      TANDEM_REQUIRE(parent[d] != -2, "topology: no path from host {} ({}) to host {} ({})", s, hosts_[s].name, d,
                     hosts_[d].name);
      std::vector<LinkId> p;
      for (int32_t v = d; v != s; v = parent[v]) p.push_back(via[v]);
      std::reverse(p.begin(), p.end());
      graph_paths_[static_cast<size_t>(s) * H + d] = std::move(p);
    }
  }
}

std::vector<LinkId> Topology::host_path(int32_t hs, int32_t hd) const {
  switch (spec_.kind) {
    case TopologyKind::kStar:
    case TopologyKind::kTwoLevel:
      if (has_backplane_) return {nic_up_[hs], backplane_, nic_down_[hd]};
      return {nic_up_[hs], nic_down_[hd]};
    case TopologyKind::kFatTree: {
      const int32_t half = k_ / 2;
      const int32_t per_pod = half * half;
      int32_t ps = hs / per_pod, pd = hd / per_pod;
      int32_t es = (hs / half) % half, ed = (hd / half) % half;
      if (ps == pd && es == ed) return {nic_up_[hs], nic_down_[hd]};
      int32_t a = hd % half;  // D-mod-k: the destination picks the aggregation switch and core
      if (ps == pd) {
        return {nic_up_[hs], edge_up_[(ps * half + es) * half + a], edge_down_[(pd * half + ed) * half + a],
                nic_down_[hd]};
      }
      int32_t j = (hd / half) % half;
      return {nic_up_[hs], edge_up_[(ps * half + es) * half + a], agg_up_[(ps * half + a) * half + j],
              agg_down_[(pd * half + a) * half + j], edge_down_[(pd * half + ed) * half + a], nic_down_[hd]};
    }
    case TopologyKind::kRing: {
      const int32_t H = hosts();
      int32_t d = (hd - hs + H) % H;
      std::vector<LinkId> p;
      if (d <= H - d) {
        for (int32_t h = hs; h != hd; h = (h + 1) % H) p.push_back(cw_[h]);
      } else {
        for (int32_t h = hs; h != hd; h = (h + H - 1) % H) p.push_back(ccw_[h]);
      }
      return p;
    }
    case TopologyKind::kGraph: return graph_paths_[static_cast<size_t>(hs) * hosts() + hd];
  }
  return {};
}

std::vector<LinkId> Topology::path(int32_t src, int32_t dst) const {
  TANDEM_REQUIRE(src >= 0 && src < endpoints() && dst >= 0 && dst < endpoints(),
                 "route {} -> {}: endpoint out of range [0, {})", src, dst, endpoints());
  if (src == dst) return {};
  int32_t hs = host_of_[src], hd = host_of_[dst];
  if (hs == hd) return {dev_up_[src], dev_down_[dst]};
  return host_path(hs, hd);
}

RouteId Topology::route(int32_t src, int32_t dst) {
  uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(src)) << 32) | static_cast<uint32_t>(dst);
  auto it = routes_.find(key);
  if (it != routes_.end()) return it->second;
  const HostNet& hs = hosts_[static_cast<size_t>(host_of(src))];
  RouteId r;
  if (hs.protocol == Protocol::kTcp && host_of(src) != host_of(dst)) {
    RouteCost cost;
    cost.data = kTcpFrameBytes / kTcpMssBytes / hs.tcp_goodput;
    const double ack = kTcpAckBytes / (kTcpSegmentsPerAck * kTcpMssBytes);
    if (fold_acks_) {
      cost.data += ack;
    } else {
      cost.ack = ack;
      cost.ack_links = path(dst, src);
    }
    SlowStart ss;
    if (hs.tcp_slow_start_after_idle) {
      for (LinkId l : path(src, dst)) ss.rtt_s += net_.link_latency_s(l);
      for (LinkId l : path(dst, src)) ss.rtt_s += net_.link_latency_s(l);
      ss.initial_window = kTcpInitialWindowSegments * kTcpMssBytes;
      ss.data_cost = kTcpFrameBytes / kTcpMssBytes / hs.tcp_goodput;  // not the ACKs symmetric execution folds in
    }
    r = net_.add_route(path(src, dst), cost, ss);
  } else {
    r = net_.add_route(path(src, dst));
  }
  routes_.emplace(key, r);
  if (const auto it = resume_.find(key); it != resume_.end() && net_.connection_state(r))
    net_.set_connection_state(r, it->second);
  return r;
}

double Topology::two_way_bytes_factor(int32_t src, int32_t dst) const {
  const int32_t hs = host_of(src), hd = host_of(dst);
  if (hs == hd) return 1.0;
  const HostNet& a = hosts_[static_cast<size_t>(hs)];
  const HostNet& b = hosts_[static_cast<size_t>(hd)];
  const double f = std::max(a.tcp_two_way_factor, b.tcp_two_way_factor);
  if (f <= 1) return 1.0;
  // a payload-rate route (no TCP costs: a TCP node whose measured p2p rate stands for its NIC, profile_network) runs
  // both directions at full rate, so its one-way and two-way times are the same
  if (fold_acks_ || a.protocol != Protocol::kTcp) return f;
  const double d = kTcpFrameBytes / kTcpMssBytes / a.tcp_goodput;
  const double ack = kTcpAckBytes / (kTcpSegmentsPerAck * kTcpMssBytes);
  return std::max(1.0, f - ack / d);
}

double Topology::fanout_cv(int32_t src, int32_t dst) const {
  const int32_t hs = host_of(src);
  if (hs == host_of(dst)) return 0.0;
  // the cluster JSON refuses it on an rdma node; a TCP node whose measured payload rate stands for its NIC
  // (profile_network makes it rdma-like) keeps it, as it keeps tcp_two_way_factor
  return hosts_[static_cast<size_t>(hs)].tcp_fanout_cv;
}

double Topology::fanout_corr(int32_t src, int32_t dst) const {
  const int32_t hs = host_of(src);
  return hs == host_of(dst) ? 0.0 : hosts_[static_cast<size_t>(hs)].tcp_fanout_corr;
}

std::vector<Topology::ConnectionTail> Topology::connection_tails(des::TimeNs end) const {
  std::vector<ConnectionTail> out;
  for (const auto& [key, r] : routes_) {
    const auto c = net_.connection_state(r);
    if (!c || c->held < 0) continue;  // not a connection, or never used
    out.push_back({static_cast<int32_t>(key >> 32), static_cast<int32_t>(key & 0xffffffffu), c->held,
                   end - c->idle_since});
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return std::pair(a.src, a.dst) < std::pair(b.src, b.dst); });
  return out;
}

void Topology::resume_connections(const std::vector<ConnectionTail>& tails) {
  for (const ConnectionTail& t : tails) {
    TANDEM_REQUIRE(t.idle_ns >= 0 && t.held > 0, "resume connection {} -> {}: idle {} ns and window {} B must be >= 0 and > 0",
                   t.src, t.dst, t.idle_ns, t.held);
    resume_[(static_cast<uint64_t>(static_cast<uint32_t>(t.src)) << 32) | static_cast<uint32_t>(t.dst)] =
        ConnectionState{t.held, -t.idle_ns};
  }
}

bool Topology::uniform_star() const {
  if (spec_.kind != TopologyKind::kStar && spec_.kind != TopologyKind::kTwoLevel) return false;
  if (has_backplane_) return false;
  for (const HostNet& h : hosts_) {
    const HostNet& a = hosts_[0];
    if (h.devices != 1 || h.nic_bytes_per_s != a.nic_bytes_per_s || h.nic_latency_s != a.nic_latency_s ||
        h.protocol != a.protocol || h.tcp_goodput != a.tcp_goodput || h.tcp_two_way_factor != a.tcp_two_way_factor ||
        h.tcp_fanout_cv != a.tcp_fanout_cv || h.tcp_fanout_corr != a.tcp_fanout_corr ||
        h.tcp_slow_start_after_idle != a.tcp_slow_start_after_idle || h.bucket_bytes_per_s != a.bucket_bytes_per_s ||
        h.bucket_burst_bytes != a.bucket_burst_bytes || h.nic_queue_bytes != a.nic_queue_bytes)
      return false;
  }
  return true;
}

std::string Topology::describe() const {
  std::string s = fmt::format("{} of {} hosts, {} endpoints", topology_kind_name(spec_.kind), hosts(), endpoints());
  if (spec_.kind == TopologyKind::kFatTree) s += fmt::format(", k={}", k_);
  return s;
}

}  // namespace tandem::simulator::network
