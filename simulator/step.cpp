#include "simulator/step.hpp"

#include <algorithm>
#include <deque>
#include <unordered_map>

#include <fmt/format.h>

#include "engine/core/error.hpp"

namespace tandem::simulator {

using engine::parallel::StageOpKind;
using network::FlowObserver;

namespace {

constexpr uint64_t kEvCompute = 0, kEvLocal = 1;
constexpr uint64_t kTagP2p = 0, kTagColl = 1;

class StepExecutor final : public des::EventHandler, public FlowObserver {
 public:
  StepExecutor(const StepSetup& s, network::Topology& topo, des::Simulator& sim)
      : s_(s), topo_(topo), net_(topo.network()), sim_(sim) {}

  StepResult run();
  void on_event(uint64_t arg) override;
  void on_flow_done(uint64_t tag) override;

 private:
  enum class Wait : uint8_t { kNone, kCompute, kRecvAct, kRecvGrad, kAllreduce, kDone };
  struct Rank {
    int32_t stage = 0, replica = 0;
    size_t pc = 0;
    Wait wait = Wait::kNone;
    int32_t wait_mb = -1;
    des::TimeNs wait_since = 0;
    int32_t segment = -1;  // >= 0 while running the last backward bucket by bucket
    bool segment_compressed = false;  // the running segment's bucket has been converted to 16 bits
    int32_t compressing_bucket = -1;  // converting this bucket (all-reduces after backward)
    bool decompressing = false, decompressed = false;  // converting the gradients back before the optimizer
    double compute_full_s = 0;  // of the running compute op
    des::TimeNs compute_start = 0;
    std::string compute_name;
    // communication stream
    int32_t next_bucket = 0, buckets_done = 0;
    bool comm_busy = false;
    des::TimeNs comm_start = 0;
    std::vector<uint8_t> bucket_ready;
    // point-to-point arrivals per micro-batch (-1: not yet) and when the sender posted them
    std::vector<des::TimeNs> act_arrived, grad_arrived, act_posted, grad_posted;
    RankBreakdown bd;
  };
  struct Member {
    uint32_t round = 0;
    uint32_t outstanding = 0;
    bool active = false;
  };
  struct Instance {  // one all-reduce of one bucket of one stage
    const CompiledPlan* plan;
    int32_t stage, bucket;
    std::vector<Member> members;
    std::vector<uint8_t> arrived;  // per receive
    const std::vector<network::RouteId>* routes;
  };

  int32_t rank_of(int32_t replica, int32_t stage) const { return replica * s_.pp + stage; }
  void advance(int32_t r);
  void start_compute(int32_t r, double full_s, std::string name);
  void end_wait(int32_t r, des::TimeNs posted);
  void try_start_comm(int32_t r);
  void member_done(int32_t r);
  void run_member(uint32_t inst, int32_t m);
  void start_round(uint32_t inst, int32_t m);
  void p2p_send(int32_t from, int32_t to, bool activation, int32_t mb, double bytes);
  void start_p2p(int32_t from, int32_t to, bool activation, int32_t mb, double bytes);
  void span(int32_t r, int32_t lane, std::string name, const char* cat, des::TimeNs a, des::TimeNs b) {
    if (s_.record_trace && b > a)
      result_.trace.push_back({r, lane, std::move(name), cat, des::to_seconds(a), des::to_seconds(b)});
  }
  const std::vector<network::RouteId>& routes_for(const CompiledPlan* plan, int32_t stage);
  bool symmetric_possible() const;
  double compress_s(int32_t r, int32_t bucket) const {
    const auto& v = s_.ranks[r].bucket_compress_s;
    return v.empty() ? 0.0 : v.at(static_cast<size_t>(bucket));
  }

  const StepSetup& s_;
  network::Topology& topo_;
  network::Network& net_;
  des::Simulator& sim_;
  std::vector<Rank> ranks_;
  std::vector<Instance> inst_;
  std::vector<std::vector<uint32_t>> inst_of_;  // [stage][bucket] -> instance
  std::vector<std::pair<std::pair<const CompiledPlan*, int32_t>, std::vector<network::RouteId>>> route_tables_;
  // Point-to-point messages from one rank to another travel in order, one at a time (the runtime
  // sends them over one connection): per directed pair, the messages not yet started (the one in
  // flight is counted by p2p_busy_).
  struct P2pMessage {
    bool activation;
    int32_t mb;
    double bytes;
  };
  std::unordered_map<uint64_t, std::deque<P2pMessage>> p2p_queued_;
  std::unordered_map<uint64_t, bool> p2p_busy_;
  static uint64_t pair_key(int32_t from, int32_t to) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(from)) << 32) | static_cast<uint32_t>(to);
  }
  int32_t finished_ = 0;
  bool sym_ = false;  // symmetric execution: rank 0 alone stands for every rank (see symmetric_possible)
  StepResult result_;
};

const std::vector<network::RouteId>& StepExecutor::routes_for(const CompiledPlan* plan, int32_t stage) {
  for (auto& [key, table] : route_tables_)
    if (key.first == plan && key.second == stage) return table;
  std::vector<network::RouteId> table(plan->sends.size());
  for (int32_t m = 0; m < (sym_ ? 1 : plan->world); ++m) {
    for (uint32_t ri = plan->first_round[m]; ri < plan->first_round[m + 1]; ++ri) {
      for (uint32_t k = plan->rounds[ri].send_begin; k < plan->send_end(ri); ++k)
        table[k] = topo_.route(rank_of(m, stage), rank_of(plan->sends[k].dst, stage));
    }
  }
  route_tables_.emplace_back(std::make_pair(plan, stage), std::move(table));
  return route_tables_.back().second;
}

StepResult StepExecutor::run() {
  const int32_t world = s_.dp * s_.pp;
  TANDEM_REQUIRE(static_cast<int32_t>(s_.ranks.size()) == world, "step setup has {} ranks for dp {} x pp {}",
                 s_.ranks.size(), s_.dp, s_.pp);
  TANDEM_REQUIRE(topo_.endpoints() >= world, "the cluster has {} devices but the job needs {} ranks",
                 topo_.endpoints(), world);
  TANDEM_REQUIRE(s_.pipeline.stages == s_.pp, "pipeline plan has {} stages, job pp is {}", s_.pipeline.stages, s_.pp);
  const int32_t M = s_.pipeline.micro_batches;
  sym_ = symmetric_possible();
  ranks_.resize(world);
  inst_of_.resize(s_.pp);
  route_tables_.reserve(64);
  for (int32_t st = 0; st < s_.pp; ++st) {
    const auto& sp = s_.pipeline.stage_plans[st];
    const size_t nb = sp.buckets.size();
    if (s_.dp > 1) {
      TANDEM_REQUIRE(s_.bucket_plans.size() == static_cast<size_t>(s_.pp) && s_.bucket_plans[st].size() == nb,
                     "stage {}: {} buckets but no all-reduce plans for them", st, nb);
    }
    for (size_t b = 0; b < nb && s_.dp > 1; ++b) {
      // symmetric execution runs member 0 alone; the full model needs every member's rounds
      const CompiledPlan* plan = sym_ ? s_.bucket_plans[st][b] : &s_.bucket_plans[st][b]->full();
      TANDEM_REQUIRE(plan->world == s_.dp, "stage {} bucket {}: plan for {} ranks, data-parallel group has {}", st, b,
                     plan->world, s_.dp);
      inst_of_[st].push_back(static_cast<uint32_t>(inst_.size()));
      Instance in{plan, st, static_cast<int32_t>(b), std::vector<Member>(s_.dp), std::vector<uint8_t>(plan->recvs.size()),
                  nullptr};
      in.routes = &routes_for(plan, st);
      inst_.push_back(std::move(in));
    }
  }
  for (int32_t r = 0; r < world; ++r) {
    Rank& rk = ranks_[r];
    rk.stage = r % s_.pp;
    rk.replica = r / s_.pp;
    const auto& sp = s_.pipeline.stage_plans[rk.stage];
    rk.bucket_ready.assign(s_.dp > 1 ? sp.buckets.size() : 0, 0);
    rk.act_arrived.assign(M, -1);
    rk.grad_arrived.assign(M, -1);
    rk.act_posted.assign(M, -1);
    rk.grad_posted.assign(M, -1);
    const RankSetup& rs = s_.ranks[r];
    TANDEM_REQUIRE(rs.speed > 0, "rank {}: speed must be > 0, got {}", r, rs.speed);
    TANDEM_REQUIRE(static_cast<int32_t>(rs.forward_s.size()) == M && static_cast<int32_t>(rs.backward_s.size()) == M,
                   "rank {}: compute times for {} / {} micro-batches, expected {}", r, rs.forward_s.size(),
                   rs.backward_s.size(), M);
  }
  for (int32_t r = 0; r < (sym_ ? 1 : world); ++r) advance(r);
  sim_.run();
  if (sym_ && finished_ == 1) {
    for (int32_t r = 1; r < world; ++r) {
      ranks_[r].bd = ranks_[0].bd;
      ranks_[r].wait = Wait::kDone;
    }
    finished_ = world;
    if (s_.record_trace) {
      const size_t n0 = result_.trace.size();
      for (int32_t r = 1; r < world; ++r)
        for (size_t i = 0; i < n0; ++i) {
          TraceSpan t = result_.trace[i];
          t.rank = r;
          result_.trace.push_back(std::move(t));
        }
    }
  }
  result_.symmetric_used = sym_;
  if (finished_ != world) {
    for (int32_t r = 0; r < world; ++r) {
      const Rank& rk = ranks_[r];
      if (rk.wait == Wait::kDone) continue;
      const auto& ops = s_.pipeline.stage_plans[rk.stage].ops;
      TANDEM_THROW(Status::kInternal, "simulated step deadlocked: rank {} (stage {}, replica {}) waits at op {} ({})",
                   r, rk.stage, rk.replica, rk.pc,
                   rk.pc < ops.size() ? engine::parallel::stage_op_name(ops[rk.pc].kind) : "end");
    }
  }
  double step = 0;
  for (const Rank& rk : ranks_) step = std::max(step, rk.bd.finish_s);
  result_.step_s = step;
  for (Rank& rk : ranks_) {
    double tail = step - rk.bd.finish_s;
    if (s_.pp > 1) {
      rk.bd.bubble_s += tail;
    } else {
      rk.bd.idle_s += tail;
    }
    result_.ranks.push_back(rk.bd);
  }
  result_.events = sim_.events_processed();
  result_.flows = net_.flows_started();
  return result_;
}

void StepExecutor::start_compute(int32_t r, double full_s, std::string name) {
  Rank& rk = ranks_[r];
  rk.wait = Wait::kCompute;
  rk.compute_full_s = full_s;
  rk.compute_start = sim_.now();
  if (s_.record_trace) rk.compute_name = std::move(name);
  sim_.schedule_in(des::ceil_ns(full_s / s_.ranks[r].speed), this, (static_cast<uint64_t>(r) << 2) | kEvCompute);
}

void StepExecutor::advance(int32_t r) {
  Rank& rk = ranks_[r];
  const auto& sp = s_.pipeline.stage_plans[rk.stage];
  const RankSetup& rs = s_.ranks[r];
  while (rk.pc < sp.ops.size()) {
    const auto& op = sp.ops[rk.pc];
    switch (op.kind) {
      case StageOpKind::kForward:
        start_compute(r, rs.forward_s[op.micro_batch], fmt::format("forward mb{}", op.micro_batch));
        return;
      case StageOpKind::kBackward:
        if (static_cast<int32_t>(rk.pc) == sp.last_backward_op && !rk.bucket_ready.empty() && s_.overlap) {
          rk.segment = 0;
          start_compute(r, rs.bucket_backward_s.at(0), fmt::format("backward mb{} bucket 0", op.micro_batch));
        } else {
          start_compute(r, rs.backward_s[op.micro_batch], fmt::format("backward mb{}", op.micro_batch));
        }
        return;
      case StageOpKind::kSendActivation:
        p2p_send(r, rank_of(rk.replica, rk.stage + 1), true, op.micro_batch,
                 s_.boundary_bytes[rk.stage][op.micro_batch]);
        break;
      case StageOpKind::kSendGradient:
        p2p_send(r, rank_of(rk.replica, rk.stage - 1), false, op.micro_batch,
                 s_.boundary_bytes[rk.stage - 1][op.micro_batch]);
        break;
      case StageOpKind::kRecvActivation:
      case StageOpKind::kRecvGradient: {
        bool act = op.kind == StageOpKind::kRecvActivation;
        if ((act ? rk.act_arrived : rk.grad_arrived)[op.micro_batch] < 0) {
          rk.wait = act ? Wait::kRecvAct : Wait::kRecvGrad;
          rk.wait_mb = op.micro_batch;
          rk.wait_since = sim_.now();
          return;
        }
        break;
      }
      case StageOpKind::kAllreduceBucket:
        if (!rk.bucket_ready.empty() && !s_.overlap) {
          if (compress_s(r, op.bucket) > 0) {  // converted first; on_event marks it ready
            rk.compressing_bucket = op.bucket;
            start_compute(r, compress_s(r, op.bucket), fmt::format("compress bucket {}", op.bucket));
            return;
          }
          rk.bucket_ready[op.bucket] = 1;
          try_start_comm(r);
        }
        break;
      case StageOpKind::kOptimizerStep:
        if (rk.buckets_done < static_cast<int32_t>(rk.bucket_ready.size())) {
          rk.wait = Wait::kAllreduce;
          rk.wait_since = sim_.now();
          return;
        }
        if (rs.decompress_s > 0 && !rk.decompressed) {
          rk.decompressed = rk.decompressing = true;
          start_compute(r, rs.decompress_s, "decompress gradients");
          return;
        }
        start_compute(r, rs.optimizer_s, "optimizer");
        return;
    }
    ++rk.pc;
  }
  rk.wait = Wait::kDone;
  rk.bd.finish_s = des::to_seconds(sim_.now());
  ++finished_;
}

void StepExecutor::on_event(uint64_t arg) {
  const uint64_t type = arg & 3;
  if (type == kEvCompute) {
    const int32_t r = static_cast<int32_t>(arg >> 2);
    Rank& rk = ranks_[r];
    const double actual = des::to_seconds(sim_.now() - rk.compute_start);
    if (s_.ranks[r].speed == 1.0) {
      rk.bd.compute_s += actual;  // differs from compute_full_s only by rounding to whole nanoseconds
    } else {
      rk.bd.compute_s += rk.compute_full_s;
      rk.bd.throttled_s += actual - rk.compute_full_s;
    }
    rk.bd.cpu_busy_s += actual;
    span(r, 0, rk.compute_name, "compute", rk.compute_start, sim_.now());
    rk.wait = Wait::kNone;
    if (rk.segment >= 0) {
      if (compress_s(r, rk.segment) > 0 && !rk.segment_compressed) {
        rk.segment_compressed = true;
        start_compute(r, compress_s(r, rk.segment), s_.record_trace ? fmt::format("compress bucket {}", rk.segment) : "");
        return;
      }
      rk.segment_compressed = false;
      rk.bucket_ready[rk.segment] = 1;
      try_start_comm(r);
      ++rk.segment;
      if (rk.segment < static_cast<int32_t>(rk.bucket_ready.size())) {
        const auto& op = s_.pipeline.stage_plans[rk.stage].ops[rk.pc];
        start_compute(r, s_.ranks[r].bucket_backward_s.at(rk.segment),
                      s_.record_trace ? fmt::format("backward mb{} bucket {}", op.micro_batch, rk.segment) : "");
        return;
      }
      rk.segment = -1;
    }
    if (rk.compressing_bucket >= 0) {
      rk.bucket_ready[rk.compressing_bucket] = 1;
      rk.compressing_bucket = -1;
      try_start_comm(r);
    }
    if (rk.decompressing) {  // the optimizer op is still ahead
      rk.decompressing = false;
      advance(r);
      return;
    }
    ++rk.pc;
    advance(r);
  } else {  // kEvLocal: a collective member finished a round's local reductions
    const uint32_t inst = static_cast<uint32_t>((arg >> 2) & 0x3fffffu);
    const int32_t m = static_cast<int32_t>(arg >> 24);
    Member& mb = inst_[inst].members[m];
    ++mb.round;
    start_round(inst, m);
  }
}

void StepExecutor::p2p_send(int32_t from, int32_t to, bool activation, int32_t mb, double bytes) {
  Rank& dst = ranks_[to];
  (activation ? dst.act_posted : dst.grad_posted)[mb] = sim_.now();
  bool& busy = p2p_busy_[pair_key(from, to)];
  if (busy) {
    p2p_queued_[pair_key(from, to)].push_back({activation, mb, bytes});
    return;
  }
  busy = true;
  start_p2p(from, to, activation, mb, bytes);
}

void StepExecutor::start_p2p(int32_t from, int32_t to, bool activation, int32_t mb, double bytes) {
  uint64_t tag = (static_cast<uint64_t>(to) << 34) | (static_cast<uint64_t>(mb) << 2) | (activation ? 2u : 0u) |
                 kTagP2p;
  net_.start_flow(topo_.route(from, to), bytes, this, tag);
}

void StepExecutor::end_wait(int32_t r, des::TimeNs posted) {
  Rank& rk = ranks_[r];
  const des::TimeNs now = sim_.now();
  (void)posted;
  rk.bd.bubble_s += des::to_seconds(now - rk.wait_since);
  const bool act = rk.wait == Wait::kRecvAct;
  span(r, 0, fmt::format("recv {} mb{}", act ? "activation" : "gradient", rk.wait_mb), "bubble", rk.wait_since, now);
  rk.wait = Wait::kNone;
  ++rk.pc;
  advance(r);
}

void StepExecutor::on_flow_done(uint64_t tag) {
  if ((tag & 1) == kTagP2p) {
    const int32_t r = static_cast<int32_t>(tag >> 34);
    const int32_t mb = static_cast<int32_t>((tag >> 2) & 0xffffffffu);
    const bool act = tag & 2;
    // the next message of this pair goes now: activations come from the previous stage (rank - 1),
    // gradients from the next (rank + 1)
    const int32_t from = act ? r - 1 : r + 1;
    auto queued = p2p_queued_.find(pair_key(from, r));
    if (queued != p2p_queued_.end() && !queued->second.empty()) {
      const P2pMessage next = queued->second.front();
      queued->second.pop_front();
      start_p2p(from, r, next.activation, next.mb, next.bytes);
    } else {
      p2p_busy_[pair_key(from, r)] = false;
    }
    Rank& rk = ranks_[r];
    (act ? rk.act_arrived : rk.grad_arrived)[mb] = sim_.now();
    if (rk.wait == (act ? Wait::kRecvAct : Wait::kRecvGrad) && rk.wait_mb == mb)
      end_wait(r, (act ? rk.act_posted : rk.grad_posted)[mb]);
    return;
  }
  const uint32_t inst = static_cast<uint32_t>((tag >> 1) & 0x3fffffu);
  const uint32_t send = static_cast<uint32_t>(tag >> 23);
  Instance& in = inst_[inst];
  const auto& snd = in.plan->sends[send];
  if (sym_) {
    // the receive this send mirrors completes now too: member q's send to member 0 is this send's image
    Member& m0 = in.members[0];
    const uint32_t j = in.plan->mirror_recv[send - in.plan->rounds[0].send_begin];
    in.arrived[j] = 1;
    uint32_t done = 1;
    if (m0.round == in.plan->recvs[j].round) ++done;
    m0.outstanding -= done;
    if (m0.outstanding == 0) run_member(inst, 0);
    return;
  }
  in.arrived[snd.recv] = 1;
  // the receiver counts the arrival now if it is in the receive's round
  Member& dm = in.members[snd.dst];
  if (dm.active && dm.round == snd.recv_round && --dm.outstanding == 0) run_member(inst, snd.dst);
  Member& sm = in.members[snd.src];  // the sender is still in the send's round
  if (--sm.outstanding == 0) run_member(inst, snd.src);
}

void StepExecutor::try_start_comm(int32_t r) {
  Rank& rk = ranks_[r];
  if (rk.comm_busy || rk.next_bucket >= static_cast<int32_t>(rk.bucket_ready.size()) ||
      !rk.bucket_ready[rk.next_bucket])
    return;
  rk.comm_busy = true;
  rk.comm_start = sim_.now();
  const uint32_t inst = inst_of_[rk.stage][rk.next_bucket];
  Member& m = inst_[inst].members[rk.replica];
  m.active = true;
  m.round = inst_[inst].plan->first_round[rk.replica];
  start_round(inst, rk.replica);
}

// Enters member m's current round: posts its sends and counts what it still waits for; a round with
// nothing outstanding goes straight on to its local ops.
void StepExecutor::start_round(uint32_t inst, int32_t m) {
  Instance& in = inst_[inst];
  Member& mb = in.members[m];
  if (mb.round == in.plan->first_round[m + 1]) {
    mb.active = false;
    member_done(rank_of(m, in.stage));
    return;
  }
  const auto& rd = in.plan->rounds[mb.round];
  const uint32_t send_end = in.plan->send_end(mb.round);
  mb.outstanding = send_end - rd.send_begin;
  for (uint32_t k = rd.recv_begin; k < in.plan->recv_end(mb.round); ++k) mb.outstanding += in.arrived[k] ? 0 : 1;
  for (uint32_t k = rd.send_begin; k < send_end; ++k) {
    uint64_t tag = (static_cast<uint64_t>(k) << 23) | (static_cast<uint64_t>(inst) << 1) | kTagColl;
    net_.start_flow((*in.routes)[k], static_cast<double>(in.plan->sends[k].bytes), this, tag);
  }
  if (mb.outstanding == 0) run_member(inst, m);
}

// Member m has completed the transfers of its current round: run the local ops, then the next round.
void StepExecutor::run_member(uint32_t inst, int32_t m) {
  Instance& in = inst_[inst];
  Member& mb = in.members[m];
  if (mb.round == in.plan->first_round[m + 1]) {
    start_round(inst, m);
    return;
  }
  const auto& rd = in.plan->rounds[mb.round];
  const int32_t r = rank_of(m, in.stage);
  const RankSetup& rs = s_.ranks[r];
  uint64_t local = rd.local_bytes;
  if (mb.round + 1 == in.plan->first_round[m + 1]) local += in.plan->finish_bytes;
  if (local > 0 && rs.local_bytes_per_s > 0) {
    double t = static_cast<double>(local) / rs.local_bytes_per_s / rs.speed;
    ranks_[r].bd.cpu_busy_s += t;
    sim_.schedule_in(des::ceil_ns(t), this, (static_cast<uint64_t>(m) << 24) | (static_cast<uint64_t>(inst) << 2) | kEvLocal);
    return;
  }
  ++mb.round;
  start_round(inst, m);
}

void StepExecutor::member_done(int32_t r) {
  Rank& rk = ranks_[r];
  span(r, 1, fmt::format("allreduce bucket {}", rk.next_bucket), "allreduce", rk.comm_start, sim_.now());
  rk.comm_busy = false;
  ++rk.buckets_done;
  ++rk.next_bucket;
  try_start_comm(r);
  if (rk.wait == Wait::kAllreduce && rk.buckets_done == static_cast<int32_t>(rk.bucket_ready.size())) {
    rk.bd.comm_exposed_s += des::to_seconds(sim_.now() - rk.wait_since);
    span(r, 0, "wait allreduce", "comm", rk.wait_since, sim_.now());
    rk.wait = Wait::kNone;
    advance(r);
  }
}

// Symmetric execution simulates rank 0 alone and gives every rank its timeline. It is exact (not an
// approximation) when every rank is the image of rank 0 under a rotation of the ring of ranks: a
// pure data-parallel step (no point-to-point traffic), identical ranks (compute, speed, memory
// bandwidth), a non-blocking star of identical NICs, and rotation-symmetric all-reduce plans. Then all
// ranks start every round at the same instant, every NIC carries the same multiset of flows, and the
// max-min rates equal those of rank 0's flows on its uplink alone: the flows rank 0 receives are the
// images of those it sends. tests/simulator/symmetric_test.cpp checks equal times against the full model.
bool StepExecutor::symmetric_possible() const {
  if (!s_.symmetric || s_.pp != 1 || s_.dp < 2 || !topo_.uniform_star()) return false;
  for (const auto& stage : s_.bucket_plans)
    for (const CompiledPlan* p : stage)
      if (!p->rotation_symmetric) return false;
  const RankSetup& a = s_.ranks[0];
  for (const RankSetup& b : s_.ranks) {
    if (b.speed != a.speed || b.local_bytes_per_s != a.local_bytes_per_s || b.forward_s != a.forward_s ||
        b.backward_s != a.backward_s || b.bucket_backward_s != a.bucket_backward_s || b.optimizer_s != a.optimizer_s ||
        b.bucket_compress_s != a.bucket_compress_s || b.decompress_s != a.decompress_s)
      return false;
  }
  return true;
}

}  // namespace

StepResult simulate_step(const StepSetup& setup, network::Topology& topology, des::Simulator& sim) {
  StepExecutor ex(setup, topology, sim);
  return ex.run();
}

}  // namespace tandem::simulator
