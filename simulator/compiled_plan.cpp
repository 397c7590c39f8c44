#include "simulator/compiled_plan.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "engine/core/error.hpp"

namespace tandem::simulator {

using engine::comm::OpKind;

uint64_t CompiledPlan::total_bytes_sent() const {
  uint64_t b = 0;
  for (const Send& s : sends) b += s.bytes;
  return b;
}

namespace {
// Per-rank channels by peer: plans give a rank few distinct peers (ring 2, halving-doubling and trees
// log n), so a linear scan beats hashing and keeps compilation linear in the number of ops.
struct Channels {
  std::vector<std::vector<std::pair<int32_t, uint32_t>>> by_rank;  // rank -> (peer, channel)
  std::vector<std::vector<uint32_t>> items;                          // channel -> indices, in plan order
  std::vector<uint32_t> taken;
  explicit Channels(int32_t n) : by_rank(static_cast<size_t>(n)) {}
  uint32_t channel(int32_t rank, int32_t peer) {
    auto& v = by_rank[static_cast<size_t>(rank)];
    for (const auto& [p, c] : v)
      if (p == peer) return c;
    v.emplace_back(peer, static_cast<uint32_t>(items.size()));
    items.emplace_back();
    taken.push_back(0);
    return v.back().second;
  }
};
}  // namespace

CompiledPlan compile_plan(const engine::comm::Plan& plan, uint64_t elem_bytes) {
  // validate_plan is costly on large worlds; matching below already checks pairing and sizes, and the
  // executor reports a plan that never completes.
  if (plan.world <= 64) engine::comm::validate_plan(plan);
  CompiledPlan c;
  c.world = plan.world;
  c.elem_bytes = elem_bytes;
  const int32_t n = plan.world;
  c.description = fmt::format("{} {} world={} count={}", engine::comm::collective_name(plan.collective),
                              engine::comm::algorithm_name(plan.algorithm), n, plan.count);  // for errors below
  size_t nrounds = 0, nrecv = 0, nsend = 0;
  for (const auto& rp : plan.ranks) {
    nrounds += rp.rounds.size();
    for (const auto& rd : rp.rounds)
      for (const auto& op : rd.ops) {
        nrecv += op.kind == OpKind::kRecv;
        nsend += op.kind == OpKind::kSend;
      }
  }
  TANDEM_CHECK(nsend == nrecv, Status::kInternal, "plan {}: {} sends but {} receives", c.description, nsend, nrecv);
  TANDEM_CHECK(nsend < (uint64_t{1} << 32) && nrounds < (uint64_t{1} << 32), Status::kOutOfMemory,
               "plan {} is too large to simulate", c.description);
  c.rounds.reserve(nrounds);
  c.recvs.reserve(nrecv);
  c.sends.reserve(nsend);
  c.first_round.reserve(static_cast<size_t>(n) + 1);
  Channels recv_ch(n);  // indexed by receiving rank, peer = sender
  for (int32_t r = 0; r < n; ++r) {
    c.first_round.push_back(static_cast<uint32_t>(c.rounds.size()));
    for (const auto& round : plan.ranks[static_cast<size_t>(r)].rounds) {
      CompiledPlan::Round cr{};
      const uint32_t ri = static_cast<uint32_t>(c.rounds.size());
      cr.recv_begin = static_cast<uint32_t>(c.recvs.size());
      for (const auto& op : round.ops) {
        switch (op.kind) {
          case OpKind::kRecv:
            recv_ch.items[recv_ch.channel(r, op.peer)].push_back(static_cast<uint32_t>(c.recvs.size()));
            c.recvs.push_back({op.peer, ri, op.dst.count * elem_bytes});
            break;
          case OpKind::kCopy: cr.local_bytes += 2 * op.src.count * elem_bytes; break;
          case OpKind::kReduce: cr.local_bytes += 3 * op.src.count * elem_bytes; break;
          case OpKind::kSend: break;
        }
      }
      cr.recv_end = static_cast<uint32_t>(c.recvs.size());
      c.rounds.push_back(cr);
    }
  }
  c.first_round.push_back(static_cast<uint32_t>(c.rounds.size()));
  // sends, in plan order per rank, take the receives of their channel in order
  for (int32_t r = 0; r < n; ++r) {
    uint32_t ri = c.first_round[static_cast<size_t>(r)];
    for (const auto& round : plan.ranks[static_cast<size_t>(r)].rounds) {
      CompiledPlan::Round& cr = c.rounds[ri++];
      cr.send_begin = static_cast<uint32_t>(c.sends.size());
      for (const auto& op : round.ops) {
        if (op.kind != OpKind::kSend) continue;
        TANDEM_CHECK(op.peer >= 0 && op.peer < n && op.peer != r, Status::kInternal, "plan {}: rank {} sends to {}",
                     c.description, r, op.peer);
        const uint32_t ch = recv_ch.channel(op.peer, r);
        auto& q = recv_ch.items[ch];
        uint32_t& taken = recv_ch.taken[ch];
        TANDEM_CHECK(taken < q.size(), Status::kInternal, "plan {}: send {} -> {} has no matching receive",
                     c.description, r, op.peer);
        const uint32_t rv = q[taken++];
        TANDEM_CHECK(c.recvs[rv].bytes == op.src.count * elem_bytes, Status::kInternal,
                     "plan {}: send {} -> {} of {} elements meets a receive of {} bytes", c.description, r, op.peer,
                     op.src.count, c.recvs[rv].bytes);
        c.sends.push_back({r, op.peer, rv, c.recvs[rv].round, op.src.count * elem_bytes});
      }
      cr.send_end = static_cast<uint32_t>(c.sends.size());
    }
  }
  if (plan.finish_avg) c.finish_bytes = 2 * plan.count * elem_bytes;
  // Plan::describe() walks the whole plan twice more; large plans get the same line from our counts
  if (n <= 256) {
    c.description = plan.describe();
  } else {
    size_t rounds = 0;
    for (const auto& rp : plan.ranks) rounds = std::max(rounds, rp.rounds.size());
    c.description = fmt::format("{} {} world={} count={} chunk={} rounds={} messages={} payload={}{}",
                                engine::comm::collective_name(plan.collective),
                                engine::comm::algorithm_name(plan.algorithm), n, plan.count, plan.chunk_count, rounds,
                                c.sends.size(), c.total_bytes_sent() / elem_bytes, plan.in_place ? " in-place" : "");
  }
  // rotation symmetry: member r's round i mirrors member 0's round i
  bool sym = n > 1;
  const uint32_t r0 = c.first_round[1] - c.first_round[0];
  for (int32_t r = 1; r < n && sym; ++r) {
    if (c.first_round[r + 1] - c.first_round[r] != r0) sym = false;
    for (uint32_t i = 0; i < r0 && sym; ++i) {
      const auto& a = c.rounds[c.first_round[0] + i];
      const auto& b = c.rounds[c.first_round[r] + i];
      if (a.send_end - a.send_begin != b.send_end - b.send_begin ||
          a.recv_end - a.recv_begin != b.recv_end - b.recv_begin || a.local_bytes != b.local_bytes) {
        sym = false;
        break;
      }
      for (uint32_t k = 0; k < a.send_end - a.send_begin && sym; ++k) {
        const auto& sa = c.sends[a.send_begin + k];
        const auto& sb = c.sends[b.send_begin + k];
        sym = sb.bytes == sa.bytes && sb.dst == (sa.dst + r) % n;
      }
      for (uint32_t k = 0; k < a.recv_end - a.recv_begin && sym; ++k) {
        const auto& ra = c.recvs[a.recv_begin + k];
        const auto& rb = c.recvs[b.recv_begin + k];
        sym = rb.bytes == ra.bytes && rb.src == (ra.src + r) % n;
      }
    }
  }
  if (sym) {
    // member 0's k-th receive from q mirrors its own k-th send to (n - q) mod n
    const uint32_t s0 = c.rounds[c.first_round[0]].send_begin;
    const uint32_t s1 = c.first_round[1] < c.rounds.size() ? c.rounds[c.first_round[1]].send_begin
                                                            : static_cast<uint32_t>(c.sends.size());
    Channels send_ch(1);
    for (uint32_t k = s0; k < s1; ++k) send_ch.items[send_ch.channel(0, c.sends[k].dst)].push_back(k);
    c.mirror_recv.assign(s1 - s0, UINT32_MAX);
    const uint32_t rb = c.rounds[c.first_round[0]].recv_begin;
    const uint32_t re = c.rounds[c.first_round[1] - 1].recv_end;
    for (uint32_t j = rb; j < re && sym; ++j) {
      const int32_t mirror_dst = (n - c.recvs[j].src) % n;
      const uint32_t ch = send_ch.channel(0, mirror_dst);
      auto& q = send_ch.items[ch];
      uint32_t& taken = send_ch.taken[ch];
      if (taken >= q.size() || c.sends[q[taken]].bytes != c.recvs[j].bytes) {
        sym = false;
        break;
      }
      c.mirror_recv[q[taken++] - s0] = j;
    }
    for (uint32_t v : c.mirror_recv) sym = sym && v != UINT32_MAX;
    if (!sym) c.mirror_recv.clear();
  }
  c.rotation_symmetric = sym;
  return c;
}

const CompiledPlan& PlanCache::get(const engine::comm::PlanRequest& r) {
  std::string k = fmt::format("{}|{}|{}|{}|{}|{}|{}|{}|{}|{}", static_cast<int>(r.collective),
                              static_cast<int>(r.algorithm), r.world, r.root, r.count, r.elem_bytes, r.chunk_bytes,
                              r.peer, r.in_place, fmt::join(r.topology.host_of, ","));
  auto it = plans_.find(k);
  if (it != plans_.end()) return *it->second;
  auto compiled = std::make_unique<CompiledPlan>(compile_plan(engine::comm::make_plan(r), r.elem_bytes));
  return *plans_.emplace(std::move(k), std::move(compiled)).first->second;
}

}  // namespace tandem::simulator
