#include "simulator/compiled_plan.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "engine/core/error.hpp"

namespace tandem::simulator {

using engine::comm::OpKind;
using engine::comm::PlanRequest;
using engine::comm::RankPlan;

uint64_t CompiledPlan::total_bytes_sent() const {
  uint64_t b = 0;
  for (const Send& s : sends) b += s.bytes;
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

// Appends member r's rounds (not the entry that closes the last one: close_rounds), its receives
// (their sizes to recv_bytes, needed only while compiling) and its sends, unmatched; receives also
// join recv_ch, if given.
void append_member(CompiledPlan& c, std::vector<uint64_t>& recv_bytes, int32_t r, const RankPlan& rp,
                   Channels* recv_ch) {
  const uint64_t eb = c.elem_bytes;
  for (const auto& round : rp.rounds) {
    CompiledPlan::Round cr{static_cast<uint32_t>(c.sends.size()), static_cast<uint32_t>(c.recvs.size()), 0};
    const uint32_t ri = static_cast<uint32_t>(c.rounds.size());
    for (const auto& op : round.ops) {
      switch (op.kind) {
        case OpKind::kRecv:
        case OpKind::kSend:
          TANDEM_CHECK(op.peer >= 0 && op.peer < c.world && op.peer != r, Status::kInternal,
                       "plan {}: rank {} {} rank {}", c.description, r,
                       op.kind == OpKind::kSend ? "sends to" : "receives from", op.peer);
          if (op.kind == OpKind::kRecv) {
            if (recv_ch) recv_ch->items[recv_ch->channel(r, op.peer)].push_back(static_cast<uint32_t>(c.recvs.size()));
            c.recvs.push_back({op.peer, ri});
            recv_bytes.push_back(op.dst.count * eb);
          } else {
            c.sends.push_back({r, op.peer, UINT32_MAX, UINT32_MAX, op.src.count * eb});
          }
          break;
        case OpKind::kCopy: cr.local_bytes += 2 * op.src.count * eb; break;
        case OpKind::kReduce: cr.local_bytes += 3 * op.src.count * eb; break;
      }
    }
    c.rounds.push_back(cr);
  }
  TANDEM_CHECK(c.sends.size() < kMaxIndex && c.recvs.size() < kMaxIndex && c.rounds.size() < kMaxIndex,
               Status::kOutOfMemory, "plan {} is too large to simulate", c.description);
}

// The entry after the last round, where its sends and receives end.
void close_rounds(CompiledPlan& c) {
  c.rounds.push_back({static_cast<uint32_t>(c.sends.size()), static_cast<uint32_t>(c.recvs.size()), 0});
}

// Sends, in plan order per rank, take the receives of their channel in order.
void match_sends(CompiledPlan& c, Channels& recv_ch, const std::vector<uint64_t>& recv_bytes) {
  TANDEM_CHECK(c.sends.size() == c.recvs.size(), Status::kInternal, "plan {}: {} sends but {} receives",
               c.description, c.sends.size(), c.recvs.size());
  for (CompiledPlan::Send& s : c.sends) {
    const uint32_t ch = recv_ch.channel(s.dst, s.src);
    auto& q = recv_ch.items[ch];
    uint32_t& taken = recv_ch.taken[ch];
    TANDEM_CHECK(taken < q.size(), Status::kInternal, "plan {}: send {} -> {} has no matching receive",
                 c.description, s.src, s.dst);
    const uint32_t rv = q[taken++];
    TANDEM_CHECK(recv_bytes[rv] == s.bytes, Status::kInternal,
                 "plan {}: send {} -> {} of {} bytes meets a receive of {} bytes", c.description, s.src, s.dst,
                 s.bytes, recv_bytes[rv]);
    s.recv = rv;
    s.recv_round = c.recvs[rv].round;
  }
}

// Member `r`'s rounds in `other` (rounds [ob, oe)) are member 0's of `c` rotated by r.
bool rotation_of(const CompiledPlan& c, const std::vector<uint64_t>& c_recv_bytes, const CompiledPlan& other,
                 const std::vector<uint64_t>& other_recv_bytes, uint32_t ob, uint32_t oe, int32_t r) {
  const int32_t n = c.world;
  const uint32_t r0 = c.first_round[1] - c.first_round[0];
  if (oe - ob != r0) return false;
  for (uint32_t i = 0; i < r0; ++i) {
    const uint32_t ai = c.first_round[0] + i, bi = ob + i;
    const auto& a = c.rounds[ai];
    const auto& b = other.rounds[bi];
    const uint32_t sends = c.send_end(ai) - a.send_begin, recvs = c.recv_end(ai) - a.recv_begin;
    if (other.send_end(bi) - b.send_begin != sends || other.recv_end(bi) - b.recv_begin != recvs ||
        a.local_bytes != b.local_bytes)
      return false;
    for (uint32_t k = 0; k < sends; ++k) {
      const auto& sa = c.sends[a.send_begin + k];
      const auto& sb = other.sends[b.send_begin + k];
      if (sb.bytes != sa.bytes || sb.dst != (sa.dst + r) % n) return false;
    }
    for (uint32_t k = 0; k < recvs; ++k) {
      if (other_recv_bytes[b.recv_begin + k] != c_recv_bytes[a.recv_begin + k] ||
          other.recvs[b.recv_begin + k].src != (c.recvs[a.recv_begin + k].src + r) % n)
        return false;
    }
  }
  return true;
}

// Under rotation symmetry, member 0's k-th receive from q is the image of its own k-th send to
// (n - q) mod n; fills mirror_recv, or returns false when some receive has no such send.
bool find_mirrors(CompiledPlan& c, const std::vector<uint64_t>& recv_bytes) {
  const int32_t n = c.world;
  const uint32_t s0 = c.rounds[c.first_round[0]].send_begin, s1 = c.rounds[c.first_round[1]].send_begin;
  Channels send_ch(1);
  for (uint32_t k = s0; k < s1; ++k) send_ch.items[send_ch.channel(0, c.sends[k].dst)].push_back(k);
  c.mirror_recv.assign(s1 - s0, UINT32_MAX);
  const uint32_t rb = c.rounds[c.first_round[0]].recv_begin, re = c.rounds[c.first_round[1]].recv_begin;
  for (uint32_t j = rb; j < re; ++j) {
    const int32_t mirror_dst = (n - c.recvs[j].src) % n;
    const uint32_t ch = send_ch.channel(0, mirror_dst);
    auto& q = send_ch.items[ch];
    uint32_t& taken = send_ch.taken[ch];
    if (taken >= q.size() || c.sends[q[taken]].bytes != recv_bytes[j]) {
      c.mirror_recv.clear();
      return false;
    }
    c.mirror_recv[q[taken++] - s0] = j;
  }
  for (uint32_t v : c.mirror_recv)
    if (v == UINT32_MAX) {
      c.mirror_recv.clear();
      return false;
    }
  return true;
}

// rotation symmetry of a full form: member r's round i mirrors member 0's round i
void detect_symmetry(CompiledPlan& c, const std::vector<uint64_t>& recv_bytes) {
  const int32_t n = c.world;
  bool sym = n > 1 && c.first_round[1] > c.first_round[0];
  for (int32_t r = 1; r < n && sym; ++r)
    sym = rotation_of(c, recv_bytes, c, recv_bytes, c.first_round[r], c.first_round[r + 1], r);
  c.rotation_symmetric = sym && find_mirrors(c, recv_bytes);
}

// Plan::describe()'s fields from counts (the whole plan is not at hand, or walking it is costly).
std::string counted_description(engine::comm::Collective collective, engine::comm::Algorithm algorithm, int32_t world,
                                uint64_t count, uint64_t chunk_count, bool in_place, size_t rounds, uint64_t messages,
                                uint64_t payload) {
  return fmt::format("{} {} world={} count={} chunk={} rounds={} messages={} payload={}{}",
                     engine::comm::collective_name(collective), engine::comm::algorithm_name(algorithm), world, count,
                     chunk_count, rounds, messages, payload, in_place ? " in-place" : "");
}

std::string counted_description(const PlanRequest& r, const CompiledPlan& c, size_t rounds) {
  using engine::comm::Collective;
  // make_plan's rule for Plan::in_place
  const bool in_place = r.in_place && r.collective != Collective::kSend && r.collective != Collective::kRecv &&
                        r.collective != Collective::kBarrier && r.collective != Collective::kBroadcast;
  return counted_description(r.collective, engine::comm::choose_algorithm(r), r.world, r.count,
                             engine::comm::plan_chunk_count(r), in_place, rounds,
                             c.is_full() ? c.sends.size() : c.sends.size() * static_cast<uint64_t>(c.world),
                             c.total_bytes_sent() / c.elem_bytes);
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
  size_t nrounds = 0, nsend = 0, nrecv = 0;
  for (const auto& rp : plan.ranks) {
    nrounds += rp.rounds.size();
    for (const auto& rd : rp.rounds)
      for (const auto& op : rd.ops) {
        nrecv += op.kind == OpKind::kRecv;
        nsend += op.kind == OpKind::kSend;
      }
  }
  c.rounds.reserve(nrounds + 1);
  c.sends.reserve(nsend);
  c.recvs.reserve(nrecv);
  std::vector<uint64_t> recv_bytes;
  recv_bytes.reserve(nrecv);
  c.first_round.reserve(static_cast<size_t>(n) + 1);
  Channels recv_ch(n);  // indexed by receiving rank, peer = sender
  for (int32_t r = 0; r < n; ++r) {
    c.first_round.push_back(static_cast<uint32_t>(c.rounds.size()));
    append_member(c, recv_bytes, r, plan.ranks[static_cast<size_t>(r)], &recv_ch);
  }
  c.first_round.push_back(static_cast<uint32_t>(c.rounds.size()));
  close_rounds(c);
  match_sends(c, recv_ch, recv_bytes);
  if (plan.finish_avg) c.finish_bytes = 2 * plan.count * elem_bytes;
  // Plan::describe() walks the whole plan twice more; large plans get the same line from our counts
  if (n <= 256) {
    c.description = plan.describe();
  } else {
    size_t rounds = 0;
    for (const auto& rp : plan.ranks) rounds = std::max(rounds, rp.rounds.size());
    c.description = counted_description(plan.collective, plan.algorithm, n, plan.count, plan.chunk_count, plan.in_place,
                                        rounds, c.sends.size(), c.total_bytes_sent() / elem_bytes);
  }
  detect_symmetry(c, recv_bytes);
  return c;
}

CompiledPlan compile_plan_by_rank(const PlanRequest& request) {
  const int32_t n = request.world;
  std::optional<engine::comm::Plan> whole;
  if (n <= 64 || !cheap_by_rank(request)) whole = engine::comm::make_plan(request);
  if (whole && n <= 64) engine::comm::validate_plan(*whole);
  CompiledPlan c = header(request, n);
  c.first_round.reserve(static_cast<size_t>(n) + 1);
  Channels recv_ch(n);
  std::vector<uint64_t> recv_bytes;  // while compiling only
  size_t rounds = 0;
  RankPlan rp;  // storage reused rank after rank
  for (int32_t r = 0; r < n; ++r) {
    c.first_round.push_back(static_cast<uint32_t>(c.rounds.size()));
    if (whole) {
      append_member(c, recv_bytes, r, whole->ranks[static_cast<size_t>(r)], &recv_ch);
    } else {
      engine::comm::make_rank_plan(request, r, rp);
      append_member(c, recv_bytes, r, rp, &recv_ch);
    }
    rounds = std::max<size_t>(rounds, c.rounds.size() - c.first_round.back());
  }
  c.first_round.push_back(static_cast<uint32_t>(c.rounds.size()));
  close_rounds(c);
  match_sends(c, recv_ch, recv_bytes);
  c.description = counted_description(request, c, rounds);
  detect_symmetry(c, recv_bytes);
  return c;
}

std::optional<CompiledPlan> compile_symmetric(const PlanRequest& request) {
  const int32_t n = request.world;
  if (n < 2 || !cheap_by_rank(request)) return std::nullopt;
  CompiledPlan c = header(request, 1);
  std::vector<uint64_t> recv_bytes;
  c.first_round.push_back(0);
  append_member(c, recv_bytes, 0, engine::comm::make_rank_plan(request, 0), nullptr);
  c.first_round.push_back(static_cast<uint32_t>(c.rounds.size()));
  if (c.rounds.empty()) return std::nullopt;
  close_rounds(c);
  CompiledPlan other = header(request, 1);  // one rank at a time, storage reused
  std::vector<uint64_t> other_recv_bytes;
  RankPlan rp;
  for (int32_t r = 1; r < n; ++r) {
    other.rounds.clear();
    other.sends.clear();
    other.recvs.clear();
    other_recv_bytes.clear();
    engine::comm::make_rank_plan(request, r, rp);
    append_member(other, other_recv_bytes, r, rp, nullptr);
    const auto rounds = static_cast<uint32_t>(other.rounds.size());
    close_rounds(other);
    if (!rotation_of(c, recv_bytes, other, other_recv_bytes, 0, rounds, r)) return std::nullopt;
  }
  if (!find_mirrors(c, recv_bytes)) return std::nullopt;
  c.rotation_symmetric = true;
  c.description = counted_description(request, c, c.first_round[1]);
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
