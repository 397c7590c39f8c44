#include "simulator/compiled_plan.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "engine/comm/executor.hpp"
#include "engine/core/error.hpp"

namespace tandem::simulator {

using engine::comm::OpKind;
using engine::comm::PlanRequest;
using engine::comm::RankPlan;
using Kind = CompiledPlan::Kind;

uint64_t CompiledPlan::total_bytes_sent() const {
  if (sizes_bounded) return exact_bytes_sent;
  uint64_t b = 0;
  for (size_t i = 0; i + 1 < ops.size(); ++i)
    if (ops[i].kind == Kind::kSend) b += ops[i].bytes;
  return is_full() ? b : b * static_cast<uint64_t>(world);
}

const CompiledPlan& CompiledPlan::full() const {
  if (is_full()) return *this;
  if (!full_) {
    TANDEM_CHECK(request.has_value(), Status::kInternal, "plan {}: symmetric form without its request", description);
    full_ = std::make_shared<const CompiledPlan>(compile_plan_by_rank(*request));
  }
  return *full_;
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

constexpr uint64_t kMaxIndex = (uint64_t{1} << 32) - 1;

// Appends member r's ops as the runtime's compiler orders them (`rt`: its storage, reused member
// after member); receives also join recv_ch (receiving member -> sender), if given. `header` gives
// the plan's layout (its ranks are not read).
void append_member(CompiledPlan& c, const engine::comm::Plan& header, const RankPlan& rp, int32_t r,
                   engine::comm::CompiledPlan& rt, Channels* recv_ch) {
  engine::comm::compile_rank_plan(header, rp, r, rt);
  const uint64_t eb = c.elem_bytes;
  const auto base = static_cast<uint32_t>(c.ops.size());
  TANDEM_CHECK(c.ops.size() + rt.ops.size() < kMaxIndex && c.succs.size() + rt.succs.size() < kMaxIndex,
               Status::kOutOfMemory, "plan {} is too large to simulate", c.description);
  for (const engine::comm::CompiledOp& o : rt.ops) {
    CompiledPlan::Op op{0, static_cast<uint32_t>(c.succs.size()), o.deps, CompiledPlan::kNone, CompiledPlan::kNone,
                        o.peer, Kind::kLocal};
    switch (o.kind) {
      case OpKind::kSend:
      case OpKind::kRecv:
        TANDEM_CHECK(o.peer >= 0 && o.peer < c.world && o.peer != r, Status::kInternal, "plan {}: rank {} {} rank {}",
                     c.description, r, o.kind == OpKind::kSend ? "sends to" : "receives from", o.peer);
        op.kind = o.kind == OpKind::kSend ? Kind::kSend : Kind::kRecv;
        op.bytes = (o.kind == OpKind::kSend ? o.src.count : o.dst.count) * eb;
        c.sends += o.kind == OpKind::kSend;
        break;
      case OpKind::kCopy: op.bytes = 2 * o.src.count * eb; break;
      case OpKind::kReduce: op.bytes = 3 * o.src.count * eb; break;
    }
    c.succs.insert(c.succs.end(), rt.succs.begin() + o.succ_begin, rt.succs.begin() + o.succ_end);
    c.ops.push_back(op);
  }
  // a transfer is posted after the previous one to its peer (the runtime's per-peer queues)
  for (const engine::comm::PeerQueue& q : rt.queues) {
    for (const auto* list : {&q.sends, &q.recvs})
      for (size_t k = 1; k < list->size(); ++k) {
        c.ops[base + (*list)[k - 1]].fifo_next = (*list)[k];
        ++c.ops[base + (*list)[k]].deps;
      }
    if (recv_ch) {
      auto& items = recv_ch->items[recv_ch->channel(r, q.peer)];
      for (uint32_t i : q.recvs) items.push_back(base + i);
    }
  }
}

// The entry after the last op, where its succ list ends.
void close_ops(CompiledPlan& c) {
  c.ops.push_back({0, static_cast<uint32_t>(c.succs.size()), 0, CompiledPlan::kNone, CompiledPlan::kNone, -1,
                   Kind::kLocal});
}

// Sends, in plan order per member, take the receives of their channel in order.
void match_sends(CompiledPlan& c, Channels& recv_ch) {
  uint64_t recvs = 0;
  for (const auto& items : recv_ch.items) recvs += items.size();
  TANDEM_CHECK(c.sends == recvs, Status::kInternal, "plan {}: {} sends but {} receives", c.description, c.sends,
               recvs);
  for (int32_t m = 0; m < c.members; ++m)
    for (uint32_t i = c.first_op[m]; i < c.first_op[m + 1]; ++i) {
      CompiledPlan::Op& s = c.ops[i];
      if (s.kind != Kind::kSend) continue;
      const uint32_t ch = recv_ch.channel(s.peer, m);
      auto& q = recv_ch.items[ch];
      uint32_t& taken = recv_ch.taken[ch];
      TANDEM_CHECK(taken < q.size(), Status::kInternal, "plan {}: send {} -> {} has no matching receive",
                   c.description, m, s.peer);
      const uint32_t rv = q[taken++];
      TANDEM_CHECK(c.ops[rv].bytes == s.bytes, Status::kInternal,
                   "plan {}: send {} -> {} of {} bytes meets a receive of {} bytes", c.description, m, s.peer, s.bytes,
                   c.ops[rv].bytes);
      s.link = rv - c.first_op[s.peer];
    }
}

// Member r's compiled ops are member 0's rotated by r: kinds, sizes, dependencies, peer order.
bool rotation_of(const CompiledPlan& c, int32_t r) {
  const int32_t n = c.world;
  const uint32_t count = c.op_count(0);
  if (c.op_count(r) != count) return false;
  for (uint32_t i = 0; i < count; ++i) {
    const auto& a = c.op(0, i);
    const auto& b = c.op(r, i);
    if (a.kind != b.kind || a.bytes != b.bytes || a.deps != b.deps || a.fifo_next != b.fifo_next) return false;
    if (a.kind != Kind::kLocal && b.peer != (a.peer + r) % n) return false;
    if (!std::equal(c.succ_begin(0, i), c.succ_end(0, i), c.succ_begin(r, i), c.succ_end(r, i))) return false;
  }
  return true;
}

// Under rotation symmetry, member 0's k-th receive from q is the image of its own k-th send to
// (n - q) mod n; fills mirror_recv, or returns false when some receive has no such send.
bool find_mirrors(CompiledPlan& c) {
  const int32_t n = c.world;
  const uint32_t count = c.op_count(0);
  Channels send_ch(1);
  for (uint32_t i = 0; i < count; ++i)
    if (c.op(0, i).kind == Kind::kSend) send_ch.items[send_ch.channel(0, c.op(0, i).peer)].push_back(i);
  c.mirror_recv.assign(count, CompiledPlan::kNone);
  uint32_t sends = 0, mirrored = 0;
  for (uint32_t j = 0; j < count; ++j) {
    const auto& rv = c.op(0, j);
    sends += rv.kind == Kind::kSend;
    if (rv.kind != Kind::kRecv) continue;
    const uint32_t ch = send_ch.channel(0, (n - rv.peer) % n);
    auto& q = send_ch.items[ch];
    uint32_t& taken = send_ch.taken[ch];
    if (taken >= q.size() || c.op(0, q[taken]).bytes != rv.bytes) {
      c.mirror_recv.clear();
      return false;
    }
    c.mirror_recv[q[taken++]] = j;
    ++mirrored;
  }
  if (mirrored != sends) c.mirror_recv.clear();
  return mirrored == sends;
}

// rotation symmetry of a full form
void detect_symmetry(CompiledPlan& c) {
  const int32_t n = c.world;
  bool sym = n > 1 && c.op_count(0) > 0;
  for (int32_t r = 1; r < n && sym; ++r) sym = rotation_of(c, r);
  c.rotation_symmetric = sym && find_mirrors(c);
}

// Rank 0's regions as the runtime's dependency analysis sees them. Two non-empty regions of one
// address space overlap exactly when each starts before the other ends, so what matters of their
// places is the order of starts against ends: per space, rank 0's region ends sorted by position
// (an end before a start at one position: touching regions do not overlap) and cut into blocks of
// only ends or only starts. For every region (plan order): its space and the blocks of its start and
// end. A region covering a whole space of known size overlaps everything there and is kept apart.
struct Outline {
  struct Ref {
    int space = -1;      // -1: an empty region (no access)
    bool whole = false;  // covers its whole space
    uint32_t lo_block = 0, hi_block = 0;
  };
  std::vector<Ref> refs;
  std::vector<uint8_t> block_is_end[3];
  size_t anchor[3] = {SIZE_MAX, SIZE_MAX, SIZE_MAX};  // the region that starts first (its start opens block 0)
  int64_t sizes[3] = {0, 0, 0};
};

template <typename F>
void for_each_region(const RankPlan& rp, F&& f) {
  for (const auto& round : rp.rounds)
    for (const auto& op : round.ops) {
      if (op.kind != OpKind::kRecv) f(op.src);
      if (op.kind != OpKind::kSend) f(op.dst);
    }
}

Outline outline(const engine::comm::Plan& header, const RankPlan& rp) {
  Outline o;
  for (int sp = 0; sp < 3; ++sp)
    o.sizes[sp] = static_cast<int64_t>(engine::comm::plan_buffer_count(header, static_cast<engine::comm::Buffer>(sp), 0));
  struct End {
    uint64_t pos;
    bool start;  // ends sort before starts at one position
    uint32_t region;
    bool operator<(const End& e) const { return pos != e.pos ? pos < e.pos : start < e.start; }
  };
  std::vector<End> ends[3];
  uint32_t k = 0;
  for_each_region(rp, [&](const engine::comm::Region& r) {
    Outline::Ref ref;
    const auto a = engine::comm::plan_address(header, 0, r);
    if (r.count > 0 && a.space >= 0 && a.space < 3) {
      ref.space = a.space;
      ref.whole = o.sizes[a.space] > 0 && static_cast<int64_t>(r.count) == o.sizes[a.space];
      if (!ref.whole) {
        ends[a.space].push_back({a.offset, true, k});
        ends[a.space].push_back({a.offset + r.count, false, k});
      }
    }
    o.refs.push_back(ref);
    ++k;
  });
  for (int sp = 0; sp < 3; ++sp) {
    auto& e = ends[sp];
    std::sort(e.begin(), e.end());
    for (size_t i = 0; i < e.size(); ++i) {
      if (i == 0 || e[i].start != e[i - 1].start) o.block_is_end[sp].push_back(!e[i].start);
      const auto block = static_cast<uint32_t>(o.block_is_end[sp].size() - 1);
      (e[i].start ? o.refs[e[i].region].lo_block : o.refs[e[i].region].hi_block) = block;
    }
    if (!e.empty()) o.anchor[sp] = e[0].region;  // a start: every region ends after it starts
  }
  return o;
}

// The bytes an op moves, as append_member counts them.
uint64_t op_bytes(const engine::comm::Op& op, uint64_t eb) {
  switch (op.kind) {
    case OpKind::kSend: return op.src.count * eb;
    case OpKind::kRecv: return op.dst.count * eb;
    case OpKind::kCopy: return 2 * op.src.count * eb;
    case OpKind::kReduce: return 3 * op.src.count * eb;
  }
  return 0;
}

// Storage congruent() reuses rank after rank.
struct Scratch {
  engine::comm::PlanAddress base[3];    // where each buffer's element 0 lies for the rank compared
  std::vector<uint64_t> offset, count;  // per region of the rank compared
  std::vector<uint64_t> bytes;          // per op of the rank compared, in plan order (see op_bytes)
  std::vector<int64_t> first[3], last[3];  // per block: the least and greatest position in it
};

// Rank r's plan is rank 0's (`a`, outlined in `o`) rotated, as the runtime's dependency analysis sees
// it: the same rounds of the same ops, peers shifted by r, and in every address space
// (engine::comm::plan_address) rank r's starts and ends in the order of rank 0's blocks -- read from
// the image of rank 0's first start, around the space when its size is known (regions never wrap
// around its end, so they overlap on the circle exactly when they do on the line). Then the same
// pairs of ops touch overlapping regions with one of them writing, and compile_rank_plan, whose
// dependencies order exactly those pairs (an identical range as a chain, the others pairwise), gives
// rank r a graph with rank 0's transitive closure: every op waits for the same ops, so both start and
// finish ops at the same times. A rigid rotation (equal segments) is such an image; so are unequal
// segments (a count not divisible by the world). Region lengths may differ unless `same_sizes`.
bool congruent(const engine::comm::Plan& header, const RankPlan& a, const Outline& o, const RankPlan& b, int32_t r,
               bool same_sizes, uint64_t eb, Scratch& w) {
  using engine::comm::Region;
  const int32_t n = header.world;
  if (a.rounds.size() != b.rounds.size()) return false;
  w.offset.assign(o.refs.size(), 0);
  w.count.assign(o.refs.size(), 0);
  w.bytes.clear();
  for (int bf = 0; bf < 3; ++bf)
    w.base[bf] = engine::comm::plan_address(header, r, Region{static_cast<engine::comm::Buffer>(bf), 0, 1});
  size_t next = 0;  // into o.refs
  auto same_place = [&](const Region& x, const Region& y) {
    const size_t k = next++;
    const Outline::Ref& ref = o.refs[k];
    if (x.buffer != y.buffer || (x.count == 0) != (y.count == 0)) return false;
    if (same_sizes && x.count != y.count) return false;
    if (x.count == 0) return true;  // no access
    const engine::comm::PlanAddress& base = w.base[static_cast<size_t>(y.buffer)];  // affine in the offset
    const engine::comm::PlanAddress py{base.space, base.offset + y.offset};
    if (py.space != ref.space) return false;
    const int64_t size = o.sizes[ref.space];
    if (size > 0 && (static_cast<int64_t>(py.offset + y.count) > size || ref.whole != (static_cast<int64_t>(y.count) == size)))
      return false;
    w.offset[k] = py.offset;
    w.count[k] = y.count;
    return true;
  };
  for (size_t t = 0; t < a.rounds.size(); ++t) {
    const auto& x = a.rounds[t].ops;
    const auto& y = b.rounds[t].ops;
    if (x.size() != y.size()) return false;
    for (size_t k = 0; k < x.size(); ++k) {
      const auto& p = x[k];
      const auto& q = y[k];
      if (p.kind != q.kind) return false;
      if (p.kind != OpKind::kRecv && !same_place(p.src, q.src)) return false;
      if (p.kind != OpKind::kSend && !same_place(p.dst, q.dst)) return false;
      if ((p.kind == OpKind::kSend || p.kind == OpKind::kRecv) && q.peer != (p.peer + r) % n) return false;
      w.bytes.push_back(op_bytes(q, eb));
    }
  }
  if (next != o.refs.size()) return false;
  uint64_t from[3] = {0, 0, 0};
  for (int sp = 0; sp < 3; ++sp) {
    w.first[sp].assign(o.block_is_end[sp].size(), INT64_MAX);
    w.last[sp].assign(o.block_is_end[sp].size(), INT64_MIN);
    if (o.sizes[sp] > 0 && o.anchor[sp] != SIZE_MAX) from[sp] = w.offset[o.anchor[sp]];
  }
  for (size_t k = 0; k < o.refs.size(); ++k) {
    const Outline::Ref& ref = o.refs[k];
    if (ref.space < 0 || ref.whole) continue;
    const auto size = static_cast<uint64_t>(o.sizes[ref.space]);
    const uint64_t lo = size > 0 ? (w.offset[k] + size - from[ref.space]) % size : w.offset[k];
    const uint64_t hi = lo + w.count[k];
    if (size > 0 && hi > size) return false;  // wraps around the image of rank 0's first start
    const auto sp = static_cast<size_t>(ref.space);
    w.first[sp][ref.lo_block] = std::min(w.first[sp][ref.lo_block], static_cast<int64_t>(lo));
    w.last[sp][ref.lo_block] = std::max(w.last[sp][ref.lo_block], static_cast<int64_t>(lo));
    w.first[sp][ref.hi_block] = std::min(w.first[sp][ref.hi_block], static_cast<int64_t>(hi));
    w.last[sp][ref.hi_block] = std::max(w.last[sp][ref.hi_block], static_cast<int64_t>(hi));
  }
  // blocks in rank 0's order: ends no later than the next starts, starts before the next ends
  for (int sp = 0; sp < 3; ++sp)
    for (size_t i = 0; i + 1 < o.block_is_end[sp].size(); ++i) {
      if (o.block_is_end[sp][i] ? w.last[sp][i] > w.first[sp][i + 1] : w.last[sp][i] >= w.first[sp][i + 1]) return false;
    }
  return true;
}

// The ring all-reduce's segments (split_even: `rem` of q + 1 elements, then q) for the sampled proof.
struct RingSegments {
  uint64_t q = 0, rem = 0;
  int32_t n = 0;
  uint64_t size(int64_t j) const { return static_cast<uint64_t>(j) < rem ? q + 1 : q; }
  // The segment starting at element `offset`, or -1 when none does.
  int64_t starting_at(uint64_t offset) const {
    const uint64_t big = rem * (q + 1);
    const uint64_t j = offset < big ? offset / (q + 1) : rem + (offset - big) / q;
    const uint64_t start = j < rem ? j * (q + 1) : big + (j - rem) * q;
    return j < static_cast<uint64_t>(n) && start == offset ? static_cast<int64_t>(j) : -1;
  }
  bool whole(uint64_t count) const { return count == q + (rem > 0) || (count == q && rem < static_cast<uint64_t>(n)); }
};

// Whether kRingSample applies to `req` (kAuto resolved), with rank 0's plan `rp0`: a ring all-reduce of one chunk
// per segment, every region of rank 0 a whole segment (user buffers: one that starts where a segment does).
std::optional<RingSegments> ring_segments(const PlanRequest& req, const RankPlan& rp0) {
  using engine::comm::Algorithm;
  using engine::comm::Buffer;
  using engine::comm::Collective;
  if (req.collective != Collective::kAllreduce || req.algorithm != Algorithm::kRing) return std::nullopt;
  RingSegments s{req.count / static_cast<uint64_t>(req.world), req.count % static_cast<uint64_t>(req.world), req.world};
  if (s.q == 0 || s.q + (s.rem > 0) > engine::comm::plan_chunk_count(req)) return std::nullopt;
  bool ok = true;
  for_each_region(rp0, [&](const engine::comm::Region& r) {
    ok = ok && s.whole(r.count) && (r.buffer == Buffer::kScratch || s.starting_at(r.offset) >= 0);
  });
  if (!ok) return std::nullopt;
  return s;
}

// Rank r's regions are rank 0's with every segment moved by r: user-buffer regions at the start of segment
// (rank 0's + r) mod n and as long as it, scratch regions whole segments.
bool segments_rotate(const RingSegments& s, const RankPlan& rp0, const RankPlan& rp, int32_t r,
                     std::vector<int64_t>& seg0) {
  using engine::comm::Buffer;
  if (seg0.empty())
    for_each_region(rp0, [&](const engine::comm::Region& x) {
      seg0.push_back(x.buffer == Buffer::kScratch ? -1 : s.starting_at(x.offset));
    });
  size_t k = 0;
  bool ok = true;
  for_each_region(rp, [&](const engine::comm::Region& x) {
    if (!ok || k >= seg0.size()) {
      ok = false;
      return;
    }
    const int64_t want = seg0[k++];
    if (x.buffer == Buffer::kScratch) {
      ok = want < 0 && s.whole(x.count);
    } else {
      const int64_t j = s.starting_at(x.offset);
      ok = want >= 0 && j == (want + r) % s.n && x.count == s.size(j);
    }
  });
  return ok && k == seg0.size();
}

// The ranks the sampled proof reads: the first and last three, those around the boundary between the long and the
// short segments and around its image (n - rem), and 64 spread over [1, n).
std::vector<int32_t> ring_sample(int32_t n, uint64_t rem) {
  std::vector<int32_t> v;
  const auto add = [&](int64_t r) {
    if (r >= 1 && r < n) v.push_back(static_cast<int32_t>(r));
  };
  for (int64_t d = 1; d <= 3; ++d) {
    add(d);
    add(n - d);
  }
  for (int64_t d = -2; d <= 2; ++d) {
    add(static_cast<int64_t>(rem) + d);
    add(n - static_cast<int64_t>(rem) + d);
  }
  for (int64_t j = 0; j < 64; ++j) add(1 + j * (n - 1) / 64);
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

// Where each op of `rp` (plan order) lies in compile_rank_plan's program order: each round's
// transfers, then its local ops.
std::vector<uint32_t> program_order(const RankPlan& rp) {
  std::vector<uint32_t> at;
  uint32_t next = 0, first = 0;
  for (const auto& round : rp.rounds) {
    for (int pass = 0; pass < 2; ++pass) {
      uint32_t k = first;
      for (const auto& op : round.ops) {
        const bool transfer = op.kind == OpKind::kSend || op.kind == OpKind::kRecv;
        if (at.size() <= k) at.resize(k + 1);
        if (transfer == (pass == 0)) at[k] = next++;
        ++k;
      }
    }
    first += static_cast<uint32_t>(round.ops.size());
  }
  return at;
}

// Plan::describe()'s fields from counts (the whole plan is not at hand, or walking it is costly).
std::string counted_description(engine::comm::Collective collective, engine::comm::Algorithm algorithm, int32_t world,
                                uint64_t count, uint64_t chunk_count, bool in_place, size_t rounds, uint64_t messages,
                                uint64_t payload) {
  return fmt::format("{} {} world={} count={} chunk={} rounds={} messages={} payload={}{}",
                     engine::comm::collective_name(collective), engine::comm::algorithm_name(algorithm), world, count,
                     chunk_count, rounds, messages, payload, in_place ? " in-place" : "");
}

std::string counted_description(const engine::comm::Plan& h, const CompiledPlan& c, size_t rounds) {
  return counted_description(h.collective, h.algorithm, h.world, h.count, h.chunk_count, h.in_place, rounds,
                             c.transfers(), c.total_bytes_sent() / c.elem_bytes);
}

// make_rank_plan is O(ops of the rank) for these; the others (O(n log n)-op plans) come from make_plan.
bool cheap_by_rank(const PlanRequest& r) {
  using engine::comm::Algorithm;
  using engine::comm::Collective;
  const Algorithm a = engine::comm::choose_algorithm(r);
  switch (r.collective) {
    case Collective::kAllreduce: return a == Algorithm::kRing || a == Algorithm::kDeterministic;
    case Collective::kReduceScatter:
    case Collective::kAllgather: return true;
    default: return false;
  }
}

CompiledPlan header(const PlanRequest& r, int32_t members) {
  CompiledPlan c;
  c.world = r.world;
  c.members = members;
  c.elem_bytes = r.elem_bytes;
  c.request = r;
  c.description = fmt::format("{} {} world={} count={}", engine::comm::collective_name(r.collective),
                              engine::comm::algorithm_name(engine::comm::choose_algorithm(r)), r.world, r.count);
  return c;
}

}  // namespace

CompiledPlan compile_plan(const engine::comm::Plan& plan, uint64_t elem_bytes) {
  // validate_plan is costly on large worlds; matching below already checks pairing and sizes, and the
  // executor reports a plan that never completes.
  if (plan.world <= 64) engine::comm::validate_plan(plan);
  CompiledPlan c;
  c.world = plan.world;
  c.members = plan.world;
  c.elem_bytes = elem_bytes;
  const int32_t n = plan.world;
  c.description = fmt::format("{} {} world={} count={}", engine::comm::collective_name(plan.collective),
                              engine::comm::algorithm_name(plan.algorithm), n, plan.count);  // for errors below
  size_t nops = 0;
  for (const auto& rp : plan.ranks)
    for (const auto& rd : rp.rounds) nops += rd.ops.size();
  c.ops.reserve(nops + 1);
  c.first_op.reserve(static_cast<size_t>(n) + 1);
  Channels recv_ch(n);  // indexed by receiving rank, peer = sender
  engine::comm::CompiledPlan rt;
  for (int32_t r = 0; r < n; ++r) {
    c.first_op.push_back(static_cast<uint32_t>(c.ops.size()));
    append_member(c, plan, plan.ranks[static_cast<size_t>(r)], r, rt, &recv_ch);
  }
  c.first_op.push_back(static_cast<uint32_t>(c.ops.size()));
  close_ops(c);
  match_sends(c, recv_ch);
  if (plan.finish_avg) c.finish_bytes = 2 * plan.count * elem_bytes;
  // Plan::describe() walks the whole plan twice more; large plans get the same line from our counts
  if (n <= 256) {
    c.description = plan.describe();
  } else {
    size_t rounds = 0;
    for (const auto& rp : plan.ranks) rounds = std::max(rounds, rp.rounds.size());
    c.description = counted_description(plan, c, rounds);
  }
  detect_symmetry(c);
  return c;
}

CompiledPlan compile_plan_by_rank(const PlanRequest& request) {
  const int32_t n = request.world;
  std::optional<engine::comm::Plan> whole;
  if (n <= 64 || !cheap_by_rank(request)) whole = engine::comm::make_plan(request);
  if (whole && n <= 64) engine::comm::validate_plan(*whole);
  const engine::comm::Plan head = whole ? engine::comm::Plan{} : engine::comm::plan_header(request);
  const engine::comm::Plan& layout = whole ? *whole : head;
  CompiledPlan c = header(request, n);
  c.first_op.reserve(static_cast<size_t>(n) + 1);
  Channels recv_ch(n);
  engine::comm::CompiledPlan rt;
  size_t rounds = 0;
  RankPlan rp;  // storage reused rank after rank
  for (int32_t r = 0; r < n; ++r) {
    c.first_op.push_back(static_cast<uint32_t>(c.ops.size()));
    if (whole) {
      append_member(c, layout, whole->ranks[static_cast<size_t>(r)], r, rt, &recv_ch);
      rounds = std::max(rounds, whole->ranks[static_cast<size_t>(r)].rounds.size());
    } else {
      engine::comm::make_rank_plan(request, r, rp);
      append_member(c, layout, rp, r, rt, &recv_ch);
      rounds = std::max(rounds, rp.rounds.size());
    }
  }
  c.first_op.push_back(static_cast<uint32_t>(c.ops.size()));
  close_ops(c);
  match_sends(c, recv_ch);
  c.description = counted_description(layout, c, rounds);
  detect_symmetry(c);
  return c;
}

std::optional<CompiledPlan> compile_symmetric(const PlanRequest& request, bool bound_sizes, SymmetryProof proof) {
  const int32_t n = request.world;
  if (n < 2 || !cheap_by_rank(request)) return std::nullopt;
  // kAuto resolved once: make_rank_plan would weigh the topology again for every rank
  PlanRequest req = request;
  req.algorithm = engine::comm::choose_algorithm(request);
  const engine::comm::Plan head = engine::comm::plan_header(req);
  CompiledPlan c = header(request, 1);
  const RankPlan rp0 = engine::comm::make_rank_plan(req, 0);
  engine::comm::CompiledPlan rt;
  c.first_op.push_back(0);
  append_member(c, head, rp0, 0, rt, nullptr);
  c.first_op.push_back(static_cast<uint32_t>(c.ops.size()));
  if (c.ops.empty()) return std::nullopt;
  close_ops(c);
  const Outline o = outline(head, rp0);
  const std::vector<uint32_t> at = program_order(rp0);
  Scratch w;
  const uint32_t count = c.op_count(0);
  TANDEM_CHECK(at.size() == count, Status::kInternal, "plan {}: {} ops in plan order, {} compiled", c.description,
               at.size(), count);
  std::vector<uint64_t> most(count);  // per op of member 0: the most any rank moves
  for (uint32_t i = 0; i < count; ++i) most[i] = c.ops[i].bytes;
  uint64_t sent = 0;  // over every rank
  for (uint32_t i = 0; i < count; ++i) sent += c.ops[i].kind == Kind::kSend ? c.ops[i].bytes : 0;
  RankPlan rp;  // one rank at a time, storage reused
  const std::optional<RingSegments> ring =
      proof == SymmetryProof::kRingSample ? ring_segments(req, rp0) : std::optional<RingSegments>{};
  if (ring) {
    if (ring->rem > 0 && !bound_sizes) return std::nullopt;  // ranks move unequal amounts
    std::vector<int64_t> seg0;
    for (int32_t r : ring_sample(n, ring->rem)) {
      engine::comm::make_rank_plan(req, r, rp);
      if (!congruent(head, rp0, o, rp, r, !bound_sizes, c.elem_bytes, w) || !segments_rotate(*ring, rp0, rp, r, seg0))
        return std::nullopt;
    }
    // every op visits each segment once over the ranks: at most q + 1 elements, the buffer's count in all
    sent = 0;
    uint32_t k = 0;
    for (const auto& round : rp0.rounds)
      for (const auto& op : round.ops) {
        const uint32_t i = at[k++];
        const uint64_t elems = op.kind == OpKind::kRecv ? op.dst.count : op.src.count;
        most[i] = c.ops[i].bytes / elems * (ring->q + (ring->rem > 0));
        sent += c.ops[i].kind == Kind::kSend ? req.count * c.elem_bytes : 0;
      }
  } else {
    for (int32_t r = 1; r < n; ++r) {
      engine::comm::make_rank_plan(req, r, rp);
      if (!congruent(head, rp0, o, rp, r, !bound_sizes, c.elem_bytes, w)) return std::nullopt;
      for (uint32_t k = 0; k < count; ++k) {
        const uint32_t i = at[k];
        most[i] = std::max(most[i], w.bytes[k]);
        sent += c.ops[i].kind == Kind::kSend ? w.bytes[k] : 0;
      }
    }
  }
  for (uint32_t i = 0; i < count; ++i) {
    c.sizes_bounded |= most[i] != c.ops[i].bytes;
    c.ops[i].bytes = most[i];
  }
  if (c.sizes_bounded) c.exact_bytes_sent = sent;
  if (!find_mirrors(c)) return std::nullopt;
  c.rotation_symmetric = true;
  c.description = counted_description(head, c, rp0.rounds.size());
  return c;
}

const CompiledPlan& PlanCache::get(const PlanRequest& r) {
  std::string k = fmt::format("{}|{}|{}|{}|{}|{}|{}|{}|{}|{}", static_cast<int>(r.collective),
                              static_cast<int>(r.algorithm), r.world, r.root, r.count, r.elem_bytes, r.chunk_bytes,
                              r.peer, r.in_place, fmt::join(r.topology.host_of, ","));
  auto it = plans_.find(k);
  if (it != plans_.end()) return *it->second;
  std::unique_ptr<CompiledPlan> compiled;
  if (r.world <= kRankByRankWorld) {
    compiled = std::make_unique<CompiledPlan>(compile_plan(engine::comm::make_plan(r), r.elem_bytes));
  } else if (auto sym = compile_symmetric(r, /*bound_sizes=*/true, SymmetryProof::kRingSample)) {
    compiled = std::make_unique<CompiledPlan>(std::move(*sym));
  } else {
    compiled = std::make_unique<CompiledPlan>(compile_plan_by_rank(r));
  }
  return *plans_.emplace(std::move(k), std::move(compiled)).first->second;
}

}  // namespace tandem::simulator
