#include "engine/comm/plan.hpp"

#include <algorithm>
#include <functional>
#include <map>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "engine/core/error.hpp"

namespace tandem::engine::comm {

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

// Below this many bytes halving-doubling exchanges whole buffers (recursive doubling: fewest rounds).
constexpr uint64_t kHdWholeBufferBytes = 32 * 1024;

bool reduces(Collective c) {
  return c == Collective::kAllreduce || c == Collective::kReduceScatter || c == Collective::kReduce;
}

int mod(int a, int n) {
  const int m = a % n;
  return m < 0 ? m + n : m;
}

int ceil_log2(int n) {
  int l = 0;
  while ((1 << l) < n) ++l;
  return l;
}

struct Span {
  uint64_t off = 0;
  uint64_t len = 0;
};

// `parts` nearly equal consecutive pieces of s (the first len % parts one element longer).
std::vector<Span> split_even(Span s, uint64_t parts) {
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
Span split_even_at(Span s, uint64_t parts, uint64_t i) {
  if (parts == 1) return s;  // the common case at large worlds: one chunk per segment
  const uint64_t base = s.len / parts, extra = s.len % parts;
  return Span{s.off + i * base + std::min(i, extra), base + (i < extra ? 1 : 0)};
}

uint64_t chunks_for(uint64_t len, uint64_t chunk) { return std::max<uint64_t>((len + chunk - 1) / chunk, 1); }

// Where a rank keeps data: element x of the collective's index space lives at buf[x + delta].
struct Loc {
  Buffer buf = Buffer::kOutput;
  int64_t delta = 0;
  Region at(Span s) const { return Region{buf, static_cast<uint64_t>(static_cast<int64_t>(s.off) + delta), s.len}; }
  bool operator==(const Loc& o) const { return buf == o.buf && delta == o.delta; }
};
constexpr Loc kIn{Buffer::kInput, 0};
constexpr Loc kOut{Buffer::kOutput, 0};
Loc scratch_at(uint64_t base, uint64_t origin) {
  return Loc{Buffer::kScratch, static_cast<int64_t>(base) - static_cast<int64_t>(origin)};
}

// Writes ops into plan.ranks. With `only` >= 0 it keeps rank `only`'s ops alone (make_rank_plan): a
// rank's ops depend only on its own rounds and folds, so dropping the others' leaves its list exactly
// as make_plan builds it, and loops over a group may visit only members() to skip the others' work.
class Builder {
 public:
  Builder(Plan& plan, uint64_t chunk, int only = -1) : plan_(plan), chunk_(chunk), only_(only) {}

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
void recv_fold(Builder& b, int r, size_t t, int peer, Fold& f, Span s, Loc tmp) {
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
void send_current(Builder& b, int r, size_t t, int peer, const Fold& f, Span s) {
  const Loc src = f.valid ? f.acc : f.own;
  for (const Span& c : split_even(s, chunks_for(s.len, b.chunk())))
    if (c.len) b.send(r, t, peer, src.at(c));
}

// ---------------------------------------------------------------- ring reduce-scatter / allgather

// Ring reduce-scatter over `group`: member gi ends owning segs[gi] fully reduced (in acc(gi, gi) when
// the returned flag is set, else -- a group of one -- still in its own input). Segments are cut into
// chunks; chunk c of step s runs in round base + s + c so chunks pipeline around the ring.
// Uses scratch [tmp_base, tmp_base + 2 * max segment) for receives into accumulators that already hold data.
std::vector<bool> ring_reduce_scatter(Builder& b, const std::vector<int>& group, const std::vector<Span>& segs,
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
void ring_allgather(Builder& b, const std::vector<int>& group, const std::vector<Span>& segs,
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
std::vector<Fold> tree_reduce(Builder& b, const std::vector<int>& group, int root_gi, Span s,
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
void tree_broadcast(Builder& b, const std::vector<int>& group, int root_gi, Span s, Loc root_src,
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
void chain_broadcast(Builder& b, const std::vector<int>& group, int root_gi, Span s, Loc loc) {
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

// ------------------------------------------------------------------------------ allreduce

std::vector<int> iota_group(int n) {
  std::vector<int> g(n);
  for (int i = 0; i < n; ++i) g[i] = i;
  return g;
}

// Makes sure every rank of `group` ends with its folded result in out (a group of one copies).
void finish_in_out(Builder& b, const std::vector<int>& group, const std::vector<Fold>& folds, Span s) {
  for (size_t gi = 0; gi < group.size(); ++gi)
    if (!folds[gi].valid) b.copy(group[gi], b.next_round(group[gi]), folds[gi].own.at(s), kOut.at(s));
}

// Ring allreduce over `group` on span s with per-member starting folds (acc in out).
void ring_allreduce(Builder& b, const std::vector<int>& group, Span s, const std::vector<Fold>& start) {
  const int g = static_cast<int>(group.size());
  if (g == 1) return finish_in_out(b, group, start, s);
  const auto segs = split_even(s, static_cast<uint64_t>(g));
  const auto owned = ring_reduce_scatter(b, group, segs, [&](int gi, int) { return start[gi]; }, 0);
  ring_allgather(b, group, segs, [&](int gi) { return owned[gi] ? kOut : start[gi].own; }, [](int) { return kOut; });
}

Fold initial_fold(const Builder& b) { return Fold{kOut, b.in_place(), kIn}; }

void plan_allreduce_ring(Builder& b, int n, Span s) {
  ring_allreduce(b, iota_group(n), s, std::vector<Fold>(n, initial_fold(b)));
}

void plan_allreduce_tree(Builder& b, int n, Span s) {
  const auto group = iota_group(n);
  auto folds = tree_reduce(b, group, 0, s, std::vector<Fold>(n, initial_fold(b)), 0);
  const Loc root_src = folds[0].valid ? kOut : folds[0].own;
  if (!(root_src == kOut)) b.copy(0, b.next_round(0), root_src.at(s), kOut.at(s));
  tree_broadcast(b, group, 0, s, kOut, [](int) { return kOut; });
}

void plan_allreduce_hd(Builder& b, int n, Span s, uint64_t elem_bytes) {
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

void plan_allreduce_hier(Builder& b, int n, Span s, const Topology& topo) {
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

// Deterministic fold: the owner of segs[i] (rank i) gathers every rank's contribution and folds them
// in rank order 0, 1, ..., n-1 into dst(i). contrib(r, i) is where rank r's part of segment i is;
// dst_free(i): dst(i) does not hold owner i's own contribution, so rank 0's part can land there
// directly. Chunk c of every segment runs in round base + c.
void deterministic_fold(Builder& b, int n, const std::vector<Span>& segs, const std::function<Loc(int r, int i)>& contrib,
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

void plan_allreduce_det(Builder& b, int n, Span s) {
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

// ------------------------------------------------------------------------- other collectives

void plan_reduce_scatter(Builder& b, int n, Span s, bool det) {
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

void plan_allgather(Builder& b, int n, Span s) {
  const auto segs = split_even(s, static_cast<uint64_t>(n));
  ring_allgather(b, iota_group(n), segs,
                 [&](int gi) {
                   if (b.in_place()) return kOut;
                   return Loc{Buffer::kInput, -static_cast<int64_t>(segs[gi].off)};
                 },
                 [](int) { return kOut; });
}

void plan_broadcast(Builder& b, int n, int root, Span s, Algorithm algo) {
  if (algo == Algorithm::kRing)
    chain_broadcast(b, iota_group(n), root, s, kOut);
  else
    tree_broadcast(b, iota_group(n), root, s, kOut, [](int) { return kOut; });
}

void plan_reduce(Builder& b, int n, int root, Span s, Algorithm algo) {
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

void plan_barrier(Builder& b, int n) {
  for (int k = 0; (1 << k) < n; ++k) {
    for (int r = 0; r < n; ++r) {
      b.send(r, static_cast<size_t>(k), mod(r + (1 << k), n), Region{Buffer::kScratch, 0, 0});
      b.recv(r, static_cast<size_t>(k), mod(r - (1 << k), n), Region{Buffer::kScratch, 0, 0});
    }
  }
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

namespace {

// make_plan's body; only >= 0 builds that rank's ops alone (see Builder), into `reuse`'s storage if given.
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

  Plan plan;
  plan.collective = r.collective;
  plan.algorithm = choose_algorithm(r);
  plan.world = r.world;
  plan.root = rooted ? r.root : 0;
  plan.peer = p2p ? r.peer : -1;
  plan.count = r.count;
  plan.in_place = r.in_place && !p2p && r.collective != Collective::kBarrier && r.collective != Collective::kBroadcast;
  plan.chunk_count = plan_chunk_count(r);
  plan.ranks.resize(static_cast<size_t>(r.world));
  if (reuse) plan.ranks[static_cast<size_t>(only)] = std::move(*reuse);
  Builder b(plan, plan.chunk_count, only);
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

// ---------------------------------------------------------------------------- validation

namespace {

const char* buffer_name(Buffer b) {
  switch (b) {
    case Buffer::kInput: return "input";
    case Buffer::kOutput: return "output";
    case Buffer::kScratch: return "scratch";
  }
  return "?";
}

std::string region_text(const Region& r) {
  return fmt::format("{}[{}, +{})", buffer_name(r.buffer), r.offset, r.count);
}

bool overlaps(const Region& a, const Region& b) {
  return a.buffer == b.buffer && a.count && b.count && a.offset < b.offset + b.count && b.offset < a.offset + a.count;
}

}  // namespace

void validate_plan(const Plan& plan) {
  const int n = plan.world;
  TANDEM_CHECK(n >= 1 && plan.ranks.size() == static_cast<size_t>(n), Status::kInternal,
               "plan '{}' has {} rank plans for world size {}", plan.describe(), plan.ranks.size(), n);
  struct Transfer {
    int from, to;
    size_t from_round, to_round;
    uint64_t count;
    bool done = false;
  };
  // sends[a][b] / recvs[b][a]: (round, count) in plan order.
  std::map<std::pair<int, int>, std::vector<std::pair<size_t, uint64_t>>> sends, recvs;
  for (int r = 0; r < n; ++r) {
    const auto& rounds = plan.ranks[r].rounds;
    for (size_t t = 0; t < rounds.size(); ++t) {
      std::vector<const Op*> transfers;
      for (size_t i = 0; i < rounds[t].ops.size(); ++i) {
        const Op& op = rounds[t].ops[i];
        auto where = [&] { return fmt::format("rank {} round {} op {}", r, t, i); };
        auto check_region = [&](const Region& reg) {
          TANDEM_CHECK(static_cast<uint8_t>(reg.buffer) <= 2, Status::kInternal, "{}: unknown buffer {}", where(),
                       static_cast<int>(reg.buffer));
          const uint64_t size = plan_buffer_count(plan, reg.buffer, r);
          TANDEM_CHECK(reg.offset <= size && reg.count <= size - reg.offset, Status::kInternal,
                       "{}: region {} is outside the {} buffer of {} elements", where(), region_text(reg),
                       buffer_name(reg.buffer), size);
        };
        switch (op.kind) {
          case OpKind::kSend:
          case OpKind::kRecv: {
            TANDEM_CHECK(op.peer >= 0 && op.peer < n && op.peer != r, Status::kInternal, "{}: invalid peer {}",
                         where(), op.peer);
            const Region& reg = op.kind == OpKind::kSend ? op.src : op.dst;
            check_region(reg);
            for (const Op* other : transfers) {
              const Region& oreg = other->kind == OpKind::kSend ? other->src : other->dst;
              const bool write = op.kind == OpKind::kRecv || other->kind == OpKind::kRecv;
              TANDEM_CHECK(!(write && overlaps(reg, oreg)), Status::kInternal,
                           "{}: {} overlaps {} of a concurrent transfer that writes", where(), region_text(reg),
                           region_text(oreg));
            }
            transfers.push_back(&op);
            if (op.kind == OpKind::kSend)
              sends[{r, op.peer}].push_back({t, reg.count});
            else
              recvs[{op.peer, r}].push_back({t, reg.count});
            break;
          }
          case OpKind::kCopy:
          case OpKind::kReduce:
            check_region(op.src);
            check_region(op.dst);
            TANDEM_CHECK(op.src.count == op.dst.count, Status::kInternal, "{}: source {} and destination {} differ",
                         where(), region_text(op.src), region_text(op.dst));
            TANDEM_CHECK(!overlaps(op.src, op.dst), Status::kInternal, "{}: source {} overlaps destination {}",
                         where(), region_text(op.src), region_text(op.dst));
            break;
          default: TANDEM_THROW(Status::kInternal, "{}: unknown op kind {}", where(), static_cast<int>(op.kind));
        }
      }
    }
  }
  std::vector<Transfer> transfers;
  // round_transfers[r][t]: indices of transfers in rank r's round t.
  std::vector<std::vector<std::vector<size_t>>> round_transfers(n);
  for (int r = 0; r < n; ++r) round_transfers[r].resize(plan.ranks[r].rounds.size());
  for (const auto& [key, list] : sends) {
    const auto& [a, b] = key;
    const auto it = recvs.find(key);
    const size_t matched = it == recvs.end() ? 0 : it->second.size();
    TANDEM_CHECK(matched == list.size(), Status::kInternal, "rank {} sends {} message(s) to rank {}, which receives {}",
                 a, list.size(), b, matched);
    for (size_t k = 0; k < list.size(); ++k) {
      const auto& rv = it->second[k];
      TANDEM_CHECK(list[k].second == rv.second, Status::kInternal,
                   "message #{} from rank {} to rank {}: {} elements sent, {} expected", k, a, b, list[k].second,
                   rv.second);
      round_transfers[a][list[k].first].push_back(transfers.size());
      round_transfers[b][rv.first].push_back(transfers.size());
      transfers.push_back({a, b, list[k].first, rv.first, list[k].second});
    }
  }
  for (const auto& [key, list] : recvs)
    TANDEM_CHECK(sends.count(key), Status::kInternal, "rank {} expects {} message(s) from rank {}, which sends none",
                 key.second, list.size(), key.first);
  // Run the rounds: a transfer completes once both sides are in the rounds that hold it.
  std::vector<size_t> cur(n, 0);
  for (bool moved = true; moved;) {
    moved = false;
    for (int r = 0; r < n; ++r) {
      while (cur[r] < round_transfers[r].size()) {
        bool all_done = true;
        for (size_t id : round_transfers[r][cur[r]]) {
          Transfer& tr = transfers[id];
          if (!tr.done && cur[tr.from] == tr.from_round && cur[tr.to] == tr.to_round) tr.done = true;
          all_done &= tr.done;
        }
        if (!all_done) break;
        ++cur[r];
        moved = true;
      }
    }
  }
  for (int r = 0; r < n; ++r) {
    if (cur[r] == round_transfers[r].size()) continue;
    std::string waits;
    for (size_t id : round_transfers[r][cur[r]]) {
      const Transfer& tr = transfers[id];
      if (!tr.done)
        waits += fmt::format(" {} rank {} (its round {})", tr.from == r ? "send to" : "receive from",
                             tr.from == r ? tr.to : tr.from, tr.from == r ? tr.to_round : tr.from_round);
    }
    TANDEM_THROW(Status::kInternal, "plan '{}' deadlocks: rank {} waits forever in round {} on{}", plan.describe(), r,
                 cur[r], waits);
  }
}

}  // namespace tandem::engine::comm
