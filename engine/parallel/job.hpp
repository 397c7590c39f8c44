#pragma once
// The job compiler: the one place where a training job -- model, strategy and grid, schedule,
// micro-batches, gradient buckets, all-reduce algorithm and chunk, compression, optimizer -- turns
// into what is executed. compile_job() yields a CompiledJob: the stage cut, the pipeline plan every
// stage runs (its ops: compute, sends, receives, bucket all-reduces, optimizer), the bucket layout
// with the collective plan request of each bucket, the bytes that cross each cut and each stage's
// memory footprint. The parallel trainer executes a CompiledJob on real transports; the simulator
// times the very same object on a modelled cluster (simulator/simulate.hpp), so a prediction is
// simulate(cluster, trainer.job()) and nothing about a job is derived in two places.
//
// The grid: world = dp * pp ranks; rank r holds pipeline stage r % pp of replica r / pp (Grid).
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "engine/comm/plan.hpp"
#include "engine/nn/model_spec.hpp"
#include "engine/optim/optimizer.hpp"
#include "engine/parallel/parallel_config.hpp"
#include "engine/parallel/schedule.hpp"

namespace tandem::engine::train {
struct TrainingFootprint;  // engine/train/memory_guard.hpp
}  // namespace tandem::engine::train

namespace tandem::engine::parallel {

// Memory options of a job (issue #16). The runtime trains in f32 and keeps every activation; these describe how
// other frameworks (or a future Tandem) train, so the memory model -- and the simulator's fit verdict -- covers them.
enum class Precision : int32_t {
  kF32 = 0,   // parameters, gradients and activations in f32
  kBF16 = 1,  // mixed precision: bf16 working weights, gradients and activations; f32 master weights
  kF16 = 2,   // the same with fp16
};
const char* precision_name(Precision p) noexcept;  // "f32", "bf16", "fp16"
Precision parse_precision(std::string_view s);     // "f32"/"fp32", "bf16", "fp16"/"f16"; else kInvalidArgument

enum class Recompute : int32_t {
  kNone = 0,         // every layer's output kept for backward
  kStageInputs = 1,  // activation checkpointing: only each micro-batch's stage input kept, the stage's forward
                     // run again during backward
  kEveryK = 2,       // the output of every k-th layer kept (recompute_every), each segment recomputed in backward
};

struct MemoryConfig {
  Precision precision = Precision::kF32;
  Recompute recompute = Recompute::kNone;
  int32_t recompute_every = 0;  // kEveryK: k >= 1
  // ZeRO-style sharding over each stage's data-parallel group: 1 shards the optimizer state (and under mixed
  // precision the f32 master weights, which belong to it), 2 the gradients too. Bucket all-reduce exchanges only;
  // the traffic stays that of the all-reduce (reduce-scatter + all-gather move the same bytes).
  int32_t zero = 0;
};
// "none", "stage" (kStageInputs) or a layer count k >= 1 (kEveryK) into m.recompute and m.recompute_every.
void parse_recompute(std::string_view s, MemoryConfig& m);
// "precision bf16, recompute every 2 layers, zero 1" ("" for the defaults).
std::string describe(const MemoryConfig& m);

struct Job {
  nn::ModelSpec model;
  int64_t batch = 64;        // samples per replica per loader batch; an optimizer step takes `accumulation` of them
  ParallelConfig parallel;   // strategy, grid, micro-batches, schedule, bucket size, compression, accumulation, cut
  comm::Algorithm algorithm = comm::Algorithm::kAuto;  // the gradient buckets' all-reduce
  uint64_t chunk_bytes = 0;  // its pipelining chunk; 0: the communicator's default
  optim::OptimizerConfig optimizer;
  bool overlap = true;       // all-reduce buckets while backward runs (else after it)
  MemoryConfig memory;       // precision, recomputation, sharding (the runtime's own: the defaults)
  // fp16 loss scaling (train::LossScaler): before every optimizer step each rank unscales its gradients (a pass
  // over them: scale, then sum of squares) and the whole world all-reduces one found-non-finite flag
  // (CompiledJob::agree_finite), so that every rank steps or skips together -- a meeting of all ranks.
  bool loss_scaling = false;
  // The data loader's batches assembled ahead by its thread (train::TrainerConfig::prefetch, data::LoaderOptions; in
  // [0, 64]): every worker holds them beside the batch it trains (StageMemory::loader_bytes).
  int32_t prefetch = 2;
  // The training set an epoch draws from, in samples (every replica its shard: DistributedSampler, ceil(samples / dp)
  // with the last ones wrapped around), and the loader batches per replica per epoch the trainer runs (its
  // limit_batches; 0: the whole shard). With them the compiler knows whether an epoch ends with a short batch
  // (CompiledJob::short_batch) -- a second batch shape whose primitives the cpu backend builds beside the full
  // batch's (StageMemory::short_batch_bytes). 0 samples: not known, nothing charged.
  int64_t train_samples = 0;
  int64_t limit_batches = 0;
};

// What one rank of a stage holds, from the layer specs (every replica of a stage holds the same).
// With P the stage's parameters, D its data-parallel group, h = 2 under mixed precision (else 4):
//   param_bytes      h * P                    (the working weights)
//   grad_bytes       h * P, or h * ceil(P / D) with zero 2
//   optimizer_bytes  (s + m) * P, or (s + m) * ceil(P / D) with zero >= 1; s the optimizer's state per
//                    parameter, m = 4 (f32 master weights) under mixed precision, else 0
//   activation_bytes see stage_memory() in job.cpp: h/4 of the f32 outputs that have storage of their own
//                    (ModelSpec::stored_activation_bytes: not in-place ReLUs, flatten views), fewer under recomputation
// and what Tandem's cpu backend (oneDNN) holds on top, from the stage's shapes (engine/nn/cpu_storage.hpp), not in
// total(): the runtime's memory guard charges them (engine/train/memory_guard.hpp), and the simulator for a Tandem
// rank on a CPU node (simulator/simulate.hpp: its profile-less figure; a profile's measured peak and runtime size
// already hold them):
//   layout_bytes       the same outputs as that backend stores them (nn::cpu_stored_output_bytes: channels padded
//                      to 16, max-pool argmax workspaces) less activation_bytes's figure of them (the input unpadded)
//   scratch_bytes      h/4 x 2 x the stage's largest stored output x micro_batch (backward's output and input gradients)
//   conv_scratch_bytes h/4 x 2 x the stage's largest convolution weights (its weight gradient and reordered copy)
//   conv_copy_bytes    h/4 x 1.2 x the stage's convolution weights (reordered into blocked formats; the runtime's
//                      resident size after its first step holds them, hence a profile's runtime_rss_bytes)
// and in host memory, charged by the guard and, for a Tandem rank on a CPU node, by the simulator (with the rank's
// data sets), also not in total():
//   loader_bytes       data::loader_bytes(step batch, job.prefetch, input size): the loader's batches assembled
//                      ahead of the one being trained (its queue and its thread's next; none with prefetch 0) and
//                      the evaluation's batch beside the training's memory
//   short_batch_bytes  what the backend keeps resident for the primitives of the epoch's short last batch, a second
//                      batch shape (nn::cpu_primitive_bytes of the stage's layers at short_micro_batch; 0 when every
//                      batch is whole): oneDNN's kernels, scratchpads and reordered weights for that shape, kept
//                      for the rest of the run once built. Charged by the guard and the simulator with the runtime.
// A Tandem cpu rank's activation peak is nn::kCpuActivationOverhead x (activation_bytes + layout_bytes) + scratch_bytes
// + conv_scratch_bytes (cpu_activation_peak_bytes()).
struct StageMemory {
  double param_bytes = 0;       // parameters of the stage's layers
  double grad_bytes = 0;        // their gradients
  double optimizer_bytes = 0;   // optimizer state (momentum: 4 bytes per parameter, Adam: 8; + master weights)
  double activation_bytes = 0;  // outputs kept for backward, of the samples in flight, plus the stage's input
  double bucket_bytes = 0;      // data parallelism: the bucket in flight and its receive scratch, plus every
                                // bucket's 16-bit wire copy under compression (kept until the optimizer step)
  int64_t samples_in_flight = 0;  // samples whose activations are alive at once (GPipe: all; 1F1B: S - s
                                  // micro-batches at most)
  int64_t micro_batch = 0;        // the largest micro-batch
  double layout_bytes = 0;        // cpu backend: padding and max-pool workspaces of the activations counted above
  double scratch_bytes = 0;       // cpu backend: backward's scratch of the largest layer
  double conv_scratch_bytes = 0;  // cpu backend: the largest convolution's weight-gradient scratch
  double conv_copy_bytes = 0;     // cpu backend: the convolutions' reordered weights
  double loader_bytes = 0;        // host: the loaders' batches beside the trained one (0 for a server)
  int64_t short_micro_batch = 0;  // the largest micro-batch of the epoch's short last batch (0: none)
  double short_batch_bytes = 0;   // cpu backend: that shape's primitives (0: none)
  double total() const noexcept { return param_bytes + grad_bytes + optimizer_bytes + activation_bytes + bucket_bytes; }
  // What a Tandem rank on the cpu backend holds at its step's peak for its activations (see above).
  double cpu_activation_peak_bytes() const noexcept;
};

struct StageProgram {
  int32_t stage = 0;
  int32_t first_layer = 0, end_layer = 0;  // layers [first_layer, end_layer)
  // One request per bucket of pipeline.stage_plans[stage].buckets, over the stage's data-parallel group
  // (world = dp). The topology is left empty: the runtime's communicator knows its hosts, the
  // simulator fills in the cluster's.
  std::vector<comm::PlanRequest> bucket_allreduces;
  StageMemory memory;
};

// The runtime memory guard's footprint of a rank of stage `s` (engine/train/memory_guard.hpp): the stage's layers
// and every StageMemory figure the guard charges, with `optimizer_state_bytes_per_param` of optimizer state still to
// allocate. ParallelTrainer checks it before its first step; the memory tests compare it with the simulator's figures.
train::TrainingFootprint training_footprint(const StageProgram& s, double optimizer_state_bytes_per_param);

// The step program of the strategies of issue #13, beside (or instead of) DDP's per-step bucket all-reduces:
// what a data-parallel worker exchanges, with whom, and how often. The trainer executes it; the simulator
// times it. Filled by compile_job from the strategy and its config fields.
enum class Exchange : int32_t {
  kBucketAllreduce = 0,  // single, ddp, pipeline, hybrid: every step, each bucket all-reduced (bucket_allreduces)
  kPushPull = 1,         // ps, ps-async, ssp: every step, each bucket's pieces pushed to their servers, the
                         // updated parameters of the same pieces pulled back (the optimizer runs on the servers)
  kParamAverage = 2,     // localsgd: local optimizer steps; parameters averaged (all-reduce) every `period` steps,
                         // after `warmup_steps` steps of kBucketAllreduce
  kElastic = 3,          // easgd: local optimizer steps; an elastic exchange with the centre every `period` steps
                         // (all-reduce among the workers, or push/pull with the servers when easgd_async)
  kGossip = 4,           // asgd: local optimizer steps; parameters exchanged with peers without a global barrier
  kRound = 5,            // fedavg: a round = sampled clients' local epochs, then a sample-weighted average
};
const char* exchange_name(Exchange e) noexcept;  // "bucket-allreduce", "push-pull", ...

// Elements [begin, end) of the model's flat f32 parameter vector (nn::Model::param_offset order). `server` is the
// server that owns the range: at compile time shard k is owned by server k; after a server loss (fail_over_servers)
// a surviving server may own several.
struct KeyRange {
  int32_t server = 0;
  int64_t begin = 0, end = 0;
  int64_t size() const noexcept { return end - begin; }
};
// The part of gradient bucket `bucket` that server `server` holds: what one push (and one pull) carries.
struct BucketPiece {
  int32_t bucket = 0, server = 0;
  int64_t begin = 0, end = 0;
};

class CompiledJob;

struct SyncProgram {
  Exchange exchange = Exchange::kBucketAllreduce;
  int32_t workers = 1;            // data-parallel ranks: [0, workers)
  int32_t servers = 0;            // server ranks: [workers, workers + servers)
  int32_t period = 1;             // steps between exchanges (easgd: tau; localsgd: H); 1: every step
  int32_t warmup_steps = 0;       // localsgd: synchronous steps first
  int32_t staleness = -1;         // ps: 0; ssp: the bound; ps-async: -1 (none)
  // ps-async: each push's rate or momentum set by its measured staleness (ParallelConfig::staleness_lr; kNone
  // elsewhere).
  // An update rule only: nothing the simulator times changes with it.
  StalenessLr staleness_lr = StalenessLr::kNone;
  // Servers: the flat parameter vector cut into one contiguous key range per server, balanced by size
  // (they differ by at most one element; a large tensor is split between servers), and each bucket cut
  // along those ranges, bucket by bucket in the order backward completes them.
  std::vector<KeyRange> shards;
  std::vector<BucketPiece> pieces;
  // Server replication (issue #17; ParallelConfig::server_replicas): every server keeps a backup of the shards
  // that the `replicas` servers before it in ring order own (replica_servers), refreshed after every update it
  // applies. min(server_replicas, servers - 1): 0 with one server.
  int32_t replicas = 0;


  // ---- simulator: figures the simulator times, derived here so that it never re-derives the job ----
  // kParamAverage and kElastic without servers: the parameter average, one all-reduce request per gradient
  // bucket of the model (f32 parameters in the bucket layout, over the workers; empty for one worker).
  std::vector<comm::PlanRequest> average_allreduces;
  // What a worker holds under this exchange (kBucketAllreduce: stages[0].memory): ps workers keep parameters
  // and gradients but no optimizer state; easgd keeps the centre variable beside its parameters (counted as
  // optimizer_bytes, the update rule's state).
  StageMemory worker_memory;
  // Per server (servers > 0), what ParameterServerSync holds: its shard's values (param_bytes: parameters, or the
  // centre for asynchronous easgd), their optimizer state (ps, ps-async, ssp), and in bucket_bytes each worker's
  // receive and reply buffer plus, for ps and ssp, the pushes kept until their clock completes (staleness + 1
  // clocks of every worker's push). With replicas, also the backups it keeps (values and optimizer state of the
  // shards it backs up; counted as param_bytes and optimizer_bytes). The runtime's memory figure and the
  // simulator's are this one.
  std::vector<StageMemory> server_memory;
  // Replication traffic (replicas > 0): the bytes one server sends to its backups per update of its whole shard
  // (values + optimizer state, to each of `replicas` servers), headers aside.
  std::vector<double> replica_bytes_per_update;

  // ---- actions beside the exchange (issue #17), which the runtime runs and the simulator times ----
  // Replication (replicas > 0; ParameterServerSync::replicate): after each update of a piece (ps, ssp: each applied
  // clock; ps-async: each push) its owner sends every backup of replica_servers(owner) one message of
  // kPsHeaderBytes + replica_bytes_per_param x the piece's parameters (its values and optimizer state), and the
  // backup answers with an acknowledgement of kPsHeaderBytes. ps and ssp answer a push of clock c only once the
  // piece's clock c - staleness is acknowledged by every backup (release_withheld); ps-async answers at once.
  double replica_bytes_per_param = 0;  // 4 + optimizer_state_bytes_per_param (0 without replicas)
  // Joiner check (ParallelTrainer::maybe_admit): an elastic ps, ps-async or ssp job that may grow
  // (ParallelConfig::elastic with max_ranks > 0, or a joiner) checks every join_check_every optimizer steps, at the
  // start of the step, whether joiners wait: worker 0 alone reads the job's store (Communicator::peek_joins: one
  // request and its reply, to the store that `tandem launch` serves on world rank 0's host); nothing collective
  // unless someone waits. 0: no check.
  int32_t join_check_every = 0;
  // fedavg (kRound): the rounds one epoch of the run holds; 0 for the other exchanges (their epoch is the loader's
  // batches). One: an epoch is one round -- sampled clients x local epochs, then the average -- so `--epochs N`
  // runs N rounds (README "epoch = round"). The trainer closes its epoch after this many rounds
  // (ParallelTrainer::fedavg_round); the simulator's totals, throughput and cost count this many per epoch.
  int32_t rounds_per_epoch = 0;
};

// The parameter-server protocol's header (ParameterServerSync::Header): every push, pull, control message, replica
// and acknowledgement starts with one.
inline constexpr double kPsHeaderBytes = 32;

// The servers that back up the shards server `owner` owns: owner + 1, ..., owner + replicas (mod servers),
// replicas = min(replicas, servers - 1). Empty without replication.
std::vector<int32_t> replica_servers(int32_t owner, int32_t servers, int32_t replicas);

// After a server loss (issue #17): the program over the surviving servers. `lost` holds the lost servers' indices in
// cj.sync; each of their shards goes to the first surviving server of replica_servers(owner) -- the backup that holds
// it -- or, with `any_survivor` (no backup survived: the shard is restored from a checkpoint), to the next surviving
// server in ring order. The survivors are renumbered in their order (the shrunk communicator's); the pieces follow
// their shards, the replicas are re-placed over the survivors by the same rule, and the servers' memory is
// recomputed by the code that sized it at compile time. Throws kPeerFailure naming the shard when a lost shard has
// no surviving backup and !any_survivor, and when every server is lost.
void fail_over_servers(CompiledJob& cj, const std::vector<int32_t>& lost, bool any_survivor);
// The same on a SyncProgram alone (what ParameterServerSync holds); `optimizer` sizes the servers' state.
void fail_over_servers(SyncProgram& p, const std::vector<int32_t>& lost, bool any_survivor,
                       const optim::OptimizerConfig& optimizer);

// Asynchronous EASGD after a server loss restored from a checkpoint (issue #13): its exchange pairs server k with
// shard k, so the centre is cut again over the `live` surviving servers (shard_key_ranges; server k owns shard k) and
// each bucket's pieces along the new ranges; the servers' memory is sized again. The values come from the
// checkpoint (ParameterServerSync::restore takes a shard of the centre at any server count). kInvalidArgument
// unless 0 < live.
void reshard_servers(SyncProgram& p, int32_t live, const optim::OptimizerConfig& optimizer);

// A job growing after a server loss (issue #17): the program compiled at the new width (its servers the survivors)
// takes the running job's shards, pieces and replicas -- the ownership that fail_over_servers gave them, the same on
// every rank -- and the servers' memory is sized again by the compiler's code. kInvalidArgument naming the entry when
// the tables do not fit the program (a shard or piece owned by no server of it, pieces outside their shard, shards
// that do not cover the model's parameters in order).
void adopt_ownership(SyncProgram& p, std::vector<KeyRange> shards, std::vector<BucketPiece> pieces, int32_t replicas,
                     const optim::OptimizerConfig& optimizer);

// Balanced key ranges: [0, total) cut into `servers` contiguous ranges whose sizes differ by at most one.
std::vector<KeyRange> shard_key_ranges(int64_t total, int32_t servers);

// Per-layer cost for a measured cut (PartitionCost::kMeasured): forward + backward of one micro-batch,
// any unit. The trainer measures it on rank 0; the simulator takes it from its compute model.
using LayerCostFn = std::function<std::vector<double>()>;

class CompiledJob {
 public:
  Job job;                          // as given, with dp and pp resolved and parallel.boundaries the cut
  int32_t world = 1;
  std::vector<int32_t> boundaries;  // pp + 1 layer indices
  int32_t step_micro_batches = 1;   // micro-batches per optimizer step: micro_batches x accumulation
  int64_t step_batch = 0;           // samples per replica per optimizer step: batch x accumulation
  std::vector<int64_t> micro_batch_sizes;  // of a full step
  // Samples of every replica's last loader batch of an epoch when it is short (job.train_samples over the replicas
  // is not a multiple of step_batch and job.limit_batches does not end the epoch before it), else 0. Not for fedavg
  // (kRound), whose clients' shards differ in size.
  int64_t short_batch = 0;
  PipelinePlan pipeline;            // a full step, every stage
  std::vector<StageProgram> stages;
  std::vector<double> boundary_bytes_per_sample;  // [s]: bytes crossing from stage s to s + 1 (and gradients back)
  SyncProgram sync;                 // the strategy's exchanges (issue #13); kBucketAllreduce for ddp/pipeline/hybrid
  // job.loss_scaling: the found-non-finite flag's all-reduce (one int32, max) over every rank (world), member r =
  // world rank r, before the optimizer step of every stage (unused without loss scaling).
  comm::PlanRequest agree_finite;

  int32_t dp() const noexcept { return job.parallel.dp; }     // workers
  int32_t servers() const noexcept { return sync.servers; }
  int32_t pp() const noexcept { return job.parallel.pp; }
  bool compressed() const noexcept { return job.parallel.compression != GradCompression::kNone; }
  bool mixed_precision() const noexcept { return job.memory.precision != Precision::kF32; }
  // Gradients converted to 16 bits before each bucket all-reduce and back: compression of f32 gradients (under
  // mixed precision they are 16-bit already and travel as they are).
  bool converts() const noexcept { return compressed() && !mixed_precision() && dp() > 1; }
  Grid grid(int rank) const;
  // The plan of a step of `micro_batches` micro-batches (the last, short batch of an epoch); the full step's
  // for step_micro_batches. Built on first use and kept; not thread-safe.
  const PipelinePlan& pipeline_for(int32_t micro_batches) const;
  // "stage 0: layers [0, 6) conv1..relu2 (12.4 MFLOP/sample, 2.6k params) | stage 1: ..."
  std::string describe_partition() const;

 private:
  mutable std::map<int32_t, PipelinePlan> short_plans_;
};

// Compiles `job` for `world` ranks. Checks everything resolve_grid checks (the same message on every
// rank), cuts the model (explicit boundaries; pp = 1; the specs' FLOPs; or `measured` for
// PartitionCost::kMeasured -- required then), builds and validates the pipeline plan, the buckets and
// their all-reduce requests, and each stage's memory. Throws kInvalidArgument naming the problem.
CompiledJob compile_job(Job job, int world, const LayerCostFn& measured = {});

// The optimizer's state per parameter (bytes): SGD 0, with momentum 4, Adam/AdamW 8.
double optimizer_state_bytes_per_param(const optim::OptimizerConfig& c) noexcept;

// The data one rank of `job` holds in host memory, with training and test sets of `train_samples` and
// `test_samples` samples of `sample_size` values loaded (every rank loads both and samples its shard by index):
// the sets as the loader stores them (data::resident_bytes) and, under FedAvg, the clients' subsets of the training
// set that ParallelTrainer builds on every rank (data::client_subsets_resident_bytes). The simulator charges it per
// rank; the trainer's own figure (ParallelTrainer::data_bytes) is what it holds, equal to it (tested).
double rank_data_bytes(const CompiledJob& job, int64_t train_samples, int64_t test_samples, int64_t sample_size);

// Field by field: the cut, the plan, the buckets and their requests, the memory figures. Empty when
// equal, else the first difference ("stage 1 bucket 0: request.count 1024 vs 2048").
std::string compare_compiled_jobs(const CompiledJob& a, const CompiledJob& b);

}  // namespace tandem::engine::parallel
