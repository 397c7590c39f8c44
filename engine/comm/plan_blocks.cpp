// The building blocks the collective plans share (see plan_builder.hpp).
#include "engine/comm/plan_builder.hpp"

namespace tandem::engine::comm::plan_detail {

// ---------------------------------------------------------------- ring reduce-scatter / allgather

// Ring reduce-scatter over `group`: member gi ends owning segs[gi] fully reduced (in acc(gi, gi) when
// the returned flag is set, else -- a group of one -- still in its own input). Segments are cut into
// chunks; chunk c of step s runs in round base + s + c so chunks pipeline around the ring.
// Uses scratch [tmp_base, tmp_base + 2 * max segment) for receives into accumulators that already hold data.
std::vector<bool> ring_reduce_scatter(PlanBuilder& b, const std::vector<int>& group, const std::vector<Span>& segs,
                                      const std::function<Fold(int gi, int seg)>& fold_of, uint64_t tmp_base) {
  const int g = static_cast<int>(group.size());
  uint64_t max_seg = 0;
  for (const Span& s : segs) max_seg = std::max(max_seg, s.len);
  const uint64_t k = chunks_for(max_seg, b.chunk());
  const auto built = b.members(group);
  std::vector<std::vector<Fold>> folds(g);
  for (int gi : built)
    for (int x = 0; x < g; ++x) folds[gi].push_back(fold_of(gi, x));
  const auto base = b.bases(group);
  bool used_tmp = false;
  for (int s = 0; s + 1 < g; ++s) {
    for (int gi : built) {
      const int a = mod(gi - s - 1, g), x = mod(gi - s - 2, g);
      const int right = group[mod(gi + 1, g)], left = group[mod(gi - 1, g)];
      Fold& fa = folds[gi][a];
      Fold& fx = folds[gi][x];
      const Loc src = fa.valid ? fa.acc : fa.own;
      const bool was_valid = fx.valid;
      const Loc tmp = scratch_at(tmp_base + static_cast<uint64_t>(s % 2) * max_seg, segs[x].off);
      for (uint64_t c = 0; c < k; ++c) {
        const size_t t = base[gi] + static_cast<size_t>(s) + c;
        const Span sc = split_even_at(segs[a], k, c);
        if (sc.len) b.send(group[gi], t, right, src.at(sc));
        const Span rc = split_even_at(segs[x], k, c);
        if (!rc.len) continue;
        if (was_valid) {
          b.recv(group[gi], t, left, tmp.at(rc));
          b.reduce(group[gi], t, fx.acc.at(rc), tmp.at(rc));
          used_tmp = true;
        } else {
          b.recv(group[gi], t, left, fx.acc.at(rc));
          b.reduce(group[gi], t, fx.acc.at(rc), fx.own.at(rc));
        }
      }
      fx.valid = true;
    }
  }
  if (used_tmp) b.need_scratch(tmp_base + 2 * max_seg);
  std::vector<bool> owned(g);  // members not built: false (only their own ops would read it)
  for (int gi : built) owned[gi] = folds[gi][gi].valid;
  return owned;
}

// Ring allgather over `group` into dst(gi): member gi contributes segs[gi], found at src(gi).
void ring_allgather(PlanBuilder& b, const std::vector<int>& group, const std::vector<Span>& segs,
                    const std::function<Loc(int gi)>& src, const std::function<Loc(int gi)>& dst) {
  const int g = static_cast<int>(group.size());
  uint64_t max_seg = 0;
  for (const Span& s : segs) max_seg = std::max(max_seg, s.len);
  const uint64_t k = chunks_for(max_seg, b.chunk());
  const auto base = b.bases(group);
  const auto built = b.members(group);
  for (int gi : built)
    if (!(src(gi) == dst(gi))) b.copy(group[gi], base[gi], src(gi).at(segs[gi]), dst(gi).at(segs[gi]));
  for (int s = 0; s + 1 < g; ++s) {
    for (int gi : built) {
      const int a = mod(gi - s, g), x = mod(gi - s - 1, g);
      const Loc from = s == 0 ? src(gi) : dst(gi);
      for (uint64_t c = 0; c < k; ++c) {
        const size_t t = base[gi] + static_cast<size_t>(s) + c;
        const Span sc = split_even_at(segs[a], k, c), rc = split_even_at(segs[x], k, c);
        if (sc.len) b.send(group[gi], t, group[mod(gi + 1, g)], from.at(sc));
        if (rc.len) b.recv(group[gi], t, group[mod(gi - 1, g)], dst(gi).at(rc));
      }
    }
  }
}

// ------------------------------------------------------------------------------ binomial trees

// Binomial reduce of span s over `group` to member root_gi. Returns the folds (the root's holds the
// result: in acc when valid, else -- a group of one -- in its own input). Scratch [tmp_base, +s.len)
// takes receives into accumulators that already hold data.
std::vector<Fold> tree_reduce(PlanBuilder& b, const std::vector<int>& group, int root_gi, Span s,
                              std::vector<Fold> folds, uint64_t tmp_base) {
  const int g = static_cast<int>(group.size());
  const auto base = b.bases(group);
  const Loc tmp = scratch_at(tmp_base, s.off);
  bool used_tmp = false;
  for (int gi = 0; gi < g; ++gi) {
    const int v = mod(gi - root_gi, g);
    int bit = 0;
    for (int mask = 1; mask < g; mask <<= 1, ++bit) {
      const size_t t = base[gi] + static_cast<size_t>(bit);
      if (v & mask) {
        send_current(b, group[gi], t, group[mod(v - mask + root_gi, g)], folds[gi], s);
        break;
      }
      if (v + mask < g) {
        used_tmp |= folds[gi].valid;
        recv_fold(b, group[gi], t, group[mod(v + mask + root_gi, g)], folds[gi], s, tmp);
      }
    }
  }
  if (used_tmp) b.need_scratch(tmp_base + s.len);
  return folds;
}

// Binomial broadcast of span s from member root_gi (data at root_src) into dst(gi) of the others.
void tree_broadcast(PlanBuilder& b, const std::vector<int>& group, int root_gi, Span s, Loc root_src,
                    const std::function<Loc(int gi)>& dst) {
  const int g = static_cast<int>(group.size());
  const int levels = ceil_log2(g);
  const auto base = b.bases(group);
  for (int bit = levels - 1; bit >= 0; --bit) {
    const int mask = 1 << bit;
    for (int v = 0; v + mask < g; v += 2 * mask) {
      const int from = mod(v + root_gi, g), to = mod(v + mask + root_gi, g);
      const Loc src = v == 0 ? root_src : dst(from);
      const size_t round = static_cast<size_t>(levels - 1 - bit);
      b.transfer(group[from], base[from] + round, src, group[to], base[to] + round, dst(to), s);
    }
  }
}

// Pipelined chain root -> root+1 -> ... : chunk c leaves position p in round p + c.
void chain_broadcast(PlanBuilder& b, const std::vector<int>& group, int root_gi, Span s, Loc loc) {
  const int g = static_cast<int>(group.size());
  const auto chunks = split_even(s, chunks_for(s.len, b.chunk()));
  const auto base = b.bases(group);
  for (int p = 0; p + 1 < g; ++p) {
    const int from = mod(root_gi + p, g), to = mod(root_gi + p + 1, g);
    for (size_t c = 0; c < chunks.size(); ++c) {
      if (!chunks[c].len) continue;
      b.send(group[from], base[from] + static_cast<size_t>(p) + c, group[to], loc.at(chunks[c]));
      b.recv(group[to], base[to] + static_cast<size_t>(p) + c, group[from], loc.at(chunks[c]));
    }
  }
}

// ------------------------------------------------------------------------- deterministic fold

// Deterministic fold: the owner of segs[i] (rank i) gathers every rank's contribution and folds them
// in rank order 0, 1, ..., n-1 into dst(i). contrib(r, i) is where rank r's part of segment i is;
// dst_free(i): dst(i) does not hold owner i's own contribution, so rank 0's part can land there
// directly. Chunk c of every segment runs in round base + c.
void deterministic_fold(PlanBuilder& b, int n, const std::vector<Span>& segs, const std::function<Loc(int r, int i)>& contrib,
                        const std::function<Loc(int i)>& dst, const std::function<bool(int i)>& dst_free,
                        uint64_t scratch_base) {
  uint64_t max_seg = 0;
  for (const Span& sg : segs) max_seg = std::max(max_seg, sg.len);
  const uint64_t k = chunks_for(max_seg, b.chunk());
  const auto base = b.bases(iota_group(n));
  bool used = false;
  for (int i = 0; i < n; ++i) {
    const auto chunks = split_even(segs[i], k);
    // Slot of contribution r (r != i) in the owner's scratch.
    auto slot = [&](int r) { return scratch_at(scratch_base + static_cast<uint64_t>(r < i ? r : r - 1) * max_seg, segs[i].off); };
    const Loc acc = (i == 0 || dst_free(i)) ? dst(i) : slot(0);
    // a rank that is not the owner only sends its part (rank-by-rank building skips the rest)
    const bool owner = b.wants(i);
    const int r_begin = owner ? 0 : b.only(), r_end = owner ? n : b.only() + 1;
    for (uint64_t c = 0; c < k; ++c) {
      const Span ch = chunks[c];
      if (!ch.len) continue;
      for (int r = r_begin; r < r_end; ++r) {
        if (r == i) continue;
        b.send(r, base[r] + c, i, contrib(r, i).at(ch));
        const Loc into = (r == 0) ? acc : slot(r);
        b.recv(i, base[i] + c, r, into.at(ch));
        used |= !(into == dst(i));
      }
      if (!owner) continue;
      const size_t t = base[i] + c;
      if (i == 0 && !(contrib(0, 0) == acc)) b.copy(i, t, contrib(0, 0).at(ch), acc.at(ch));
      for (int r = 1; r < n; ++r) b.reduce(i, t, acc.at(ch), (r == i ? contrib(i, i) : slot(r)).at(ch));
      if (!(acc == dst(i))) b.copy(i, t, acc.at(ch), dst(i).at(ch));
    }
  }
  if (used && n > 1) b.need_scratch(scratch_base + static_cast<uint64_t>(n - 1) * max_seg);
}

}  // namespace tandem::engine::comm::plan_detail
