#include "simulator/step.hpp"

#include <algorithm>
#include <deque>
#include <functional>
#include <memory>
#include <unordered_map>

#include <fmt/format.h>

#include "engine/core/error.hpp"
#include "simulator/comm_cpu.hpp"

namespace tandem::simulator {

using engine::parallel::StageOpKind;
using network::FlowObserver;

namespace {

constexpr uint64_t kEvCompute = 0, kEvLocal = 1, kEvDispatch = 2, kEvXferCpu = 3;
constexpr uint64_t kTagP2p = 0, kTagColl = 1;

class StepExecutor final : public des::EventHandler, public FlowObserver {
 public:
  StepExecutor(const StepSetup& s, network::Topology& topo, des::Simulator& sim)
      : s_(s), topo_(topo), net_(topo.network()), sim_(sim) {}

  StepResult run();
  void on_event(uint64_t arg) override;
  void on_flow_done(uint64_t tag) override;

 private:
  enum class Wait : uint8_t { kNone, kCompute, kRecvAct, kRecvGrad, kAllreduce, kAgree, kDone };
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
    bool unscaling = false, unscaled = false, agreed = false;  // loss scaling: the unscale pass, the flag's meeting
    double compute_full_s = 0;  // of the running compute op
    des::TimeNs compute_start = 0;
    std::string compute_name;
    // communication stream
    int32_t next_bucket = 0, buckets_done = 0;
    bool comm_busy = false;
    des::TimeNs comm_start = 0;
    // StepSetup::comm_cycle_s: when the current cycle started, when its last all-reduce ended, the last bucket it
    // took, and whether the next cycle's start is scheduled
    des::TimeNs cycle_at = 0, cycle_free_at = 0;
    int32_t cycle_last = -1;
    bool cycle_pending = false;
    std::vector<uint8_t> bucket_ready;
    // point-to-point arrivals per micro-batch (-1: not yet) and when the sender posted them
    std::vector<des::TimeNs> act_arrived, grad_arrived, act_posted, grad_posted;
    RankBreakdown bd;
  };
  // A member of an all-reduce runs its ops as the runtime's executor does (compiled_plan.hpp): an op
  // starts once its dependencies are done -- a transfer also once the previous one to its peer is
  // posted -- so chunks pipeline across the plan's rounds. Sends are flows; a receive completes when
  // it is posted and its data has arrived; copies and reductions run one at a time on the rank's
  // CPU (the executor's thread), the lowest ready op in program order first.
  static constexpr uint32_t kIdle = UINT32_MAX, kFinish = UINT32_MAX - 1;
  static constexpr uint8_t kReleased = 1, kArrived = 2, kDone = 4;
  static constexpr uint8_t kSendCpu = 1, kRecvCpu = 2, kFlowDone = 4;
  struct Member {
    uint32_t left = 0;          // ops not done
    uint32_t running = kIdle;   // the local op on the CPU (member-local), kFinish (closing average), kIdle
    bool active = false, dispatch_pending = false;
    des::TimeNs local_start = 0;
    std::vector<uint32_t> ready;  // local ops waiting for the CPU: a min-heap of member-local indices
  };
  struct Instance {  // one all-reduce of one bucket of one stage
    const CompiledPlan* plan;
    int32_t stage, bucket;
    std::vector<Member> members;
    std::vector<uint32_t> remaining;  // per op: dependencies not yet met
    std::vector<uint8_t> state;       // per op: kReleased | kArrived | kDone
    std::vector<des::TimeNs> started;  // per op, when op_log is recorded
    std::vector<uint8_t> xfer;  // per send, when transfers cost CPU: kSendCpu | kRecvCpu pending, kFlowDone
    const std::vector<network::RouteId>* routes;  // per op (sends)
    // One connection per peer: a send posted while the previous one to its peer is still on the wire waits
    // behind it (its bytes follow that one's, as on a TCP connection), not beside it sharing the link.
    std::vector<uint32_t> conn_prev;  // per send: the previous send to its peer (global index), else kNone
    std::vector<uint8_t> conn;        // per send: kOnWire while its flow runs, kHeld while it waits behind one
    std::vector<des::TimeNs> held_at;  // per held send: when it was posted
  };
  static constexpr uint8_t kOnWire = 1, kHeld = 2;

  int32_t rank_of(int32_t replica, int32_t stage) const { return replica * s_.pp + stage; }
  void advance(int32_t r);
  void start_compute(int32_t r, double full_s, std::string name);
  // `seconds` of the rank's CPU (at its speed), then on_event(arg): on its node's CPU model if it has one;
  // `contended`: compute, which the co-run table slows (copies, reductions and transfer CPU are not)
  void run_cpu(int32_t r, double seconds, uint64_t arg, bool contended = true);
  void end_wait(int32_t r, des::TimeNs posted);
  void try_start_comm(int32_t r);
  void launch_comm(int32_t r);
  // StepSetup::comm_cycle_s: a cycle of rank r's collective loop starts (takes the buckets ready now)
  void cycle_tick(int32_t r);
  struct CycleTick final : des::EventHandler {
    StepExecutor* ex = nullptr;
    void on_event(uint64_t r) override { ex->cycle_tick(static_cast<int32_t>(r)); }
  };
  CycleTick cycle_;
  // StepSetup::comm_negotiation_s: the cycle rank r started has been negotiated; its all-reduces start
  void cycle_negotiated(int32_t r);
  struct CycleNegotiated final : des::EventHandler {
    StepExecutor* ex = nullptr;
    void on_event(uint64_t r) override { ex->cycle_negotiated(static_cast<int32_t>(r)); }
  };
  CycleNegotiated negotiated_;
  // StepSetup::host_staging_bytes_per_s: the copy of rank r's bucket to the host (`in`) or back (`out`) is done
  double staging_s(int32_t r) const;
  void start_bucket(int32_t r);
  void bucket_done(int32_t r);
  struct Staged final : des::EventHandler {
    StepExecutor* ex = nullptr;
    bool out = false;
    void on_event(uint64_t r) override {
      out ? ex->bucket_done(static_cast<int32_t>(r)) : ex->start_bucket(static_cast<int32_t>(r));
    }
  };
  Staged staged_in_, staged_out_;
  void member_done(int32_t r);
  void start_member(uint32_t inst, int32_t m);
  void release(uint32_t inst, int32_t m, uint32_t i);
  void complete(uint32_t inst, int32_t m, uint32_t i);
  void request_dispatch(uint32_t inst, int32_t m);
  void dispatch(uint32_t inst, int32_t m);
  void finish_member(uint32_t inst, int32_t m);
  // A transfer's parts: its flow, and (when transfers cost CPU) the sender's and the receiver's CPU work.
  void start_xfer_cpu(uint32_t inst, int32_t m, uint32_t g, double bytes);
  double xfer_cpu_s(int32_t r, int32_t peer, double bytes) const;
  void xfer_part_done(uint32_t inst, uint32_t g, uint8_t part);
  void send_done(uint32_t inst, uint32_t g);
  void start_send(uint32_t inst, int32_t m, uint32_t g);
  // `woken`: the receiver's wake-up wait (below) is already behind it.
  void recv_arrived(uint32_t inst, uint32_t g, bool woken = false);
  void p2p_arrived(uint64_t tag, bool woken);
  // A message to a blocked receiver on a node with more ranks than cores waits for the receiver's slice
  // (CpuShare::wakeup_s): the flow tag's delivery is delayed that long. Returns whether it was.
  bool defer_wakeup(int32_t r, uint64_t tag);
  struct Wake final : des::EventHandler {  // the delayed deliveries (flow tags)
    StepExecutor* ex = nullptr;
    void on_event(uint64_t tag) override { ex->wake_done(tag); }
  };
  void wake_done(uint64_t tag);
  // Loss scaling: rank r reached the found-non-finite meeting; when the last has, every rank goes on after the
  // agreement plan's latency (agree_done).
  void arrive_agree(int32_t r);
  void agree_done();
  double agree_latency_s();
  struct AgreeEvent final : des::EventHandler {
    StepExecutor* ex = nullptr;
    void on_event(uint64_t) override { ex->agree_done(); }
  };
  AgreeEvent agree_;
  int32_t agree_arrived_ = 0;
  static uint64_t member_arg(uint32_t inst, int32_t m, uint64_t type) {
    return (static_cast<uint64_t>(m) << 24) | (static_cast<uint64_t>(inst) << 2) | type;
  }
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
  std::vector<std::unique_ptr<NodeCpu>> shared_cpus_;  // one per modelled node
  std::vector<NodeCpu*> cpus_;                         // per rank: its node's CPU model, or null
  std::vector<double> wake_s_;  // per rank: the wake-up wait of a message to it while blocked (empty: none)
  Wake wake_;
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
  bool xfer_cpu_ = false;  // some rank's transfers cost CPU (RankSetup::net_cpu_s_per_byte, copy_cpu_s_per_byte)
  bool sym_ = false;  // symmetric execution: rank 0 alone stands for every rank (see symmetric_possible)
  StepResult result_;
};

const std::vector<network::RouteId>& StepExecutor::routes_for(const CompiledPlan* plan, int32_t stage) {
  for (auto& [key, table] : route_tables_)
    if (key.first == plan && key.second == stage) return table;
  std::vector<network::RouteId> table(plan->ops.size());
  for (int32_t m = 0; m < (sym_ ? 1 : plan->world); ++m) {
    for (uint32_t g = plan->first_op[m]; g < plan->first_op[m + 1]; ++g)
      if (plan->ops[g].kind == CompiledPlan::Kind::kSend)
        table[g] = topo_.route(rank_of(m, stage), rank_of(plan->ops[g].peer, stage));
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
  for (const RankSetup& rs : s_.ranks) {
    TANDEM_REQUIRE(rs.net_cpu_s_per_byte >= 0 && rs.copy_cpu_s_per_byte >= 0 && rs.net_cpu_s_per_wakeup >= 0 &&
                       rs.copy_cpu_s_per_message >= 0,
                   "step setup: transfer CPU costs must be >= 0 (net {}, copy {} s per byte, net {} s per wake-up, "
                   "copy {} s per message)",
                   rs.net_cpu_s_per_byte, rs.copy_cpu_s_per_byte, rs.net_cpu_s_per_wakeup, rs.copy_cpu_s_per_message);
    TANDEM_REQUIRE(rs.net_cpu_s_per_wakeup == 0 || rs.net_pace_bytes_per_s > 0,
                   "step setup: a wake-up cost ({} s) needs the rank's link pace (net_pace_bytes_per_s > 0, got {})",
                   rs.net_cpu_s_per_wakeup, rs.net_pace_bytes_per_s);
    xfer_cpu_ = xfer_cpu_ || transfers_cost_cpu(rs);
  }
  TANDEM_REQUIRE(s_.host_of_rank.empty() || s_.host_of_rank.size() == static_cast<size_t>(world),
                 "step setup: host_of_rank has {} ranks, expected {}", s_.host_of_rank.size(), world);
  sym_ = symmetric_possible();
  topo_.fold_acks(sym_);
  ranks_.resize(world);
  TANDEM_REQUIRE(s_.comm_cycle_s >= 0, "step setup: comm_cycle_s must be >= 0, got {}", s_.comm_cycle_s);
  TANDEM_REQUIRE(s_.comm_negotiation_s >= 0, "step setup: comm_negotiation_s must be >= 0, got {}",
                 s_.comm_negotiation_s);
  TANDEM_REQUIRE(s_.comm_negotiation_s == 0 || s_.comm_cycle_s > 0,
                 "step setup: comm_negotiation_s ({} s) is a cost per cycle, but comm_cycle_s is 0 (no cycles)",
                 s_.comm_negotiation_s);
  cycle_.ex = this;
  negotiated_.ex = this;
  TANDEM_REQUIRE(s_.host_staging_bytes_per_s >= 0, "step setup: host_staging_bytes_per_s must be >= 0, got {}",
                 s_.host_staging_bytes_per_s);
  staged_in_.ex = staged_out_.ex = this;
  staged_out_.out = true;
  for (Rank& rk : ranks_) {  // the loop's first tick is the step's start
    rk.cycle_at = sim_.now() - std::max<des::TimeNs>(1, des::to_ns(s_.comm_cycle_s));
    rk.cycle_free_at = sim_.now();
  }
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
      // symmetric execution runs member 0 alone; the full model needs every member's ops
      const CompiledPlan* plan = sym_ ? s_.bucket_plans[st][b] : &s_.bucket_plans[st][b]->full();
      TANDEM_REQUIRE(plan->world == s_.dp, "stage {} bucket {}: plan for {} ranks, data-parallel group has {}", st, b,
                     plan->world, s_.dp);
      inst_of_[st].push_back(static_cast<uint32_t>(inst_.size()));
      Instance in{plan, st, static_cast<int32_t>(b), std::vector<Member>(s_.dp), {}, {}, {}, {}, nullptr};
      const size_t nops = sym_ ? plan->first_op[1] : plan->ops.size() - 1;
      in.remaining.resize(nops);
      for (size_t g = 0; g < nops; ++g) in.remaining[g] = plan->ops[g].deps;
      in.state.assign(nops, 0);
      if (s_.op_log) in.started.assign(nops, 0);
      if (xfer_cpu_) in.xfer.assign(nops, 0);
      in.conn_prev.assign(nops, CompiledPlan::kNone);
      in.conn.assign(nops, 0);
      in.held_at.assign(nops, 0);
      for (int32_t m = 0; m < (sym_ ? 1 : plan->world); ++m)
        for (uint32_t g = plan->first_op[m]; g < plan->first_op[m + 1]; ++g)
          if (plan->ops[g].kind == CompiledPlan::Kind::kSend && plan->ops[g].fifo_next != CompiledPlan::kNone)
            in.conn_prev[plan->first_op[m] + plan->ops[g].fifo_next] = g;
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
  if (!s_.node_cpu.empty()) {
    TANDEM_REQUIRE(s_.node_of_rank.size() == static_cast<size_t>(world), "step setup: node_of_rank has {} ranks, expected {}",
                   s_.node_of_rank.size(), world);
    std::vector<int32_t> per_node(s_.node_cpu.size(), 0);
    for (int32_t n : s_.node_of_rank) {
      TANDEM_REQUIRE(n >= 0 && static_cast<size_t>(n) < s_.node_cpu.size(), "step setup: rank on node {} of {}", n,
                     s_.node_cpu.size());
      ++per_node[static_cast<size_t>(n)];
    }
    std::vector<NodeCpu*> node(s_.node_cpu.size(), nullptr);
    cpus_.resize(static_cast<size_t>(world));
    // modelled where the ranks alone can exceed the cores or a quota holds; then a rank's training
    // thread and its all-reduce thread are both tasks of its node
    for (int32_t r = 0; r < world; ++r) {
      const size_t n = static_cast<size_t>(s_.node_of_rank[r]);
      // a rank whose transfers cost CPU runs two busy threads: training and collectives
      if (!s_.node_cpu[n].needs_model(per_node[n] * (xfer_cpu_ ? 2 : 1))) continue;
      if (!node[n]) {
        shared_cpus_.push_back(std::make_unique<NodeCpu>(sim_, s_.node_cpu[n]));
        node[n] = shared_cpus_.back().get();
      }
      cpus_[static_cast<size_t>(r)] = node[n];
    }
    // more ranks than cores: a woken receiver waits for a core (the profile's wakeup_latency_s)
    for (int32_t r = 0; r < world; ++r) {
      const CpuShare& c = s_.node_cpu[static_cast<size_t>(s_.node_of_rank[r])];
      if (c.wakeup_s <= 0 || per_node[static_cast<size_t>(s_.node_of_rank[r])] <= c.cores) continue;
      wake_s_.resize(static_cast<size_t>(world), 0.0);
      wake_s_[static_cast<size_t>(r)] = c.wakeup_s;
    }
    wake_.ex = this;
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
  run_cpu(r, full_s / s_.ranks[r].speed, (static_cast<uint64_t>(r) << 2) | kEvCompute);
}

void StepExecutor::run_cpu(int32_t r, double seconds, uint64_t arg, bool contended) {
  if (!cpus_.empty() && cpus_[static_cast<size_t>(r)])
    return cpus_[static_cast<size_t>(r)]->start(seconds, this, arg, contended);
  sim_.schedule_in(des::ceil_ns(seconds), this, arg);
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
        if (rs.unscale_s > 0 && !rk.unscaled) {
          rk.unscaled = rk.unscaling = true;
          start_compute(r, rs.unscale_s, "unscale gradients");
          return;
        }
        if (s_.agree_plan != nullptr && !rk.agreed) {
          arrive_agree(r);
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
    if (s_.ranks[r].speed == 1.0 && actual - rk.compute_full_s < 2e-9) {
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
    if (rk.decompressing || rk.unscaling) {  // the optimizer op is still ahead
      rk.decompressing = rk.unscaling = false;
      advance(r);
      return;
    }
    ++rk.pc;
    advance(r);
  } else if (type == kEvXferCpu) {
    xfer_part_done(static_cast<uint32_t>((arg >> 3) & 0x3fffffu), static_cast<uint32_t>(arg >> 25),
                   (arg & 4) ? kRecvCpu : kSendCpu);
  } else {
    const uint32_t inst = static_cast<uint32_t>((arg >> 2) & 0x3fffffu);
    const int32_t m = static_cast<int32_t>(arg >> 24);
    if (type == kEvDispatch) return dispatch(inst, m);
    // kEvLocal: a collective member's copy or reduction is done
    Member& mb = inst_[inst].members[m];
    const uint32_t i = mb.running;
    mb.running = kIdle;
    if (i == kFinish) {
      mb.active = false;
      member_done(rank_of(m, inst_[inst].stage));
      return;
    }
    if (!mb.ready.empty()) request_dispatch(inst, m);
    complete(inst, m, i);
  }
}

void StepExecutor::arrive_agree(int32_t r) {
  Rank& rk = ranks_[r];
  rk.wait = Wait::kAgree;
  rk.wait_since = sim_.now();
  // symmetric execution runs rank 0 for every (identical) rank: its arrival is everyone's
  if (++agree_arrived_ < (sym_ ? 1 : s_.dp * s_.pp)) return;
  agree_.ex = this;
  sim_.schedule_in(des::ceil_ns(agree_latency_s()), &agree_, 0);
}

void StepExecutor::agree_done() {
  const des::TimeNs now = sim_.now();
  for (int32_t r = 0; r < (sym_ ? 1 : s_.dp * s_.pp); ++r) {
    Rank& rk = ranks_[r];
    if (rk.wait != Wait::kAgree) continue;
    rk.bd.comm_exposed_s += des::to_seconds(now - rk.wait_since);  // as waiting for an all-reduce
    span(r, 0, "agree finite", "comm", rk.wait_since, now);
    rk.wait = Wait::kNone;
    rk.agreed = true;
    advance(r);
  }
}

// The agreement plan's critical path when every transfer costs its route's latency and nothing else: an op starts
// when its dependencies are done, a receive is done once its matching send has started and the latency passed.
double StepExecutor::agree_latency_s() {
  const CompiledPlan& plan = s_.agree_plan->full();
  const size_t n = plan.ops.size() - 1;
  std::vector<uint32_t> indeg(n, 0);
  std::vector<double> start(n, 0.0), done(n, 0.0), lat(n, 0.0);
  std::vector<int32_t> member(n, 0);
  for (int32_t m = 0; m < plan.world; ++m)
    for (uint32_t i = 0; i < plan.op_count(m); ++i) {
      const uint32_t g = plan.first_op[m] + i;
      member[g] = m;
      for (const uint32_t* p = plan.succ_begin(m, i); p != plan.succ_end(m, i); ++p) ++indeg[plan.first_op[m] + *p];
      const CompiledPlan::Op& op = plan.op(m, i);
      if (op.kind == CompiledPlan::Kind::kSend) {
        ++indeg[plan.first_op[op.peer] + op.link];
        lat[g] = net_.route_latency_s(topo_.route(m, op.peer));
      }
    }
  std::vector<uint32_t> ready;
  for (uint32_t g = 0; g < n; ++g)
    if (indeg[g] == 0) ready.push_back(g);
  double end = 0;
  auto release = [&](uint32_t g, double t, double& at) {
    at = std::max(at, t);
    if (--indeg[g] == 0) ready.push_back(g);
  };
  size_t seen = 0;
  while (!ready.empty()) {
    const uint32_t g = ready.back();
    ready.pop_back();
    ++seen;
    const int32_t m = member[g];
    const uint32_t i = g - plan.first_op[m];
    const CompiledPlan::Op& op = plan.op(m, i);
    // a receive's start already holds its matching send's start plus latency (released below)
    done[g] = start[g];
    end = std::max(end, done[g]);
    if (op.kind == CompiledPlan::Kind::kSend) release(plan.first_op[op.peer] + op.link, start[g] + lat[g],
                                                       start[plan.first_op[op.peer] + op.link]);
    for (const uint32_t* p = plan.succ_begin(m, i); p != plan.succ_end(m, i); ++p)
      release(plan.first_op[m] + *p, done[g], start[plan.first_op[m] + *p]);
  }
  TANDEM_CHECK(seen == n, Status::kInternal, "the loss-scaling agreement plan ({}) has a dependency cycle",
               plan.description);
  return end;
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

// A point-to-point message (flow tag) is in its receiver's buffer.
void StepExecutor::p2p_arrived(uint64_t tag, bool woken) {
  const int32_t r = static_cast<int32_t>(tag >> 34);
  const int32_t mb = static_cast<int32_t>((tag >> 2) & 0xffffffffu);
  const bool act = tag & 2;
  Rank& rk = ranks_[r];
  const bool waiting = rk.wait == (act ? Wait::kRecvAct : Wait::kRecvGrad) && rk.wait_mb == mb;
  if (!woken && waiting && defer_wakeup(r, tag)) return;
  (act ? rk.act_arrived : rk.grad_arrived)[mb] = sim_.now();
  if (waiting) end_wait(r, (act ? rk.act_posted : rk.grad_posted)[mb]);
}

bool StepExecutor::defer_wakeup(int32_t r, uint64_t tag) {
  if (wake_s_.empty() || wake_s_[static_cast<size_t>(r)] <= 0) return false;
  sim_.schedule_in(des::ceil_ns(wake_s_[static_cast<size_t>(r)]), &wake_, tag);
  return true;
}

void StepExecutor::wake_done(uint64_t tag) {
  if ((tag & 1) == kTagP2p) return p2p_arrived(tag, true);
  recv_arrived(static_cast<uint32_t>((tag >> 1) & 0x3fffffu), static_cast<uint32_t>(tag >> 23), true);
}

void StepExecutor::on_flow_done(uint64_t tag) {
  if ((tag & 1) == kTagP2p) {
    const int32_t r = static_cast<int32_t>(tag >> 34);
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
    return p2p_arrived(tag, false);
  }
  const uint32_t inst = static_cast<uint32_t>((tag >> 1) & 0x3fffffu);
  const auto g = static_cast<uint32_t>(tag >> 23);
  {  // off the wire: a send held behind it on the connection goes now
    Instance& in = inst_[inst];
    in.conn[g] = 0;
    const CompiledPlan& plan = *in.plan;
    const uint32_t next = plan.ops[g].fifo_next;
    if (next != CompiledPlan::kNone) {
      const int32_t m = sym_ ? 0
                             : static_cast<int32_t>(std::upper_bound(plan.first_op.begin(), plan.first_op.end(), g) -
                                                    plan.first_op.begin() - 1);
      const uint32_t n = plan.first_op[m] + next;
      if (in.conn[n] & kHeld) start_send(inst, m, n);
    }
  }
  if (xfer_cpu_) return xfer_part_done(inst, g, kFlowDone);
  send_done(inst, g);
  recv_arrived(inst, g);
}

// Send g (member m's) goes on the wire: its flow, and its sender's and receiver's CPU work.
// A send held behind the previous one (on_flow_done, when that one's last byte has arrived) began to leave when
// that one's last byte left, one route latency L earlier, or when it was posted if later: it waits what is left of
// its own latency, max(0, posted + L - now), and arrives right behind.
void StepExecutor::start_send(uint32_t inst, int32_t m, uint32_t g) {
  Instance& in = inst_[inst];
  const CompiledPlan::Op& op = in.plan->ops[g];
  const network::RouteId route = (*in.routes)[g];
  des::TimeNs wait = -1;
  if (in.conn[g] == kHeld)
    wait = std::max<des::TimeNs>(0, in.held_at[g] + des::to_ns(net_.route_latency_s(route)) - sim_.now());
  in.conn[g] = kOnWire;
  const uint64_t tag = (static_cast<uint64_t>(g) << 23) | (static_cast<uint64_t>(inst) << 1) | kTagColl;
  net_.start_flow(route, static_cast<double>(op.bytes), this, tag, wait);
  if (xfer_cpu_) start_xfer_cpu(inst, m, g, static_cast<double>(op.bytes));
}

// Send g's sender is done with it: the send completes.
void StepExecutor::send_done(uint32_t inst, uint32_t g) {
  const CompiledPlan& plan = *inst_[inst].plan;
  const int32_t src =
      sym_ ? 0 : static_cast<int32_t>(std::upper_bound(plan.first_op.begin(), plan.first_op.end(), g) - plan.first_op.begin() - 1);
  complete(inst, src, g - plan.first_op[src]);
}

// Send g's data is in its receiver's buffer: the receive completes if it is posted.
void StepExecutor::recv_arrived(uint32_t inst, uint32_t g, bool woken) {
  Instance& in = inst_[inst];
  const CompiledPlan& plan = *in.plan;
  int32_t dst = 0;
  uint32_t j = 0;  // the receive (of member dst) this flow completes
  if (sym_) {
    // the receive this send mirrors completes now too: member q's send to member 0 is this send's image
    j = plan.mirror_recv[g];
  } else {
    dst = plan.ops[g].peer;
    j = plan.first_op[dst] + plan.ops[g].link;
  }
  // the receive is posted and its member's thread has nothing on the CPU: it sleeps until woken
  if (!woken && (in.state[j] & (kReleased | kDone)) == kReleased && in.members[dst].running == kIdle &&
      in.members[dst].ready.empty() && !in.members[dst].dispatch_pending &&
      defer_wakeup(rank_of(dst, in.stage), (static_cast<uint64_t>(g) << 23) | (static_cast<uint64_t>(inst) << 1) | kTagColl))
    return;
  in.state[j] |= kArrived;
  if ((in.state[j] & (kReleased | kDone)) == kReleased) complete(inst, dst, j - plan.first_op[dst]);
}

double StepExecutor::xfer_cpu_s(int32_t r, int32_t peer, double bytes) const {
  return transfer_cpu_s(s_.ranks, s_.host_of_rank, r, peer, bytes);
}

// Send g (member m's) is posted: its sender's and its receiver's CPU work start with its flow, on their nodes'
// CPUs beside whatever else runs there. In symmetric execution rank 0 does both: its receive that mirrors g
// (plan.mirror_recv) streams in at the same time, from the image of rank 0.
void StepExecutor::start_xfer_cpu(uint32_t inst, int32_t m, uint32_t g, double bytes) {
  Instance& in = inst_[inst];
  const int32_t src = rank_of(m, in.stage);
  const int32_t dst = sym_ ? src : rank_of(in.plan->ops[g].peer, in.stage);
  const int32_t other = sym_ ? rank_of(in.plan->ops[g].peer, in.stage) : src;  // dst's peer
  const double send_s = xfer_cpu_s(src, sym_ ? other : dst, bytes), recv_s = xfer_cpu_s(dst, other, bytes);
  const uint64_t base = (static_cast<uint64_t>(g) << 25) | (static_cast<uint64_t>(inst) << 3) | kEvXferCpu;
  if (send_s > 0) {
    in.xfer[g] |= kSendCpu;
    ranks_[src].bd.cpu_busy_s += send_s;
    ranks_[src].bd.comm_cpu_s += send_s;
    run_cpu(src, send_s, base, false);
  }
  if (recv_s > 0) {
    in.xfer[g] |= kRecvCpu;
    ranks_[dst].bd.cpu_busy_s += recv_s;
    ranks_[dst].bd.comm_cpu_s += recv_s;
    run_cpu(dst, recv_s, base | 4, false);
  }
}

// One part of send g is over: the send completes once its flow and its sender's CPU work are done, the data
// arrives once the flow and the receiver's CPU work are.
void StepExecutor::xfer_part_done(uint32_t inst, uint32_t g, uint8_t part) {
  uint8_t& x = inst_[inst].xfer[g];
  x = part == kFlowDone ? static_cast<uint8_t>(x | kFlowDone) : static_cast<uint8_t>(x & ~part);
  if (!(x & kFlowDone)) return;
  const bool send_now = !(x & kSendCpu) && (part == kFlowDone || part == kSendCpu);
  const bool recv_now = !(x & kRecvCpu) && (part == kFlowDone || part == kRecvCpu);
  if (send_now) send_done(inst, g);
  if (recv_now) recv_arrived(inst, g);
}

void StepExecutor::try_start_comm(int32_t r) {
  Rank& rk = ranks_[r];
  if (rk.comm_busy || rk.cycle_pending || rk.next_bucket >= static_cast<int32_t>(rk.bucket_ready.size()) ||
      !rk.bucket_ready[rk.next_bucket])
    return;
  if (s_.comm_cycle_s > 0 && rk.next_bucket > rk.cycle_last) {
    // not taken by the current cycle: the next one starts a period after it, or when its work ended if later, or
    // at a later tick of the idle loop
    const des::TimeNs period = std::max<des::TimeNs>(1, des::to_ns(s_.comm_cycle_s));
    des::TimeNs t = std::max(rk.cycle_at + period, rk.cycle_free_at);
    if (sim_.now() > t) t += (sim_.now() - t + period - 1) / period * period;
    rk.cycle_pending = true;
    sim_.schedule_at(t, &cycle_, static_cast<uint64_t>(r));
    return;
  }
  launch_comm(r);
}

void StepExecutor::cycle_tick(int32_t r) {
  Rank& rk = ranks_[r];
  rk.cycle_pending = false;
  rk.cycle_at = sim_.now();
  int32_t k = rk.next_bucket;  // ready when the tick was scheduled; the cycle takes it and the ready ones after it
  while (k + 1 < static_cast<int32_t>(rk.bucket_ready.size()) && rk.bucket_ready[k + 1]) ++k;
  rk.cycle_last = k;
  if (s_.comm_negotiation_s > 0) {  // the coordinator's round: the cycle stays pending until it ends
    rk.cycle_pending = true;
    sim_.schedule_at(sim_.now() + std::max<des::TimeNs>(1, des::to_ns(s_.comm_negotiation_s)), &negotiated_,
                     static_cast<uint64_t>(r));
    return;
  }
  launch_comm(r);
}

void StepExecutor::cycle_negotiated(int32_t r) {
  ranks_[r].cycle_pending = false;
  launch_comm(r);
}

void StepExecutor::launch_comm(int32_t r) {
  Rank& rk = ranks_[r];
  rk.comm_busy = true;
  rk.comm_start = sim_.now();
  if (s_.host_staging_bytes_per_s > 0)
    return sim_.schedule_at(sim_.now() + des::to_ns(staging_s(r)), &staged_in_, static_cast<uint64_t>(r));
  start_bucket(r);
}

double StepExecutor::staging_s(int32_t r) const {
  const Rank& rk = ranks_[r];
  const auto& bucket = s_.pipeline.stage_plans[rk.stage].buckets[rk.next_bucket];
  return static_cast<double>(bucket.bytes) / s_.host_staging_bytes_per_s;
}

void StepExecutor::start_bucket(int32_t r) {
  const Rank& rk = ranks_[r];
  start_member(inst_of_[rk.stage][rk.next_bucket], rk.replica);
}

// Member m joins its all-reduce: every op without dependencies starts, in program order.
void StepExecutor::start_member(uint32_t inst, int32_t m) {
  Instance& in = inst_[inst];
  const CompiledPlan& plan = *in.plan;
  Member& mb = in.members[m];
  mb.active = true;
  mb.left = plan.op_count(m);
  if (mb.left == 0) return finish_member(inst, m);
  for (uint32_t g = plan.first_op[m]; g < plan.first_op[m + 1]; ++g)
    if (in.remaining[g] == 0 && !(in.state[g] & kReleased)) release(inst, m, g - plan.first_op[m]);
}

// Member m's op i has its dependencies: a transfer is posted (and lets the next one to its peer go),
// a local op waits for the CPU (or, taking no time, is done at once).
void StepExecutor::release(uint32_t inst, int32_t m, uint32_t i) {
  Instance& in = inst_[inst];
  const CompiledPlan& plan = *in.plan;
  const uint32_t g = plan.first_op[m] + i;
  const CompiledPlan::Op& op = plan.ops[g];
  in.state[g] |= kReleased;
  if (s_.op_log) in.started[g] = sim_.now();
  if (op.kind == CompiledPlan::Kind::kLocal) {
    const RankSetup& rs = s_.ranks[rank_of(m, in.stage)];
    if (op.bytes == 0 || rs.local_bytes_per_s <= 0) return complete(inst, m, i);
    Member& mb = in.members[m];
    mb.ready.push_back(i);
    std::push_heap(mb.ready.begin(), mb.ready.end(), std::greater<>());
    request_dispatch(inst, m);
    return;
  }
  if (op.kind == CompiledPlan::Kind::kSend) {
    const uint32_t prev = in.conn_prev[g];
    if (prev != CompiledPlan::kNone && in.conn[prev] != 0)
    {
      in.conn[g] = kHeld;  // leaves when the previous send to this peer is off the wire (on_flow_done), in order
      in.held_at[g] = sim_.now();
    }
    else
      start_send(inst, m, g);
  }
  if (op.fifo_next != CompiledPlan::kNone && --in.remaining[plan.first_op[m] + op.fifo_next] == 0)
    release(inst, m, op.fifo_next);
  if (op.kind == CompiledPlan::Kind::kRecv && (in.state[g] & (kArrived | kDone)) == kArrived) complete(inst, m, i);
}

void StepExecutor::complete(uint32_t inst, int32_t m, uint32_t i) {
  Instance& in = inst_[inst];
  const CompiledPlan& plan = *in.plan;
  const uint32_t base = plan.first_op[m];
  in.state[base + i] |= kDone;
  if (s_.op_log)
    s_.op_log->push_back({in.stage, in.bucket, m, i, des::to_seconds(in.started[base + i]), des::to_seconds(sim_.now())});
  for (const uint32_t* p = plan.succ_begin(m, i); p != plan.succ_end(m, i); ++p)
    if (--in.remaining[base + *p] == 0) release(inst, m, *p);
  if (--in.members[m].left == 0) finish_member(inst, m);
}

// The CPU takes the lowest ready local op at the end of the instant's events, so the choice does
// not depend on the order of simultaneous completions (symmetric and full execution agree).
void StepExecutor::request_dispatch(uint32_t inst, int32_t m) {
  Member& mb = inst_[inst].members[m];
  if (mb.running != kIdle || mb.dispatch_pending) return;
  mb.dispatch_pending = true;
  sim_.schedule_in(0, this, member_arg(inst, m, kEvDispatch));
}

void StepExecutor::dispatch(uint32_t inst, int32_t m) {
  Instance& in = inst_[inst];
  Member& mb = in.members[m];
  mb.dispatch_pending = false;
  if (mb.running != kIdle || mb.ready.empty()) return;
  std::pop_heap(mb.ready.begin(), mb.ready.end(), std::greater<>());
  mb.running = mb.ready.back();
  mb.ready.pop_back();
  const int32_t r = rank_of(m, in.stage);
  const RankSetup& rs = s_.ranks[r];
  const double t = static_cast<double>(in.plan->op(m, mb.running).bytes) / rs.local_bytes_per_s / rs.speed;
  ranks_[r].bd.cpu_busy_s += t;
  if (s_.op_log) in.started[in.plan->first_op[m] + mb.running] = sim_.now();
  run_cpu(r, t, member_arg(inst, m, kEvLocal), false);
}

// Every op is done: the closing average (if any) on the CPU, then the member's all-reduce is over.
void StepExecutor::finish_member(uint32_t inst, int32_t m) {
  Instance& in = inst_[inst];
  Member& mb = in.members[m];
  const int32_t r = rank_of(m, in.stage);
  const RankSetup& rs = s_.ranks[r];
  if (in.plan->finish_bytes > 0 && rs.local_bytes_per_s > 0) {
    const double t = static_cast<double>(in.plan->finish_bytes) / rs.local_bytes_per_s / rs.speed;
    ranks_[r].bd.cpu_busy_s += t;
    mb.running = kFinish;
    run_cpu(r, t, member_arg(inst, m, kEvLocal), false);
    return;
  }
  mb.active = false;
  member_done(r);
}

void StepExecutor::member_done(int32_t r) {
  if (s_.host_staging_bytes_per_s > 0)
    return sim_.schedule_at(sim_.now() + des::to_ns(staging_s(r)), &staged_out_, static_cast<uint64_t>(r));
  bucket_done(r);
}

void StepExecutor::bucket_done(int32_t r) {
  Rank& rk = ranks_[r];
  span(r, 1, fmt::format("allreduce bucket {}", rk.next_bucket), "allreduce", rk.comm_start, sim_.now());
  rk.comm_busy = false;
  rk.cycle_free_at = sim_.now();
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
// ranks start every op at the same instant, every NIC carries the same multiset of flows, and the
// max-min rates equal those of rank 0's flows on its uplink alone: the flows rank 0 receives are the
// images of those it sends. tests/simulator/symmetric_test.cpp checks equal times against the full model.
bool StepExecutor::symmetric_possible() const {
  if (!s_.symmetric || s_.pp != 1 || s_.dp < 2 || !topo_.uniform_star()) return false;
  if (!s_.node_cpu.empty()) {  // ranks sharing a node's CPU are not independent images of rank 0
    std::vector<uint8_t> seen(s_.node_cpu.size(), 0);
    for (int32_t n : s_.node_of_rank)
      if (seen.at(static_cast<size_t>(n))++) return false;
  }
  for (const auto& stage : s_.bucket_plans)
    for (const CompiledPlan* p : stage)
      if (!p->rotation_symmetric) return false;
  const RankSetup& a = s_.ranks[0];
  for (const RankSetup& b : s_.ranks) {
    if (b.speed != a.speed || b.local_bytes_per_s != a.local_bytes_per_s || b.forward_s != a.forward_s ||
        b.backward_s != a.backward_s || b.bucket_backward_s != a.bucket_backward_s || b.optimizer_s != a.optimizer_s ||
        b.bucket_compress_s != a.bucket_compress_s || b.decompress_s != a.decompress_s || b.unscale_s != a.unscale_s ||
        b.net_cpu_s_per_byte != a.net_cpu_s_per_byte || b.copy_cpu_s_per_byte != a.copy_cpu_s_per_byte ||
        b.net_cpu_s_per_wakeup != a.net_cpu_s_per_wakeup || b.net_pace_bytes_per_s != a.net_pace_bytes_per_s ||
        b.copy_cpu_s_per_message != a.copy_cpu_s_per_message)
      return false;
  }
  if (xfer_cpu_ && !s_.host_of_rank.empty()) {  // shared-memory transfers between some ranks only
    std::vector<int32_t> hosts = s_.host_of_rank;
    std::sort(hosts.begin(), hosts.end());
    if (std::adjacent_find(hosts.begin(), hosts.end()) != hosts.end()) return false;
  }
  return true;
}

}  // namespace

double transfer_cpu_s(const std::vector<RankSetup>& ranks, const std::vector<int32_t>& host_of_rank, int32_t r,
                      int32_t peer, double bytes) {
  const RankSetup& rs = ranks[static_cast<size_t>(r)];
  const bool local = !host_of_rank.empty() && host_of_rank[static_cast<size_t>(r)] == host_of_rank[static_cast<size_t>(peer)];
  const TransferCpuCost cost{rs.net_cpu_s_per_byte, rs.net_cpu_s_per_wakeup, rs.copy_cpu_s_per_byte,
                             rs.copy_cpu_s_per_message};
  const double peer_pace = ranks[static_cast<size_t>(peer)].net_pace_bytes_per_s;  // 0: the peer sets no pace
  const double pace = peer_pace > 0 ? std::min(rs.net_pace_bytes_per_s, peer_pace) : rs.net_pace_bytes_per_s;
  return cost.seconds(bytes, local, pace) / rs.speed;
}

StepResult simulate_step(const StepSetup& setup, network::Topology& topology, des::Simulator& sim) {
  StepExecutor ex(setup, topology, sim);
  return ex.run();
}

}  // namespace tandem::simulator
