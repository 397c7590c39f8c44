// Plans of the collectives other than allreduce: reduce-scatter, allgather, broadcast, reduce, barrier.
#include "engine/comm/plan_builder.hpp"

namespace tandem::engine::comm::plan_detail {

void plan_reduce_scatter(PlanBuilder& b, int n, Span s, bool det) {
  const auto segs = split_even(s, static_cast<uint64_t>(n));  // equal: count % world == 0
  const uint64_t per = segs[0].len;
  auto out_of = [&](int gi) { return Loc{Buffer::kOutput, -static_cast<int64_t>(segs[gi].off)}; };
  if (det) {
    if (n == 1) {
      if (!b.in_place()) b.copy(0, 0, kIn.at(s), out_of(0).at(s));
      return;
    }
    // In place, a rank's own segment of the input is its output.
    deterministic_fold(
        b, n, segs, [&](int r, int i) { return (r == i && b.in_place()) ? out_of(i) : kIn; }, out_of,
        [&](int) { return !b.in_place(); }, 0);
    return;
  }
  // Accumulators: the owned segment in the output, the others in scratch after the ring's 2 slots.
  const uint64_t acc_base = 2 * per;
  const auto owned = ring_reduce_scatter(
      b, iota_group(n), segs,
      [&](int gi, int x) {
        if (x == gi) return Fold{out_of(gi), b.in_place(), kIn};
        return Fold{scratch_at(acc_base + static_cast<uint64_t>(x < gi ? x : x - 1) * per, segs[x].off), false, kIn};
      },
      0);
  if (n > 1) b.need_scratch(acc_base + static_cast<uint64_t>(n - 1) * per);
  if (!owned[0] && !b.in_place()) b.copy(0, b.next_round(0), kIn.at(segs[0]), out_of(0).at(segs[0]));
}

void plan_allgather(PlanBuilder& b, int n, Span s) {
  const auto segs = split_even(s, static_cast<uint64_t>(n));
  ring_allgather(b, iota_group(n), segs,
                 [&](int gi) {
                   if (b.in_place()) return kOut;
                   return Loc{Buffer::kInput, -static_cast<int64_t>(segs[gi].off)};
                 },
                 [](int) { return kOut; });
}

void plan_broadcast(PlanBuilder& b, int n, int root, Span s, Algorithm algo) {
  if (algo == Algorithm::kRing)
    chain_broadcast(b, iota_group(n), root, s, kOut);
  else
    tree_broadcast(b, iota_group(n), root, s, kOut, [](int) { return kOut; });
}

void plan_reduce(PlanBuilder& b, int n, int root, Span s, Algorithm algo) {
  // Non-roots have no output: they accumulate in scratch [0, s.len) and use scratch after it.
  auto fold_for = [&](int r) {
    if (r == root) return Fold{kOut, b.in_place(), kIn};
    return Fold{scratch_at(0, s.off), false, kIn};
  };
  const auto group = iota_group(n);
  if (algo == Algorithm::kTree) {
    std::vector<Fold> folds;
    for (int r = 0; r < n; ++r) folds.push_back(fold_for(r));
    auto done = tree_reduce(b, group, root, s, folds, s.len);
    if (n > 1) b.need_scratch(s.len);
    if (!done[root].valid) b.copy(root, b.next_round(root), kIn.at(s), kOut.at(s));
    return;
  }
  const auto segs = split_even(s, static_cast<uint64_t>(n));
  std::vector<bool> owned(n);
  if (algo == Algorithm::kDeterministic) {
    deterministic_fold(
        b, n, segs, [&](int r, int) { return (r == root && b.in_place()) ? kOut : kIn; },
        [&](int r) { return fold_for(r).acc; }, [&](int r) { return r != root || !b.in_place(); }, s.len);
    std::fill(owned.begin(), owned.end(), true);
  } else {  // ring reduce-scatter, then gather the segments at the root
    owned = ring_reduce_scatter(b, group, segs, [&](int gi, int) { return fold_for(gi); }, s.len);
  }
  if (n > 1) b.need_scratch(s.len);
  const auto base = b.bases(group);
  for (int r = 0; r < n; ++r) {
    if (r == root) continue;
    b.transfer(r, base[r], owned[r] ? fold_for(r).acc : kIn, root, base[root], kOut, segs[r]);
  }
  if (!owned[root] && !b.in_place()) b.copy(root, b.next_round(root), kIn.at(segs[root]), kOut.at(segs[root]));
}

// Dissemination: in round k every rank sends to rank + 2^k and receives from rank - 2^k, and sends in round k + 1
// only once rounds 0..k have delivered; after ceil(log2 n) rounds every rank has heard, directly or through a
// chain, from every other rank since it entered. Executors order ops by their regions alone (executor.hpp), so
// the rounds are chained through data: each message is one element, the token of what its sender has heard.
// Scratch element 0 holds this rank's token, sent in every round; round k receives into element k + 1 and
// copies it into the token, so the next send waits for this receive and (the copies write one element in
// turn) for every earlier one. The receives themselves wait for nothing: each is posted at once. (Empty
// messages would leave the rounds unordered, and a rank could leave having heard from rank - 1, - 2, - 4, ...
// alone.) Tokens carry no value, only their arrival counts: element 0 is sent before anything was written to it.
void plan_barrier(PlanBuilder& b, int n) {
  const int rounds = ceil_log2(n);
  if (rounds) b.need_scratch(static_cast<uint64_t>(rounds) + 1);
  const Region token{Buffer::kScratch, 0, 1};
  for (int k = 0; k < rounds; ++k) {
    const auto t = static_cast<size_t>(k);
    const Region heard{Buffer::kScratch, static_cast<uint64_t>(k) + 1, 1};
    for (int r = 0; r < n; ++r) {
      b.send(r, t, mod(r + (1 << k), n), token);
      b.recv(r, t, mod(r - (1 << k), n), heard);
      if (k + 1 < rounds) b.copy(r, t, heard, token);  // the last round's arrivals need not be passed on
    }
  }
}

}  // namespace tandem::engine::comm::plan_detail
