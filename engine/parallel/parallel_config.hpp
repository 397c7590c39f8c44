#pragma once
// How a job is spread over ranks: the strategy (single, DDP, pipeline, hybrid DP x PP), the grid it
// implies, micro-batches, schedule, gradient buckets and their compression -- and the checks that
// turn a configuration that cannot work into a clear error on every rank before any work starts.
//
// The grid: world = dp * pp ranks; rank r holds pipeline stage r % pp of data-parallel replica
// r / pp. Consecutive ranks form one pipeline (point-to-point traffic stays on a host when ranks
// are placed host by host); the ranks holding one stage form its data-parallel group.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/parallel/schedule.hpp"

namespace tandem::engine::parallel {

// The strategies of the papers' other half (issue #13) are data parallel only (pp = 1):
//   kPs        parameter server, synchronous: a step waits for every worker's push (DDP's result)
//   kPsAsync   parameter server, asynchronous: each push is applied as it arrives
//   kSsp       parameter server, bounded staleness: a worker at most `staleness` clocks ahead of the slowest
//   kAsgd      asynchronous SGD without servers
//   kEasgd     elastic averaging SGD: local steps, an elastic exchange with a centre every `tau` steps
//   kFedAvg    federated averaging: rounds of local epochs on sampled clients, weighted average
//   kLocalSgd  local SGD (post-local SGD with warmup_steps > 0): parameters averaged every `average_every` steps
// Server ranks (kPs, kPsAsync, kSsp; kEasgd with easgd_async) are the last `servers` ranks of the world:
// workers are ranks [0, world - servers), so rank 0 is always a worker.
enum class Strategy : int32_t {
  kSingle = 0, kDdp = 1, kPipeline = 2, kHybrid = 3,
  kPs = 4, kPsAsync = 5, kSsp = 6, kAsgd = 7, kEasgd = 8, kFedAvg = 9, kLocalSgd = 10,
};
// "single", "ddp", "pipeline", "hybrid", "ps", "ps-async", "ssp", "asgd", "easgd", "fedavg", "localsgd"
const char* strategy_name(Strategy s) noexcept;
Strategy parse_strategy(std::string_view s);       // kInvalidArgument listing the valid names
// Strategies whose ranks are split into servers and workers (with the config: easgd_async needs a server).
bool has_servers(Strategy s, bool easgd_async = false) noexcept;

// Gradients on the wire: f32, or halved to f16 / bf16 (converted before the all-reduce and back
// after; the sum is taken in the compressed type).
enum class GradCompression : int32_t { kNone = 0, kF16 = 1, kBF16 = 2 };
const char* compression_name(GradCompression c) noexcept;  // "none", "fp16", "bf16"
GradCompression parse_compression(std::string_view s);      // "none", "fp16"/"f16", "bf16"

// ps-async: how the step of one push follows its staleness tau -- the updates its piece received on the server
// between the reply (or sync point) that gave the worker the values it computed the gradient from and this push:
//   kNone     every push is one optimizer step at the schedule's rate (Downpour);
//   kInverse  the rate / max(tau, 1) (Zhang et al. 2016, "Staleness-aware Async-SGD"): a push computed from
//             parameters tau updates old moves them 1/tau as far;
//   kMomentum SGD with momentum mu: the push's momentum coefficient is max(0, 1 - (1 - mu)(tau + 1)), the rate
//             unchanged -- asynchrony adds momentum of about tau / (tau + 1) of its own (Mitliagkas et al. 2016), so
//             the server's buffer keeps mu in all (param_server.hpp states both rules and why).
enum class StalenessLr : int32_t { kNone = 0, kInverse = 1, kMomentum = 2 };
const char* staleness_lr_name(StalenessLr s) noexcept;  // "none", "inverse", "momentum"
StalenessLr parse_staleness_lr(std::string_view s);     // kInvalidArgument naming --staleness-lr and the valid names

// Cost per layer used to cut the model into balanced stages.
enum class PartitionCost : int32_t {
  kFlops = 0,     // forward + backward FLOPs of the layer specs (the same on every machine)
  kMeasured = 1,  // forward + backward time of each layer measured on rank 0, broadcast to all
};
PartitionCost parse_partition_cost(std::string_view s);  // "flops", "measured"

struct ParallelConfig {
  Strategy strategy = Strategy::kSingle;
  int dp = 0;                 // 0: derived from the strategy and the world size
  int pp = 0;                 // 0: derived likewise
  int micro_batches = 1;      // per optimizer step and replica (pipeline: M)
  ScheduleKind schedule = ScheduleKind::kOneFOneB;
  double bucket_mb = 25.0;    // DDP gradient bucket size in MiB (PyTorch's default)
  // > 0: the first bucket formed (the stage's last layers, whose gradients are ready first) closes at this size
  // instead of bucket_mb, as PyTorch DDP's does (dist._DEFAULT_FIRST_BUCKET_BYTES, 1 MiB); 0: every bucket bucket_mb.
  double first_bucket_mb = 0;
  // Explicit bucket sizes in MiB, in gradient-ready order (the stage's last layers first): bucket k closes once it
  // holds >= bucket_sizes_mb[k]; the buckets after the list close at bucket_mb. Sizes copied from another framework's
  // buckets (PyTorch DDP logs its bucket sizes in bytes: give bytes / 2^20) rebuild those buckets where they end at
  // layer boundaries (sizes are rounded to whole bytes). Not together with first_bucket_mb (it is the list {x}).
  std::vector<double> bucket_sizes_mb;
  GradCompression compression = GradCompression::kNone;
  int accumulation = 1;       // batches whose gradients are summed before one all-reduce and step
  PartitionCost partition = PartitionCost::kFlops;
  std::vector<int32_t> boundaries;  // explicit stage cut (S + 1 entries) instead of the partitioner
  bool trace = false;         // record spans for a Chrome trace

  // ---- issue #13: parameter servers, asynchronous and averaging strategies (pp = 1) ----
  int servers = 1;              // ps, ps-async, ssp, asynchronous easgd: server ranks (the last ones)
  // ps, ps-async, ssp (issue #17): every server keeps a backup of the shards of the `server_replicas` servers before
  // it in ring order (values, optimizer state, clock), refreshed after each update it applies; a lost server's shard
  // is then taken over by its backup without a restart (param_server.hpp states the rule). In [0, servers - 1].
  int server_replicas = 0;
  int staleness = 2;            // ssp: clocks a worker may run ahead of the slowest (0: synchronous)
  StalenessLr staleness_lr = StalenessLr::kNone;  // ps-async: a push's rate or momentum by its staleness (above)
  int tau = 4;                  // easgd: local steps between elastic exchanges
  double alpha = 0;             // easgd: moving rate; 0: 0.9 / workers (the paper's beta = 0.9)
  bool easgd_async = false;     // easgd: asynchronous variant (centre on a server) instead of all-reduce rounds
  int clients = 0;              // fedavg: virtual clients over all ranks; 0: one per rank
  double dirichlet_alpha = 0;   // fedavg: label skew Dirichlet(alpha) of the clients' data; 0: IID
  double client_fraction = 1.0; // fedavg: fraction of clients sampled per round, in (0, 1]
  int local_epochs = 1;         // fedavg: epochs over its own data a sampled client runs per round
  double round_deadline_s = 0;  // fedavg: a round closes after this long with whoever reported; 0: the
                                // communicator's timeout (never an unbounded wait)
  int average_every = 8;        // localsgd: H, steps between parameter averages
  int warmup_steps = 0;         // localsgd: synchronous DDP steps first (post-local SGD)

  // ---- issue #17: elastic training (parallel_trainer.hpp states the rules) ----
  bool elastic = false;            // ddp, ps, pipeline, hybrid: survive the loss of ranks, continuing with fewer (the asynchronous
                                   // and averaging strategies always do: absorbs_worker_loss)
  int min_ranks = 1;               // fewer ranks left than this stops the job (with a checkpoint)
  std::string elastic_checkpoint;  // where that stop writes its checkpoint ("": none)
  // Growth (elastic ddp, pipeline, hybrid; ps, ps-async and ssp by workers): joiners are admitted at step boundaries
  // (parallel_trainer.hpp).
  int max_ranks = 0;               // > 0: joiners beyond this many ranks are refused (0: no bound)
  int join_poll_steps = 1;         // check for joiners every this many steps (a store read on rank 0 + a broadcast)
  bool joining = false;            // this rank joins a running job: `world` came from join_communicator
  int64_t spare_wait_ms = 3600000; // elastic pipeline/hybrid: how long a spare waits to be drafted (then kTimeout)
};

// Whether a lost worker is absorbed -- the survivors shrink their communicator and go on (parallel_trainer.hpp
// states how each strategy re-forms): always for ps-async, ssp, asgd, easgd (both variants), fedavg and localsgd
// (a dead worker does not stop them); for ddp, ps, pipeline and hybrid only with `elastic` (they otherwise stop naming
// the rank, as synchronous training does; pipeline and hybrid re-form their grid). A lost parameter server is taken
// over from a replica (server_replicas) or restored from elastic_checkpoint; without either it stops the job.
bool absorbs_worker_loss(const ParallelConfig& config) noexcept;

struct Grid {
  int world = 1, rank = 0;
  int dp = 1, pp = 1;           // strategies with servers: dp = workers = world - servers
  int servers = 0;              // server ranks: the last `servers` of the world
  bool server = false;          // this rank is a server (its stage and dp_rank are then 0)
  int server_index = -1;        // rank - (world - servers) on a server
  int stage = 0;    // rank % pp
  int dp_rank = 0;  // rank / pp
  int rank_of(int dp_index, int stage_index) const noexcept { return dp_index * pp + stage_index; }
};

// Fills dp/pp from the strategy and world size and checks everything that can be checked locally:
// world != dp * pp (or not divisible by the one given), a strategy that contradicts dp/pp, more
// stages than layers, more micro-batches than samples in a batch, bad bucket size or accumulation.
// Throws kInvalidArgument; the message says what was given and what would work. The checks depend
// only on their arguments, so every rank given the same command line fails the same way.
Grid resolve_grid(ParallelConfig& config, int world, int rank, int64_t num_layers, int64_t batch_size);

// The config as a short line for logs: "hybrid dp=2 pp=2 micro_batches=4 schedule=1f1b ...".
std::string describe(const ParallelConfig& config);

}  // namespace tandem::engine::parallel
