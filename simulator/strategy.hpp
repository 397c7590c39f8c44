#pragma once
// The strategies of issue #13 on a modelled cluster, from the compiled job's SyncProgram
// (engine/parallel/job.hpp): what is timed is the communication pattern, never the update math.
//
//   push-pull (ps, ps-async, ssp)  every step a worker computes; as backward completes bucket b it pushes each
//       piece (bucket, server) to that server (worker -> server flows: a server's NIC sees the incast of every
//       worker, an uneven shard shows); a worker's next step waits for its pulls (there is no other gate).
//       ps-async (staleness -1): each push is applied on arrival (a server's updates run one at a time) and pulled
//       back by its worker alone. ps and ssp (staleness S >= 0), as the runtime's ParameterServerSync runs them
//       (on_push, apply_complete, release_withheld): a push of clock c is stored; the last of a piece's W pushes
//       of clock c applies the clock (one optimizer step of the piece; the other pushes take no server time); the
//       reply to a push of clock c is withheld until the piece has applied clock c - S, and the replies one
//       applied clock releases leave together. S = 0 is ps: every worker pulls the piece once the step's clock is
//       applied. S > 0: a worker more than S clocks ahead of the slowest waits for its pulls (the part of its wait
//       before the last withheld reply was released is reported as staleness_wait_s).
//       Replication (sync.replicas > 0, as ParameterServerSync::replicate): each update of a piece (ps, ssp: each
//       applied clock; ps-async: each push) goes from its server to each backup (a header and
//       replica_bytes_per_param per parameter) and comes back acknowledged (a header); ps and ssp answer a push of
//       clock c only once clock c - S is acknowledged by every backup. The joiner check (sync.join_check_every > 0):
//       worker 0 spends join_check_s before every join_check_every-th step reading the job's store.
//   elastic with servers (asynchronous easgd)  local steps (compute + local optimizer); every `period` steps a
//       worker pushes its whole parameter shards to their servers and pulls the centre back, without a barrier.
//   gossip (asgd)  as the runtime's Gossip (engine/parallel/averaging.cpp): at the start of step c a worker sends
//       a snapshot of its state to its partner of the step (gossip_partner: the seeded random perfect matching,
//       a new one each step; an odd worker out sits the step out) and the partner sends its own, so each worker's
//       uplink carries one model per step; the exchange runs beside the step's compute, and the step ends when
//       the local step is done and both transfers are (the partner's starts when the partner reaches step c);
//       no global barrier.
//   round (fedavg)  see simulate_rounds.
// A server's update of a piece (or shard) takes its node's optimizer time for the whole model scaled by the
// piece's share of the parameters. A server is one thread serving one request at a time in arrival order (its
// updates queue), and its NIC sends in the order it answers: the replies released together leave together (ps:
// every worker's pull of the piece, sharing the link; ssp: the pushes one applied clock releases), a later
// release waits behind them (a FIFO queue, as a host's bytes queue in its NIC). So asynchronous workers whose pushes arrive together are answered one after
// another and drift out of phase, as the runtime's trace shows (bench/strategies/ps_trace.py), instead of moving
// as a convoy; a synchronous step's replies still share the link.
// CPU (every executor here, as the DDP step executor does it): on nodes with a CPU model (StepSetup::node_cpu:
// a CFS quota, or more threads than cores) compute, a server's updates and the CPU work of moving each message
// (transfer_cpu_s of step.hpp: per byte plus TCP wake-ups, on the sender and on the receiver, beside the flow) run as
// tasks of the node's CPU; a message is delivered once its flow and both sides' CPU work are done.
#include <cstdint>
#include <vector>

#include "engine/parallel/job.hpp"
#include "simulator/network/topology.hpp"
#include "simulator/step.hpp"

namespace tandem::simulator {

struct StrategySetup {
  engine::parallel::SyncProgram sync;  // the compiled job's
  // workers [0, sync.workers) then servers; a worker's micro-batch times, bucket split and local optimizer step
  // as for DDP; a server's optimizer_s is one update of the whole model on its node (at full speed)
  std::vector<RankSetup> ranks;
  // as StepSetup's: each rank's node and the nodes' CPU shares (empty: no CPU model), the host of each rank where
  // transfers between ranks of one host cost copy_cpu_s_per_byte (empty: every transfer crosses the network)
  std::vector<int32_t> node_of_rank;
  std::vector<CpuShare> node_cpu;
  std::vector<int32_t> host_of_rank;
  double param_bytes = 0;  // the model's f32 parameters
  int32_t steps = 0;       // steps (rounds) to simulate; 0: chosen from the exchange (window_steps)
  // fedavg, as the runtime runs it (engine/parallel/fedavg.hpp): the virtual clients, the fraction sampled per
  // round and the seed (sample_clients draws round r's clients; clients_of_worker deals them to the workers),
  // each client's optimizer steps per round (local_epochs over its own shard, which engine/data/partition.hpp
  // cuts IID or with Dirichlet label skew) and the round deadline (0: none)
  int32_t clients = 0, sampled = 0;
  double client_fraction = 1;
  uint64_t seed = 0;
  std::vector<int64_t> client_steps;  // [client]
  double round_samples = 0;  // samples a round trains: sampled x a client's mean (its batches' samples x local_epochs)
  double deadline_s = 0;
  // The compute's pass-to-pass coefficient of variation (the profile's compute_cv, compute/step_noise.hpp): a
  // worker's forward and backward of step c take compute_factor(cv, seed, worker, c) times their figures; a FedAvg
  // client's local steps, one factor for their sum. 0: every step alike.
  double compute_cv = 0;
  // The joiner check (sync.join_check_every > 0): worker 0's read of the job's store, which `tandem launch` serves on
  // world rank 0's host (worker 0's own): a request and its answer over loopback TCP, costing one wake-up of each
  // side (the store's to answer, worker 0's for the answer) at the profile's tcp_cpu_s_per_wakeup, run on worker 0's
  // node before the step (0: no figure, the check is free).
  double join_check_s = 0;
};

// A worker's answers' share weight on a server host with a measured fan-out spread (network/topology.hpp's
// fanout_cv, fanout_corr): lognormal of mean 1 and CV `cv`, whose log follows an AR(1) from clock to clock with
// lag-one correlation `corr` (a connection's share persists, as measured), driven by one standard normal per
// (seed, worker, clock). `prev`: the worker's last draw (clock -1: none); the result is the draw at `clock`.
struct FanoutDraw {
  int32_t clock = -1;
  double z = 0;       // the standard normal the weight is made of
  double weight = 1;  // exp(sigma z - sigma^2 / 2), sigma^2 = ln(1 + cv^2)
};
FanoutDraw fanout_weight(double cv, double corr, uint64_t seed, int32_t worker, int32_t clock, FanoutDraw prev = {});

// Steps (rounds) a setup's window simulates when `steps` is 0.
int32_t window_steps(const StrategySetup& setup);

// Simulates a window of steps of a push-pull, asynchronous elastic or gossip program on `topology` (fresh
// network and simulator); every figure of the result is the mean per step. Step time is the slowest worker's
// mean (each worker goes through its own shard of an epoch, as the runtime's sampler splits it), so faster
// workers of an asynchronous program end the window with idle time.
StepResult simulate_async_steps(const StrategySetup& setup, network::Topology& topology, des::Simulator& sim);

// FedAvg rounds: a round opens on rank 0; each worker runs its sampled clients one after the other (each
// client_steps optimizer steps of a step's compute) and uploads each client's model to rank 0 as it finishes
// (incast); the round closes when every upload is in, or at the deadline with whoever reported (the others are
// dropped and their workers stop); rank 0 averages (a pass over the parameters per counted client at memory
// bandwidth) and broadcasts the model to the other workers; the next round opens when they all have it.
// Round r's clients are the runtime's own draw (sample_clients with the job's seed), dealt to the workers as
// the runtime deals them; a client's compute is its own number of steps (an empty client: none).
StepResult simulate_rounds(const StrategySetup& setup, network::Topology& topology, des::Simulator& sim);

}  // namespace tandem::simulator
