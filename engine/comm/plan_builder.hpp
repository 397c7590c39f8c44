#pragma once
// Internal to the plan builders (plan*.cpp): index-space spans, where a rank keeps data (Loc), the
// PlanBuilder that writes ops into a Plan, and the building blocks the collectives share (ring
// reduce-scatter / allgather, binomial trees, chains, the deterministic fold). Not for use outside
// engine/comm.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

#include "engine/comm/plan.hpp"

namespace tandem::engine::comm::plan_detail {

inline int mod(int a, int n) {
  const int m = a % n;
  return m < 0 ? m + n : m;
}

inline int ceil_log2(int n) {
  int l = 0;
  while ((1 << l) < n) ++l;
  return l;
}

struct Span {
  uint64_t off = 0;
  uint64_t len = 0;
};

// `parts` nearly equal consecutive pieces of s (the first len % parts one element longer).
inline std::vector<Span> split_even(Span s, uint64_t parts) {
  std::vector<Span> out(parts);
  const uint64_t base = s.len / parts, extra = s.len % parts;
  uint64_t off = s.off;
  for (uint64_t i = 0; i < parts; ++i) {
    out[i] = {off, base + (i < extra ? 1 : 0)};
    off += out[i].len;
  }
  return out;
}

// split_even(s, parts)[i], without building the list (hot loops of the ring plans).
inline Span split_even_at(Span s, uint64_t parts, uint64_t i) {
  if (parts == 1) return s;  // the common case at large worlds: one chunk per segment
  const uint64_t base = s.len / parts, extra = s.len % parts;
  return Span{s.off + i * base + std::min(i, extra), base + (i < extra ? 1 : 0)};
}

inline uint64_t chunks_for(uint64_t len, uint64_t chunk) { return std::max<uint64_t>((len + chunk - 1) / chunk, 1); }

// Where a rank keeps data: element x of the collective's index space lives at buf[x + delta].
struct Loc {
  Buffer buf = Buffer::kOutput;
  int64_t delta = 0;
  Region at(Span s) const { return Region{buf, static_cast<uint64_t>(static_cast<int64_t>(s.off) + delta), s.len}; }
  bool operator==(const Loc& o) const { return buf == o.buf && delta == o.delta; }
};
constexpr Loc kIn{Buffer::kInput, 0};
constexpr Loc kOut{Buffer::kOutput, 0};
inline Loc scratch_at(uint64_t base, uint64_t origin) {
  return Loc{Buffer::kScratch, static_cast<int64_t>(base) - static_cast<int64_t>(origin)};
}

// Writes ops into plan.ranks. With `only` >= 0 it keeps rank `only`'s ops alone (make_rank_plan): a
// rank's ops depend only on its own rounds and folds, so dropping the others' leaves its list exactly
// as make_plan builds it, and loops over a group may visit only members() to skip the others' work.
class PlanBuilder {
 public:
  PlanBuilder(Plan& plan, uint64_t chunk, int only = -1) : plan_(plan), chunk_(chunk), only_(only) {}

  bool wants(int r) const { return only_ < 0 || r == only_; }
  int only() const { return only_; }
  // Positions in `group` whose ops are built: all of them, or the kept rank's (if it is a member).
  std::vector<int> members(const std::vector<int>& group) const {
    std::vector<int> m;
    for (int gi = 0; gi < static_cast<int>(group.size()); ++gi)
      if (wants(group[gi])) m.push_back(gi);
    return m;
  }

  uint64_t chunk() const { return chunk_; }
  bool in_place() const { return plan_.in_place; }
  size_t next_round(int r) const {
    if (only_ >= 0) return r == only_ ? used_ : 0;  // the others get no ops
    return plan_.ranks[r].rounds.size();
  }
  std::vector<size_t> bases(const std::vector<int>& group) const {
    std::vector<size_t> b;
    for (int r : group) b.push_back(next_round(r));
    return b;
  }
  void need_scratch(uint64_t n) { plan_.scratch_count = std::max(plan_.scratch_count, n); }

  void send(int r, size_t t, int peer, Region src) { add(r, t, Op{OpKind::kSend, peer, src, {}}); }
  void recv(int r, size_t t, int peer, Region dst) { add(r, t, Op{OpKind::kRecv, peer, {}, dst}); }
  void copy(int r, size_t t, Region src, Region dst) {
    if (src.count) add(r, t, Op{OpKind::kCopy, -1, src, dst});
  }
  void reduce(int r, size_t t, Region dst, Region src) {
    if (src.count) add(r, t, Op{OpKind::kReduce, -1, src, dst});
  }
  // A chunked transfer between r (sending) and q (receiving) in rounds tr / tq; empty spans are skipped
  // on both sides alike (both compute the same spans).
  void transfer(int r, size_t tr, Loc src, int q, size_t tq, Loc dst, Span s) {
    for (const Span& c : split_even(s, chunks_for(s.len, chunk_))) {
      if (!c.len) continue;
      send(r, tr, q, src.at(c));
      recv(q, tq, r, dst.at(c));
    }
  }

 private:
  void add(int r, size_t t, Op op) {
    if (!wants(r)) return;
    auto& rounds = plan_.ranks[r].rounds;
    if (rounds.size() <= t) rounds.resize(t + 1);
    // keeping one rank, rounds from used_ on may hold an earlier rank's ops (storage reused)
    if (only_ >= 0)
      for (; used_ <= t; ++used_) rounds[used_].ops.clear();
    rounds[t].ops.push_back(op);
  }
  Plan& plan_;
  uint64_t chunk_;
  int only_;
  size_t used_ = 0;  // rounds of the kept rank in use

 public:
  // Keeping one rank: drops reused storage past its last round.
  void finish() {
    if (only_ >= 0) plan_.ranks[static_cast<size_t>(only_)].rounds.resize(used_);
  }
};

// Receives `s` of a contribution from `peer` at round t and folds it into rank r's accumulator:
// straight into the accumulator (then acc op= own input) when the accumulator does not hold r's
// data yet, else through scratch at tmp (element s.off lands at tmp + s.off - tmp_origin).
struct Fold {
  Loc acc;
  bool valid;     // acc holds r's contribution (or a partial sum including it)
  Loc own;        // where r's own contribution is when !valid
};
inline void recv_fold(PlanBuilder& b, int r, size_t t, int peer, Fold& f, Span s, Loc tmp) {
  for (const Span& c : split_even(s, chunks_for(s.len, b.chunk()))) {
    if (!c.len) continue;
    if (f.valid) {
      b.recv(r, t, peer, tmp.at(c));
      b.reduce(r, t, f.acc.at(c), tmp.at(c));
    } else {
      b.recv(r, t, peer, f.acc.at(c));
      b.reduce(r, t, f.acc.at(c), f.own.at(c));
    }
  }
  if (s.len) f.valid = true;
}
inline void send_current(PlanBuilder& b, int r, size_t t, int peer, const Fold& f, Span s) {
  const Loc src = f.valid ? f.acc : f.own;
  for (const Span& c : split_even(s, chunks_for(s.len, b.chunk())))
    if (c.len) b.send(r, t, peer, src.at(c));
}

inline std::vector<int> iota_group(int n) {
  std::vector<int> g(n);
  for (int i = 0; i < n; ++i) g[i] = i;
  return g;
}

// ------------------------------------------------------------------ building blocks (plan_blocks.cpp)

std::vector<bool> ring_reduce_scatter(PlanBuilder& b, const std::vector<int>& group, const std::vector<Span>& segs,
                                      const std::function<Fold(int gi, int seg)>& fold_of, uint64_t tmp_base);
void ring_allgather(PlanBuilder& b, const std::vector<int>& group, const std::vector<Span>& segs,
                    const std::function<Loc(int gi)>& src, const std::function<Loc(int gi)>& dst);
std::vector<Fold> tree_reduce(PlanBuilder& b, const std::vector<int>& group, int root_gi, Span s,
                              std::vector<Fold> folds, uint64_t tmp_base);
void tree_broadcast(PlanBuilder& b, const std::vector<int>& group, int root_gi, Span s, Loc root_src,
                    const std::function<Loc(int gi)>& dst);
void chain_broadcast(PlanBuilder& b, const std::vector<int>& group, int root_gi, Span s, Loc loc);
void deterministic_fold(PlanBuilder& b, int n, const std::vector<Span>& segs,
                        const std::function<Loc(int r, int i)>& contrib, const std::function<Loc(int i)>& dst,
                        const std::function<bool(int i)>& dst_free, uint64_t scratch_base);

// ------------------------------------------------------------------------- allreduce (plan_allreduce.cpp)

void plan_allreduce_ring(PlanBuilder& b, int n, Span s);
void plan_allreduce_tree(PlanBuilder& b, int n, Span s);
void plan_allreduce_hd(PlanBuilder& b, int n, Span s, uint64_t elem_bytes);
void plan_allreduce_hier(PlanBuilder& b, int n, Span s, const Topology& topo);
void plan_allreduce_det(PlanBuilder& b, int n, Span s);

// --------------------------------------------------------------- other collectives (plan_collectives.cpp)

void plan_reduce_scatter(PlanBuilder& b, int n, Span s, bool det);
void plan_allgather(PlanBuilder& b, int n, Span s);
void plan_broadcast(PlanBuilder& b, int n, int root, Span s, Algorithm algo);
void plan_reduce(PlanBuilder& b, int n, int root, Span s, Algorithm algo);
void plan_barrier(PlanBuilder& b, int n);

}  // namespace tandem::engine::comm::plan_detail
