#pragma once
// The averaging family of issue #13 -- local SGD, EASGD (synchronous) and gossip ASGD -- as StepSync objects that
// ParallelTrainer calls around its local step. Each worker runs its own optimizer on its own shard; the exchange
// (kParamAverage, kElastic, kGossip of the job's SyncProgram) acts on the replica's state: its parameters and its
// batch-norm buffers, one flat host vector (parameters first).
//
//   localsgd  Local SGD / post-local SGD (Lin et al. 2020): the first warmup_steps steps are synchronous DDP
//             (bucketed gradient all-reduce); afterwards each step is local and every H = average_every steps the
//             replicas' parameters and buffers are averaged by an all-reduce. Optimizer state (momentum) stays
//             local. H = 1 without warmup is DDP for every optimizer linear in the gradient -- SGD with momentum,
//             Nesterov, weight decay: mean_i(x - lr m_i) = x - lr mean_i(m_i), and mean_i(m_i) follows DDP's
//             momentum -- up to float rounding (Adam and gradient clipping are not linear, and differ).
//   easgd     Elastic averaging SGD, synchronous (Zhang, Choromanska and LeCun 2015): every tau steps each worker i,
//             with the centre c replicated on every worker, does d_i = alpha (x_i - c); x_i -= d_i; c += sum_i d_i
//             (the sum by all-reduce, so every copy of c stays identical). alpha = 0 means 0.9 / workers (the
//             paper's beta = 0.9). The centre is the model: evaluation and checkpoints use it (model.params of a
//             checkpoint is the centre; the workers' own states are kept beside it for an exact resume).
//   asgd      Asynchronous SGD without servers, as decentralised pairwise gossip (D-PSGD with a random matching,
//             Lian et al. 2017, with AD-PSGD's overlap of communication and computation): before each step the
//             workers are paired by a seeded matching (the same on every rank, a new one each step; with an odd
//             count one worker sits the step out); each sends its partner a snapshot of its state and receives the
//             partner's, non-blocking, while it computes its local step; afterwards it moves to the pair's average
//             plus its own update: x_i <- (s_i + s_j) / 2 + (x_i - s_i). The step ends once both snapshots have
//             arrived: the communicator's send is buffered (done once copied), so each side sends a one-value
//             receipt once it holds the partner's snapshot and waits for the partner's (the step program the
//             simulator times; without it the worker whose snapshot is still on its uplink starts its next step and
//             its next snapshot queues behind: measured 12% slower, bench/strategies/README.md session 18).
//             Pairwise averaging keeps the workers' mean,
//             so the mean follows SGD. Why not lock-free AD-PSGD: it needs one-sided atomic averaging, which the
//             transports do not have; a matching gives each rank exactly one partner per step, so every exchange
//             is a matched send/receive pair that cannot deadlock (each wait has the communicator's deadline), no
//             rank ever waits for more than one other, and there is no global barrier. Evaluation and checkpoints
//             use the workers' mean (as for localsgd between averages).
// Checkpoints of all three hold every worker's own parameters, buffers and optimizer state ("replica.<r>.*"
// records) beside the model the evaluation uses, so a resumed run continues exactly.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/comm/communicator.hpp"
#include "engine/nn/model.hpp"
#include "engine/parallel/job.hpp"
#include "engine/train/checkpoint.hpp"

namespace tandem::engine::parallel {

// This worker's parameters and batch-norm buffers (layers [first, end)) as one host vector, and back.
class ReplicaState {
 public:
  ReplicaState(nn::Model& model, size_t first_layer, size_t end_layer);
  std::vector<float> get() const;
  void set(const std::vector<float>& v);
  int64_t params() const noexcept { return params_; }
  int64_t size() const noexcept { return params_ + buffers_; }

 private:
  nn::Model& model_;
  size_t first_, end_;
  int64_t params_ = 0, buffers_ = 0;
};

// What a strategy does around ParallelTrainer's local step. For each optimizer step the trainer calls
// before_step(k) (k: steps done before it), runs forward and backward -- through the DDP bucket reducer when
// synchronous(k), else locally -- and the optimizer, then after_step(k + 1). Every worker makes the same calls.
class StepSync {
 public:
  virtual ~StepSync() = default;
  virtual bool synchronous(int64_t /*step*/) const { return false; }
  virtual void before_step(int64_t /*step*/) {}
  virtual void after_step(int64_t /*steps_done*/) {}
  // Collective over the workers: the state (ReplicaState layout) that evaluation and checkpoints use instead of
  // this replica's own; empty: the replica's own (replicas are identical).
  virtual std::vector<float> consensus() { return {}; }
  // Replicas differ between exchanges: a checkpoint keeps every replica's own state beside the consensus.
  virtual bool replicas_diverge() const { return true; }
  // Absorbing a lost worker (ParallelTrainer's recovery; collective over the survivors, all of whom call it):
  // `workers` is the survivors' communicator (shrunk from the old one); steps before `resume_at` -- a step that
  // some survivor completed with the old group before the loss -- run locally on a survivor that redoes them
  // (no exchange, no synchronous reduction), so every survivor's next exchange is at the same step. `root` holds
  // the state the survivors adopt where the strategy keeps one replicated (EASGD's centre). Returns the buffers of
  // the old communicator's operations in flight; they must outlive that communicator.
  virtual std::shared_ptr<void> rebind(comm::Communicator* workers, int64_t resume_at, int root) = 0;
  // The strategy's own checkpoint records (the same on every worker), and their restore.
  virtual void save(train::Checkpoint& /*ck*/) const {}
  virtual void load(const train::Checkpoint& /*ck*/, const std::string& /*path*/) {}
};

// The StepSync of kParamAverage, kElastic (synchronous) or kGossip; null for other exchanges. `workers`: the
// workers' communicator (null for one worker); `state` must outlive the result. Collective over the workers when
// they construct the trainer (the EASGD centre starts as the replicas' common initial state).
std::unique_ptr<StepSync> make_averaging_sync(const CompiledJob& job, comm::Communicator* workers,
                                              ReplicaState& state, uint64_t seed);

// EASGD's moving rate as run: alpha, or 0.9 / workers when alpha is 0.
double easgd_alpha(double alpha, int workers) noexcept;

// The gossip partner of `worker` at step `step`: a seeded random perfect matching of [0, workers), the same on every
// rank; -1 when the worker sits the step out (odd count) or is alone.
int gossip_partner(int worker, int workers, uint64_t seed, int64_t step);

// Collective: v <- the mean of v over the communicator's ranks (in place; f32 sum, then scaled).
void allreduce_mean(comm::Communicator& c, std::vector<float>& v);

// The elastic centre (for tests and the checkpoint); null for other strategies.
const std::vector<float>* easgd_centre(const StepSync* sync) noexcept;

}  // namespace tandem::engine::parallel
