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

// Where rank 0's regions lie (engine::comm::plan_address), in plan order: what every other rank is
// compared with.
std::vector<engine::comm::PlanAddress> addresses(const engine::comm::Plan& header, const RankPlan& rp) {
  std::vector<engine::comm::PlanAddress> v;
  for (const auto& round : rp.rounds)
    for (const auto& op : round.ops) {
      if (op.kind != OpKind::kRecv) v.push_back(engine::comm::plan_address(header, 0, op.src));
      if (op.kind != OpKind::kSend) v.push_back(engine::comm::plan_address(header, 0, op.dst));
    }
  return v;
}

// Rank r's plan is rank 0's (`a`, its regions at `at0`) rotated, as the runtime's dependency analysis
// sees it: the same rounds of the same ops, peers shifted by r, and in every address space
// (engine::comm::plan_address) every non-empty region moved by one offset, modulo the space's size,
// without wrapping around its end. A rigid rotation keeps which regions overlap, so
// compile_rank_plan gives rank r rank 0's graph.
bool congruent(const engine::comm::Plan& header, const RankPlan& a, const std::vector<engine::comm::PlanAddress>& at0,
               const RankPlan& b, int32_t r) {
  using engine::comm::Region;
  const int32_t n = header.world;
  if (a.rounds.size() != b.rounds.size()) return false;
  int64_t shift[3] = {0, 0, 0}, sizes[3];
  bool seen[3] = {false, false, false};
  for (int sp = 0; sp < 3; ++sp)
    sizes[sp] = static_cast<int64_t>(engine::comm::plan_buffer_count(header, static_cast<engine::comm::Buffer>(sp), 0));
  size_t next = 0;  // into at0
  auto same_place = [&](const Region& x, const Region& y) {
    const engine::comm::PlanAddress px = at0[next++];
    if (x.count != y.count || x.buffer != y.buffer) return false;
    if (x.count == 0) return true;  // no access
    const auto py = engine::comm::plan_address(header, r, y);
    if (px.space != py.space || px.space < 0 || px.space > 2) return false;
    const int64_t size = sizes[px.space];
    const auto ox = static_cast<int64_t>(px.offset), oy = static_cast<int64_t>(py.offset);
    const auto len = static_cast<int64_t>(x.count);
    int64_t& d = shift[px.space];
    if (size > 0) {
      if (ox + len > size || oy + len > size) return false;
      if (!seen[px.space]) d = ((oy - ox) % size + size) % size;
      seen[px.space] = true;
      return oy == ox + d || oy == ox + d - size;  // (ox + d) mod size, both in [0, size)
    }
    if (!seen[px.space]) d = oy - ox;  // a space of unknown size (scratch): translated, not rotated
    seen[px.space] = true;
    return oy == ox + d;
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
    }
  }
  return true;
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

std::optional<CompiledPlan> compile_symmetric(const PlanRequest& request) {
  const int32_t n = request.world;
  if (n < 2 || !cheap_by_rank(request)) return std::nullopt;
  const engine::comm::Plan head = engine::comm::plan_header(request);
  CompiledPlan c = header(request, 1);
  const RankPlan rp0 = engine::comm::make_rank_plan(request, 0);
  engine::comm::CompiledPlan rt;
  c.first_op.push_back(0);
  append_member(c, head, rp0, 0, rt, nullptr);
  c.first_op.push_back(static_cast<uint32_t>(c.ops.size()));
  if (c.ops.empty()) return std::nullopt;
  close_ops(c);
  const auto at0 = addresses(head, rp0);
  RankPlan rp;  // one rank at a time, storage reused
  for (int32_t r = 1; r < n; ++r) {
    engine::comm::make_rank_plan(request, r, rp);
    if (!congruent(head, rp0, at0, rp, r)) return std::nullopt;
  }
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
  } else if (auto sym = compile_symmetric(r)) {
    compiled = std::make_unique<CompiledPlan>(std::move(*sym));
  } else {
    compiled = std::make_unique<CompiledPlan>(compile_plan_by_rank(r));
  }
  return *plans_.emplace(std::move(k), std::move(compiled)).first->second;
}

}  // namespace tandem::simulator
