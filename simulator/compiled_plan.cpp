#include "simulator/compiled_plan.hpp"

#include <unordered_map>

#include <fmt/format.h>

#include "engine/core/error.hpp"

namespace tandem::simulator {

using engine::comm::OpKind;

uint64_t CompiledPlan::total_bytes_sent() const {
  uint64_t b = 0;
  for (const Send& s : sends) b += s.bytes;
  return b;
}

CompiledPlan compile_plan(const engine::comm::Plan& plan, uint64_t elem_bytes) {
  // validate_plan is quadratic-ish on large worlds; matching below already checks pairing and sizes,
  // and the executor reports a plan that never completes.
  if (plan.world <= 64) engine::comm::validate_plan(plan);
  CompiledPlan c;
  c.world = plan.world;
  c.elem_bytes = elem_bytes;
  c.description = plan.describe();
  const int32_t n = plan.world;
  // pending receives per (src -> dst) channel, in plan order, matched to sends in plan order
  std::unordered_map<uint64_t, std::vector<uint32_t>> recv_queue;
  std::unordered_map<uint64_t, size_t> recv_taken;
  auto key = [](int32_t a, int32_t b) { return (static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b); };
  for (int32_t r = 0; r < n; ++r) {
    c.first_round.push_back(static_cast<uint32_t>(c.rounds.size()));
    for (const auto& round : plan.ranks[static_cast<size_t>(r)].rounds) {
      CompiledPlan::Round cr{};
      cr.send_begin = cr.send_end = static_cast<uint32_t>(c.sends.size());
      cr.recv_begin = static_cast<uint32_t>(c.recvs.size());
      for (const auto& op : round.ops) {
        switch (op.kind) {
          case OpKind::kRecv:
            recv_queue[key(op.peer, r)].push_back(static_cast<uint32_t>(c.recvs.size()));
            c.recvs.push_back({op.peer, op.dst.count * elem_bytes});
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
        auto& q = recv_queue[key(r, op.peer)];
        size_t& taken = recv_taken[key(r, op.peer)];
        TANDEM_CHECK(taken < q.size(), Status::kInternal, "plan {}: send {} -> {} has no matching receive",
                     c.description, r, op.peer);
        uint32_t rv = q[taken++];
        TANDEM_CHECK(c.recvs[rv].bytes == op.src.count * elem_bytes, Status::kInternal,
                     "plan {}: send {} -> {} of {} elements meets a receive of {} bytes", c.description, r, op.peer,
                     op.src.count, c.recvs[rv].bytes);
        c.sends.push_back({op.peer, rv, op.src.count * elem_bytes});
      }
      cr.send_end = static_cast<uint32_t>(c.sends.size());
    }
  }
  if (plan.finish_avg) c.finish_bytes = 2 * plan.count * elem_bytes;
  // rotation symmetry: member r's round i mirrors member 0's round i
  bool sym = n > 1;
  const uint32_t r0 = c.first_round[1] - c.first_round[0];
  for (int32_t r = 1; r < n && sym; ++r) {
    if (c.first_round[r + 1] - c.first_round[r] != r0) sym = false;
    for (uint32_t i = 0; i < r0 && sym; ++i) {
      const auto& a = c.rounds[c.first_round[0] + i];
      const auto& b = c.rounds[c.first_round[r] + i];
      if (a.send_end - a.send_begin != b.send_end - b.send_begin || a.recv_end - a.recv_begin != b.recv_end - b.recv_begin ||
          a.local_bytes != b.local_bytes) {
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
