#pragma once
// One training step executed on a modelled cluster: every rank runs its stage's pipeline plan
// (engine/parallel/schedule.hpp) on a compute stream, point-to-point activations and gradients
// travel as flows, and gradient buckets are all-reduced with the runtime's collective plans
// (compiled_plan.hpp) on a communication stream that overlaps the rest of backward. An all-reduce runs
// with the runtime executor's dependencies, not round by round: its chunks pipeline across rounds.
//
// Ranks are laid out replica-major: rank = replica * pp + stage, and rank r runs on topology
// endpoint r. Each rank's step time splits exactly into compute (at full speed), throttled compute
// (the extra time a slowed CPU takes), exposed communication (waiting for all-reduces), bubble
// (blocked receiving activations or gradients from a neighbouring stage, the transfer included, and
// a pipeline stage's time after it finished) and idle (a data-parallel rank done before the step
// ends). These are the runtime's definitions (engine/parallel/step_trace.hpp), so predicted and
// measured splits compare directly.
#include <cstdint>
#include <string>
#include <vector>

#include "engine/parallel/schedule.hpp"
#include "simulator/compiled_plan.hpp"
#include "simulator/compute/node_cpu.hpp"
#include "simulator/network/topology.hpp"

namespace tandem::simulator {

struct RankSetup {
  double speed = 1.0;                 // compute speed factor (< 1: throttled CPU, swapping)
  double local_bytes_per_s = 0;       // memory bandwidth for the plans' local reductions; 0: free
  std::vector<double> forward_s;      // per micro-batch, at full speed
  std::vector<double> backward_s;     // per micro-batch, at full speed
  std::vector<double> bucket_backward_s;  // the last backward split by gradient bucket (bucket order)
  double optimizer_s = 0;
  // compressed gradients: converting each bucket before its all-reduce, and all of them back after
  // the last one (training thread, at the rank's speed); empty / 0 without compression
  std::vector<double> bucket_compress_s;
  double decompress_s = 0;
  // fp16 loss scaling (CompiledJob::agree_finite): the pass that unscales the stage's gradients and checks them
  // (scale, then sum of squares), before the optimizer step; 0 without loss scaling
  double unscale_s = 0;
  // CPU seconds (at full speed, divided by `speed`) per payload byte that one side of a message spends on
  // moving it: `net_cpu_s_per_byte` through the network stack to or from a rank on another node (TCP: system
  // calls, the kernel's protocol work and copies), `copy_cpu_s_per_byte` through shared memory to or from a rank
  // of the same node (one memcpy into or out of the ring). Charged to the sender and to the receiver of every
  // all-reduce transfer, as CPU tasks on their node's CPU model that run while the flow is in flight (a send is
  // done once its flow and its sender's CPU work are; a receive once the flow and the receiver's). 0: free.
  double net_cpu_s_per_byte = 0;
  double copy_cpu_s_per_byte = 0;
  // Network transfers also cost `net_cpu_s_per_wakeup` per wake-up, their wake-ups set by the link's pace
  // (simulator/comm_cpu.hpp): `net_pace_bytes_per_s` is this rank's NIC payload rate, and a transfer goes at the
  // slower of its two ends' (> 0 wherever net_cpu_s_per_wakeup is). 0: no wake-up cost (the per-byte model alone).
  double net_cpu_s_per_wakeup = 0;
  double net_pace_bytes_per_s = 0;
  // Each message to or from a rank of the same node also costs one wake-up where the node's ranks outnumber its
  // cores (simulator/comm_cpu.hpp): CPU seconds per message and side; 0: none.
  double copy_cpu_s_per_message = 0;
};

// When one op of an all-reduce ran (StepSetup::op_log): member `member`'s op `op` (member-local, as
// CompiledPlan numbers them) of bucket `bucket` of stage `stage`. Transfers start when posted and end
// when done (a receive: posted and its data arrived); local ops start on the CPU.
struct OpSpan {
  int32_t stage, bucket, member;
  uint32_t op;
  double start_s, end_s;
};

struct StepSetup {
  engine::parallel::PipelinePlan pipeline;
  int32_t dp = 1, pp = 1;
  std::vector<RankSetup> ranks;                 // dp * pp
  std::vector<std::vector<double>> boundary_bytes;  // [stage s -> s+1][micro-batch] activation bytes
  // [stage][bucket]: the all-reduce plan over the stage's data-parallel group (member d = replica d)
  std::vector<std::vector<const CompiledPlan*>> bucket_plans;
  // fp16 loss scaling: the found-non-finite flag all-reduced over every rank (member r = rank r) before each
  // optimizer step (CompiledJob::agree_finite). Every rank waits there for the last to arrive, then for the plan's
  // critical path of message latencies (its 4 bytes take no bandwidth to speak of); null: no such meeting.
  const CompiledPlan* agree_plan = nullptr;
  bool overlap = true;                          // all-reduce buckets during backward (else after it)
  // A framework that launches its collectives from a background loop running in cycles (Horovod: every
  // HOROVOD_CYCLE_TIME, 5 ms by default; its loop sleeps out the rest of a cycle, then takes every tensor ready
  // by then): a cycle starts at a tick and takes the buckets ready at its start, which run one after another;
  // the next cycle starts `comm_cycle_s` after this one did, or when its all-reduces end if that is later, and
  // an idle loop ticks every `comm_cycle_s` (the step starts at a tick). So a bucket ready between ticks waits
  // for the next one, and one that becomes ready during a cycle's all-reduces waits for that cycle to end.
  // 0: a bucket's all-reduce starts as soon as it is ready and the previous one is done (Tandem, PyTorch DDP).
  double comm_cycle_s = 0;
  // The loop's coordination at the start of each cycle (Horovod before its response cache: rank 0 gathers every
  // rank's list of ready tensors and broadcasts which to all-reduce, over MPI): the cycle's all-reduces start
  // `comm_negotiation_s` after its tick; the next tick is still `comm_cycle_s` after this one, or when the cycle's
  // work ended if later. Only with comm_cycle_s > 0; 0: none.
  double comm_negotiation_s = 0;
  // A framework that runs each bucket's all-reduce from host memory (Caffe2's Gloo CUDA all-reduces with their default
  // host workspace: the GPUs' reduction is copied to the host, all-reduced there, and copied back, one stage after
  // the other): every rank's all-reduce of a bucket of B bytes starts B / host_staging_bytes_per_s after it is
  // launched and ends as long after its collective plan finished, on the communication stream. 0: the collective
  // runs from device memory.
  double host_staging_bytes_per_s = 0;
  bool record_trace = false;
  bool symmetric = true;                        // allow symmetric execution where provably identical
  std::vector<OpSpan>* op_log = nullptr;        // if set, every all-reduce op's span is appended (tests)
  // Nodes whose CPU is time-shared by several ranks or held by a CFS quota (compute/node_cpu.hpp):
  // node_of_rank[r] indexes node_cpu; empty, or a node whose share needs no model, keeps the plain
  // model (each rank computes alone at its speed).
  std::vector<int32_t> node_of_rank;
  std::vector<CpuShare> node_cpu;
  // Node of each rank, for telling a shared-memory transfer (same node) from a network one when a rank's
  // transfers cost CPU (RankSetup::copy_cpu_s_per_byte); empty: every transfer crosses the network.
  std::vector<int32_t> host_of_rank;
};

struct RankBreakdown {
  double finish_s = 0;
  double compute_s = 0;
  double throttled_s = 0;
  double comm_exposed_s = 0;
  double bubble_s = 0;
  double idle_s = 0;
  double staleness_wait_s = 0;  // ssp: waiting for pulls withheld while more than `staleness` clocks ahead of the slowest
  double cpu_busy_s = 0;   // compute, local reductions and transfers' CPU work, at the rank's speed (for CPU credits)
  double comm_cpu_s = 0;   // of which the CPU work of moving all-reduce messages (RankSetup::net_cpu_s_per_byte)
};

// One FedAvg round (simulator/strategy.hpp).
struct RoundReport {
  double start_s = 0, time_s = 0;
  int32_t sampled = 0;   // clients sampled for the round
  int32_t counted = 0;   // their models reached rank 0 before the round closed
  int32_t dropped = 0;   // stragglers past the deadline
};

struct TraceSpan {
  int32_t rank;
  int32_t lane;  // 0 the training thread, 1 all-reduces (as the runtime's trace)
  std::string name;
  const char* category;  // "compute", "bubble", "comm", "allreduce"
  double start_s, end_s;
};

struct StepResult {
  double step_s = 0;
  std::vector<RankBreakdown> ranks;
  std::vector<TraceSpan> trace;
  uint64_t events = 0;
  uint64_t flows = 0;
  bool symmetric_used = false;  // the data-parallel all-reduces ran in symmetric (one-rank) mode
  // The strategies of issue #13 (simulator/strategy.hpp): a window of `window_steps` steps (or rounds) is
  // simulated and every figure above is its mean per step (round).
  int32_t window_steps = 1;
  std::vector<RoundReport> rounds;        // fedavg
  std::vector<double> nic_in_bytes, nic_out_bytes;  // per rank, per step: bytes its pushes, pulls, exchanges and
                                                    // uploads carried (filled by the strategies' executor)
};

// Runs one step on `topology` (whose network and simulator must be fresh). Throws kInternal if the
// plans deadlock (some rank never finishes).
// Whether any of rank r's transfers cost CPU (some figure of transfer_cpu_s's is set).
inline bool transfers_cost_cpu(const RankSetup& rs) {
  return rs.net_cpu_s_per_byte > 0 || rs.copy_cpu_s_per_byte > 0 || rs.net_cpu_s_per_wakeup > 0 ||
         rs.copy_cpu_s_per_message > 0;
}

// CPU seconds (at its speed) rank r spends on `bytes` of one message to or from `peer`: a copy when host_of_rank
// puts them on one node, else a network transfer at the slower of the two ends' paces (simulator/comm_cpu.hpp).
// The one cost every executor charges -- this step executor and the strategies' (simulator/strategy.cpp).
double transfer_cpu_s(const std::vector<RankSetup>& ranks, const std::vector<int32_t>& host_of_rank, int32_t r,
                      int32_t peer, double bytes);

StepResult simulate_step(const StepSetup& setup, network::Topology& topology, des::Simulator& sim);

}  // namespace tandem::simulator
