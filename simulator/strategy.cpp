#include "simulator/strategy.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <memory>
#include <limits>
#include <numeric>

#include "engine/core/error.hpp"
#include "engine/core/rng.hpp"
#include "engine/parallel/averaging.hpp"
#include "engine/parallel/fedavg.hpp"
#include "simulator/compute/step_noise.hpp"

namespace tandem::simulator {

using engine::parallel::Exchange;

namespace {

// Flow tags: kind in the low 2 bits, the worker in the next 22, an index (piece, shard, round) above. Kind 3 is
// fedavg's upload in the round executor and a server-to-server replica (or its acknowledgement) in the asynchronous
// one, whose "worker" bits then hold the backup's index among the piece's backups times 2, plus 1 for the ack.
constexpr uint64_t kPush = 0, kPull = 1, kGossip = 2, kUpload = 3, kReplica = 3;
// salts the seed of the fan-out draws (fanout_weight) apart from the compute's
constexpr uint64_t kFanoutSeed = 0x66616e6f7574ull;
uint64_t flow_tag(uint64_t kind, int32_t worker, uint64_t index) {
  return (index << 24) | (static_cast<uint64_t>(worker) << 2) | kind;
}
// Event args: kind in the low 2 bits, the rank above (fedavg: the round too, see RoundExecutor).
constexpr uint64_t kEvWorker = 0, kEvServer = 1, kEvDeadline = 2;

// Compute on a rank: timed at its speed, split into full-speed compute and the throttled excess.
void account_compute(RankBreakdown& bd, double full_s, double actual_s, double speed) {
  if (speed == 1.0) {
    bd.compute_s += actual_s;
  } else {
    bd.compute_s += full_s;
    bd.throttled_s += actual_s - full_s;
  }
  bd.cpu_busy_s += actual_s;
}

// A step's compute before its last backward (forward of every micro-batch, backward of all but the last), the
// last backward and the local optimizer step.
double pre_backward_s(const RankSetup& r) {
  const double f = std::accumulate(r.forward_s.begin(), r.forward_s.end(), 0.0);
  const double b = std::accumulate(r.backward_s.begin(), r.backward_s.end(), 0.0);
  return f + b - (r.backward_s.empty() ? 0.0 : r.backward_s.back());
}
double step_compute_s(const RankSetup& r) {
  const double f = std::accumulate(r.forward_s.begin(), r.forward_s.end(), 0.0);
  const double b = std::accumulate(r.backward_s.begin(), r.backward_s.end(), 0.0);
  return f + b + r.optimizer_s;
}

// CPU seconds rank r spends moving `bytes` of a message to or from `peer`, at its speed: the step executor's cost
// (transfer_cpu_s in simulator/step.hpp: per byte, plus TCP's wake-ups at the link's pace, simulator/comm_cpu.hpp).
double message_cpu_s(const StrategySetup& s, int32_t r, int32_t peer, double bytes) {
  return transfer_cpu_s(s.ranks, s.host_of_rank, r, peer, bytes);
}

// Event kind of a message's CPU work (the others: kEvWorker, kEvServer, kEvDeadline); the transfer above.
constexpr uint64_t kEvXfer = 3;
// Flow tags of messages whose CPU work is modelled: the transfer's index, this bit set.
constexpr uint64_t kXferFlow = uint64_t{1} << 63;

// What both executors share: the setup, the network, the nodes' CPUs, and the bytes each rank's flows carried.
class FlowExecutor : public des::EventHandler, public network::FlowObserver {
 public:
  FlowExecutor(const StrategySetup& s, network::Topology& topo, des::Simulator& sim)
      : s_(s), topo_(topo), net_(topo.network()), sim_(sim) {}

  void on_flow_done(uint64_t tag) final {
    if ((tag & kXferFlow) == 0) {
      wire_done(tag);
      delivered(tag);
      return;
    }
    const uint64_t id = tag & ~kXferFlow;
    wire_done(xfers_[static_cast<size_t>(id)].tag);  // may start flows (and grow xfers_)
    xfer_part_done(id);
  }
  void on_event(uint64_t arg) final {
    if ((arg & 3) == kEvXfer) return xfer_part_done(arg >> 2);
    event(arg);
  }

 protected:
  // The ranks' CPUs: a node's CPU model where step.cpp would model it (its ranks' threads can exceed its cores,
  // or a quota holds; a rank whose messages cost CPU runs two threads, its training and its transfers).
  void setup_cpus(int32_t world) {
    for (int32_t r = 0; r < world; ++r) {
      const RankSetup& rs = s_.ranks[static_cast<size_t>(r)];
      TANDEM_REQUIRE(rs.net_cpu_s_per_byte >= 0 && rs.copy_cpu_s_per_byte >= 0,
                     "strategy setup: transfer CPU costs must be >= 0 (net {}, copy {} s per byte)",
                     rs.net_cpu_s_per_byte, rs.copy_cpu_s_per_byte);
      xfer_cpu_ = xfer_cpu_ || transfers_cost_cpu(rs);
    }
    TANDEM_REQUIRE(s_.host_of_rank.empty() || s_.host_of_rank.size() >= static_cast<size_t>(world),
                   "strategy setup: host_of_rank has {} ranks, expected {}", s_.host_of_rank.size(), world);
    if (s_.node_cpu.empty()) return;
    TANDEM_REQUIRE(s_.node_of_rank.size() >= static_cast<size_t>(world),
                   "strategy setup: node_of_rank has {} ranks, expected {}", s_.node_of_rank.size(), world);
    std::vector<int32_t> per_node(s_.node_cpu.size(), 0);
    for (int32_t r = 0; r < world; ++r) {
      const int32_t n = s_.node_of_rank[static_cast<size_t>(r)];
      TANDEM_REQUIRE(n >= 0 && static_cast<size_t>(n) < s_.node_cpu.size(), "strategy setup: rank {} on node {} of {}",
                     r, n, s_.node_cpu.size());
      ++per_node[static_cast<size_t>(n)];
    }
    std::vector<NodeCpu*> node(s_.node_cpu.size(), nullptr);
    cpus_.assign(static_cast<size_t>(world), nullptr);
    for (int32_t r = 0; r < world; ++r) {
      const auto n = static_cast<size_t>(s_.node_of_rank[static_cast<size_t>(r)]);
      if (!s_.node_cpu[n].needs_model(per_node[n] * (xfer_cpu_ ? 2 : 1))) continue;
      if (!node[n]) {
        owned_cpus_.push_back(std::make_unique<NodeCpu>(sim_, s_.node_cpu[n]));
        node[n] = owned_cpus_.back().get();
      }
      cpus_[static_cast<size_t>(r)] = node[n];
    }
  }
  // Stops rank r's CPU work started with `arg` (its node's share goes to the rest); without a CPU model its event
  // still comes and the caller ignores it.
  void cancel_cpu(int32_t r, uint64_t arg) {
    if (!cpus_.empty() && cpus_[static_cast<size_t>(r)]) cpus_[static_cast<size_t>(r)]->cancel(this, arg);
  }
  // `seconds` of rank r's CPU (at its speed already); event(arg) when done.
  // `contended`: compute, which the co-run table slows (a transfer's CPU and an average are not)
  void run_cpu(int32_t r, double seconds, uint64_t arg, bool contended = true) {
    if (!cpus_.empty() && cpus_[static_cast<size_t>(r)])
      return cpus_[static_cast<size_t>(r)]->start(seconds, this, arg, contended);
    sim_.schedule_in(des::ceil_ns(seconds), this, arg);
  }
  // A message: its flow, and where moving it costs CPU, the sender's and the receiver's CPU work beside it.
  // `wire_factor`: the flow's bytes on the network are that many times the message's (a swap's loser,
  // Topology::two_way_bytes_factor); what the NICs count and the CPU work stay the message's. `share_weight`: the
  // flow's share weight on its links (Network::start_flow; a fan-out draw, Topology::fanout_cv).
  void flow(int32_t from, int32_t to, double bytes, uint64_t tag, double wire_factor = 1.0, double share_weight = 1.0) {
    out_[static_cast<size_t>(from)] += bytes;
    in_[static_cast<size_t>(to)] += bytes;
    const double send_s = xfer_cpu_ ? message_cpu_s(s_, from, to, bytes) : 0.0;
    const double recv_s = xfer_cpu_ ? message_cpu_s(s_, to, from, bytes) : 0.0;
    if (send_s <= 0 && recv_s <= 0) {
      net_.start_flow(topo_.route(from, to), bytes * wire_factor, this, tag, -1, share_weight);
      return;
    }
    const uint64_t id = xfers_.size();
    xfers_.push_back({tag, static_cast<int32_t>(1 + (send_s > 0) + (recv_s > 0))});
    for (const auto& [rank, cpu] : {std::pair{from, send_s}, std::pair{to, recv_s}}) {
      if (cpu <= 0) continue;
      RankBreakdown& bd = breakdown(rank);
      bd.cpu_busy_s += cpu;
      bd.comm_cpu_s += cpu;
      run_cpu(rank, cpu, (id << 2) | kEvXfer, false);
    }
    net_.start_flow(topo_.route(from, to), bytes * wire_factor, this, kXferFlow | id, -1, share_weight);
  }
  // The bytes per step (round) of a window of k.
  void report_bytes(StepResult& r, double k) const {
    for (size_t i = 0; i < in_.size(); ++i) {
      r.nic_in_bytes.push_back(in_[i] / k);
      r.nic_out_bytes.push_back(out_[i] / k);
    }
    r.events = sim_.events_processed();
    r.flows = net_.flows_started();
  }

  // The executor's own events (kinds kEvWorker, kEvServer, kEvDeadline).
  virtual void event(uint64_t arg) = 0;
  // A message's flow has left the wire (its sender's NIC is free of it).
  virtual void wire_done(uint64_t /*tag*/) {}
  // A message is in its receiver's hands: its flow and both sides' CPU work are done.
  virtual void delivered(uint64_t tag) = 0;
  virtual RankBreakdown& breakdown(int32_t rank) = 0;

  const StrategySetup& s_;
  network::Topology& topo_;
  network::Network& net_;
  des::Simulator& sim_;
  std::vector<double> in_, out_;

 private:
  struct Transfer {
    uint64_t tag;
    int32_t left;  // parts not done: the flow, the sender's CPU work, the receiver's
  };
  void xfer_part_done(uint64_t id) {
    Transfer& x = xfers_[static_cast<size_t>(id)];
    if (--x.left == 0) delivered(x.tag);
  }

  bool xfer_cpu_ = false;  // some rank's messages cost CPU
  std::vector<std::unique_ptr<NodeCpu>> owned_cpus_;
  std::vector<NodeCpu*> cpus_;  // per rank: its node's CPU model, or null
  std::vector<Transfer> xfers_;
};

class AsyncExecutor final : public FlowExecutor {
 public:
  using FlowExecutor::FlowExecutor;
  StepResult run();

 private:
  void event(uint64_t arg) override;
  void wire_done(uint64_t tag) override;
  void delivered(uint64_t tag) override;
  RankBreakdown& breakdown(int32_t rank) override {
    return rank < W_ ? workers_[static_cast<size_t>(rank)].bd : servers_[static_cast<size_t>(rank - W_)].bd;
  }

  enum class Phase : uint8_t { kCompute, kWaitComm, kDone };
  // What a worker is computing: the step before its last backward, a bucket of the last backward, the local
  // optimizer step.
  // kJoinCheck: worker 0's read of the job's store for joiners before the step (SyncProgram::join_check_every).
  enum class Work : uint8_t { kPre, kBucket, kOptimizer, kJoinCheck };
  struct Worker {
    int32_t clock = 0;  // steps completed
    Phase phase = Phase::kCompute;
    Work work = Work::kPre;
    int32_t bucket = 0;
    int32_t pending = 0;  // flows the step still waits for (pulls, the elastic exchange)
    // gossip: this step's partner (-1: sits the step out), whether its own send is done, and the steps whose
    // partner's state has arrived (a partner ahead may send before this worker reaches the step)
    int32_t partner = -1;
    bool sent = true;
    std::vector<char> received;
    des::TimeNs wait_since = 0, compute_start = 0, finish = 0;
    // ssp: when the last of this step's replies that the bound withheld was released (its wait up to then is a
    // staleness wait, the rest exposed communication)
    des::TimeNs held_until = 0;
    FanoutDraw fan;  // its answers' share weight (fan_out), kept from clock to clock
    double compute_full_s = 0;
    double noise = 1;  // this step's compute factor (compute_factor)
    RankBreakdown bd;
  };
  struct Update {
    int64_t index;      // piece (push-pull) or shard (elastic)
    int32_t worker;     // whose push (or elastic exchange) it is
    int32_t clock = 0;  // ps, ssp: the push's clock (the worker's step, from 1)
  };
  // ps, ssp: a push whose reply waits until the piece has applied clock - staleness
  struct Withheld {
    int32_t worker;
    int64_t piece;
    int32_t clock;
    bool held = false;  // not answered by the server's handling of the push itself
  };
  struct Reply {
    int32_t worker;
    double bytes;
    uint64_t tag;
    int32_t clock = 0;  // the clock of the push it answers (the fan-out draw's key)
  };
  struct Server {
    std::deque<Update> queue;
    bool busy = false;
    des::TimeNs start = 0;
    std::vector<Withheld> withheld;  // ps, ssp: in the order the pushes were handled
    // its NIC's send queue: each update's replies, in the order the updates ran; the head's are on the wire
    std::deque<std::vector<Reply>> nic_queue;
    int32_t on_wire = 0;  // replies of the head still on the wire
    bool fanned = false;  // its answers are posted at once (fan_out), not queued
    RankBreakdown bd;
  };

  bool push_pull() const { return s_.sync.exchange == Exchange::kPushPull; }
  // ps and ssp apply a piece once per clock, when every worker's push of the clock is in (the runtime's
  // apply_complete); ps-async (staleness -1) applies each push on its own
  bool per_clock() const { return push_pull() && s_.sync.staleness >= 0; }
  int32_t server_rank(int32_t server) const { return W_ + server; }
  void begin_step(int32_t w);
  void compute(int32_t w, Work work, double full_s);
  void after_backward(int32_t w);
  void wait_comm(int32_t w);
  bool comm_done(const Worker& wk) const;
  void end_step(int32_t w);
  void enqueue(int32_t server, Update u);
  void run_server(int32_t server);
  void send_replies(int32_t server, std::vector<Reply> replies);
  void start_replies(int32_t server);
  bool fan_out(int32_t server, const std::vector<Reply>& replies);
  void release(int32_t server);
  void replicate(int32_t server, int64_t piece, int32_t clock);
  void replica_delivered(int64_t piece, int32_t link, bool ack);
  // the newest clock of `piece` every backup has acknowledged (INT32_MAX without replicas)
  int32_t replicated(int64_t piece) const;
  int32_t server_of(int64_t index) const {
    return push_pull() ? s_.sync.pieces[static_cast<size_t>(index)].server : s_.sync.shards[static_cast<size_t>(index)].server;
  }
  double update_s(int32_t server, const Update& u) const;

  int32_t W_ = 1, K_ = 1;
  double total_elems_ = 1;
  std::vector<Worker> workers_;
  std::vector<Server> servers_;
  // per clock: [piece] the last clock applied, [piece][clock] the pushes of the clock handled
  std::vector<int32_t> applied_;
  std::vector<std::vector<int32_t>> got_;
  // replication: [piece][backup] the clocks (ps-async: updates) of the replicas on their way or not yet
  // acknowledged, in the order sent, and the newest acknowledged
  std::vector<std::vector<std::deque<int32_t>>> unacked_;
  std::vector<std::vector<int32_t>> acked_;
};

StepResult AsyncExecutor::run() {
  const auto& sync = s_.sync;
  W_ = sync.workers;
  K_ = window_steps(s_);
  const int32_t world = W_ + sync.servers;
  TANDEM_REQUIRE(static_cast<int32_t>(s_.ranks.size()) == world, "strategy setup: {} ranks for {} workers + {} servers",
                 s_.ranks.size(), W_, sync.servers);
  TANDEM_REQUIRE(topo_.endpoints() >= world, "the cluster has {} devices but the job needs {} ranks", topo_.endpoints(),
                 world);
  total_elems_ = 0;
  for (const auto& r : sync.shards) total_elems_ += static_cast<double>(r.size());
  total_elems_ = std::max(total_elems_, 1.0);
  workers_.resize(W_);
  for (Worker& wk : workers_) wk.received.assign(static_cast<size_t>(K_), 0);
  servers_.resize(sync.servers);
  applied_.assign(sync.pieces.size(), 0);
  got_.assign(sync.pieces.size(), std::vector<int32_t>(static_cast<size_t>(K_) + 1, 0));
  unacked_.assign(sync.pieces.size(), {});
  acked_.assign(sync.pieces.size(), {});
  if (push_pull() && sync.replicas > 0) {
    TANDEM_REQUIRE(sync.replica_bytes_per_param > 0, "strategy setup: {} replica(s) per shard but no replica size",
                   sync.replicas);
    for (size_t k = 0; k < sync.pieces.size(); ++k) {
      const size_t n = engine::parallel::replica_servers(sync.pieces[k].server, sync.servers, sync.replicas).size();
      unacked_[k].resize(n);
      acked_[k].assign(n, 0);
    }
  }
  in_.assign(world, 0.0);
  out_.assign(world, 0.0);
  setup_cpus(world);
  for (int32_t w = 0; w < W_; ++w) begin_step(w);
  sim_.run();
  StepResult res;
  res.window_steps = K_;
  double step = 0;
  for (int32_t w = 0; w < W_; ++w) {
    TANDEM_CHECK(workers_[w].phase == Phase::kDone, Status::kInternal,
                 "simulated {} deadlocked: worker {} stopped at step {}", engine::parallel::exchange_name(sync.exchange),
                 w, workers_[w].clock);
    step = std::max(step, des::to_seconds(workers_[w].finish));
  }
  const double k = K_;
  res.step_s = step / k;
  auto per_step = [&](RankBreakdown b, double finish) {
    b.compute_s /= k, b.throttled_s /= k, b.comm_exposed_s /= k, b.staleness_wait_s /= k, b.cpu_busy_s /= k;
    b.comm_cpu_s /= k;
    b.finish_s = finish / k;
    b.idle_s = std::max(0.0, res.step_s - b.compute_s - b.throttled_s - b.comm_exposed_s - b.staleness_wait_s);
    return b;
  };
  for (int32_t w = 0; w < W_; ++w) res.ranks.push_back(per_step(workers_[w].bd, des::to_seconds(workers_[w].finish)));
  for (Server& sv : servers_) res.ranks.push_back(per_step(sv.bd, step));
  report_bytes(res, k);
  return res;
}

void AsyncExecutor::begin_step(int32_t w) {
  Worker& wk = workers_[w];
  if (wk.clock == K_) {
    wk.phase = Phase::kDone;
    wk.finish = sim_.now();
    return;
  }
  // no gate here: as in the runtime, a worker starts its next step once it has its pulls, and ssp's bound holds
  // it by withholding them (release)
  wk.held_until = 0;
  const RankSetup& rs = s_.ranks[w];
  wk.noise = compute_factor(s_.compute_cv, s_.seed, w, wk.clock);
  if (s_.sync.exchange == Exchange::kGossip) {
    // the runtime's Gossip::before_step: the step's partner from the seeded matching, and this worker's state
    // snapshot sent to it at once, beside the step's compute (the communicator's progress thread moves it)
    wk.partner = engine::parallel::gossip_partner(w, W_, s_.seed, wk.clock);
    wk.sent = wk.partner < 0;
    if (wk.partner >= 0) {
      // the partner's snapshot of this step still on its way: a simultaneous swap, whose TCP cost the cluster's
      // measured two-way factor gives (this flow, the second, is the one that loses; 1 where none is measured)
      const Worker& p = workers_[static_cast<size_t>(wk.partner)];
      const bool swap = p.clock == wk.clock && !p.sent && p.partner == w;
      flow(w, wk.partner, s_.param_bytes, flow_tag(kGossip, w, static_cast<uint64_t>(wk.clock)),
           swap ? topo_.two_way_bytes_factor(w, wk.partner) : 1.0);
    }
  }
  // the runtime's joiner check (ParallelTrainer::maybe_admit): worker 0 reads the store before its step
  if (w == 0 && s_.sync.join_check_every > 0 && s_.join_check_s > 0 && wk.clock % s_.sync.join_check_every == 0) {
    compute(w, Work::kJoinCheck, s_.join_check_s);
    return;
  }
  // push-pull splits the last backward by bucket (each bucket's pieces go as it completes); the others compute
  // the whole step before their exchange
  compute(w, Work::kPre, push_pull() ? pre_backward_s(rs) : step_compute_s(rs) - rs.optimizer_s);
}

void AsyncExecutor::compute(int32_t w, Work work, double full_s) {
  Worker& wk = workers_[w];
  wk.phase = Phase::kCompute;
  wk.work = work;
  if (work != Work::kOptimizer && work != Work::kJoinCheck) full_s *= wk.noise;  // forward and backward vary
  wk.compute_full_s = full_s;
  wk.compute_start = sim_.now();
  run_cpu(w, full_s / s_.ranks[w].speed, (static_cast<uint64_t>(w) << 2) | kEvWorker);
}

void AsyncExecutor::event(uint64_t arg) {
  const int32_t i = static_cast<int32_t>(arg >> 2);
  if ((arg & 3) == kEvServer) {
    Server& sv = servers_[i];
    const Update u = sv.queue.front();
    sv.queue.pop_front();
    const double actual = des::to_seconds(sim_.now() - sv.start);
    account_compute(sv.bd, update_s(i, u), actual, s_.ranks[server_rank(i)].speed);
    sv.busy = false;
    if (push_pull()) replicate(i, u.index, u.clock);
    if (per_clock()) {  // the clock is applied: its last push joins the withheld, and what may go goes
      applied_[static_cast<size_t>(u.index)] = u.clock;
      sv.withheld.push_back({u.worker, u.index, u.clock});
      release(i);
      run_server(i);
      return;
    }
    std::vector<Reply> replies;
    if (push_pull()) {  // ps-async: the push's own worker pulls the piece back
      const auto& piece = s_.sync.pieces[static_cast<size_t>(u.index)];
      const double bytes = 4.0 * static_cast<double>(piece.end - piece.begin);
      replies.push_back({u.worker, bytes, flow_tag(kPull, u.worker, static_cast<uint64_t>(u.index)), u.clock});
    } else {  // elastic: the centre's shard back to its worker
      const double bytes = 4.0 * static_cast<double>(s_.sync.shards[static_cast<size_t>(u.index)].size());
      replies.push_back({u.worker, bytes, flow_tag(kPull, u.worker, static_cast<uint64_t>(u.index)), u.clock});
    }
    send_replies(i, std::move(replies));
    run_server(i);
    return;
  }
  Worker& wk = workers_[i];
  const RankSetup& rs = s_.ranks[i];
  if (wk.work == Work::kJoinCheck) {  // the store's answer: a wait on communication, CPU on the node
    const double actual = des::to_seconds(sim_.now() - wk.compute_start);
    wk.bd.comm_exposed_s += actual;
    wk.bd.cpu_busy_s += actual;
    wk.bd.comm_cpu_s += actual;
    compute(i, Work::kPre, pre_backward_s(rs));
    return;
  }
  account_compute(wk.bd, wk.compute_full_s, des::to_seconds(sim_.now() - wk.compute_start), rs.speed);
  switch (wk.work) {
    case Work::kPre:
      if (push_pull() && !rs.bucket_backward_s.empty()) {
        wk.bucket = 0;
        compute(i, Work::kBucket, rs.bucket_backward_s[0]);
      } else if (push_pull()) {
        after_backward(i);
      } else {
        compute(i, Work::kOptimizer, rs.optimizer_s);
      }
      return;
    case Work::kBucket: {
      for (size_t p = 0; p < s_.sync.pieces.size(); ++p) {
        const auto& piece = s_.sync.pieces[p];
        if (piece.bucket != wk.bucket) continue;
        ++wk.pending;  // its pull
        flow(i, server_rank(piece.server), 4.0 * static_cast<double>(piece.end - piece.begin),
             flow_tag(kPush, i, p));
      }
      if (++wk.bucket < static_cast<int32_t>(rs.bucket_backward_s.size())) {
        compute(i, Work::kBucket, rs.bucket_backward_s[static_cast<size_t>(wk.bucket)]);
      } else {
        after_backward(i);
      }
      return;
    }
    case Work::kOptimizer: after_backward(i); return;
    case Work::kJoinCheck: return;  // handled above
  }
}

// The step's compute is done: start its exchange, if any, and wait for it.
void AsyncExecutor::after_backward(int32_t w) {
  Worker& wk = workers_[w];
  const auto& sync = s_.sync;
  if (sync.exchange == Exchange::kElastic && (wk.clock + 1) % sync.period == 0) {
    for (size_t sh = 0; sh < sync.shards.size(); ++sh) {
      ++wk.pending;
      flow(w, server_rank(sync.shards[sh].server), 4.0 * static_cast<double>(sync.shards[sh].size()),
           flow_tag(kPush, w, sh));
    }
  }
  wait_comm(w);
}

bool AsyncExecutor::comm_done(const Worker& wk) const {
  if (wk.pending > 0) return false;
  return wk.partner < 0 || (wk.sent && wk.received[static_cast<size_t>(wk.clock)] != 0);
}

void AsyncExecutor::wait_comm(int32_t w) {
  Worker& wk = workers_[w];
  if (comm_done(wk)) {
    end_step(w);
    return;
  }
  wk.phase = Phase::kWaitComm;
  wk.wait_since = sim_.now();
}

void AsyncExecutor::end_step(int32_t w) {
  Worker& wk = workers_[w];
  ++wk.clock;
  wk.phase = Phase::kCompute;
  begin_step(w);
}

// The server's NIC sends one batch of replies at a time, in the order the server produced them (a FIFO queue): the
// replies of one batch (ps-async: an update's; ps: every worker's pull of an applied clock; ssp: those one handled
// push or applied clock released) leave together and share the link.
void AsyncExecutor::send_replies(int32_t server, std::vector<Reply> replies) {
  Server& sv = servers_[static_cast<size_t>(server)];
  if (sv.nic_queue.empty() && fan_out(server, replies)) {
    sv.fanned = true;
    return;
  }
  sv.nic_queue.push_back(std::move(replies));
  if (sv.nic_queue.size() == 1) start_replies(server);
}

void AsyncExecutor::start_replies(int32_t server) {
  Server& sv = servers_[static_cast<size_t>(server)];
  while (!sv.nic_queue.empty() && sv.nic_queue.front().empty()) sv.nic_queue.pop_front();
  if (sv.nic_queue.empty()) return;
  const std::vector<Reply> head = sv.nic_queue.front();  // flows may finish, and the queue move, while starting
  sv.on_wire = static_cast<int32_t>(head.size());
  for (const Reply& r : head) flow(server_rank(server), r.worker, r.bytes, r.tag);
}

// A server host with a measured fan-out spread (Topology::fanout_cv > 0): its answers are not queued one batch after
// another but posted at once (the NIC's own FIFO, nic_queue_bytes, still queues windows posted behind others'), each
// sharing the uplink with its worker's weight at that clock (fanout_weight: mean 1, the measured CV, persisting from
// clock to clock with the measured correlation; every piece of one clock alike) -- TCP connections through one FIFO
// get shares in proportion to their windows, which differ and carry over -- so that one worker's answer may overtake
// another's and the workers' clocks wander apart, as measured (bench/strategies/README.md, session 15). Returns false,
// posting nothing, when no answer's host has a spread.
bool AsyncExecutor::fan_out(int32_t server, const std::vector<Reply>& replies) {
  bool any = false;
  for (const Reply& r : replies) {
    const double cv = topo_.fanout_cv(server_rank(server), r.worker);
    if (cv <= 0) continue;
    any = true;
    Worker& wk = workers_[static_cast<size_t>(r.worker)];
    wk.fan = fanout_weight(cv, topo_.fanout_corr(server_rank(server), r.worker), s_.seed, r.worker, r.clock, wk.fan);
    flow(server_rank(server), r.worker, r.bytes, r.tag, 1.0, wk.fan.weight);
  }
  if (!any) return false;
  for (const Reply& r : replies)
    if (topo_.fanout_cv(server_rank(server), r.worker) <= 0) flow(server_rank(server), r.worker, r.bytes, r.tag);
  return true;
}

void AsyncExecutor::wire_done(uint64_t tag) {
  if ((tag & 3) != kPull) return;
  const int32_t server = server_of(static_cast<int64_t>(tag >> 24));
  Server& sv = servers_[static_cast<size_t>(server)];
  if (sv.fanned) return;  // posted at once (fan_out): no queue
  if (--sv.on_wire > 0) return;
  sv.nic_queue.pop_front();
  start_replies(server);
}

void AsyncExecutor::delivered(uint64_t tag) {
  const uint64_t kind = tag & 3;
  const int32_t w = static_cast<int32_t>((tag >> 2) & 0x3fffffu);
  const int64_t index = static_cast<int64_t>(tag >> 24);
  if (kind == kGossip) {  // worker w's snapshot of step `index` has reached its partner
    Worker& from = workers_[w];
    const int32_t to = engine::parallel::gossip_partner(w, W_, s_.seed, index);
    workers_[to].received[static_cast<size_t>(index)] = 1;
    if (from.clock == index) from.sent = true;
    for (const int32_t x : {w, to}) {
      Worker& wx = workers_[x];
      if (wx.phase == Phase::kWaitComm && wx.clock == index && comm_done(wx)) {
        wx.bd.comm_exposed_s += des::to_seconds(sim_.now() - wx.wait_since);
        end_step(x);
      }
    }
    return;
  }
  if (kind == kReplica) {
    replica_delivered(index, w >> 1, (w & 1) != 0);
    return;
  }
  if (kind == kPush) {
    // the push of the worker's step in progress (it waits for the pull before its next step)
    enqueue(server_of(index), {index, w, workers_[w].clock + 1});
    return;
  }
  Worker& wk = workers_[w];  // a pull (or the elastic reply) of this worker's step
  if (--wk.pending == 0 && wk.phase == Phase::kWaitComm && comm_done(wk)) {
    const double waited = des::to_seconds(sim_.now() - wk.wait_since);
    const double held =
        s_.sync.staleness > 0 ? std::clamp(des::to_seconds(wk.held_until - wk.wait_since), 0.0, waited) : 0.0;
    wk.bd.staleness_wait_s += held;
    wk.bd.comm_exposed_s += waited - held;
    end_step(w);
  }
}

void AsyncExecutor::enqueue(int32_t server, Update u) {
  servers_[server].queue.push_back(u);
  run_server(server);
}

double AsyncExecutor::update_s(int32_t server, const Update& u) const {
  const auto& sync = s_.sync;
  const double elems = push_pull() ? static_cast<double>(sync.pieces[static_cast<size_t>(u.index)].end -
                                                         sync.pieces[static_cast<size_t>(u.index)].begin)
                                   : static_cast<double>(sync.shards[static_cast<size_t>(u.index)].size());
  return s_.ranks[server_rank(server)].optimizer_s * elems / total_elems_;
}

// The server handles its pushes one at a time in arrival order. ps-async: each is an update. ps, ssp (the
// runtime's on_push and apply_complete): a push is stored, and the last of its clock's W pushes applies the clock
// (one optimizer step of the piece, as ps's; the sum of the W gradients before it, a pass at memory bandwidth, is
// not charged, for ps as for ssp); the other pushes take no server time and may be answered at once (release).
void AsyncExecutor::run_server(int32_t server) {
  Server& sv = servers_[server];
  while (!sv.busy && !sv.queue.empty()) {
    const Update& u = sv.queue.front();
    if (per_clock() && ++got_[static_cast<size_t>(u.index)][static_cast<size_t>(u.clock)] < W_) {
      sv.withheld.push_back({u.worker, u.index, u.clock});
      sv.queue.pop_front();
      release(server);
      continue;
    }
    sv.busy = true;
    sv.start = sim_.now();
    const double t = update_s(server, u) / s_.ranks[server_rank(server)].speed;
    run_cpu(server_rank(server), t, (static_cast<uint64_t>(server) << 2) | kEvServer);
  }
}

// ps, ssp (the runtime's release_withheld): every withheld push whose piece has applied its clock - staleness is
// answered with the piece's values now. Those released together leave together (one entry of the NIC's FIFO,
// sharing the link: ps's W pulls of an applied clock; ssp's pushes held by the bound, released by the slowest
// worker's push of clock - staleness, with that push's own reply).
void AsyncExecutor::release(int32_t server) {
  Server& sv = servers_[static_cast<size_t>(server)];
  std::vector<Withheld> go;
  std::vector<Withheld> keep;
  for (Withheld& x : sv.withheld) {
    if (applied_[static_cast<size_t>(x.piece)] >= x.clock - s_.sync.staleness &&
        replicated(x.piece) >= x.clock - s_.sync.staleness) {
      go.push_back(x);
    } else {
      x.held = true;  // waits past the handling of its push
      keep.push_back(x);
    }
  }
  sv.withheld = std::move(keep);
  if (go.empty()) return;
  std::sort(go.begin(), go.end(), [](const Withheld& a, const Withheld& b) {
    return a.worker != b.worker ? a.worker < b.worker : a.piece < b.piece;
  });
  std::vector<Reply> replies;
  for (const Withheld& x : go) {
    const auto& piece = s_.sync.pieces[static_cast<size_t>(x.piece)];
    replies.push_back({x.worker, 4.0 * static_cast<double>(piece.end - piece.begin),
                       flow_tag(kPull, x.worker, static_cast<uint64_t>(x.piece)), x.clock});
    if (x.held) workers_[static_cast<size_t>(x.worker)].held_until = sim_.now();
  }
  send_replies(server, std::move(replies));
}

// Replication (SyncProgram::replica_bytes_per_param; the runtime's replicate and poll_replication): each update of a
// piece goes from its server to each of its backups (a header and the piece's values and optimizer state), and
// each backup acknowledges it with a header. The flows share the servers' links with the pushes and pulls.
void AsyncExecutor::replicate(int32_t server, int64_t piece, int32_t clock) {
  const auto& sync = s_.sync;
  if (sync.replicas <= 0) return;
  const auto& p = sync.pieces[static_cast<size_t>(piece)];
  const double bytes = engine::parallel::kPsHeaderBytes + sync.replica_bytes_per_param * static_cast<double>(p.end - p.begin);
  const std::vector<int32_t> backups = engine::parallel::replica_servers(server, sync.servers, sync.replicas);
  for (size_t b = 0; b < backups.size(); ++b) {
    unacked_[static_cast<size_t>(piece)][b].push_back(clock);
    flow(server_rank(server), server_rank(backups[b]), bytes,
         flow_tag(kReplica, static_cast<int32_t>(b << 1), static_cast<uint64_t>(piece)));
  }
}

void AsyncExecutor::replica_delivered(int64_t piece, int32_t link, bool ack) {
  const auto& sync = s_.sync;
  const int32_t owner = sync.pieces[static_cast<size_t>(piece)].server;
  if (!ack) {  // at the backup: it acknowledges
    const int32_t backup = engine::parallel::replica_servers(owner, sync.servers, sync.replicas)[static_cast<size_t>(link)];
    flow(server_rank(backup), server_rank(owner), engine::parallel::kPsHeaderBytes,
         flow_tag(kReplica, (link << 1) | 1, static_cast<uint64_t>(piece)));
    return;
  }
  std::deque<int32_t>& q = unacked_[static_cast<size_t>(piece)][static_cast<size_t>(link)];
  TANDEM_CHECK(!q.empty(), Status::kInternal, "simulated replication: an acknowledgement of piece {} for no replica", piece);
  int32_t& a = acked_[static_cast<size_t>(piece)][static_cast<size_t>(link)];
  a = std::max(a, q.front());
  q.pop_front();
  if (per_clock()) release(owner);  // ps, ssp: replies may wait for it
}

int32_t AsyncExecutor::replicated(int64_t piece) const {
  const std::vector<int32_t>& a = acked_[static_cast<size_t>(piece)];
  return a.empty() ? std::numeric_limits<int32_t>::max() : *std::min_element(a.begin(), a.end());
}

// FedAvg rounds (see simulate_rounds). Events and uploads carry their round so that a dropped client's late
// work is ignored.
class RoundExecutor final : public FlowExecutor {
 public:
  using FlowExecutor::FlowExecutor;
  StepResult run();

 private:
  void event(uint64_t arg) override;
  void delivered(uint64_t tag) override;
  RankBreakdown& breakdown(int32_t rank) override { return workers_[static_cast<size_t>(rank)].bd; }

  enum class Stage : uint8_t { kClients, kAveraging, kBroadcast };
  struct Worker {
    std::deque<int32_t> clients;  // this round's, not yet started
    int32_t round_clients = 0;    // this round's, all: what its one update carries
    bool computing = false;
    des::TimeNs compute_start = 0;
    double client_full_s = 0;
    RankBreakdown bd;
  };
  void open_round();
  void next_client(int32_t w);
  void update_done(int32_t w);
  void uploaded(int32_t w);
  void close_round();
  uint64_t round_event(uint64_t kind, int32_t rank) const {
    return (static_cast<uint64_t>(round_) << 24) | (static_cast<uint64_t>(rank) << 2) | kind;
  }

  int32_t W_ = 1, R_ = 1, round_ = 0;
  Stage stage_ = Stage::kClients;
  des::TimeNs open_ = 0, closed_ = 0, avg_start_ = 0, avg_end_ = 0;
  int32_t outstanding_ = 0, counted_ = 0, broadcasts_ = 0;
  std::vector<Worker> workers_;
  StepResult res_;
};

StepResult RoundExecutor::run() {
  W_ = s_.sync.workers;
  R_ = window_steps(s_);
  TANDEM_REQUIRE(static_cast<int32_t>(s_.ranks.size()) == W_, "fedavg setup: {} ranks for {} workers", s_.ranks.size(),
                 W_);
  TANDEM_REQUIRE(topo_.endpoints() >= W_, "the cluster has {} devices but the job needs {} ranks", topo_.endpoints(), W_);
  TANDEM_REQUIRE(s_.clients >= 1 && s_.sampled >= 1 && s_.sampled <= s_.clients,
                 "fedavg setup: {} sampled of {} clients", s_.sampled, s_.clients);
  workers_.resize(W_);
  in_.assign(W_, 0.0);
  out_.assign(W_, 0.0);
  setup_cpus(W_);
  open_round();
  sim_.run();
  TANDEM_CHECK(round_ == R_, Status::kInternal, "simulated fedavg stopped in round {} of {}", round_, R_);
  const double total = res_.rounds.back().start_s + res_.rounds.back().time_s;  // later events: dropped work
  const double k = R_;
  res_.window_steps = R_;
  res_.step_s = total / k;
  for (Worker& wk : workers_) {
    RankBreakdown b = wk.bd;
    b.compute_s /= k, b.throttled_s /= k, b.comm_exposed_s /= k, b.cpu_busy_s /= k, b.comm_cpu_s /= k;
    b.finish_s = res_.step_s;
    b.idle_s = std::max(0.0, res_.step_s - b.compute_s - b.throttled_s - b.comm_exposed_s);
    res_.ranks.push_back(b);
  }
  report_bytes(res_, k);
  return res_;
}

void RoundExecutor::open_round() {
  if (round_ == R_) return;
  open_ = sim_.now();
  stage_ = Stage::kClients;
  outstanding_ = W_;  // one update per worker, as the runtime sends them (RoundExchange::finish)
  counted_ = 0;
  const std::vector<int32_t> sampled = engine::parallel::sample_clients(s_.clients, s_.client_fraction, s_.seed, round_);
  TANDEM_CHECK(static_cast<int32_t>(sampled.size()) == s_.sampled, Status::kInternal,
               "fedavg round {}: {} clients drawn, {} expected", round_, sampled.size(), s_.sampled);
  for (int32_t w = 0; w < W_; ++w) {
    for (const int32_t client : engine::parallel::clients_of_worker(sampled, w, W_)) workers_[w].clients.push_back(client);
    workers_[w].round_clients = static_cast<int32_t>(workers_[w].clients.size());
  }
  if (s_.deadline_s > 0) sim_.schedule_in(des::ceil_ns(s_.deadline_s), this, round_event(kEvDeadline, 0));
  for (int32_t w = 0; w < W_ && stage_ == Stage::kClients; ++w) next_client(w);
}

// A worker trains its clients one after the other and sends worker 0 one update, the sum over them, once the last is
// done -- a worker that drew none sends its (empty) update at once -- as ParallelTrainer::fedavg_round does.
void RoundExecutor::next_client(int32_t w) {
  Worker& wk = workers_[w];
  if (wk.clients.empty()) {
    update_done(w);
    return;
  }
  const int32_t client = wk.clients.front();
  wk.clients.pop_front();
  const RankSetup& rs = s_.ranks[w];
  wk.computing = true;
  wk.compute_start = sim_.now();
  const auto steps = static_cast<double>(s_.client_steps.at(static_cast<size_t>(client)));
  // one factor for the client's local steps: their sum varies as cv / sqrt(steps)
  const double noise = steps >= 1 ? compute_factor(s_.compute_cv, s_.seed, w,
                                                   static_cast<int64_t>(round_) * s_.clients + client, steps)
                                  : 1.0;
  wk.client_full_s = steps * step_compute_s(rs) * noise;
  run_cpu(w, wk.client_full_s / rs.speed, round_event(kEvWorker, w));
}

void RoundExecutor::event(uint64_t arg) {
  const auto round = static_cast<int32_t>(arg >> 24);
  const int32_t rank = static_cast<int32_t>((arg >> 2) & 0x3fffffu);
  if (round != round_) return;  // a dropped client's work, or the deadline of a round that closed before it
  switch (arg & 3) {
    case kEvWorker: {
      Worker& wk = workers_[rank];
      if (!wk.computing) return;  // stopped when the round closed
      wk.computing = false;
      account_compute(wk.bd, wk.client_full_s, des::to_seconds(sim_.now() - wk.compute_start), s_.ranks[rank].speed);
      if (stage_ == Stage::kClients) next_client(rank);
      return;
    }
    case kEvDeadline:
      if (stage_ == Stage::kClients) close_round();
      return;
    case kEvServer: {  // rank 0 has averaged: broadcast the model
      account_compute(workers_[0].bd, 0, des::to_seconds(sim_.now() - avg_start_), 1.0);
      avg_end_ = sim_.now();
      stage_ = Stage::kBroadcast;
      broadcasts_ = W_ - 1;
      for (int32_t w = 1; w < W_; ++w) flow(0, w, s_.param_bytes, flow_tag(kPull, w, static_cast<uint64_t>(round_)));
      if (broadcasts_ == 0) delivered(flow_tag(kPull, 0, static_cast<uint64_t>(round_)));
      return;
    }
  }
}

void RoundExecutor::update_done(int32_t w) {
  if (w == 0) {
    uploaded(0);  // worker 0's own update needs no upload
  } else {
    flow(w, 0, s_.param_bytes, flow_tag(kUpload, w, static_cast<uint64_t>(round_)));
  }
}

void RoundExecutor::uploaded(int32_t w) {
  counted_ += workers_[static_cast<size_t>(w)].round_clients;
  if (--outstanding_ == 0 && stage_ == Stage::kClients) close_round();
}

void RoundExecutor::close_round() {
  stage_ = Stage::kAveraging;
  closed_ = sim_.now();
  // stragglers stop: their compute up to now counts, the rest of their clients is dropped
  for (int32_t w = 0; w < W_; ++w) {
    Worker& wk = workers_[w];
    wk.clients.clear();
    if (wk.computing) {
      wk.computing = false;
      cancel_cpu(w, round_event(kEvWorker, w));  // on a modelled node its CPU goes to what runs next
      const double actual = des::to_seconds(sim_.now() - wk.compute_start);
      account_compute(wk.bd, actual * s_.ranks[w].speed, actual, s_.ranks[w].speed);
    }
  }
  const RankSetup& r0 = s_.ranks[0];
  // a pass over each update that came in (RoundExchange::finish sums them)
  const double updates = W_ - outstanding_;
  const double avg = r0.local_bytes_per_s > 0 ? updates * s_.param_bytes / r0.local_bytes_per_s / r0.speed : 0.0;
  avg_start_ = sim_.now();
  run_cpu(0, avg, round_event(kEvServer, 0), false);
}

void RoundExecutor::delivered(uint64_t tag) {
  const auto round = static_cast<int32_t>(tag >> 24);
  if (round != round_) return;  // a dropped client's upload arriving late
  if ((tag & 3) == kUpload) {
    if (stage_ == Stage::kClients) uploaded(static_cast<int32_t>((tag >> 2) & 0x3fffffu));
    return;
  }
  if (--broadcasts_ > 0) return;
  // every worker has the average: the round is over
  const des::TimeNs now = sim_.now();
  // waiting for the average: the others from the close, rank 0 after its averaging
  for (int32_t w = 0; w < W_; ++w) workers_[w].bd.comm_exposed_s += des::to_seconds(now - (w == 0 ? avg_end_ : closed_));
  RoundReport rr;
  rr.start_s = des::to_seconds(open_);
  rr.time_s = des::to_seconds(now - open_);
  rr.sampled = s_.sampled;
  rr.counted = counted_;
  rr.dropped = s_.sampled - counted_;
  res_.rounds.push_back(rr);
  ++round_;
  open_round();
}

}  // namespace

FanoutDraw fanout_weight(double cv, double corr, uint64_t seed, int32_t worker, int32_t clock, FanoutDraw prev) {
  TANDEM_REQUIRE(std::isfinite(cv) && cv >= 0 && cv <= 1 && std::isfinite(corr) && corr >= 0 && corr < 1,
                 "fan-out draw: CV {} must be in [0, 1] and correlation {} in [0, 1)", cv, corr);
  TANDEM_REQUIRE(clock >= 0, "fan-out draw: clock {} must be >= 0", clock);
  if (cv == 0) return {clock, 0.0, 1.0};
  // one standard normal per (seed, worker, clock), counter-based: the event order does not matter
  const auto eps = [&](int32_t c) {
    Rng rng(mix64(mix64(seed ^ kFanoutSeed, static_cast<uint64_t>(worker)), static_cast<uint64_t>(c)));
    return rng.normal();
  };
  FanoutDraw d = prev;
  if (d.clock < 0 || d.clock > clock || clock - d.clock > 64) {  // a fresh start, or far enough that it is forgotten
    d.clock = clock;
    d.z = eps(clock);
  }
  const double keep = std::sqrt(1 - corr * corr);
  for (int32_t c = d.clock + 1; c <= clock; ++c) d.z = corr * d.z + keep * eps(c);
  d.clock = clock;
  const double s2 = std::log1p(cv * cv);  // lognormal of mean 1 and CV cv
  d.weight = std::exp(std::sqrt(s2) * d.z - s2 / 2);
  return d;
}

namespace {
constexpr int32_t kLongWindowSteps = 1024;
constexpr int64_t kWindowReplies = 1 << 17;
}  // namespace

int32_t window_steps(const StrategySetup& s) {
  if (s.steps > 0) return s.steps;
  switch (s.sync.exchange) {
    case Exchange::kPushPull: {
      if (s.sync.staleness == 0) return 4;
      // ps-async and ssp: the workers' clocks drift apart (fan-out draws, compute noise) and ssp's bound binds
      // only once they are S clocks apart, which takes tens of steps; so a long window, kLongWindowSteps (about a
      // bench run's 234 steps, four times over: the bound's episodes are long, so
      // a window of one run's length predicts one run's chance), cut to a cost bound of kWindowReplies answers (workers x pieces x steps) for a
      // large job, and never below the short window of 16 + 2 S steps
      const int64_t per_step = std::max<int64_t>(1, static_cast<int64_t>(s.sync.workers) *
                                                        static_cast<int64_t>(std::max<size_t>(1, s.sync.pieces.size())));
      const int32_t floor = 16 + 2 * std::max(0, s.sync.staleness);
      return static_cast<int32_t>(std::clamp<int64_t>(kWindowReplies / per_step, floor, std::max(floor, kLongWindowSteps)));
    }
    case Exchange::kElastic: return 4 * std::max(1, s.sync.period);
    case Exchange::kGossip: return 16;
    case Exchange::kRound: {
      const int32_t cover = (s.clients + s.sampled - 1) / std::max(1, s.sampled);
      return std::clamp(cover, 1, 16);
    }
    default: return 1;
  }
}

StepResult simulate_async_steps(const StrategySetup& setup, network::Topology& topology, des::Simulator& sim) {
  AsyncExecutor ex(setup, topology, sim);
  return ex.run();
}

StepResult simulate_rounds(const StrategySetup& setup, network::Topology& topology, des::Simulator& sim) {
  RoundExecutor ex(setup, topology, sim);
  return ex.run();
}

}  // namespace tandem::simulator
