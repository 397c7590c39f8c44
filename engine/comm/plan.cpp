#include "engine/comm/plan.hpp"

#include <algorithm>
#include <functional>
#include <map>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "engine/comm/plan_builder.hpp"
#include "engine/core/error.hpp"

namespace tandem::engine::comm {

using namespace plan_detail;  // the builders (plan_builder.hpp)

const char* collective_name(Collective c) noexcept {
  switch (c) {
    case Collective::kAllreduce: return "allreduce";
    case Collective::kReduceScatter: return "reduce_scatter";
    case Collective::kAllgather: return "allgather";
    case Collective::kBroadcast: return "broadcast";
    case Collective::kReduce: return "reduce";
    case Collective::kBarrier: return "barrier";
    case Collective::kSend: return "send";
    case Collective::kRecv: return "recv";
  }
  return "unknown";
}

const char* algorithm_name(Algorithm a) noexcept {
  switch (a) {
    case Algorithm::kAuto: return "auto";
    case Algorithm::kRing: return "ring";
    case Algorithm::kHalvingDoubling: return "hd";
    case Algorithm::kTree: return "tree";
    case Algorithm::kHierarchical: return "hier";
    case Algorithm::kDirect: return "direct";
    case Algorithm::kDeterministic: return "det";
  }
  return "unknown";
}

Algorithm parse_algorithm(const std::string& s) {
  if (s == "auto" || s.empty()) return Algorithm::kAuto;
  if (s == "ring") return Algorithm::kRing;
  if (s == "hd" || s == "rhd" || s == "halving-doubling" || s == "halving_doubling") return Algorithm::kHalvingDoubling;
  if (s == "tree") return Algorithm::kTree;
  if (s == "hier" || s == "hierarchical") return Algorithm::kHierarchical;
  if (s == "direct") return Algorithm::kDirect;
  if (s == "det" || s == "deterministic") return Algorithm::kDeterministic;
  TANDEM_THROW(Status::kInvalidArgument,
               "unknown collective algorithm '{}' (expected auto, ring, hd, tree, hier, direct or det)", s);
}

bool Topology::multi_rank_hosts() const {
  std::map<int32_t, int> per_host;
  for (int32_t h : host_of)
    if (++per_host[h] > 1) return true;
  return false;
}

uint64_t Plan::message_count() const {
  uint64_t n = 0;
  for (const auto& rp : ranks)
    for (const auto& round : rp.rounds)
      for (const auto& op : round.ops) n += op.kind == OpKind::kSend ? 1 : 0;
  return n;
}

uint64_t Plan::payload_count() const {
  uint64_t n = 0;
  for (const auto& rp : ranks)
    for (const auto& round : rp.rounds)
      for (const auto& op : round.ops) n += op.kind == OpKind::kSend ? op.src.count : 0;
  return n;
}

std::string Plan::describe() const {
  size_t rounds = 0;
  for (const auto& rp : ranks) rounds = std::max(rounds, rp.rounds.size());
  std::string s = fmt::format("{} {} world={} count={}", collective_name(collective), algorithm_name(algorithm),
                              world, count);
  if (collective == Collective::kBroadcast || collective == Collective::kReduce) s += fmt::format(" root={}", root);
  if (collective == Collective::kSend || collective == Collective::kRecv)
    s += fmt::format(" from={} to={}", root, peer);
  s += fmt::format(" chunk={} rounds={} messages={} payload={} scratch={}{}{}", chunk_count, rounds, message_count(),
                   payload_count(), scratch_count, in_place ? " in-place" : "", finish_avg ? " avg" : "");
  return s;
}

uint64_t plan_buffer_count(const Plan& plan, Buffer b, int32_t rank) {
  const uint64_t n = plan.count;
  const uint64_t w = static_cast<uint64_t>(std::max(plan.world, 1));
  if (b == Buffer::kScratch) return plan.scratch_count;
  const bool in = b == Buffer::kInput;
  switch (plan.collective) {
    case Collective::kAllreduce: return n;
    case Collective::kReduceScatter: return in ? n : n / w;
    case Collective::kAllgather: return in ? n / w : n;
    case Collective::kBroadcast: return in ? 0 : n;
    case Collective::kReduce: return in ? n : (rank == plan.root ? n : 0);
    case Collective::kBarrier: return 0;
    case Collective::kSend:
    case Collective::kRecv: return in ? (rank == plan.root ? n : 0) : (rank == plan.peer ? n : 0);
  }
  return 0;
}

uint64_t plan_chunk_count(const PlanRequest& request) {
  const uint64_t bytes = request.chunk_bytes ? request.chunk_bytes : kDefaultChunkBytes;
  const uint64_t elem = std::max<uint64_t>(request.elem_bytes, 1);
  return std::max<uint64_t>(bytes / elem, 1);
}

uint64_t effective_chunk_bytes(uint64_t configured, uint64_t buffer_bytes) {
  constexpr uint64_t kMaxChunksPerBuffer = 512;
  const uint64_t base = configured ? configured : kDefaultChunkBytes;
  return std::max(base, (buffer_bytes + kMaxChunksPerBuffer - 1) / kMaxChunksPerBuffer);
}

namespace {

bool reduces(Collective c) {
  return c == Collective::kAllreduce || c == Collective::kReduceScatter || c == Collective::kReduce;
}

bool supported(Collective c, Algorithm a) {
  switch (c) {
    case Collective::kAllreduce: return a != Algorithm::kDirect;
    case Collective::kReduceScatter: return a == Algorithm::kRing || a == Algorithm::kDeterministic;
    case Collective::kAllgather: return a == Algorithm::kRing;
    case Collective::kBroadcast: return a == Algorithm::kTree || a == Algorithm::kRing;
    case Collective::kReduce:
      return a == Algorithm::kTree || a == Algorithm::kRing || a == Algorithm::kDeterministic;
    case Collective::kBarrier:
    case Collective::kSend:
    case Collective::kRecv: return a == Algorithm::kDirect;
  }
  return false;
}

}  // namespace

Algorithm choose_algorithm(const PlanRequest& r) {
  Algorithm a = r.algorithm;
  if (a == Algorithm::kDeterministic && !reduces(r.collective)) a = Algorithm::kAuto;
  if (a != Algorithm::kAuto) {
    if (!supported(r.collective, a))
      TANDEM_THROW(Status::kUnsupported, "{} has no '{}' algorithm", collective_name(r.collective), algorithm_name(a));
    return a;
  }
  const uint64_t bytes = r.count * std::max<uint64_t>(r.elem_bytes, 1);
  switch (r.collective) {
    case Collective::kAllreduce: {
      if (r.world <= 1) return Algorithm::kRing;
      if (bytes <= 64 * 1024) return Algorithm::kHalvingDoubling;
      const bool several_hosts = [&] {
        for (int32_t h : r.topology.host_of)
          if (h != r.topology.host_of.front()) return true;
        return false;
      }();
      if (several_hosts && r.topology.multi_rank_hosts() && bytes >= 256 * 1024) return Algorithm::kHierarchical;
      // Up to 2 MiB on a power-of-two world, halving-doubling's 2 log2(n) dependent steps beat the
      // ring's 2(n - 1) -- each rank moves the same bytes either way (measured with 4 ranks sharing 2
      // cores, best of 3 rounds: 1 MiB 1.78 vs 0.92 GB/s busbw over tcp, 4.41 vs 3.85 over ucx;
      // at 4 MiB the ring was ahead over tcp, 0.91 vs 0.81).
      const bool pow2 = (r.world & (r.world - 1)) == 0;
      if (r.world > 2 && pow2 && bytes <= 2 * 1024 * 1024) return Algorithm::kHalvingDoubling;
      if (bytes < 512 * 1024 && r.world > 4) return Algorithm::kHalvingDoubling;
      return Algorithm::kRing;
    }
    case Collective::kReduceScatter:
    case Collective::kAllgather: return Algorithm::kRing;
    case Collective::kBroadcast:
    case Collective::kReduce: return bytes <= 256 * 1024 || r.world <= 2 ? Algorithm::kTree : Algorithm::kRing;
    case Collective::kBarrier:
    case Collective::kSend:
    case Collective::kRecv: return Algorithm::kDirect;
  }
  return Algorithm::kRing;
}

Plan plan_header(const PlanRequest& r) {
  const bool rooted = r.collective == Collective::kBroadcast || r.collective == Collective::kReduce ||
                      r.collective == Collective::kSend || r.collective == Collective::kRecv;
  const bool p2p = r.collective == Collective::kSend || r.collective == Collective::kRecv;
  Plan plan;
  plan.collective = r.collective;
  plan.algorithm = choose_algorithm(r);
  plan.world = r.world;
  plan.root = rooted ? r.root : 0;
  plan.peer = p2p ? r.peer : -1;
  plan.count = r.count;
  plan.in_place = r.in_place && !p2p && r.collective != Collective::kBarrier && r.collective != Collective::kBroadcast;
  plan.chunk_count = plan_chunk_count(r);
  return plan;
}

namespace {

// make_plan's body; only >= 0 builds that rank's ops alone (see PlanBuilder), into `reuse`'s storage if given.
Plan build_plan(const PlanRequest& r, int only, RankPlan* reuse = nullptr) {
  TANDEM_REQUIRE(r.world >= 1, "world size must be at least 1 (got {})", r.world);
  TANDEM_REQUIRE(static_cast<uint8_t>(r.collective) <= static_cast<uint8_t>(Collective::kRecv),
                 "unknown collective value {}", static_cast<int>(r.collective));
  TANDEM_REQUIRE(static_cast<uint8_t>(r.algorithm) <= static_cast<uint8_t>(Algorithm::kDeterministic),
                 "unknown algorithm value {}", static_cast<int>(r.algorithm));
  TANDEM_REQUIRE(r.topology.host_of.empty() || r.topology.host_of.size() == static_cast<size_t>(r.world),
                 "topology lists {} ranks but the world has {}", r.topology.host_of.size(), r.world);
  const bool rooted = r.collective == Collective::kBroadcast || r.collective == Collective::kReduce ||
                      r.collective == Collective::kSend || r.collective == Collective::kRecv;
  if (rooted)
    TANDEM_REQUIRE(r.root >= 0 && r.root < r.world, "{} root {} is out of range for world size {}",
                   collective_name(r.collective), r.root, r.world);
  const bool p2p = r.collective == Collective::kSend || r.collective == Collective::kRecv;
  if (p2p)
    TANDEM_REQUIRE(r.peer >= 0 && r.peer < r.world && r.peer != r.root,
                   "{} from rank {} to rank {} is invalid for world size {}", collective_name(r.collective), r.root,
                   r.peer, r.world);
  if (r.collective == Collective::kReduceScatter || r.collective == Collective::kAllgather)
    TANDEM_REQUIRE(r.count % static_cast<uint64_t>(r.world) == 0,
                   "{} count {} (elements of the full buffer) is not a multiple of the world size {}",
                   collective_name(r.collective), r.count, r.world);

  Plan plan = plan_header(r);
  plan.ranks.resize(static_cast<size_t>(r.world));
  if (reuse) plan.ranks[static_cast<size_t>(only)] = std::move(*reuse);
  PlanBuilder b(plan, plan.chunk_count, only);
  const int n = r.world;
  const Span all{0, r.count};
  switch (r.collective) {
    case Collective::kAllreduce:
      switch (plan.algorithm) {
        case Algorithm::kRing: plan_allreduce_ring(b, n, all); break;
        case Algorithm::kHalvingDoubling: plan_allreduce_hd(b, n, all, std::max<uint64_t>(r.elem_bytes, 1)); break;
        case Algorithm::kTree: plan_allreduce_tree(b, n, all); break;
        case Algorithm::kHierarchical: plan_allreduce_hier(b, n, all, r.topology); break;
        case Algorithm::kDeterministic: plan_allreduce_det(b, n, all); break;
        default: break;
      }
      break;
    case Collective::kReduceScatter:
      plan_reduce_scatter(b, n, all, plan.algorithm == Algorithm::kDeterministic);
      break;
    case Collective::kAllgather: plan_allgather(b, n, all); break;
    case Collective::kBroadcast: plan_broadcast(b, n, plan.root, all, plan.algorithm); break;
    case Collective::kReduce: plan_reduce(b, n, plan.root, all, plan.algorithm); break;
    case Collective::kBarrier: plan_barrier(b, n); break;
    case Collective::kSend:
    case Collective::kRecv:
      b.transfer(plan.root, 0, kIn, plan.peer, 0, kOut, all);
      if (r.count == 0) {  // an empty message still travels, so the receiver knows it happened
        b.send(plan.root, 0, plan.peer, Region{Buffer::kInput, 0, 0});
        b.recv(plan.peer, 0, plan.root, Region{Buffer::kOutput, 0, 0});
      }
      break;
  }
  b.finish();
  return plan;
}

}  // namespace

Plan make_plan(const PlanRequest& r) { return build_plan(r, -1); }

RankPlan make_rank_plan(const PlanRequest& r, int32_t rank) {
  TANDEM_REQUIRE(rank >= 0 && rank < r.world, "make_rank_plan: rank {} is out of range for world size {}", rank,
                 r.world);
  Plan plan = build_plan(r, rank);
  return std::move(plan.ranks[static_cast<size_t>(rank)]);
}

void make_rank_plan(const PlanRequest& r, int32_t rank, RankPlan& out) {
  TANDEM_REQUIRE(rank >= 0 && rank < r.world, "make_rank_plan: rank {} is out of range for world size {}", rank,
                 r.world);
  Plan plan = build_plan(r, rank, &out);
  out = std::move(plan.ranks[static_cast<size_t>(rank)]);
}

}  // namespace tandem::engine::comm
