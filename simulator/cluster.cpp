#include "simulator/cluster.hpp"

#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "engine/core/error.hpp"
#include "simulator/units.hpp"

namespace tandem::simulator {

int32_t ClusterSpec::endpoints() const {
  int32_t n = 0;
  for (const NodeSpec& nd : nodes) n += nd.ranks();
  return n;
}

int32_t ClusterSpec::node_of_endpoint(int32_t e) const {
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (e < nodes[i].ranks()) return static_cast<int32_t>(i);
    e -= nodes[i].ranks();
  }
  TANDEM_THROW(Status::kInvalidArgument, "endpoint out of range for cluster {}", text);
}

double NodeSpec::rank_cores() const noexcept {
  const double c = static_cast<double>(hw.vcpus);
  return std::max(1.0, c / static_cast<double>(ranks_per_node));
}

std::vector<network::HostNet> ClusterSpec::host_nets() const {
  std::vector<network::HostNet> out;
  for (const NodeSpec& nd : nodes) {
    network::HostNet h;
    h.name = nd.name;
    h.devices = nd.ranks();
    h.nic_bytes_per_s = nd.hw.nic_bytes_per_s;
    h.nic_latency_s = nd.hw.nic_latency_s;
    h.intra_bytes_per_s = nd.hw.intra_bytes_per_s;
    h.intra_latency_s = nd.hw.intra_latency_s;
    h.protocol = nd.protocol;
    h.tcp_goodput = nd.tcp_goodput;
    h.tcp_slow_start_after_idle = nd.tcp_slow_start_after_idle;
    h.tcp_two_way_factor = nd.tcp_two_way_factor;
    h.tcp_fanout_cv = nd.tcp_fanout_cv;
    h.tcp_fanout_corr = nd.tcp_fanout_corr;
    h.bucket_bytes_per_s = nd.bucket_bytes_per_s;
    h.bucket_burst_bytes = nd.bucket_burst_bytes;
    h.nic_queue_bytes = nd.nic_queue_bytes;
    if (nd.hw.gpus == 0 && nd.ranks() > 1 && h.intra_bytes_per_s <= 0) {
      // ranks of one CPU node exchange through memory: a copy reads and writes each byte
      h.intra_bytes_per_s = nd.hw.mem_bytes_per_s / 2;
      if (h.intra_latency_s <= 0) h.intra_latency_s = kCpuIntraLatencyS;
    }
    out.push_back(h);
  }
  return out;
}

std::string ClusterSpec::describe() const {
  std::string s;
  for (size_t i = 0; i < nodes.size();) {
    size_t j = i;
    while (j < nodes.size() && nodes[j].hw.name == nodes[i].hw.name) ++j;
    s += fmt::format("{}{} x {}", s.empty() ? "" : " + ", j - i, nodes[i].hw.name);
    i = j;
  }
  return s + fmt::format(" ({})", network::topology_kind_name(topology.kind));
}

namespace {

void set_defaults(NodeSpec& n) {
  n.credit_mode = n.hw.burst.default_mode;
  n.protocol = n.hw.rdma ? network::Protocol::kRdma : network::Protocol::kTcp;
}

void default_topology(ClusterSpec& c) {
  for (const NodeSpec& n : c.nodes)
    if (n.ranks() > 1 && c.topology.kind == network::TopologyKind::kStar) c.topology.kind = network::TopologyKind::kTwoLevel;
}

NodeSpec node_from_json(const nlohmann::json& j, const std::string& where) {
  json_check_keys(j, {"preset", "count", "name", "credit_mode", "initial_credits", "nic_mbps", "nic_gbps",
                      "nic_bytes_per_s", "nic_latency_s", "nic_latency_ms", "nic_latency_us", "memory_gib",
                      "memory_mib", "memory_bytes", "swap_gib", "swap_mib", "swap_bytes", "swap_slowdown",
                      "peak_gflops", "peak_tflops", "efficiency", "mem_gbps", "mem_bytes_per_s", "usd_per_hour",
                      "vcpus", "gpus", "gpu_memory_gib", "gpu_memory_bytes", "intra_gbps", "intra_bytes_per_s",
                      "intra_latency_us", "intra_latency_s", "kernel_overhead_us", "os_reserved_mib", "runtime_bytes",
                      "runtime_mib", "runtime_gib", "ranks_per_node", "cpu_quota", "cpu_period_s", "cpu_period_ms",
                      "cpu_period_us", "protocol", "tcp_goodput", "tcp_slow_start_after_idle", "tcp_two_way_factor", "tcp_fanout_cv", "tcp_fanout_corr", "bucket_mbps", "bucket_gbps", "bucket_bytes_per_s",
                      "bucket_burst_bytes", "bucket_burst_mib", "nic_queue_bytes", "nic_queue_mib"},
                  where);
  NodeSpec n;
  if (j.contains("preset")) {
    TANDEM_REQUIRE(j["preset"].is_string(), "{}.preset: expected a preset name", where);
    try {
      n.hw = find_preset(j["preset"].get<std::string>());
    } catch (const Error& e) {
      TANDEM_THROW(Status::kInvalidArgument, "{}.preset: {}", where, e.what());
    }
  } else {
    n.hw.name = "custom";
    for (const char* need : {"vcpus", "memory", "peak", "mem", "nic"}) {
      bool found = false;
      for (auto it = j.begin(); it != j.end(); ++it) found = found || it.key().rfind(need, 0) == 0;
      TANDEM_REQUIRE(found, "{}: a node without \"preset\" must give {} (e.g. vcpus, memory_gib, peak_gflops, "
                     "mem_gbps, nic_gbps)", where, need);
    }
  }
  set_defaults(n);
  if (j.contains("name")) {
    TANDEM_REQUIRE(j["name"].is_string(), "{}.name: expected a string", where);
    n.name = j["name"].get<std::string>();
  }
  auto integer = [&](const char* key, int lo, int hi) -> std::optional<int> {
    auto v = json_number(j, key, where);
    if (!v) return std::nullopt;
    TANDEM_REQUIRE(*v == static_cast<int>(*v) && *v >= lo && *v <= hi, "{}.{}: expected an integer in [{}, {}], got {}",
                   where, key, lo, hi, *v);
    return static_cast<int>(*v);
  };
  if (auto v = integer("vcpus", 1, 4096)) n.hw.vcpus = *v;
  if (auto v = integer("gpus", 0, 64)) n.hw.gpus = *v;
  if (auto v = json_bytes(j, "memory", where)) n.hw.memory_bytes = *v;
  if (auto v = json_bytes(j, "swap", where)) n.swap_bytes = *v;
  if (auto v = json_number(j, "gpu_memory_gib", where)) n.hw.gpu_memory_bytes = *v * 1073741824.0;
  if (auto v = json_number(j, "gpu_memory_bytes", where)) n.hw.gpu_memory_bytes = *v;
  if (auto v = json_number(j, "os_reserved_mib", where)) n.hw.os_reserved_bytes = *v * 1048576.0;
  if (auto v = json_bytes(j, "runtime", where)) n.runtime_bytes = *v;
  if (auto v = json_number(j, "swap_slowdown", where)) {
    TANDEM_REQUIRE(*v >= 1, "{}.swap_slowdown: must be >= 1, got {}", where, *v);
    n.swap_slowdown = *v;
  }
  if (auto v = json_number(j, "peak_gflops", where)) n.hw.peak_flops = *v * 1e9;
  if (auto v = json_number(j, "peak_tflops", where)) n.hw.peak_flops = *v * 1e12;
  if (auto v = json_number(j, "efficiency", where)) {
    TANDEM_REQUIRE(*v > 0 && *v <= 1, "{}.efficiency: must be in (0, 1], got {}", where, *v);
    n.hw.efficiency = *v;
  }
  if (auto v = json_number(j, "mem_gbps", where)) n.hw.mem_bytes_per_s = *v * 1e9;  // GB/s
  if (auto v = json_number(j, "mem_bytes_per_s", where)) n.hw.mem_bytes_per_s = *v;
  if (auto v = json_bandwidth(j, "nic", where)) n.hw.nic_bytes_per_s = *v;
  if (auto v = json_seconds(j, "nic_latency", where)) n.hw.nic_latency_s = *v;
  if (auto v = json_bandwidth(j, "intra", where)) n.hw.intra_bytes_per_s = *v;
  if (auto v = json_seconds(j, "intra_latency", where)) n.hw.intra_latency_s = *v;
  if (auto v = json_number(j, "kernel_overhead_us", where)) n.hw.kernel_overhead_s = *v * 1e-6;
  if (auto v = json_number(j, "usd_per_hour", where)) n.hw.usd_per_hour = *v;
  if (auto v = integer("ranks_per_node", 1, 4096)) {
    TANDEM_REQUIRE(n.hw.gpus == 0, "{}.ranks_per_node: only for CPU nodes ({} has {} GPUs, one rank each)", where,
                   n.hw.name, n.hw.gpus);
    n.ranks_per_node = *v;
  }
  if (auto v = json_number(j, "cpu_quota", where)) {
    TANDEM_REQUIRE(*v > 0 && *v <= n.hw.vcpus, "{}.cpu_quota: expected cores in (0, vcpus = {}], got {}", where,
                   n.hw.vcpus, *v);
    n.cpu_quota = *v;
  }
  if (auto v = json_seconds(j, "cpu_period", where)) {
    TANDEM_REQUIRE(*v >= 1e-3 && *v <= 1.0, "{}.cpu_period: CFS allows 1 ms to 1 s, got {} s", where, *v);
    TANDEM_REQUIRE(n.cpu_quota > 0, "{}.cpu_period: given without cpu_quota", where);
    n.cpu_period_s = *v;
  }
  if (j.contains("protocol")) {
    const std::string s = j["protocol"].is_string() ? j["protocol"].get<std::string>() : "";
    TANDEM_REQUIRE(s == "tcp" || s == "rdma", "{}.protocol: expected \"tcp\" or \"rdma\", got {}", where,
                   j["protocol"].dump());
    n.protocol = s == "tcp" ? network::Protocol::kTcp : network::Protocol::kRdma;
  }
  if (auto v = json_number(j, "tcp_goodput", where)) {
    TANDEM_REQUIRE(*v > 0 && *v <= 1, "{}.tcp_goodput: expected a factor in (0, 1], got {}", where, *v);
    TANDEM_REQUIRE(n.protocol == network::Protocol::kTcp, "{}.tcp_goodput: the node's protocol is rdma", where);
    n.tcp_goodput = *v;
  }
  if (auto v = json_number(j, "tcp_two_way_factor", where)) {
    TANDEM_REQUIRE(*v >= 1 && *v <= 16, "{}.tcp_two_way_factor: expected a factor in [1, 16] (an exchange's time over a "
                   "one-way transfer's), got {}", where, *v);
    TANDEM_REQUIRE(n.protocol == network::Protocol::kTcp, "{}.tcp_two_way_factor: the node's protocol is rdma", where);
    n.tcp_two_way_factor = *v;
  }
  if (auto v = json_number(j, "tcp_fanout_cv", where)) {
    TANDEM_REQUIRE(*v >= 0 && *v <= 1, "{}.tcp_fanout_cv: expected a coefficient of variation in [0, 1] (of a flow's "
                   "time among flows fanning out of the node), got {}", where, *v);
    TANDEM_REQUIRE(n.protocol == network::Protocol::kTcp, "{}.tcp_fanout_cv: the node's protocol is rdma", where);
    n.tcp_fanout_cv = *v;
  }
  if (auto v = json_number(j, "tcp_fanout_corr", where)) {
    TANDEM_REQUIRE(*v >= 0 && *v < 1, "{}.tcp_fanout_corr: expected a correlation in [0, 1) (of a connection's share "
                   "from one fan-out to the next), got {}", where, *v);
    TANDEM_REQUIRE(n.protocol == network::Protocol::kTcp, "{}.tcp_fanout_corr: the node's protocol is rdma", where);
    n.tcp_fanout_corr = *v;
  }
  if (j.contains("tcp_slow_start_after_idle")) {
    const auto& v = j["tcp_slow_start_after_idle"];
    TANDEM_REQUIRE(v.is_boolean() || (v.is_number_integer() && (v.get<int64_t>() == 0 || v.get<int64_t>() == 1)),
                   "{}.tcp_slow_start_after_idle: expected true or false (or the sysctl's 1 or 0), got {}", where, v.dump());
    TANDEM_REQUIRE(n.protocol == network::Protocol::kTcp, "{}.tcp_slow_start_after_idle: the node's protocol is rdma",
                   where);
    n.tcp_slow_start_after_idle = v.is_boolean() ? v.get<bool>() : v.get<int64_t>() == 1;
  }
  if (auto v = json_bandwidth(j, "bucket", where)) {
    TANDEM_REQUIRE(*v > 0 && *v < n.hw.nic_bytes_per_s, "{}.bucket: the token bucket's rate must be > 0 and below "
                   "the NIC's line rate ({} Mbit/s), got {} Mbit/s", where, n.hw.nic_bytes_per_s * 8e-6, *v * 8e-6);
    n.bucket_bytes_per_s = *v;
    auto burst = json_bytes(j, "bucket_burst", where);
    TANDEM_REQUIRE(burst.has_value(), "{}.bucket_burst_bytes: required with a token bucket", where);
    TANDEM_REQUIRE(*burst >= network::kBucketFrameBytes, "{}.bucket_burst: must hold a frame ({} bytes), got {}",
                   where, network::kBucketFrameBytes, *burst);
    n.bucket_burst_bytes = *burst;
  } else {
    TANDEM_REQUIRE(!json_bytes(j, "bucket_burst", where), "{}.bucket_burst: given without a bucket rate (bucket_mbps)",
                   where);
  }
  if (auto v = json_bytes(j, "nic_queue", where)) {
    TANDEM_REQUIRE(*v >= network::kBucketFrameBytes && std::isfinite(*v), "{}.nic_queue: the NIC's queue must hold a "
                   "frame ({} bytes), got {}", where, network::kBucketFrameBytes, *v);
    TANDEM_REQUIRE(n.protocol == network::Protocol::kTcp, "{}.nic_queue: the node's protocol is rdma (the queue "
                   "model is TCP's windows)", where);
    n.nic_queue_bytes = *v;
  }
  if (j.contains("credit_mode")) {
    TANDEM_REQUIRE(j["credit_mode"].is_string(), "{}.credit_mode: expected \"standard\" or \"unlimited\"", where);
    TANDEM_REQUIRE(n.hw.burst.default_mode != CreditMode::kNone,
                   "{}.credit_mode: {} is not a burstable instance (credits apply to t2/t3)", where, n.hw.name);
    try {
      n.credit_mode = parse_credit_mode(j["credit_mode"].get<std::string>());
    } catch (const Error& e) {
      TANDEM_THROW(Status::kInvalidArgument, "{}.credit_mode: {}", where, e.what());
    }
  }
  if (auto v = json_number(j, "initial_credits", where)) {
    TANDEM_REQUIRE(n.hw.burst.default_mode != CreditMode::kNone,
                   "{}.initial_credits: {} is not a burstable instance", where, n.hw.name);
    n.initial_credits = *v;
  }
  TANDEM_REQUIRE(n.hw.peak_flops > 0, "{}: peak FLOP/s must be > 0 (peak_gflops)", where);
  TANDEM_REQUIRE(n.hw.mem_bytes_per_s > 0, "{}: memory bandwidth must be > 0 (mem_gbps)", where);
  TANDEM_REQUIRE(n.hw.nic_bytes_per_s > 0, "{}: NIC bandwidth must be > 0 (nic_gbps or nic_mbps)", where);
  TANDEM_REQUIRE(n.hw.memory_bytes > 0, "{}: memory must be > 0 (memory_gib)", where);
  TANDEM_REQUIRE(n.hw.gpus == 0 || n.hw.gpu_memory_bytes > 0, "{}: GPU nodes need gpu_memory_gib", where);
  TANDEM_REQUIRE(n.hw.gpus <= 1 || n.hw.intra_bytes_per_s > 0, "{}: nodes with several GPUs need intra_gbps", where);
  return n;
}

}  // namespace

ClusterSpec cluster_from_json(const nlohmann::json& j, const std::string& where) {
  json_check_keys(j, {"nodes", "topology", "sharing"}, where);
  TANDEM_REQUIRE(j.contains("nodes") && j["nodes"].is_array() && !j["nodes"].empty(),
                 "{}.nodes: required, a non-empty array of node objects", where);
  ClusterSpec c;
  for (size_t i = 0; i < j["nodes"].size(); ++i) {
    std::string w = fmt::format("{}.nodes[{}]", where, i);
    const auto& nj = j["nodes"][i];
    NodeSpec n = node_from_json(nj, w);
    int count = 1;
    if (auto v = json_number(nj, "count", w)) {
      TANDEM_REQUIRE(*v >= 1 && *v <= 65536 && *v == static_cast<int>(*v), "{}.count: expected an integer in "
                     "[1, 65536], got {}", w, *v);
      count = static_cast<int>(*v);
    }
    for (int k = 0; k < count; ++k) {
      NodeSpec copy = n;
      if (copy.name.empty()) {
        copy.name = fmt::format("n{}", c.nodes.size());
      } else if (count > 1) {
        copy.name += fmt::format("-{}", k);
      }
      c.nodes.push_back(std::move(copy));
    }
  }
  if (j.contains("topology")) {
    c.topology = network::topology_from_json(j["topology"], where + ".topology");
  } else {
    default_topology(c);
  }
  if (j.contains("sharing")) {
    TANDEM_REQUIRE(j["sharing"].is_string(), "{}.sharing: expected \"max-min\" or \"rtt-weighted\"", where);
    std::string s = j["sharing"].get<std::string>();
    if (s == "max-min") {
      c.sharing = network::Sharing::kMaxMin;
    } else if (s == "rtt-weighted") {
      c.sharing = network::Sharing::kRttWeighted;
    } else {
      TANDEM_THROW(Status::kInvalidArgument, "{}.sharing: unknown \"{}\" (max-min, rtt-weighted)", where, s);
    }
  }
  return c;
}

ClusterSpec parse_cluster(const std::string& spec) {
  TANDEM_REQUIRE(!spec.empty(), "cluster: empty specification (use PRESET:COUNT, e.g. t2.micro:4, or a JSON file)");
  ClusterSpec c;
  const size_t first = spec.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && spec[first] == '{') {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(spec);
    } catch (const nlohmann::json::exception& e) {
      TANDEM_THROW(Status::kInvalidArgument, "cluster JSON: {}", e.what());
    }
    c = cluster_from_json(j);
  } else if (spec.find(".json") != std::string::npos || spec.find('/') != std::string::npos) {
    c = cluster_from_json(read_json_file(spec, "cluster file"), spec);
  } else {
    size_t pos = 0;
    while (pos <= spec.size()) {
      size_t plus = spec.find('+', pos);
      std::string part = spec.substr(pos, plus == std::string::npos ? std::string::npos : plus - pos);
      size_t colon = part.rfind(':');
      std::string name = colon == std::string::npos ? part : part.substr(0, colon);
      int count = 1;
      if (colon != std::string::npos) {
        std::string num = part.substr(colon + 1);
        char* end = nullptr;
        long v = std::strtol(num.c_str(), &end, 10);
        TANDEM_REQUIRE(!num.empty() && end && *end == '\0' && v >= 1 && v <= 65536,
                       "cluster \"{}\": count \"{}\" must be an integer in [1, 65536]", spec, num);
        count = static_cast<int>(v);
      }
      NodeSpec n;
      n.hw = find_preset(name);
      set_defaults(n);
      for (int k = 0; k < count; ++k) {
        NodeSpec copy = n;
        copy.name = fmt::format("n{}", c.nodes.size());
        c.nodes.push_back(std::move(copy));
      }
      if (plus == std::string::npos) break;
      pos = plus + 1;
    }
    c.from_presets = true;
    default_topology(c);
  }
  c.text = spec;
  return c;
}

ClusterSpec resize_cluster(const ClusterSpec& c, int32_t count) {
  TANDEM_REQUIRE(count >= 1, "cluster size must be >= 1, got {}", count);
  TANDEM_REQUIRE(!c.nodes.empty(), "cannot resize an empty cluster");
  ClusterSpec out = c;
  out.nodes.clear();
  for (int32_t i = 0; i < count; ++i) {
    NodeSpec n = c.nodes.front();
    n.name = fmt::format("n{}", i);
    out.nodes.push_back(std::move(n));
  }
  out.text = fmt::format("{}:{}", c.nodes.front().hw.name, count);
  if (out.topology.kind == network::TopologyKind::kGraph) out.topology = network::TopologySpec{};
  return out;
}

}  // namespace tandem::simulator
