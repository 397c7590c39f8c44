#include "engine/comm/executor.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <tuple>
#include <utility>

#include "engine/comm/reduce_kernels.hpp"
#include "engine/core/error.hpp"

namespace tandem::engine::comm {

namespace {

// A region in the unified address space: in-place calls map input and output onto one space.
struct Access {
  uint32_t op;
  int space;
  uint64_t lo, hi;
  bool write;
};

struct AddressMap {
  int space[3] = {0, 1, 2};
  int64_t shift[3] = {0, 0, 0};
  Access access(uint32_t op, const Region& r, bool write) const {
    const int b = static_cast<int>(r.buffer);
    const uint64_t lo = static_cast<uint64_t>(static_cast<int64_t>(r.offset) + shift[b]);
    return Access{op, space[b], lo, lo + r.count, write};
  }
};

AddressMap address_map(const Plan& plan, int rank) {
  AddressMap m;
  if (!plan.in_place) return m;
  const uint64_t per = plan.count / static_cast<uint64_t>(std::max(plan.world, 1));
  const auto at_rank = static_cast<int64_t>(per) * rank;
  switch (plan.collective) {
    case Collective::kReduceScatter:  // output = input + rank * per
      m.space[1] = 0;
      m.shift[1] = at_rank;
      break;
    case Collective::kAllgather:  // input = output + rank * per
      m.space[0] = 1;
      m.shift[0] = at_rank;
      break;
    default:  // the same buffer
      m.space[1] = 0;
      break;
  }
  return m;
}

}  // namespace

std::shared_ptr<const CompiledPlan> compile_plan(const Plan& plan, int rank) {
  TANDEM_CHECK(rank >= 0 && rank < plan.world, Status::kInternal, "compile_plan: rank {} outside world {}", rank,
               plan.world);
  auto cp = std::make_shared<CompiledPlan>();
  cp->collective = plan.collective;
  cp->algorithm = plan.algorithm;
  cp->world = plan.world;
  cp->rank = rank;
  cp->scratch_count = plan.scratch_count;
  cp->chunk_count = plan.chunk_count;
  cp->description = plan.describe();
  compile_rank_plan(plan, plan.ranks[rank], rank, *cp);
  return cp;
}

PlanAddress plan_address(const Plan& plan, int rank, const Region& r) {
  const Access a = address_map(plan, rank).access(0, r, false);
  return PlanAddress{a.space, a.lo};
}

void compile_rank_plan(const Plan& plan, const RankPlan& rank_plan, int rank, CompiledPlan& out) {
  TANDEM_CHECK(rank >= 0 && rank < plan.world, Status::kInternal, "compile_plan: rank {} outside world {}", rank,
               plan.world);
  CompiledPlan* cp = &out;
  cp->ops.clear();
  cp->succs.clear();
  cp->queues.clear();
  cp->ready_locals.clear();
  cp->recv_count = 0;
  // Program order: each round's transfers, then its local ops.
  for (const Round& round : rank_plan.rounds) {
    for (int pass = 0; pass < 2; ++pass)
      for (const Op& op : round.ops) {
        const bool transfer = op.kind == OpKind::kSend || op.kind == OpKind::kRecv;
        if (transfer != (pass == 0)) continue;
        CompiledOp c;
        c.kind = op.kind;
        c.peer = op.peer;
        c.src = op.src;
        c.dst = op.dst;
        if (op.kind == OpKind::kRecv) c.slot = cp->recv_count++;
        cp->ops.push_back(c);
      }
  }
  const auto n = static_cast<uint32_t>(cp->ops.size());
  const AddressMap map = address_map(plan, rank);
  std::vector<Access> acc;
  for (uint32_t i = 0; i < n; ++i) {
    const CompiledOp& o = cp->ops[i];
    switch (o.kind) {
      case OpKind::kSend: acc.push_back(map.access(i, o.src, false)); break;
      case OpKind::kRecv: acc.push_back(map.access(i, o.dst, true)); break;
      case OpKind::kCopy:
        acc.push_back(map.access(i, o.src, false));
        acc.push_back(map.access(i, o.dst, true));
        break;
      case OpKind::kReduce:
        acc.push_back(map.access(i, o.src, false));
        acc.push_back(map.access(i, o.dst, true));  // read and written
        break;
    }
  }
  acc.erase(std::remove_if(acc.begin(), acc.end(), [](const Access& a) { return a.hi == a.lo; }), acc.end());
  std::sort(acc.begin(), acc.end(), [](const Access& a, const Access& b) {
    return std::tie(a.space, a.lo, a.hi, a.op, a.write) < std::tie(b.space, b.lo, b.hi, b.op, b.write);
  });
  auto same_range = [](const Access& a, const Access& b) { return a.space == b.space && a.lo == b.lo && a.hi == b.hi; };
  std::vector<std::pair<uint32_t, uint32_t>> edges;
  // Accesses to one identical range (a chunk written and read step after step) in program order: a
  // read follows the last write, a write follows the reads since the last write (or that write). This
  // orders every conflicting pair of them, transitively, with O(accesses) edges instead of all pairs.
  struct Group {
    size_t begin, end;  // into acc
  };
  std::vector<Group> groups;
  std::vector<uint32_t> reads;
  for (size_t g = 0; g < acc.size();) {
    size_t e = g + 1;
    while (e < acc.size() && same_range(acc[g], acc[e])) ++e;
    groups.push_back({g, e});
    uint32_t last_write = UINT32_MAX;
    reads.clear();
    for (size_t k = g; k < e; ++k) {
      const Access& a = acc[k];
      if (a.write) {
        for (uint32_t r : reads)
          if (r != a.op) edges.emplace_back(r, a.op);
        if (reads.empty() && last_write != UINT32_MAX && last_write != a.op) edges.emplace_back(last_write, a.op);
        last_write = a.op;
        reads.clear();
      } else {
        if (last_write != UINT32_MAX && last_write != a.op) edges.emplace_back(last_write, a.op);
        reads.push_back(a.op);
      }
    }
    g = e;
  }
  // Sweep over ranges that overlap without being equal: every pair of their accesses where one writes
  // orders the earlier op before the later.
  std::vector<const Group*> active;
  for (size_t k = 0; k < groups.size(); ++k) {
    const Group& gr = groups[k];
    const Access& a = acc[gr.begin];
    if (k && acc[groups[k - 1].begin].space != a.space) active.clear();
    active.erase(
        std::remove_if(active.begin(), active.end(), [&](const Group* h) { return acc[h->begin].hi <= a.lo; }),
        active.end());
    for (const Group* h : active)
      for (size_t i = gr.begin; i < gr.end; ++i)
        for (size_t j = h->begin; j < h->end; ++j) {
          const Access &x = acc[i], &y = acc[j];
          if ((x.write || y.write) && x.op != y.op) edges.emplace_back(std::min(x.op, y.op), std::max(x.op, y.op));
        }
    active.push_back(&gr);
  }
  std::sort(edges.begin(), edges.end());
  edges.erase(std::unique(edges.begin(), edges.end()), edges.end());
  cp->succs.reserve(edges.size());
  size_t e = 0;
  for (uint32_t i = 0; i < n; ++i) {
    cp->ops[i].succ_begin = static_cast<uint32_t>(cp->succs.size());
    for (; e < edges.size() && edges[e].first == i; ++e) {
      cp->succs.push_back(edges[e].second);
      ++cp->ops[edges[e].second].deps;
    }
    cp->ops[i].succ_end = static_cast<uint32_t>(cp->succs.size());
  }
  std::map<int32_t, size_t> queue_of;
  for (uint32_t i = 0; i < n; ++i) {
    const CompiledOp& o = cp->ops[i];
    if (o.kind == OpKind::kSend || o.kind == OpKind::kRecv) {
      auto [it, fresh] = queue_of.emplace(o.peer, cp->queues.size());
      if (fresh) cp->queues.push_back(PeerQueue{o.peer, {}, {}});
      auto& q = cp->queues[it->second];
      (o.kind == OpKind::kSend ? q.sends : q.recvs).push_back(i);
    } else if (o.deps == 0) {
      cp->ready_locals.push_back(i);
    }
  }
  std::reverse(cp->ready_locals.begin(), cp->ready_locals.end());  // popped from the back: program order
}

void PlanExecutor::run(const CompiledPlan& plan, const ExecBuffers& buffers, transports::Transport& transport,
                       const std::vector<int>& transport_rank, uint64_t tag, const WireHeader& header,
                       ExecHooks& hooks) {
  plan_ = &plan;
  buffers_ = buffers;
  elem_bytes_ = dtype_size(buffers.dtype);
  transport_ = &transport;
  transport_rank_ = &transport_rank;
  tag_ = tag;
  header_ = &header;
  const size_t n = plan.ops.size();
  remaining_.resize(n);
  for (size_t i = 0; i < n; ++i) remaining_[i] = plan.ops[i].deps;
  requests_.clear();
  requests_.resize(n);
  recv_headers_.resize(plan.recv_count);
  send_heads_.assign(plan.queues.size(), 0);
  recv_heads_.assign(plan.queues.size(), 0);
  ready_.assign(plan.ready_locals.begin(), plan.ready_locals.end());
  inflight_.clear();
  done_ = 0;
  failed_peer_ = -1;
  last_event_ = std::chrono::steady_clock::now();

  while (done_ < n) {
    bool moved = false;
    // Start every transfer whose data is ready and whose predecessors to that peer are posted;
    // receives first, so a peer's rendezvous send finds its receive.
    for (size_t q = 0; q < plan.queues.size(); ++q) {
      const PeerQueue& pq = plan.queues[q];
      while (recv_heads_[q] < pq.recvs.size() && remaining_[pq.recvs[recv_heads_[q]]] == 0) post(pq.recvs[recv_heads_[q]++]);
      while (send_heads_[q] < pq.sends.size() && remaining_[pq.sends[send_heads_[q]]] == 0) post(pq.sends[send_heads_[q]++]);
    }
    while (!ready_.empty()) {
      const uint32_t i = ready_.back();
      ready_.pop_back();
      run_local(i);
      finish(i);
      moved = true;
    }
    if (!inflight_.empty()) {
      transport.progress();
      for (size_t k = 0; k < inflight_.size();) {
        const uint32_t i = inflight_[k];
        if (!test_request(i)) {
          ++k;
          continue;
        }
        const CompiledOp& o = plan.ops[i];
        if (o.kind == OpKind::kRecv) {
          const size_t expected = sizeof(WireHeader) + o.dst.count * elem_bytes_;
          const size_t got = requests_[i]->bytes();
          const WireHeader& h = recv_headers_[o.slot];
          if (got < sizeof(WireHeader)) {
            WireHeader none;
            none.magic = 0;
            hooks.bad_message(o.peer, none, got, expected);
          }
          if (!same_operation(h, header) || got != expected || requests_[i]->truncated())
            hooks.bad_message(o.peer, h, got, expected);
        }
        requests_[i].reset();
        inflight_[k] = inflight_.back();
        inflight_.pop_back();
        finish(i);
        moved = true;
      }
    }
    hooks.poll();
    if (moved)
      last_event_ = std::chrono::steady_clock::now();
    else if (done_ < n)
      hooks.idle(*this);
  }
  plan_ = nullptr;
}

void PlanExecutor::post(uint32_t i) {
  const CompiledOp& o = plan_->ops[i];
  const int peer = (*transport_rank_)[static_cast<size_t>(o.peer)];
  failed_peer_ = o.peer;  // until posted: an isend/irecv that throws names its peer
  if (o.kind == OpKind::kSend) {
    const std::array<transports::ConstPart, 2> parts{
        transports::ConstPart{header_, sizeof(WireHeader)},
        transports::ConstPart{buffers_.base[static_cast<int>(o.src.buffer)] + o.src.offset * elem_bytes_,
                              o.src.count * elem_bytes_}};
    requests_[i] = transport_->isend(peer, tag_, std::span(parts.data(), o.src.count ? 2 : 1));
  } else {
    const std::array<transports::MutPart, 2> parts{
        transports::MutPart{&recv_headers_[o.slot], sizeof(WireHeader)},
        transports::MutPart{buffers_.base[static_cast<int>(o.dst.buffer)] + o.dst.offset * elem_bytes_,
                            o.dst.count * elem_bytes_}};
    requests_[i] = transport_->irecv(peer, tag_, std::span(parts.data(), o.dst.count ? 2 : 1));
  }
  failed_peer_ = -1;
  inflight_.push_back(i);
}

bool PlanExecutor::test_request(uint32_t i) {
  try {
    return requests_[i]->test();
  } catch (const Error&) {
    failed_peer_ = plan_->ops[i].peer;
    throw;
  }
}

void PlanExecutor::run_local(uint32_t i) {
  const CompiledOp& o = plan_->ops[i];
  unsigned char* dst = buffers_.base[static_cast<int>(o.dst.buffer)] + o.dst.offset * elem_bytes_;
  const unsigned char* src = buffers_.base[static_cast<int>(o.src.buffer)] + o.src.offset * elem_bytes_;
  if (o.kind == OpKind::kCopy) {
    if (dst != src) std::memcpy(dst, src, o.src.count * elem_bytes_);
  } else {
    reduce_kernel(reduce_isa_, dst, src, o.src.count, buffers_.dtype, buffers_.op);
  }
}

void PlanExecutor::finish(uint32_t i) {
  ++done_;
  const CompiledOp& o = plan_->ops[i];
  for (uint32_t k = o.succ_begin; k < o.succ_end; ++k) {
    const uint32_t s = plan_->succs[k];
    if (--remaining_[s] == 0 && plan_->ops[s].kind != OpKind::kSend && plan_->ops[s].kind != OpKind::kRecv)
      ready_.push_back(s);
  }
}

void PlanExecutor::abandon() {
  for (auto& r : requests_)
    if (r) {
      r->cancel();
      r.reset();
    }
  inflight_.clear();
  plan_ = nullptr;
}

std::vector<int> PlanExecutor::waiting_peers() const {
  std::vector<int> peers;
  if (!plan_) return peers;
  for (uint32_t i : inflight_) peers.push_back(plan_->ops[i].peer);
  std::sort(peers.begin(), peers.end());
  peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
  return peers;
}

}  // namespace tandem::engine::comm
