// Allreduce plans: ring, tree, halving-doubling, hierarchical, deterministic.
#include "engine/comm/plan_builder.hpp"

#include <map>

namespace tandem::engine::comm::plan_detail {

// Below this many bytes halving-doubling exchanges whole buffers (recursive doubling: fewest rounds).
constexpr uint64_t kHdWholeBufferBytes = 32 * 1024;

// Makes sure every rank of `group` ends with its folded result in out (a group of one copies).
void finish_in_out(PlanBuilder& b, const std::vector<int>& group, const std::vector<Fold>& folds, Span s) {
  for (size_t gi = 0; gi < group.size(); ++gi)
    if (!folds[gi].valid) b.copy(group[gi], b.next_round(group[gi]), folds[gi].own.at(s), kOut.at(s));
}

// Ring allreduce over `group` on span s with per-member starting folds (acc in out).
void ring_allreduce(PlanBuilder& b, const std::vector<int>& group, Span s, const std::vector<Fold>& start) {
  const int g = static_cast<int>(group.size());
  if (g == 1) return finish_in_out(b, group, start, s);
  const auto segs = split_even(s, static_cast<uint64_t>(g));
  const auto owned = ring_reduce_scatter(b, group, segs, [&](int gi, int) { return start[gi]; }, 0);
  ring_allgather(b, group, segs, [&](int gi) { return owned[gi] ? kOut : start[gi].own; }, [](int) { return kOut; });
}

Fold initial_fold(const PlanBuilder& b) { return Fold{kOut, b.in_place(), kIn}; }

void plan_allreduce_ring(PlanBuilder& b, int n, Span s) {
  ring_allreduce(b, iota_group(n), s, std::vector<Fold>(n, initial_fold(b)));
}

void plan_allreduce_tree(PlanBuilder& b, int n, Span s) {
  const auto group = iota_group(n);
  auto folds = tree_reduce(b, group, 0, s, std::vector<Fold>(n, initial_fold(b)), 0);
  const Loc root_src = folds[0].valid ? kOut : folds[0].own;
  if (!(root_src == kOut)) b.copy(0, b.next_round(0), root_src.at(s), kOut.at(s));
  tree_broadcast(b, group, 0, s, kOut, [](int) { return kOut; });
}

void plan_allreduce_hd(PlanBuilder& b, int n, Span s, uint64_t elem_bytes) {
  const int p = 1 << (ceil_log2(n + 1) - 1);  // largest power of two <= n
  const int rem = n - p;
  std::vector<Fold> folds(n, initial_fold(b));
  // Fold the extra ranks in: of each pair (2i, 2i+1), i < rem, the odd one carries on for both.
  for (int i = 0; i < rem; ++i) {
    const size_t t0 = b.next_round(2 * i), t1 = b.next_round(2 * i + 1);
    send_current(b, 2 * i, t0, 2 * i + 1, folds[2 * i], s);
    recv_fold(b, 2 * i + 1, t1, 2 * i, folds[2 * i + 1], s, scratch_at(0, s.off));
    if (b.in_place() && s.len) b.need_scratch(s.len);
  }
  std::vector<int> real(p);  // virtual rank -> rank
  for (int v = 0; v < p; ++v) real[v] = v < rem ? 2 * v + 1 : v + rem;
  const bool whole = s.len * elem_bytes <= kHdWholeBufferBytes || s.len < static_cast<uint64_t>(p);
  if (whole) {
    // Recursive doubling: exchange whole buffers with partner v ^ mask and fold.
    for (int mask = 1; mask < p; mask <<= 1) {
      std::vector<size_t> base;
      for (int v = 0; v < p; ++v) base.push_back(b.next_round(real[v]));
      std::vector<Fold> before(folds);
      for (int v = 0; v < p; ++v) {
        const int r = real[v], q = real[v ^ mask];
        send_current(b, r, base[v], q, before[r], s);
        if (folds[r].valid && s.len) b.need_scratch(s.len);
        recv_fold(b, r, base[v], q, folds[r], s, scratch_at(0, s.off));
      }
    }
  } else {
    // Rabenseifner: recursive halving (reduce-scatter), then recursive doubling (allgather).
    std::vector<Span> cur(p, s);
    std::vector<std::vector<std::pair<Span, Span>>> steps(p);  // (kept, given away) per step
    for (int mask = p / 2; mask >= 1; mask >>= 1) {
      std::vector<size_t> base;
      for (int v = 0; v < p; ++v) base.push_back(b.next_round(real[v]));
      for (int v = 0; v < p; ++v) {
        const int r = real[v], q = real[v ^ mask];
        const auto halves = split_even(cur[v], 2);
        const Span keep = (v & mask) ? halves[1] : halves[0];
        const Span give = (v & mask) ? halves[0] : halves[1];
        send_current(b, r, base[v], q, folds[r], give);
        if (folds[r].valid && keep.len) b.need_scratch(keep.len);
        recv_fold(b, r, base[v], q, folds[r], keep, scratch_at(0, keep.off));
        steps[v].push_back({keep, give});
        cur[v] = keep;
      }
    }
    for (int mask = 1; mask < p; mask <<= 1) {
      std::vector<size_t> base;
      for (int v = 0; v < p; ++v) base.push_back(b.next_round(real[v]));
      for (int v = 0; v < p; ++v) {
        const auto [keep, give] = steps[v].back();
        steps[v].pop_back();
        const int r = real[v], q = real[v ^ mask];
        for (const Span& c : split_even(keep, chunks_for(keep.len, b.chunk())))
          if (c.len) b.send(r, base[v], q, kOut.at(c));
        for (const Span& c : split_even(give, chunks_for(give.len, b.chunk())))
          if (c.len) b.recv(r, base[v], q, kOut.at(c));
      }
    }
    if (p > 1)
      for (int v = 0; v < p; ++v) folds[real[v]].valid = true;  // every element of out now written
  }
  for (int v = 0; v < p; ++v)
    if (!folds[real[v]].valid) b.copy(real[v], b.next_round(real[v]), folds[real[v]].own.at(s), kOut.at(s));
  // Unfold: the odd partner hands the result back.
  for (int i = 0; i < rem; ++i)
    b.transfer(2 * i + 1, b.next_round(2 * i + 1), kOut, 2 * i, b.next_round(2 * i), kOut, s);
}

void plan_allreduce_hier(PlanBuilder& b, int n, Span s, const Topology& topo) {
  std::vector<std::vector<int>> hosts;
  std::map<int32_t, size_t> index;
  for (int r = 0; r < n; ++r) {
    const int32_t h = topo.host_of.empty() ? r : topo.host_of[r];
    auto [it, fresh] = index.emplace(h, hosts.size());
    if (fresh) hosts.emplace_back();
    hosts[it->second].push_back(r);
  }
  std::vector<int> leaders;
  std::vector<Fold> leader_folds;
  for (const auto& host : hosts) {
    auto folds = tree_reduce(b, host, 0, s, std::vector<Fold>(host.size(), initial_fold(b)), 0);
    leaders.push_back(host[0]);
    leader_folds.push_back(folds[0]);
  }
  ring_allreduce(b, leaders, s, leader_folds);
  for (const auto& host : hosts) tree_broadcast(b, host, 0, s, kOut, [](int) { return kOut; });
}

void plan_allreduce_det(PlanBuilder& b, int n, Span s) {
  const auto segs = split_even(s, static_cast<uint64_t>(n));
  const Loc own = b.in_place() ? kOut : kIn;
  if (n == 1) {
    if (!(own == kOut)) b.copy(0, 0, own.at(s), kOut.at(s));
    return;
  }
  deterministic_fold(b, n, segs, [&](int, int) { return own; }, [](int) { return kOut; },
                     [&](int) { return !b.in_place(); }, 0);
  ring_allgather(b, iota_group(n), segs, [](int) { return kOut; }, [](int) { return kOut; });
}

}  // namespace tandem::engine::comm::plan_detail
