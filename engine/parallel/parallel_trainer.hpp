#pragma once
// Training over many ranks: single, DDP, pipeline and hybrid DP x PP behind one loop.
//
// Every strategy runs the same way: the rank's pipeline stage (the whole model when pp = 1)
// executes its part of a PipelinePlan (schedule.hpp) for each step -- M micro-batches (times the
// gradient accumulation), GPipe or 1F1B -- with the stage's data-parallel group all-reducing its
// gradient buckets during the last backward pass; then the optimizer steps. The math is that of
// single-device training on the global batch (batch size x dp samples): equal up to float
// rounding, and bit-identical to train::Trainer when nothing regroups the sums (see the tests).
//
// Construction is collective over `world` (every rank must construct with the same settings):
//   1. local checks (resolve_grid: world vs dp x pp, stages vs layers, micro-batches vs batch) --
//      they depend only on the arguments, so they fail on every rank before any communication;
//   2. an all-gather of every rank's settings: a rank whose settings differ fails everyone with
//      kMismatch naming it and the field, before any work; the ranks also agree on the steps per
//      epoch here (the sampler gives every replica the same count, padding the last batch);
//   3. the stage and data-parallel communicators (split of `world`), parameters and batch-norm
//      buffers broadcast from data-parallel rank 0, a barrier that zeroes every rank's trace clock.
//
// The strategies of issue #13 that this trainer runs itself (pp = 1, every rank a worker): localsgd, easgd
// (synchronous) and asgd through a StepSync around the local step (averaging.hpp: local steps skip the DDP
// reducer; the exchange acts after the optimizer), and fedavg, where one step() -- and one epoch -- is one round
// (fedavg.hpp). Evaluation and checkpoints use the strategy's model: EASGD's centre; the workers' mean for
// localsgd and asgd; the global model for fedavg. Checkpoints also keep every worker's own state, so a resumed run
// continues exactly. The parameter-server family plugs in beside them (server ranks outside the step loop).
// Parameter servers (ps, ps-async, ssp; easgd with easgd_async): the last ranks of the world are servers
// (ParameterServerSync, param_server.hpp). They run the same collective calls: a server's step() serves the workers'
// pushes and pulls, and every world collective (end of an epoch, evaluate, checkpoint, trace) starts with a sync point
// at which the workers leave their push/pull region and take the servers' parameters. A checkpoint holds the
// servers' shards (parameters and optimizer state) as the whole model; of asynchronous EASGD, the servers' centre as
// the model and every worker's own parameters, buffers and optimizer state beside it (replica records, as for the
// averaging strategies), so every strategy resumes where it was saved.
//
// Elastic DDP (issue #17; ParallelConfig::elastic with strategy ddp). The trainer runs on a communicator of its
// own (split from `world`) and survives the loss of ranks:
//  - Detection: a peer failure or timeout of a collective inside step(), train_epoch()'s reductions or evaluate()
//    (mid-step too: the step in flight is abandoned). Other failures stay fatal, as without elastic.
//  - Membership: the survivors shrink the communicator (Communicator::shrink: one decision through the store, never
//    two views), re-form the data-parallel group and redo the abandoned work. No process restarts.
//  - Consistent state: every step starts from a host snapshot (parameters, buffers, optimizer state, step count,
//    sampler, RNG). A step whose gradient all-reduce completed on any rank is a valid step of the old group: a
//    completed all-reduce leaves the same bits on every rank that completed it, and a rank can be at most one step
//    ahead of another (the next all-reduce needs everyone's gradient). So the survivor that completed the most
//    steps is authoritative (the lowest such rank); every survivor takes its snapshot, bit for bit.
//  - Global batch and learning rate: the per-replica batch is kept, so the global batch shrinks to batch x dp';
//    the learning rate is scaled by dp' / dp (the linear scaling rule; dp the replicas the job started with) on top
//    of its schedule, which stays indexed by optimizer steps.
//  - Data: the epoch's global sample order is kept. With g = position x dp samples taken (the authoritative
//    snapshot's), the dp' survivors continue at position floor(g / dp') of their new shards: no sample of the epoch
//    is skipped and at most dp' - 1 are seen twice. An epoch is then longer in steps (ceil(N / dp') / batch).
//  - Stop: fewer than min_ranks survivors write a checkpoint (elastic_checkpoint, atomically, resumable at any dp)
//    and fail with kPeerFailure naming the lost world ranks, on every survivor. Not when the job's training is done
//    (a loss in the closing collectives of its last epoch, config.epochs: training_done): the survivors finish its
//    evaluation and save, and only a further step stops them so.
//  - Leaving: a rank whose trainer ends with its communicator failed and not shrunk (its last save gave up on a loss)
//    says so in the survivors' agreement (Communicator::leave), which then does not wait out its window for the rank,
//    with the last epoch it reported as rank 0: the survivors' rank 0 returns that epoch already_reported.
//  - Rank 0: losing it is survived like any rank when the store is served outside the ranks (TANDEM_STORE; `tandem
//    launch` serves it): the lowest survivor becomes rank 0 and reports from then on. With the store in world rank 0
//    (no launcher, or a --master-addr not on the launcher's machine) losing rank 0 stops the job (kTimeout).
//  - Epoch figures (train_epoch's training loss, accuracy and samples; every absorbing strategy): each rank adds up
//    what it scored in the epoch, and the ranks sum that at the epoch's end, in its first closing collective. A rank
//    lost before then takes its share with it: the epoch reports what the ranks alive at the sums scored -- the
//    accuracy is the survivors' over their own samples, and train_samples says how many -- and a survivor that took
//    a step as done from the authoritative rank (it was cut off in it) counts none of that step's samples. The share
//    is not carried: that would put every rank's figures somewhere else at each step, an all-reduce of 3 values per
//    step (a latency added to every step of every job, for a rare event) or room in the gradient buckets (which
//    compression and the parameter servers alter). A loss once any rank completed the sums loses nothing (the ones
//    cut off in them take the completed sums: closing_plan). `tandem train` marks an epoch in which ranks were lost
//    ("lost_in_epoch" in its JSON line, a note after its text line).
//  - Limits: a snapshot per step costs a host copy of the parameters and optimizer state.
//
// Growth (issue #17; elastic ddp at pp = 1; elastic_grow.cpp). New ranks join a running job (comm::join_communicator,
// `tandem launch --join`) and build their trainer with ParallelConfig::joining over the communicator it returns:
//  - When: at step boundaries. Every join_poll_steps optimizer steps (default 1), at the start of step(), rank 0 reads
//    the join counter in the job's store and broadcasts it over the trainer's group (Communicator::pending_joins:
//    one store round trip on rank 0 and an 8-byte broadcast; the same answer everywhere, so the ranks never split).
//  - Membership: Communicator::grow -- one decision by rank 0 through the store (admission.hpp), joiners beyond
//    max_ranks refused with the reason, the old ranks keep their ranks, joiners follow; a joiner that dies while
//    being admitted costs at most the communicator's timeout, after which the old ranks go on without it.
//  - State: the old ranks re-form the data-parallel group over the grown world with the same collectives the joiners'
//    constructor runs, then every rank takes rank 0's snapshot (parameters, buffers, optimizer state, step and epoch
//    counters, RNG, the sampler's global position) -- the adoption the survivors of a loss use.
//  - Global batch and learning rate: the rule of shrink, mirrored -- the per-replica batch is kept, so the global
//    batch grows to batch x dp'; the learning rate is x dp' / dp (dp: the replicas the job started with). The epoch's
//    global sample order is kept: g samples taken continue at floor(g / dp') of the new shards. Joiners that ask a
//    moment apart may be admitted one after the other at one step boundary (2 -> 3 -> 4); both re-shards start from
//    the same exact g (Snapshot::taken), so this is the same as one admission 2 -> 4 (no extra sample repeated).
//  - Limits: the joiners must be started with the job's settings (checked: kMismatch naming the field). Pipeline and
//    hybrid grids grow by whole rows (below); parameter-server jobs by workers (below).
//
// Parameter-server jobs grow by workers (issue #17; elastic ps, ps-async and ssp; elastic_grow.cpp admit_workers).
// The same machinery: the poll (Communicator::pending_joins) every join_poll_steps steps, Communicator::grow's one
// decision with max_ranks, the joiner's constructor mirrored by the running ranks, share_grown_state's labels and
// rank 0's progress. What differs:
//  - The check (ps, ssp) rides on the push/pull messages (ParameterServerSync::request_admission): every
//    join_poll_steps steps worker 0 alone reads the job's store (Communicator::peek_joins); when someone waits, its
//    next kStep(t) asks the servers for an admission at the step boundary t + staleness, the servers put it on every
//    pull reply, and only at that boundary do the ranks leave the push/pull region (a sync point) and admit. So a check
//    costs one store round trip on rank 0 and nothing collective (bench/elastic/join_check_cost.py). ps-async bounds
//    no worker's lead, so no message is sure to carry the decision in time: its check stays collective, a sync point
//    and pending_joins every join_poll_steps steps (an epoch's end's cost; raise join_poll_steps for a large model).
//    A parameter-server job checks only when given a bound to grow to (max_ranks > 0; `tandem launch --max-ranks`
//    above -n sets it); without one its joiners wait unanswered. After a loss is absorbed the ranks may be a step
//    apart (a server counts a step once its pushes are in, a worker once its pulls are), so the checks resume at the
//    first step past the most progress any rank had at the re-form; a re-form (and an admission) drops an admission
//    asked for before it, and worker 0 asks again.
//  - Order: Communicator::grow puts the joiners after the servers; every rank then splits the grown world workers
//    first (old workers, joiners, then the servers with their indices), so the servers stay the last ranks. A joiner
//    is a worker and takes the next world-rank label after every rank the job had (the server keeps its own).
//    A rank lost inside that split can leave it completed on some ranks and cut off on others (no common
//    communicator left between them): a rank whose split failed stops with kPeerFailure saying so (it cannot tell
//    whether the others went on), and the ranks that completed it meet both losses on the reordered world, undo the
//    admission and absorb them (test hook TANDEM_TEST_REFORM_LEAVE="rank:split").
//  - The job is compiled again at the new width (compile_job: the compiler sizes the servers); the shards and their
//    owners stay the running job's.
//  - Servers (ParameterServerSync::grow): ps counts the new workers in every clock from the next (each update
//    averages dp' pushes); ssp starts them at the current clock -- every worker's after the sync point, so the
//    slowest -- and its bound holds over all of them; ps-async has nothing to wait for, and its schedule keeps its
//    place (one step per dp' updates from here). Every server then sends its shards to every worker: a joiner's first
//    pull is the servers' current parameters.
//  - Data and learning rate: DDP grow's rule. The per-worker batch is kept and the epoch's global order continues at
//    floor(g / dp') of the new shards, on the servers too (they count batches as worker 0 does); the learning rate
//    (applied by the servers) is x dp' / dp where an update averages the workers' gradients (ps, ssp) and x 1 for
//    ps-async, whose updates each take one worker's gradient, whose batch does not change. A worker loss applies the
//    same rule to the workers left (dp' / dp, dp the job's starting width), so a shrink after a grow does not keep
//    the grown factor. Every rank takes worker 0's batch-norm buffers.
//  - Servers do not join; after a server loss a joiner is a worker as before. The surviving servers keep the shards
//    they own (fail_over_servers' ownership); rank 0 sends that ownership to every rank of the grown world (each old
//    rank checks it holds the same: kMismatch everywhere otherwise), the job is compiled over the servers running
//    now with it (adopt_ownership), and the joiner pulls each shard from its current owner. A new server needs a
//    restart from a checkpoint.
//
// Elastic pipeline and hybrid DP x PP (issue #17; elastic_reform.cpp). The trainer's own communicator spans every rank
// (the stage and replica groups are split from it). A failure seen on any group aborts this rank's groups -- whoever
// waits on it there fails at once -- and a barrier on the own communicator shows whether a rank is gone; then:
//  - Membership: shrink (one decision through the store), as for DDP.
//  - State: every survivor has its two newest step snapshots (a rank can have completed the step the others were cut
//    off in); all roll back to the newest step every survivor has. For each pipeline stage the lowest surviving rank
//    holding it sends its slice (parameters, buffers, optimizer state) to survivor 0, which assembles the whole model
//    and deals it out at the new grid -- the reshard of load_checkpoint, in memory. A stage with no surviving replica
//    is restored, with everything else, from elastic_checkpoint (all ranks go back to its step); without one every
//    survivor stops with kPeerFailure naming the stage.
//  - Grid rule (loss and growth alike; elastic_reform.cpp grid_for): for n ranks, pp' = min(pp0, n) and
//    dp' = floor(n / pp'), pp0 the depth the job was launched with (a grid that lost depth regains it when it can); a
//    changed depth re-cuts the model; a pipeline job that widens to dp' > 1 runs as hybrid from then on. Learning rate
//    x dp' / dp, per-replica batch kept, the sampler's global position kept (floor(g / dp')), as for DDP. At an
//    unchanged depth every rank keeps the stage it holds where it can: stage s's dp' places go to the ranks holding
//    s first (the lowest first), the places left to the other ranks (holding state first, then the lowest).
//  - Epoch figures: what each rank's last stage scored in the epoch so far rolls back with its step snapshot and is
//    summed over the survivors at the re-form (the lost ranks' share is gone); train_epoch reports it with what the
//    new grid scores. An epoch in which nothing was scored reports NaN loss and accuracy (0 samples), never 0.
//  - An epoch's end (form_grid, closing_plan): the closing collectives (sums, time split, evaluation) run over every
//    rank, so a loss there leaves the survivors at most one collective apart, all at the same step. The ones cut off
//    in a collective that others completed take its result from the lowest of those (its sums then count the lost
//    rank's figures once) and all go on to the next one. A rank that completed the epoch's last step and was cut off
//    in the sums while another survivor was cut off in that step goes back to the step before it with the others and
//    redoes it (train_epoch) before the sums. Any other mix stops every survivor with kPeerFailure naming the rank.
//    Test hook points: TANDEM_TEST_REFORM_LEAVE "last-step", "summed", "timed", "evaluated" (parallel_trainer.cpp).
//  - Spares: the ranks beyond dp' x pp' (their state goes to no one; the grid prefers ranks that hold state, then
//    the lowest ranks) stay in the job as spares: each waits in the job's admission queue as a joiner does
//    (Communicator::rejoin; its step() blocks there) and is admitted, with the joiners waiting there, when the grid
//    can widen by a whole row: at a step boundary when n + waiting gives a wider grid (another loss re-forms at
//    once when it happens in a step: the waiting ranks are drafted into that re-form). A spare keeps its world-rank
//    label. When the job ends, the grid's rank 0 (its trainer's destructor) refuses every rank still waiting
//    (Communicator::refuse_joiners): a spare's step() then returns a last, empty step that ends the epoch and its
//    completed_epochs() jumps to the job's epochs, so a `for` over epochs stops; its evaluate(), save_checkpoint()
//    and write_trace() do nothing. When the grid stops instead (its survivors cannot re-form, or fewer than min_ranks
//    are left), each of them refuses the waiting ranks as it stops (refuse_waiting_ranks), and a spare's step() fails
//    with kPeerFailure giving the survivors' reason within the store's poll (0.5 s); a rank leaving alone refuses
//    nobody. A spare waits at most ParallelConfig::spare_wait_ms (kTimeout after).
//  - Growth: at a step boundary (every join_poll_steps steps) the grid's rank 0 counts the waiting ranks (joiners and
//    spares, one queue) and the grid admits just enough of them (the oldest first) to fill whole rows -- a pipeline
//    1 x 2 with one joiner waits (3 ranks make no wider grid) and widens to 2 x 2 when a second one asks; the rest
//    keep waiting. The admitted ranks run the same re-form as after a loss (state assembled from one replica of each
//    stage, dealt out at the new grid), with the joiners' trainers mirroring it from their constructor
//    (ParallelConfig::joining over join_communicator's world, with the job's settings: the data-parallel width and
//    stage cut are the job's to choose).
//
// A lost worker absorbed (issues #13 and #17; absorbs_worker_loss in parallel_config.hpp): ps-async, ssp, asgd, easgd
// (both variants), fedavg and localsgd always -- a dead worker does not stop them -- and ps and ddp with elastic. The
// same membership as elastic DDP: one communicator of the trainer's own (with servers: over every rank, split from
// `world`) is shrunk to the survivors (Communicator::shrink, one decision through the store); every survivor then
// logs a warning naming the lost world rank(s) and how its strategy re-formed, and redoes the work it was in (its
// step from its own snapshot, or the collective). min_ranks counts every rank, servers included; below it every
// survivor stops as elastic DDP does (checkpoint, kPeerFailure naming the lost ranks). Per strategy:
//  - ps-async, ssp, ps: the servers drop the worker from the ranks they expect (ParameterServerSync::reform): its
//    pending pushes go, every clock now complete over the survivors is applied averaged over them, and ssp's bound
//    is evaluated over the live workers only (a clock completes when every live worker pushed it); every worker takes
//    the servers' newest parameters. A worker whose push of its step in flight was applied on every server counts
//    the step as done; the others redo it (ps-async: a redone step whose first push reached a server is applied
//    twice there -- one stale gradient, within its semantics). ps keeps DDP's average over the live workers.
//  - easgd asynchronous: the centre's server expects the survivors; an exchange cut by the loss is redone (the
//    centre may then take that worker's elastic move twice).
//  - localsgd, easgd (synchronous), asgd: each survivor goes on from its own state; an exchange that some survivor
//    completed with the old group before the loss runs locally on the survivors that redo that step, so the next
//    exchange is at the same step everywhere; EASGD's centre is taken from the survivor with the most steps; gossip
//    draws its matching over the survivors only, so it never pairs with the lost rank again.
//  - fedavg: the survivors adopt the global model of the one with the most rounds and redo the round in flight, its
//    sampled clients dealt over the survivors (the lost worker's clients are trained by the others).
//  - Data: except ddp and fedavg (which re-shard as above), each survivor keeps its own shard of the starting width;
//    the lost worker's shard is not trained any more. Learning rates are kept, except ddp, ps and ssp:
//    x dp'/dp (dp the workers the job started with; ps and ssp average dp' gradients per update, as DDP).
//  - A lost parameter server (ps, ps-async, ssp; ParallelConfig::server_replicas, param_server.hpp states the rule):
//    with a surviving replica, the backup server takes its shard over (values, optimizer state, clock) and the
//    workers re-route that key range to it (fail_over_servers in job.hpp: the job compiler's ownership, which job()
//    then shows); ps ends exactly where the uninterrupted run does. With no replica but an elastic_checkpoint on
//    disk, the next surviving server takes the range and every rank goes back to the checkpoint (load_checkpoint).
//    Otherwise every survivor stops with kPeerFailure naming the server and why; losing every server always stops
//    ("parameter server N (world rank R) was lost"). Synchronous ps without elastic stops naming the lost worker, as
//    DDP.
//  - A further loss during a re-form (issue #17): the parameter servers' re-form is a transaction
//    (ParameterServerSync::reform): every survivor's committed view -- membership, shard ownership, shard values,
//    optimizer state, clocks -- stays untouched until all of them have built the new one and voted; a rank lost before
//    that makes every survivor abandon the attempt, shrink again and re-form from the old view over the smaller
//    membership (both losses counted against it: a shard whose every copy is now gone stops every survivor naming it,
//    or comes back from elastic_checkpoint; below min_ranks the job stops with its checkpoint, as above). Each retry
//    removes a rank and is bounded by the communicator's deadline. A rank lost inside the vote itself can leave the
//    vote completed on some survivors and failed on others; a completed vote means every survivor had built the new
//    view, so those whose vote failed keep it aside and, right after the next shrink (settle_ps_view), adopt it when
//    any survivor committed (roll forward) or drop it when none did (roll back): one view again, then the re-form
//    for the new loss. A re-form that took shards from the checkpoint leaves a restore due until load_checkpoint
//    completes: a loss before that sends every rank back to the checkpoint again (the shards' values are not real).
//    Test hook: TANDEM_TEST_REFORM_LEAVE="rank:point" (parallel_trainer.cpp).
//  - An epoch's end: a loss in its closing collectives (sums, time split, evaluation) leaves the survivors at most one
//    collective apart; the ones cut off in a collective that others completed take its result from the lowest of
//    those (closing_plan and share_closing, the rule of elastic grids above; its sums then count the lost rank's
//    figures) and go on with the others. When those others had gone on into the next step, they were past the
//    checkpoint save between the epochs (a loss fails it, and they give it up: save_checkpoint), so the ranks that
//    took the result skip that save too. Any other mix stops every survivor with kPeerFailure naming the ranks.
//    Test hook points "summed", "timed", "evaluated" (tests/parallel/elastic_test.cpp).
//  - Limits: as elastic DDP. Async EASGD keeps no replica of its centre: a lost server's shard comes back from elastic_checkpoint (the centre cut again over the surviving
//    servers, job.hpp reshard_servers; every rank back to the checkpoint), else every survivor stops naming it.
//
// Results: step() reports this rank's view (loss only on the last stage; NaN elsewhere);
// train_epoch() and evaluate() reduce over all ranks, so every rank returns the global figures (train_epoch: NaN
// loss and accuracy when no sample was scored).
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/comm/communicator.hpp"
#include "engine/data/loader.hpp"
#include "engine/nn/model.hpp"
#include "engine/optim/optimizer.hpp"
#include "engine/optim/schedule.hpp"
#include "engine/parallel/averaging.hpp"
#include "engine/parallel/fedavg.hpp"
#include "engine/parallel/grad_reducer.hpp"
#include "engine/parallel/job.hpp"
#include "engine/parallel/param_server.hpp"
#include "engine/parallel/parallel_config.hpp"
#include "engine/parallel/schedule.hpp"
#include "engine/parallel/stage_executor.hpp"
#include "engine/parallel/step_trace.hpp"
#include "engine/train/checkpoint.hpp"
#include "engine/train/trainer.hpp"

namespace tandem::engine::parallel {

// Time split of an epoch: per step, averaged over the ranks (and the extremes over ranks).
struct EpochSplit {
  int64_t steps = 0;
  double step_s = 0, compute_s = 0, bubble_s = 0, comm_s = 0, data_s = 0, other_s = 0, allreduce_s = 0;
  double bubble_fraction = 0;      // bubble / step, mean over ranks
  double max_bubble_fraction = 0;  // the most idle rank's
};

class ParallelTrainer {
 public:
  // `model`, the datasets and `world` must outlive the trainer. `world` may be null for a single rank.
  // The trainer makes `model` hold only this rank's stage (nn::Model::hold): a stage never allocates the other
  // stages' parameters, gradients or optimizer state.
  ParallelTrainer(nn::Model& model, const data::Dataset& train, const data::Dataset* test, train::TrainerConfig config,
                  ParallelConfig parallel, comm::Communicator* world);
  ~ParallelTrainer();
  ParallelTrainer(const ParallelTrainer&) = delete;
  ParallelTrainer& operator=(const ParallelTrainer&) = delete;

  // One optimizer step on the next batch (every rank calls it the same number of times).
  train::StepResult step();
  // The rest of the epoch, then evaluation on the test set; figures are global (reduced over ranks).
  train::EpochResult train_epoch(const train::ProgressFn& progress = {});
  // Collective evaluation: each replica scores its share (samples i with i % dp == replica) through
  // its pipeline; loss and accuracy are over all of them. limit_batches: per replica (-1: config).
  train::EvalResult evaluate(const data::Dataset& data, int64_t limit_batches = -1);

  // Collective: replica 0's stages send their slices to rank 0, which writes one checkpoint of the
  // whole model (train::Trainer's format plus a "parallel" record) atomically; every rank learns
  // whether it worked.
  // Resuming at any dp' x pp': every rank takes its new stage's slices of the whole-model parameters, buffers and
  // optimizer state (momentum, Adam moments follow their parameter to the new stage cut), and the sampler keeps the
  // global sample position (train::reshard_sampler): with the same global batch (batch x dp x accumulation) the
  // resumed run sees the samples, and reaches the parameters, of the uninterrupted one up to float rounding (the
  // reduction order changes with the grid). Strategies: single, ddp, pipeline, hybrid, ps and ssp change dp and pp
  // freely (parameter servers take their shards of the whole-model state, any number of servers); fedavg changes
  // the number of workers when its clients stay the same; localsgd, easgd, asgd (each worker's own state) and
  // ps-async (one update per push) refuse another dp with kInvalidArgument naming the reason.
  // Elastic or absorbing, without parameter servers: a rank lost during the save fails none of the survivors here
  // (see the .cpp); they re-form at their next collective, and the file holds this step or, when the loss came before
  // rank 0 wrote, an earlier one.
  void save_checkpoint(const std::string& path);
  // Every rank reads the file and takes its stage's share; then the ranks check they agree.
  void load_checkpoint(const std::string& path);
  // Collective: rank 0 writes one Chrome trace with every rank's spans (needs config.trace).
  void write_trace(const std::string& path);
  // Leaves the job at once: aborts this rank's communicators (the others see it leave, as they see a killed
  // process's transport close, and absorb or report the loss) so that nothing collective is left to do -- the
  // destructor then skips the parameter servers' sync point. For tests of the survivors and a rank that must stop.
  void abandon() noexcept;

  const Grid& grid() const noexcept { return grid_; }
  const ParallelConfig& parallel_config() const noexcept { return pc_; }
  const train::TrainerConfig& config() const noexcept { return config_; }
  // fp16 loss scaling (config.loss_scale): the scale and the steps skipped, the same on every rank.
  const train::LossScaler& loss_scaler() const noexcept { return scaler_; }
  // The job this trainer executes, compiled once (engine/parallel/job.hpp): the simulator times the same object.
  const CompiledJob& job() const noexcept { return job_; }
  int64_t train_samples() const noexcept { return train_.size(); }  // the whole training set (every rank's)
  // The data sets this rank holds: the training and test sets it was given and its FedAvg clients' subsets
  // (rank_data_bytes in job.hpp describes it for the simulator).
  double data_bytes() const noexcept;
  const std::vector<int32_t>& boundaries() const noexcept { return job_.boundaries; }
  // "stage 0: layers [0, 6) conv1..relu2 (12.4 MFLOP/sample, 2.6k params) | stage 1: ..."
  std::string describe_partition() const { return job_.describe_partition(); }
  const PipelinePlan& plan() const noexcept { return job_.pipeline; }
  int64_t completed_epochs() const noexcept { return completed_epochs_; }
  int64_t global_step() const noexcept { return optimizer_->steps(); }
  int64_t batches_per_epoch() const;
  // Time split of the last train_epoch (collective figures, the same on every rank).
  const EpochSplit& last_split() const noexcept { return last_split_; }
  // This rank's accumulated split since construction (or reset_split()).
  const TimeSplit& local_split() const noexcept { return local_; }
  void reset_split() { local_ = TimeSplit{}; }
  nn::Model& model() noexcept { return model_; }
  optim::Optimizer& optimizer() noexcept { return *optimizer_; }
  Tracer& tracer() noexcept { return tracer_; }
  // The averaging strategies' exchange (null for the others), and how the last FedAvg round closed.
  const StepSync* step_sync() const noexcept { return sync_.get(); }
  const RoundOutcome& last_round() const noexcept { return last_round_; }
  // ps, ps-async, ssp, asynchronous easgd: this rank's side of the servers (worker or server); null otherwise.
  const ParameterServerSync* param_server() const noexcept { return ps_.get(); }
  // Elastic: the world ranks still training (index: this trainer's rank now), those lost (in the order they were
  // found dead), and the learning-rate factor dp' / dp now applied.
  const std::vector<int>& members() const noexcept { return members_; }
  const std::vector<int>& lost_ranks() const noexcept { return lost_; }
  double lr_scale() const noexcept { return lr_scale_; }
  // The last admission of joiners on this rank: ms from the agreement to the grown group's first step (-1: none).
  double last_admission_ms() const noexcept { return last_admission_ms_; }
  int world_rank() const noexcept {
    return spare_ ? spare_label_ : members_.empty() ? grid_.rank : members_[static_cast<size_t>(grid_.rank)];
  }
  // Elastic pipeline/hybrid: this rank has no place in the grid and waits as a spare (grid().rank is then -1).
  bool spare() const noexcept { return spare_; }
  // This replica's position in its shard of the current epoch (samples taken).
  int64_t sample_position() const noexcept { return sampler_.position(); }

 private:
  // Runs f; a failure other than a bad argument aborts this rank's communicators with its reason, so
  // ranks waiting for this one fail at once and name where it started, instead of timing out.
  template <typename F>
  auto failing_loudly(F&& f) -> decltype(f());
  // A communicator's failure text with its group ranks turned into world ranks ("world rank 2").
  std::string in_world_ranks(const std::string& message) const;
  train::TrainingIdentity identity() const;
  bool parameter_server() const noexcept;  // ps, ps-async, ssp, or easgd with easgd_async: ranks with servers
  bool elastic_centre() const noexcept;    // easgd with easgd_async: the centre variable on the servers
  train::StepResult step_impl();
  // ---- issue #17: elastic DDP ----
  // The collective work elastic_retry guards: survivors must have been in the same one (or in the step that the
  // authoritative survivor completed) to re-form.
  enum class Phase : int64_t { kStep = 1, kEpochSums = 2, kSplit = 3, kEvaluate = 4, kSyncPoint = 5 };
  // Runs f; when elastic and f fails because a peer is gone, shrinks, adopts the consistent state and runs f again
  // (a step that the authoritative survivor completed is not redone: step() returns it as done, without a loss).
  template <typename F>
  auto elastic_retry(Phase phase, F&& f) -> decltype(f());
  void take_snapshot();
  // reshard: continue the epoch's global order over the new width (ddp, fedavg); else keep this rank's shard.
  void restore_snapshot(bool reshard);
  // Returns true when this rank's step in flight was completed (by the others, or by the servers).
  bool recover(Phase phase, const std::string& why);
  // The trainer's own communicator (null when it has none): the one a failure shows on and that shrinks.
  comm::Communicator* trainer_comm() const noexcept;
  // Throws, naming why, when this rank's program aborted the trainer's communicator (elastic_retry recovers no peer).
  void stop_if_stopped_here(const Error& e) const;
  // A job that never checks for joiners closes its store to them (rank 0): `tandem launch --join` is refused at once,
  // naming why, instead of waiting for an admission no step boundary makes.
  void close_to_joiners();
  // recover, below min_ranks: true when the job's training is done on every survivor (collective over them): each is
  // past the steps of the job's last epoch (config.epochs) -- in its closing collectives (phase), or its last step was
  // completed by the others (step_done). A loss there does not fail the job: its evaluation and save go on.
  bool training_done(Phase phase, bool step_done);
  // Shrinks it to the survivors and updates members, lost ranks and the grid (with servers: count_servers after).
  void shrink_group(const std::string& why);
  // With servers, right after shrink_group (collective over the survivors): the outcome of a re-form whose vote a
  // loss cut short on some ranks (ParameterServerSync::reform) is settled -- when any survivor committed it, the
  // ranks that kept its view aside adopt it (roll forward), else they drop it -- so every survivor holds one view.
  // Returns true when the adopted re-form completed this rank's step in flight. A survivor more than one re-form
  // behind, or one behind without the view: kPeerFailure naming the ranks. An admission of workers cut short
  // (admit_workers) is settled the same way: when a survivor committed it, the ranks whose vote failed adopt the grown
  // view they built; when none did, every survivor puts back the trainer's state from before it (admission_undo_)
  // and the servers' old view, and the re-form that follows starts from there.
  bool settle_ps_view(const std::string& why);
  // With servers, after settle_ps_view (collective over the survivors): every survivor must hold the same committed
  // view of the servers: kPeerFailure naming the ranks otherwise (a guard: settle_ps_view makes them one).
  void check_ps_views(const std::string& why);
  // With servers: the servers left (kept_servers_) and the grid's split; a lost last server stops the job.
  void count_servers(const std::string& why, const std::vector<int>& before);
  // The survivors' agreement after a shrink (`before`: the members before it), strategy by strategy. First the
  // epoch's closing collectives (closing_plan): ranks cut off in one that others completed take its result and are
  // held to nothing more. Of the rest, the non-adopting strategies (the ps family, localsgd, easgd, asgd) go on from
  // where each rank was, so past the epoch's sums every rank must redo the same phase, else the job stops ("cannot
  // re-form"); ddp and fedavg take the state of the rank furthest on, at most one step ahead.
  bool reform(Phase phase, const std::string& why, const std::vector<int>& before);
  // "world rank 5", or "world rank 5 (server 1)" for a parameter server.
  std::string rank_label(int world_rank) const;
  train::EvalResult evaluate_impl(const data::Dataset& data, int64_t limit_batches);
  // growing: the width-dependent fields (dp, steps per epoch) are left out (a joiner's and the job's differ).
  void agree_on_settings(bool growing = false);
  // ---- issue #17: growth (elastic_grow.cpp) ----
  bool grows() const noexcept;  // elastic ddp at pp = 1 with a group to grow
  // At a step boundary: admits waiting joiners (every join_poll_steps steps), re-forms the group over old + new.
  void maybe_admit();
  bool admit();  // one admission; false when nobody came in
  // Both sides of an admission, after the group is re-formed: labels, the job's starting width, rank 0's state.
  // from[i]: the rank that new rank i had in the trainer's communicator before (-1: a joiner); empty: the old ranks
  // first, in their order.
  // old_labels: the labels of the ranks `from` points into (default members_).
  void share_grown_state(const std::vector<int>& from = {}, const std::vector<int>* old_labels = nullptr);
  // The grown world's labels: from[i] >= 0 keeps old_labels[from[i]]; joiners take the next numbers after every
  // rank the job ever had (rank 0's rule, which every old rank computes alike).
  std::vector<int> grown_labels(const std::vector<int>& from, const std::vector<int>& old_labels) const;
  // ---- issue #17: parameter-server jobs that grow by workers (elastic_grow.cpp) ----
  bool grows_workers() const noexcept;  // elastic ps, ps-async, ssp with the trainer's own communicator
  bool admit_workers();  // one admission of workers; false when nobody came in (or the joiners were refused)
  // Collective over the grown world (old ranks first, joiners after): the world reordered workers first -- old
  // workers, joiners, then the servers with their indices -- a split whose keys every rank knows alone (a joiner, an
  // old worker or a server), so it is the first thing done on the grown world (admit_workers' transaction runs on
  // what it returns).
  std::unique_ptr<comm::Communicator> split_workers_first(comm::Communicator& grown) const;
  // Collective over that reordered world: rank 0's shape (W workers, S servers) and the ownership of the shards
  // (ownership_): rank 0's, checked against every old rank's (kMismatch on every rank when one differs). from: as
  // above.
  void share_ownership(comm::Communicator& reordered, std::vector<int>& from);
  // The job compiled at the grown width over the servers running now, with the ownership shared above.
  CompiledJob compile_grown(Job job) const;
  // Every rank takes `root`'s snapshot (progress, parameters, buffers, optimizer state) and re-shards the sampler.
  void adopt_state(int root);
  // ps, ssp: dp' / dp (the servers average dp' gradients per update: DDP's rule, after growth and loss alike);
  // ps-async: 1 (an update takes one worker's gradient, whose batch does not change).
  double workers_lr_scale() const noexcept;
  // Checkpoints after a grow or shrink (save_checkpoint, load_checkpoint): ps-async's server update count (collective;
  // -1 for other strategies) and the width the learning-rate rule counts from, taken back at the same width.
  int64_t saved_server_updates();
  // save_checkpoint's collective body (every rank; rank 0 writes, checkpoint_written_ says it did).
  void write_checkpoint(const std::string& path);
  void restore_lr_base(int64_t lr_base_dp);
  // ---- issue #17: pipeline and hybrid grids re-formed after a loss (elastic_reform.cpp) ----
  bool reforms_grid() const noexcept;  // elastic pipeline or hybrid
  // f failed with a peer gone: aborts the stage and replica groups (whoever waits on this rank there fails at once)
  // and returns whether the trainer's own communicator failed (probed with a barrier when it looks healthy).
  bool probe_loss(const std::string& why);
  // After shrink_group: the survivors assemble the whole model at the newest common step and re-form the grid.
  // phase: the work this rank was cut off in (the survivors draft waiting ranks only when all were in a step).
  bool reform_grid(const std::string& why, Phase phase);
  // form_grid and reform at an epoch's end: checks that the survivors (`all`: `width` values per rank, as they gather
  // them) are at most one closing collective apart and returns the lowest rank whose result the ones behind take
  // (-1: none behind); kPeerFailure naming the rank otherwise.
  int closing_plan(const std::string& why, const std::vector<int64_t>& all, size_t width, const std::vector<int>& labels,
                   int64_t P) const;
  static const char* phase_name(Phase p);
  // closings_ as this rank gives it to closing_plan's table; one fewer on the world rank TANDEM_TEST_CLOSINGS_BEHIND
  // names (a test hook: a mix the survivors cannot reconcile, closing_plan's stop).
  int64_t closings_reported() const;
  // Collective over S after closing_plan: rank `from` (world rank from_label, now in from_phase) sends the result of
  // the closing collective it completed; a rank that `adopts` (it was cut off in it, in `phase`) keeps it in
  // adopted_closing_.
  void share_closing(comm::Communicator& S, int from, bool adopts, Phase phase, int from_label, Phase from_phase);
  // The survivors decided together that the job stops (a re-form they cannot make, or fewer than min_ranks left):
  // every rank waiting to join or to be drafted (a spare) is refused at once with kJobStopped and `why` (a spare then
  // fails with kPeerFailure naming it) instead of waiting out spare_wait_ms. Not on a rank that leaves alone (abandon,
  // or its own error): the others may go on and draft the waiting ranks.
  void refuse_waiting_ranks(const std::string& why) noexcept;
  static constexpr const char* kJobStopped = "the job stopped";
  bool refused_ = false;  // refuse_waiting_ranks ran (the destructor then refuses nobody "the job ended")
  // This rank completed the closing collective `phase` (or took its result at a re-form) with `result`.
  void closed(Phase phase, std::vector<double> result);
  // The constructor's grid-dependent steps again, on world_, at pp stages.
  void regrid(int pp);
  // ---- issue #17: pipeline and hybrid grids that grow, and their spares (elastic_reform.cpp, elastic_grow.cpp) ----
  // Collective over S = own_comm_ (ranks holding state first, then joiners/spares admitted into it): the job's head
  // and settings, the newest common step, each stage's slice assembled on rank 0 and dealt out at grid_for(S);
  // ranks without a place become spares. draft: waiting ranks may be admitted first (a re-form after a loss).
  void form_grid(const std::string& why, bool draft);
  // The grown world (old ranks: own_comm_->grow's; a joiner: its constructor's `world`; a spare: rejoin's): the
  // trainer's own communicator is split from it, then form_grid.
  void enter_grown(std::unique_ptr<comm::Communicator> grown, comm::Communicator* borrowed);
  bool grows_grid() const noexcept;  // elastic pipeline/hybrid with a grid (not a spare)
  // How many waiting ranks to admit into `n` grid ranks (0: no wider grid).
  int to_draft(int n, int64_t waiting) const;
  // A spare's step(): waits in the admission queue; true when drafted into the grid, false when the job ended.
  bool wait_as_spare();
  void become_spare(comm::Communicator* via);
  void attach_reducer();
  bool admit_grid(int k);  // a step boundary: admits k waiting ranks and re-forms the grid (false: nobody came in)
  // The job's head from rank 0 of own_comm_ (widths, elastic bounds, launch depth, the stage cut, the strategy, the
  // depth of the grid that holds the state) and every rank's world-rank label (joiners get new ones).
  std::vector<int> share_grid_head(int& old_pp);
  std::vector<double> measure_layer_costs();
  void broadcast_replica_state();
  void begin_epoch_if_needed();
  bool epoch_exhausted() const;
  // After a step: when the epoch is exhausted, counts it done and stops the loader thread (an epoch cut short by
  // limit_batches would otherwise keep assembling the rest of the sampler's epoch). True when it did.
  bool end_epoch_if_exhausted();
  std::vector<MicroBatch> make_micro_batches(const data::Batch& b, int count, std::vector<Tensor>& keep);
  void optimizer_step();
  // fp16 loss scaling: this rank's "found non-finite" flag combined over every rank of the job (one all-reduce of
  // the flag over world_, the step's kAgreeFinite): the same skip-or-step decision everywhere.
  bool agree_nonfinite(bool local);
  std::vector<double> allreduce_sum(std::vector<double> v);
  EpochSplit reduce_split(const TimeSplit& s);
  // ---- issue #13: the averaging family ----
  void setup_strategy();
  train::StepResult fedavg_round();
  // Runs f with the strategy's model (EASGD's centre, the workers' mean) in place of this replica's own.
  template <typename F>
  auto with_consensus(F&& f) -> decltype(f());
  void save_replicas(train::Checkpoint* ck);           // collective over the workers; ck non-null on rank 0
  void load_replica(const train::Checkpoint& ck, const std::string& path);
  // Throws kInvalidArgument naming the reason when this run cannot resume a checkpoint of `saved_dp` workers.
  void check_resharding(const train::Checkpoint& ck, int saved_dp) const;
  // Collective over the world: kInvalidArgument on every rank, naming the step and the lowest world rank, when any
  // rank holds non-finite parameters (a diverged run: the checkpoint at `path` is not overwritten).
  void refuse_diverged(const std::string& path);
  // FedAvg resumed with another client split (clients, Dirichlet alpha, seed) than it was written with: refused.
  void check_client_split(const train::Checkpoint& ck) const;

  nn::Model& model_;
  const data::Dataset& train_;
  const data::Dataset* test_;
  train::TrainerConfig config_;
  ParallelConfig pc_;
  comm::Communicator* world_;
  Grid grid_;
  CompiledJob job_;
  int32_t first_ = 0, end_ = 0;
  std::unique_ptr<comm::Communicator> pipe_comm_, dp_comm_;
  Tracer tracer_;
  data::DistributedSampler sampler_;
  std::unique_ptr<data::Loader> loader_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  optim::ScheduleConfig schedule_;
  Rng rng_;
  train::LossScaler scaler_;  // fp16 loss scaling (off unless config_.loss_scale asks)
  bool last_skipped_ = false;
  int64_t scaled_steps_ = 0;  // optimizer steps run under loss scaling, skipped ones counted (the test hook's clock)
  std::unique_ptr<GradientReducer> reducer_;
  std::unique_ptr<ParameterServerSync> ps_;  // ps, ps-async, ssp (before executor_, which points at it)
  std::unique_ptr<StageExecutor> executor_;
  int64_t completed_epochs_ = 0;
  // ---- issue #13: the averaging family ----
  std::unique_ptr<ReplicaState> replica_;
  std::unique_ptr<StepSync> sync_;
  std::vector<data::Dataset> clients_;  // fedavg: each client's shard of the training set
  std::unique_ptr<RoundExchange> rounds_;
  RoundOutcome last_round_;
  TimeSplit local_;
  EpochSplit last_split_;
  // Elastic (every strategy that re-forms): the closing collectives (epoch sums, time split, evaluation) this rank
  // completed, the last one's phase and result (at most kClosedResult values), and a result taken at a re-form from a
  // rank that completed the one this rank was cut off in (reform, form_grid; the collective's lambda returns it
  // instead of running it). skip_save_: that rank had gone on into a step, so the next save_checkpoint before a step
  // does nothing here (share_closing).
  static constexpr size_t kClosedResult = 10;
  static constexpr size_t kPlanWidth = 6;  // closing_plan's table: values per rank
  bool skip_save_ = false;
  int64_t closings_ = 0;
  Phase closed_phase_ = Phase::kStep;
  std::vector<double> closed_result_;
  std::optional<std::vector<double>> adopted_closing_;
  Phase reform_phase_ = Phase::kStep;  // reform_grid -> form_grid: the work this rank was cut off in
  // ---- issue #17: elastic DDP (world_ then points at dp_comm_, the trainer's own communicator) ----
  // train_epoch's figures so far: what this rank's last stage scored (loss sum, hits, samples). Kept by the trainer and
  // in every step snapshot, so a re-form's roll-back takes them back with the step and carries them over
  // (form_grid: summed over the survivors, held by one rank of the new grid).
  struct EpochFigures {
    double loss_sum = 0;
    int64_t correct = 0, scored = 0;
  };
  EpochFigures figures_;
  struct Snapshot {
    std::vector<float> params, buffers;
    std::vector<std::vector<float>> state;  // the optimizer's state tensors
    bool whole = true;  // parameters and optimizer state kept (not with parameter servers)
    int64_t steps = 0, completed_epochs = 0;
    data::SamplerState sampler;
    int sampler_world = 1;
    // Samples of the epoch taken over all replicas when known exactly (a re-shard's g, until the next step), else
    // -1 (then position x sampler_world): two admissions at one step boundary (2 -> 3 -> 4) re-shard as one.
    int64_t taken = -1;
    Rng::State rng{};
    EpochFigures figures;
  };
  Snapshot snapshot_;
  Snapshot prev_snapshot_;  // elastic pipeline/hybrid: the snapshot before (a rank may be one step ahead)
  bool has_prev_ = false;
  bool snapshot_valid_ = false;
  int64_t progress_of(const Snapshot& s) const noexcept;
  std::unique_ptr<comm::Communicator> own_comm_;  // parameter servers absorbing a loss: the trainer's own, every rank
  // Buffers of operations in flight on retired communicators: declared before them, so destroyed after them.
  std::vector<std::shared_ptr<void>> retired_buffers_;
  std::vector<std::unique_ptr<comm::Communicator>> retired_;  // failed communicators, kept until the trainer dies
  std::vector<int> members_;  // world ranks alive, by current rank
  std::vector<int> kept_servers_;
  // Parameter servers: the world-rank labels (workers, then servers) in the numbering of the servers' last completed
  // construction, re-form or growth, and its workers; set by note_ps_membership. A shrink maps the survivors into it.
  std::vector<int> ps_labels_;
  int ps_workers_ = 0;
  std::vector<int> ps_voting_labels_;  // the same for the re-form being voted on (settle_ps_view adopts them)
  int ps_voting_workers_ = 0;
  // TANDEM_TEST_REFORM_LEAVE at `point` (parallel_trainer.cpp): this rank leaves the job there (abandon, kInternal),
  // or, at "voted" above the leaving rank, sees its vote cut off by that loss (the error of the loss).
  void reform_test_point(const char* point);
  bool leave_hook_ = false;  // TANDEM_TEST_REFORM_LEAVE is set (read once, at construction)
  // TANDEM_TEST_SAVE_FAULT (parallel_trainer.cpp): at the start of write_checkpoint, this rank leaves the job or
  // stalls when the hook names it and this save; saves_ counts this trainer's saves.
  void save_test_fault();
  int64_t saves_ = 0;
  void note_ps_membership();  // after a shrink with servers: the index each surviving server had before it
  std::vector<int> lost_;
  // The step at which a shrink last kept every rank (recover: a timeout with nobody lost); a second one at the same
  // step stops the job with the timeout rather than re-form again (-1: none yet).
  int64_t kept_all_step_ = -1;
  int initial_dp_ = 1;
  int initial_world_ = 1;
  int sampler_dp_ = 1;      // the width the sampler's shards were cut for
  bool absorbing_ = false;  // absorbs_worker_loss(pc_) with a communicator to shrink
  double lr_scale_ = 1.0;
  int64_t schedule_epoch_steps_ = 0;  // the epoch length schedule_ was laid out with (the job's starting width)
  std::unique_ptr<comm::Communicator> grown_;  // the grown world after an admission (dp_comm_ is split from it)
  SyncProgram ownership_;  // growing with servers: the running job's servers, replicas, shards and pieces (rank 0's)
  int64_t poll_from_ = 0;  // parameter servers: no poll for joiners before this step (re-aligned after a loss)
  double last_admission_ms_ = -1;
  // ---- issue #17: grids that grow, spares ----
  int launch_pp_ = 1;                 // the depth the job was launched with (grid_for's pp0)
  Strategy launch_strategy_ = Strategy::kSingle;
  bool spare_ = false;
  bool released_ = false;             // a spare the job refused (it ended): step() returns at once from then on
  int spare_label_ = -1;              // a spare's world-rank label (kept when it is drafted)
  comm::Communicator* spare_via_ = nullptr;  // the communicator a spare rejoins through (in retired_)
  // The last re-shard's exact g, valid while the sampler stays at (taken_epoch_, taken_position_).
  int64_t taken_ = -1, taken_epoch_ = -1, taken_position_ = -1;
  // An admission of workers in progress (admit_workers, from the reordered world until the servers' commit): the
  // trainer's state before it, which settle_ps_view puts back when no survivor committed the admission.
  struct AdmissionUndo {
    Grid grid;
    train::TrainerConfig config;
    CompiledJob job;
    ParallelConfig pc;
    int initial_dp = 1, initial_world = 1, sampler_dp = 1, ps_workers = 0;
    int64_t schedule_epoch_steps = 0, taken = -1, taken_epoch = -1, taken_position = -1;
    optim::ScheduleConfig schedule;
    double lr_scale = 1.0;
    Snapshot snapshot;
    data::DistributedSampler sampler;
    std::vector<int> ps_labels;
    SyncProgram ownership;
  };
  std::unique_ptr<AdmissionUndo> admission_undo_;
  // Who reports an epoch (issue #17): the rank that is rank 0 when the epoch closes. reported_epoch_: the last epoch
  // this rank closed as rank 0. It says so in its standing note ("reported=<epoch>", Communicator::set_note) before
  // the epoch's result goes to its program, and again when it leaves a failed communicator (the destructor,
  // Communicator::leave); survivors that count it out -- orderly or killed by a signal -- keep the highest they read
  // in reported_elsewhere_ (shrink_group), so an epoch whose reporter went after reporting it is not reported again.
  int64_t reported_epoch_ = 0;
  int64_t reported_elsewhere_ = 0;
  // Fewer than min_ranks left after a loss in the job's last epoch's closing collectives: the job's training is done,
  // so the survivors finish its evaluation and save; this stop (the message) is raised at any further step.
  std::string finished_below_min_;
  bool checkpoint_written_ = false;  // write_checkpoint: this rank wrote the file in the last save
  bool save_given_up_ = false;  // save_checkpoint: the last save met a lost rank and was given up (absorbing)
  bool left_admission_ = false;  // admit_workers: cut off inside the grown world's split, this rank leaves the job
  void undo_admission();  // puts admission_undo_ back (the grid's world and rank stay the communicator's)
};

}  // namespace tandem::engine::parallel
