#include "engine/parallel/parallel_trainer.hpp"

#include "engine/core/settings.hpp"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <cctype>
#include <cmath>
#include <cstring>
#include <exception>
#include <bit>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <thread>
#include <type_traits>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "engine/core/error.hpp"
#include "engine/core/log.hpp"
#include "engine/data/partition.hpp"
#include "engine/train/checkpoint.hpp"
#include "engine/train/memory_guard.hpp"

namespace tandem::engine::parallel {

using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Tags of the world communicator's point-to-point messages (the pipeline's use their own communicator).
constexpr uint32_t kTagCheckpoint = 11;
constexpr uint32_t kTagTraceSize = 12;
constexpr uint32_t kTagTraceBody = 13;
constexpr uint32_t kTagReplica = 14;  // the workers' communicator: a worker's own state for a checkpoint
constexpr uint32_t kTagVoteCut = 16;  // TANDEM_TEST_REFORM_LEAVE at "voted": a receive nobody answers

// Test hook (fedavg): TANDEM_TEST_FEDAVG_STALL="rank:round:seconds" makes world rank `rank` sleep that long before
// it reports round `round` -- a straggler for the deadline tests.
void fedavg_test_stall(int rank, int64_t round) {
  const char* v = std::getenv("TANDEM_TEST_FEDAVG_STALL");
  if (v == nullptr || *v == '\0') return;
  int r = -1;
  long long k = -1;
  double s = 0;
  if (std::sscanf(v, "%d:%lld:%lf", &r, &k, &s) != 3 || r != rank || k != round || !(s > 0)) return;
  log::warn("fedavg round {}: TANDEM_TEST_FEDAVG_STALL: world rank {} sleeps {:.3g} s before it reports", round, rank, s);
  std::this_thread::sleep_for(std::chrono::duration<double>(s));
}

// Test hook (loss scaling): TANDEM_TEST_NONFINITE="rank:step" writes a NaN into world rank `rank`'s gradients (after
// any all-reduce, before the loss scaler's check) at its `step`-th step (1-based, skipped steps counted): only that
// rank sees a non-finite gradient, so the others skip only through the agreement.
bool nonfinite_test_hook(int rank, int64_t step) {
  const std::optional<std::string> v = settings::current()->text("TANDEM_TEST_NONFINITE");
  if (!v) return false;
  int r = -1;
  long long k = -1;
  if (std::sscanf(v->c_str(), "%d:%lld", &r, &k) != 2 || r != rank || k != step) return false;
  log::warn("step {}: TANDEM_TEST_NONFINITE: world rank {} gets a NaN gradient", step, rank);
  return true;
}

// Test hook (parameter-server re-form, issue #17): TANDEM_TEST_REFORM_LEAVE="rank:point" makes world rank `rank` leave
// the job (ParallelTrainer::abandon: its communicators aborted, as a killed process's close) when a re-form it takes
// part in reaches `point` (ParameterServerSync::set_reform_hook: "agreed", after the survivors' agreement; "voting",
// the new view built, the shards sent and the replicas re-seeded, before the vote; "voted", the vote completed on that
// rank, before it commits; "committed", once every survivor committed (a barrier), after which the others wait for the
// loss to surface and meet it at their next operation, before any server served the new view; "replicating", a
// server right after sending the header of an update's replica, 100 ms before it leaves without the payload, so its
// backup has taken the header; and the trainer's "restoring", the re-form committed with shards taken from the
// checkpoint, before load_checkpoint); and of an admission of workers (ParameterServerSync::grow): "growing", the grown
// view built, before a server sends its shards or a worker receives them, and "grow-voted" and "grow-committed", which
// behave as "voted" and "committed", and "split", where that rank's split of the grown world fails (kPeerFailure)
// after the others' completed; its thread then ends with kInternal naming the hook (at "split", with the kPeerFailure
// admit_workers stops with). At "voted" the survivors with a higher world rank see their vote cut off by that loss
// (they wait for it to surface, then fail as the vote would have) while the lower ones commit: the split outcome of
// a rank lost inside the vote, which a real loss gives depending on the collective's message order. Elastic pipeline
// and hybrid grids, at an epoch's end: "last-step", the rank (of a stage before the last) leaves at its first gradient
// receive of an epoch's last step -- the later stages' replicas complete the step without it, its own stage's are
// cut off in their gradient all-reduce; and "summed", "timed", "evaluated", the rank leaves right after completing the
// epoch's sums, its time split or an evaluation, the survivors with a higher world rank cut off in that collective
// as at "voted" while the lower ones go on to the next. Returns the rank named at `point`, or -1. For the tests of a
// loss during a re-form or an epoch's closing collectives.
int reform_leave_test_hook(const char* point) {
  const std::optional<std::string> v = settings::current()->text("TANDEM_TEST_REFORM_LEAVE");
  if (!v) return -1;
  const size_t colon = v->find(':');
  if (colon == std::string::npos || v->substr(colon + 1) != point) return -1;
  int r = -1;
  if (std::sscanf(v->c_str(), "%d:", &r) != 1) return -1;
  return r;
}

// Test hook (a fault inside a checkpoint save, issue #17): TANDEM_TEST_SAVE_FAULT="rank:save:what" hits world rank
// `rank` at the start of its `save`-th checkpoint save (1-based, this trainer's saves counted), before the save's
// first collective: `what` "leave" makes it leave the job there (ParallelTrainer::abandon, as a killed process, then
// kInternal naming the hook), a number makes it sleep that many seconds and go on (a process stopped and continued).
// The other ranks meet the fault in the save's collectives. Returns what to do ("" when this save is not hit).
std::string save_fault_test_hook(int rank, int64_t save) {
  const std::optional<std::string> v = settings::current()->text("TANDEM_TEST_SAVE_FAULT");
  if (!v) return {};
  int r = -1;
  long long k = -1;
  int used = 0;
  if (std::sscanf(v->c_str(), "%d:%lld:%n", &r, &k, &used) != 2 || used == 0 || r != rank || k != save) return {};
  return v->substr(static_cast<size_t>(used));
}

// Blocking helpers over a communicator's host buffers.
void broadcast_tensor(comm::Communicator& c, compute::Backend& be, Tensor t, int root) {
  if (t.numel() == 0) return;
  if (be.device().is_cpu()) {
    c.broadcast(t.data<float>(), static_cast<size_t>(t.numel()), DType::kF32, root)->wait();
    return;
  }
  Tensor h = be.to_host(t);
  c.broadcast(h.data<float>(), static_cast<size_t>(h.numel()), DType::kF32, root)->wait();
  be.copy(h, t);
}

std::vector<float> host_floats(compute::Backend& be, const Tensor& t) {
  if (t.numel() == 0) return {};
  const Tensor h = be.to_host(t);
  const float* p = h.data<float>();
  return {p, p + h.numel()};
}

void copy_floats(compute::Backend& be, const float* src, Tensor dst) {
  if (dst.numel() == 0) return;
  be.copy(Tensor::wrap(const_cast<float*>(src), dst.shape(), DType::kF32), dst);
}

// Samples i with i % parts == part (evaluation shard of one replica; no padding, so every test
// sample is scored exactly once over the replicas).
data::Dataset shard_of(const data::Dataset& d, int part, int parts) {
  data::Dataset s;
  s.name = d.name;
  s.channels = d.channels;
  s.height = d.height;
  s.width = d.width;
  s.num_classes = d.num_classes;
  const int64_t ss = d.sample_size();
  for (int64_t i = part; i < d.size(); i += parts) {
    s.pixels.insert(s.pixels.end(), d.sample(i), d.sample(i) + ss);
    s.labels.push_back(d.labels[static_cast<size_t>(i)]);
  }
  return s;
}

// A joiner of an elastic pipeline or hybrid job holds no stage until the job places it (form_grid): its grid is the
// job's to choose, so the width and depth it was started with are not checked against its world here.
Grid starting_grid(ParallelConfig& pc, const comm::Communicator* world, int64_t layers, int64_t batch) {
  if (pc.joining && pc.elastic && (pc.strategy == Strategy::kPipeline || pc.strategy == Strategy::kHybrid)) {
    Grid g;
    g.world = world != nullptr ? world->size() : 1;
    g.rank = g.stage = -1;
    return g;
  }
  // A worker joining an elastic parameter-server job: its place comes from the job once the grown world is ordered
  // workers first (the constructor's split_workers_first).
  if (pc.joining && pc.elastic && has_servers(pc.strategy, pc.easgd_async) && !pc.easgd_async) return Grid{};
  return resolve_grid(pc, world != nullptr ? world->size() : 1, world != nullptr ? world->rank() : 0, layers, batch);
}

uint64_t hash_bounds(const std::vector<int32_t>& b) {
  uint64_t h = 0x626f756e6473;
  for (int32_t v : b) h = mix64(h, static_cast<uint64_t>(v));
  return h;
}

// The bucket policy beside bucket_mb: the first bucket's cap and the explicit sizes, bit for bit.
uint64_t hash_bucket_policy(const ParallelConfig& c) {
  uint64_t h = mix64(0x6275636b657473, std::bit_cast<uint64_t>(c.first_bucket_mb));
  for (double v : c.bucket_sizes_mb) h = mix64(h, std::bit_cast<uint64_t>(v));
  return h;
}

}  // namespace

ParallelTrainer::ParallelTrainer(nn::Model& model, const data::Dataset& train, const data::Dataset* test,
                                 train::TrainerConfig config, ParallelConfig parallel, comm::Communicator* world)
    : model_(model),
      train_(train),
      test_(test),
      config_(std::move(config)),
      pc_(std::move(parallel)),
      world_(world != nullptr && world->size() > 1 ? world : nullptr),
      grid_(starting_grid(pc_, world, static_cast<int64_t>(model.num_layers()), config_.batch_size)),
      tracer_(pc_.trace),
      sampler_(train.size(), grid_.dp, grid_.dp_rank, true, config_.seed),
      rng_(mix64(config_.seed, 0x747261696e)),
      scaler_(config_.loss_scale) {
  // ---- 1. local checks (the same verdict on every rank) ----
  // fp16 loss scaling skips a step on every rank at once (agree_nonfinite). The strategies that step on their own
  // (local steps, servers, rounds) and elastic jobs (whose recovery counts optimizer steps) do not take it yet.
  TANDEM_CHECK(!scaler_.enabled() || ((pc_.strategy == Strategy::kSingle || pc_.strategy == Strategy::kDdp ||
                                       pc_.strategy == Strategy::kPipeline || pc_.strategy == Strategy::kHybrid) &&
                                      !pc_.elastic),
               Status::kUnsupported,
               "strategy {}{}: loss scaling ({}) runs with single, ddp, pipeline and hybrid, not elastic; train this "
               "strategy in f32 or bf16", strategy_name(pc_.strategy), pc_.elastic ? " (elastic)" : "",
               config_.loss_scale.describe());
  // Every strategy runs here: the averaging family of issue #13 through a StepSync (averaging.hpp, fedavg.hpp), the
  // parameter-server family (ps, ps-async, ssp, asynchronous easgd) through ParameterServerSync (param_server.hpp).
  TANDEM_CHECK(!parameter_server() || pc_.compression == GradCompression::kNone, Status::kUnsupported,
               "strategy {}: gradient compression ({}) is not supported with parameter servers yet (pushes are f32)",
               strategy_name(pc_.strategy), compression_name(pc_.compression));
  TANDEM_CHECK(!parameter_server() || elastic_centre() || config_.clip_norm <= 0, Status::kUnsupported,
               "strategy {}: gradient clipping (clip_norm {}) needs the global norm over every server's shard before "
               "any update; not supported with parameter servers yet",
               strategy_name(pc_.strategy), config_.clip_norm);
  const bool joins_workers = pc_.joining && pc_.elastic && parameter_server() && !elastic_centre();
  // A joiner whose admission fails leaves at once (its communicators aborted, as a killed process's): the running
  // ranks then meet its loss at once, whether or not they committed the admission (ParameterServerSync::grow).
  struct LeaveOnThrow {
    ParallelTrainer* t;
    int uncaught = std::uncaught_exceptions();
    ~LeaveOnThrow() {
      if (t == nullptr || std::uncaught_exceptions() <= uncaught) return;
      t->abandon();
      // as the destructor, which does not run: the servers' object goes while the communicators it uses still live
      t->executor_.reset();
      t->ps_.reset();
    }
  } leave_on_throw{joins_workers ? this : nullptr};
  if (joins_workers) {
    // A worker joining a parameter-server job (issue #17): the running ranks admitted it into `world` after their
    // servers; both sides reorder it workers first (admit_workers mirrors this constructor), and the job places it.
    TANDEM_CHECK(world_ != nullptr, Status::kInvalidArgument, "joining a running job needs the grown world");
    own_comm_ = split_workers_first(*world_);
    world_ = own_comm_.get();
    std::vector<int> from;
    share_ownership(*world_, from);
    ParallelConfig now = pc_;  // the servers running now (after a server loss: fewer than the job started with)
    now.servers = ownership_.servers;
    now.server_replicas = ownership_.replicas;
    grid_ = resolve_grid(now, world_->size(), world_->rank(), static_cast<int64_t>(model_.num_layers()),
                         config_.batch_size);
    sampler_ = data::DistributedSampler(train.size(), grid_.dp, grid_.dp_rank, true, config_.seed);
  }
  config_.world = grid_.dp;
  config_.rank = grid_.dp_rank;
  config_.validate();
  launch_pp_ = std::max(1, pc_.pp);
  launch_strategy_ = pc_.strategy;
  const bool joins_grid = pc_.joining && grid_.stage < 0;  // starting_grid: placed by the job (form_grid)
  const nn::SampleShape in = model_.spec().input;
  auto check_data = [&](const data::Dataset& d) {
    TANDEM_REQUIRE(d.channels * d.height * d.width == in.numel() &&
                       (in.h * in.w == 1 || (d.channels == in.c && d.height == in.h && d.width == in.w)),
                   "dataset '{}' has samples {}x{}x{} but model '{}' takes {}", d.name, d.channels, d.height, d.width,
                   model_.spec().name, nn::to_string(in));
    TANDEM_REQUIRE(d.num_classes <= model_.spec().num_classes(), "dataset '{}' has {} classes but model '{}' outputs {}",
                   d.name, d.num_classes, model_.spec().name, model_.spec().num_classes());
  };
  check_data(train_);
  if (test_ != nullptr) check_data(*test_);
  // ---- 2. every rank agrees on the settings (and so on the steps per epoch) ----
  data::LoaderOptions lo;
  lo.batch_size = config_.batch_size * pc_.accumulation;
  lo.augment = train::default_augment(train_, config_.normalize, config_.augment);
  lo.train = true;
  lo.prefetch = config_.prefetch;
  lo.seed = config_.seed;
  loader_ = std::make_unique<data::Loader>(train_, sampler_, lo);
  if (!joins_grid) agree_on_settings(pc_.joining);
  // ---- 3. the job, compiled once: the cut, the plan, the buckets and their all-reduces, the memory ----
  // Defaults that depend on the grid, resolved once for the job, the logs and tandem_trainer_parallel_query.
  if (pc_.strategy == Strategy::kEasgd) pc_.alpha = easgd_alpha(pc_.alpha, grid_.dp);
  if (pc_.strategy == Strategy::kFedAvg && pc_.clients == 0) pc_.clients = grid_.dp;
  Job job;
  job.model = model_.spec();
  job.batch = config_.batch_size;
  job.parallel = pc_;
  job.optimizer = config_.optimizer;
  job.loss_scaling = scaler_.enabled();  // agree_nonfinite: the job's agree_finite all-reduce
  job.prefetch = config_.prefetch;       // the loader made above: its batches ahead are the stage's loader_bytes
  job.train_samples = train_.size();     // the sampler's set: whether an epoch ends with a short batch
  job.limit_batches = config_.limit_batches;
  if (world_ != nullptr) {
    // the data-parallel groups are split from `world` and keep its options: the runtime's request_for
    const comm::CommOptions& o = world_->options();
    job.algorithm = o.deterministic ? comm::Algorithm::kDeterministic : o.allreduce_algorithm;
    job.chunk_bytes = o.chunk_bytes;
  }
  if (joins_grid) {
    // A joiner of a pipeline or hybrid grid (issue #17): the running ranks admitted it into the grown world `world`;
    // it mirrors their re-form (elastic_grow.cpp enter_grown) and so takes a stage, or waits as a spare.
    TANDEM_CHECK(world_ != nullptr, Status::kInvalidArgument, "joining a running job needs the grown world");
    job_.job = std::move(job);  // compiled at the grid the job chooses (regrid)
    absorbing_ = true;
    enter_grown(nullptr, world_);
    attach_reducer();
    tracer_.reset_zero();
    return;
  }
  absorbing_ = absorbs_worker_loss(pc_) && world_ != nullptr && (grid_.pp == 1 || reforms_grid());
  const ParallelConfig launched = pc_;
  job_ = joins_workers ? compile_grown(std::move(job)) : compile_job(std::move(job), grid_.world, [this] {
    const std::vector<double> cost = measure_layer_costs();
    if (grid_.rank == 0) log::debug("measured partition: per-layer forward + backward times of rank 0 (s): {}",
                                    fmt::join(cost, ", "));
    return cost;
  });
  pc_ = job_.job.parallel;
  if (joins_workers) {  // the job's settings as launched (a later admission compares them); job() holds the servers now
    pc_.servers = launched.servers;
    pc_.server_replicas = launched.server_replicas;
  }
  const StageProgram& mine = job_.stages[static_cast<size_t>(grid_.stage)];
  first_ = mine.first_layer;
  end_ = mine.end_layer;
  // The rank's model holds only its stage's layers: parameters, gradients and statistics of the other stages are
  // never allocated here (their initial values come from the same seed on the rank that holds them).
  model_.hold(static_cast<size_t>(first_), static_cast<size_t>(end_));
  // Memory guard (issue #6): this rank's stage, before its optimizer state and first step allocate.
  train::check_training_memory(model_, training_footprint(mine, optimizer_state_bytes_per_param(config_.optimizer)),
                               fmt::format("rank {} (stage {} of {})", grid_.rank, grid_.stage, grid_.pp));

  // ---- 4. groups, replicated state, optimizer ----
  if (world_ != nullptr) {
    // Elastic pipeline/hybrid: a communicator of the trainer's own over every rank, which shrinks after a loss;
    // the stage and replica groups are split from it.
    if (absorbing_ && reforms_grid()) {
      own_comm_ = world_->split(0, grid_.rank);
      world_ = own_comm_.get();
    }
    if (grid_.pp > 1) pipe_comm_ = world_->split(grid_.dp_rank, grid_.stage);
    // Absorbing a lost worker with parameter servers: a communicator of the trainer's own over every rank carries
    // the push/pull traffic and the collectives, so shrinking it leaves the caller's `world` alone.
    if (absorbing_ && parameter_server() && !joins_workers) {  // a joiner has its own already (reordered)
      own_comm_ = world_->split(0, grid_.rank);
      world_ = own_comm_.get();
    }
    // parameter servers join no data-parallel group (color -1): the workers' group broadcasts their state
    if (grid_.dp > 1) dp_comm_ = world_->split(grid_.server ? -1 : grid_.stage, grid_.dp_rank);
    // Elastic or absorbing without servers (pp = 1: the group is the whole world): likewise one communicator of
    // the trainer's own carries every collective, so a failure always shows on it.
    if (absorbing_ && !parameter_server() && !reforms_grid() && grid_.pp == 1 && dp_comm_) world_ = dp_comm_.get();
  }
  for (int r = 0; r < grid_.world; ++r) members_.push_back(r);
  initial_dp_ = grid_.dp;
  initial_world_ = grid_.world;
  sampler_dp_ = grid_.dp;
  broadcast_replica_state();
  // With parameter servers the optimizer runs on the servers (ParameterServerSync); this rank's optimizer has no
  // buffer and only counts the steps (the schedule, the checkpoint's progress). Asynchronous EASGD's workers step
  // locally; its servers hold the centre variable.
  const bool counting_only = parameter_server() && (grid_.server || !elastic_centre());
  optimizer_ = std::make_unique<optim::Optimizer>(
      model_.backend(), config_.optimizer,
      std::vector<Tensor>{counting_only ? Tensor::empty(Shape{0})
                                             : model_.range_params(static_cast<size_t>(first_),
                                                                   static_cast<size_t>(end_))});
  schedule_epoch_steps_ = batches_per_epoch();
  schedule_ = optim::parse_schedule(config_.schedule, config_.optimizer.lr, schedule_epoch_steps_, config_.epochs);
  leave_hook_ = settings::current()->text("TANDEM_TEST_REFORM_LEAVE").has_value();
  if (parameter_server()) {
    TANDEM_CHECK(world_ != nullptr, Status::kInvalidArgument, "strategy {} needs at least one worker and one server",
                 strategy_name(pc_.strategy));
    ps_ = std::make_unique<ParameterServerSync>(*world_, model_, job_.sync, job_.pipeline.stage_plans[0].buckets,
                                                config_.optimizer, schedule_, pc_.alpha, tracer_);
    // (only when the test hook is set: ParameterServerSync calls it on every replica it sends)
    if (leave_hook_) ps_->set_reform_hook([this](const char* point) { reform_test_point(point); });
  } else if (dp_comm_) {
    reducer_ = std::make_unique<GradientReducer>(*dp_comm_, model_,
                                                 job_.pipeline.stage_plans[static_cast<size_t>(grid_.stage)].buckets,
                                                 pc_.compression, tracer_);
  }
  note_ps_membership();
  executor_ = std::make_unique<StageExecutor>(model_, grid_.stage, grid_.pp, first_, end_, pipe_comm_.get(),
                                              ps_ ? static_cast<GradientSync*>(ps_.get()) : reducer_.get(), tracer_);
  setup_strategy();
  if (world_ != nullptr) world_->barrier()->wait();
  // A joiner (issue #17): the running ranks mirrored the collectives above; now it takes their state.
  if (pc_.joining) {
    TANDEM_CHECK(grows() || grows_workers(), Status::kUnsupported,
                 "joining a running job needs elastic ddp, pipeline, hybrid, ps, ps-async or ssp (strategy {}, pp {}, "
                 "elastic {})",
                 strategy_name(pc_.strategy), grid_.pp, pc_.elastic);
    share_grown_state();  // the labels are rank 0's to give (an old worker)
    // A worker's side of the servers' growth: it takes the job's clock and pulls its first parameters (the old
    // ranks' from-worker indices matter only on a server).
    if (joins_workers) ps_->grow(*world_, std::vector<int>(static_cast<size_t>(grid_.dp), -1), job_.sync,
                                 optimizer_->steps(), lr_scale_);
    note_ps_membership();
  }
  close_to_joiners();
  tracer_.reset_zero();  // right after a common barrier: the ranks' traces line up
}

double ParallelTrainer::data_bytes() const noexcept {
  double bytes = train_.resident_bytes() + (test_ != nullptr ? test_->resident_bytes() : 0.0);
  for (const data::Dataset& c : clients_) bytes += c.resident_bytes();
  return bytes;
}

void ParallelTrainer::setup_strategy() {
  const Exchange x = job_.sync.exchange;
  if (x != Exchange::kParamAverage && x != Exchange::kElastic && x != Exchange::kGossip && x != Exchange::kRound)
    return;
  replica_ = std::make_unique<ReplicaState>(model_, static_cast<size_t>(first_), static_cast<size_t>(end_));
  sync_ = make_averaging_sync(job_, dp_comm_.get(), *replica_, config_.seed);
  if (x != Exchange::kRound) return;
  // FedAvg: every step is local; the clients' shards of the training set, the same split on every rank.
  executor_->set_reducer(nullptr);
  const data::ClientShards shards =
      pc_.dirichlet_alpha > 0
          ? data::partition_dirichlet(train_.labels, train_.num_classes, pc_.clients, pc_.dirichlet_alpha, config_.seed)
          : data::partition_iid(train_.size(), pc_.clients, config_.seed);
  clients_.reserve(shards.size());
  for (size_t k = 0; k < shards.size(); ++k)
    clients_.push_back(data::subset(train_, shards[k], fmt::format("{} client {}", train_.name, k)));
  // An epoch is job_.sync.rounds_per_epoch rounds (the job compiler's rule, which the simulator counts too). This
  // executor closes its epoch after each round (fedavg_round): its snapshots, checkpoints and re-forms count progress
  // in whole epochs, so it runs only the compiler's one round per epoch.
  TANDEM_CHECK(job_.sync.rounds_per_epoch == 1, Status::kInternal,
               "fedavg: the compiled job holds {} rounds per epoch; the trainer runs one", job_.sync.rounds_per_epoch);
  rounds_ = std::make_unique<RoundExchange>(dp_comm_.get(), pc_.round_deadline_s);
  if (grid_.rank == 0)
    log::info("fedavg: {} clients ({}), {:.3g} sampled per round, {} local epoch(s), round deadline {:.3g} s",
              pc_.clients, pc_.dirichlet_alpha > 0 ? fmt::format("Dirichlet({}) label skew", pc_.dirichlet_alpha) : "IID",
              pc_.client_fraction, pc_.local_epochs, rounds_->deadline_s());
}

ParallelTrainer::~ParallelTrainer() {
  // A rank that ends with its communicator failed and not shrunk (the job's last save gave up on a loss) tells the
  // survivors' agreement it left, so they do not wait out the window for it, and whether it reported an epoch.
  if (comm::Communicator* c = trainer_comm(); absorbing_ && c != nullptr && c->is_failed())
    c->leave(fmt::format("reported={}", reported_epoch_));
  // The job ends here (elastic pipeline/hybrid): the grid's rank 0 refuses the spares and joiners still waiting, so
  // they stop now rather than at the end of their wait.
  // Not after the survivors stopped it: they refused them already, with the reason (refuse_waiting_ranks).
  if (reforms_grid() && own_comm_ && !spare_ && !refused_ && !own_comm_->is_failed() && own_comm_->rank() == 0) {
    try {
      own_comm_->refuse_joiners("the job ended");
    } catch (...) {
      // best effort: they stop at the end of their wait
    }
  }
  executor_.reset();
  reducer_.reset();
  ps_.reset();  // leaves the push/pull region with the other ranks (bounded by the deadline)
}

void ParallelTrainer::abandon() noexcept {
  const std::string why = fmt::format("world rank {} left the job", world_rank());
  for (comm::Communicator* c : {world_, own_comm_.get(), dp_comm_.get(), pipe_comm_.get()}) {
    try {
      if (c != nullptr && !c->is_failed()) c->abort(why);
    } catch (...) {
      // best effort: the others learn it from the closed transport otherwise
    }
  }
}

bool ParallelTrainer::parameter_server() const noexcept { return has_servers(pc_.strategy, pc_.easgd_async); }

bool ParallelTrainer::elastic_centre() const noexcept {
  return pc_.strategy == Strategy::kEasgd && pc_.easgd_async;
}

void ParallelTrainer::agree_on_settings(bool growing) {
  if (world_ == nullptr) return;
  const optim::OptimizerConfig& oc = config_.optimizer;
  float lr = oc.lr;
  uint32_t lr_bits;
  std::memcpy(&lr_bits, &lr, sizeof lr_bits);
  const std::vector<std::pair<const char*, int64_t>> mine = {
      // growing: the job chooses the grid (a pipeline that widened runs as hybrid), so only the family is checked
      {"strategy", static_cast<int64_t>(growing && launch_strategy_ == Strategy::kPipeline ? Strategy::kHybrid
                                                                                            : launch_strategy_)},
      {"dp", growing ? 0 : pc_.dp},
      {"pp", growing ? 0 : pc_.pp},
      {"micro_batches", pc_.micro_batches},
      {"schedule", static_cast<int64_t>(pc_.schedule)},
      {"accumulation", pc_.accumulation},
      {"bucket bytes", static_cast<int64_t>(pc_.bucket_mb * 1048576.0)},
      {"first bucket / bucket sizes", static_cast<int64_t>(hash_bucket_policy(pc_) >> 1)},
      {"compression", static_cast<int64_t>(pc_.compression)},
      {"partition", static_cast<int64_t>(pc_.partition)},
      {"explicit stage cut", growing ? 0 : static_cast<int64_t>(hash_bounds(pc_.boundaries) >> 1)},
      {"batch size", config_.batch_size},
      {"model layers", static_cast<int64_t>(model_.num_layers())},
      {"model parameters", model_.total_params()},
      {"training samples", train_.size()},
      {"test samples", test_ != nullptr ? test_->size() : -1},
      {"steps per epoch", growing ? 0 : batches_per_epoch()},
      {"seed", static_cast<int64_t>(config_.seed)},
      {"epochs", config_.epochs},
      {"optimizer", static_cast<int64_t>(oc.kind)},
      {"learning rate", static_cast<int64_t>(lr_bits)},
      {"limit_batches", config_.limit_batches},
      {"eval_limit_batches", config_.eval_limit_batches},
      {"augment", config_.augment ? 1 : 0},
      {"normalize", config_.normalize ? 1 : 0},
      {"deterministic", world_->options().deterministic ? 1 : 0},
      {"servers", pc_.servers},
      {"staleness", pc_.staleness},
      {"staleness_lr", static_cast<int64_t>(pc_.staleness_lr)},
      {"tau", pc_.tau},
      {"alpha (bits)", std::bit_cast<int64_t>(pc_.alpha)},
      {"easgd_async", pc_.easgd_async ? 1 : 0},
      {"clients", pc_.clients},
      {"dirichlet_alpha (bits)", std::bit_cast<int64_t>(pc_.dirichlet_alpha)},
      {"client_fraction (bits)", std::bit_cast<int64_t>(pc_.client_fraction)},
      {"local_epochs", pc_.local_epochs},
      {"round_deadline_s (bits)", std::bit_cast<int64_t>(pc_.round_deadline_s)},
      {"average_every", pc_.average_every},
      {"warmup_steps", pc_.warmup_steps},
      {"elastic", pc_.elastic ? 1 : 0},
      {"min_ranks", growing ? 0 : pc_.min_ranks},
      {"loss scaling", static_cast<int64_t>(config_.loss_scale.mode)},
      {"loss scale (bits)", std::bit_cast<int64_t>(config_.loss_scale.mode == train::LossScaleConfig::Mode::kFixed
                                                       ? config_.loss_scale.scale
                                                       : config_.loss_scale.init)},
      {"loss scale growth interval", config_.loss_scale.growth_interval},
      {"loss scale growth (bits)", std::bit_cast<int64_t>(config_.loss_scale.growth)},
      {"loss scale backoff (bits)", std::bit_cast<int64_t>(config_.loss_scale.backoff)},
  };
  const size_t K = mine.size();
  std::vector<int64_t> send(K), all(K * static_cast<size_t>(world_->size()));
  for (size_t k = 0; k < K; ++k) send[k] = mine[k].second;
  world_->allgather(send.data(), all.data(), K, DType::kI64)->wait();
  for (int r = 1; r < world_->size(); ++r) {
    for (size_t k = 0; k < K; ++k) {
      const int64_t theirs = all[static_cast<size_t>(r) * K + k], first = all[k];
      TANDEM_CHECK(theirs == first, Status::kMismatch,
                   "ranks disagree on the training configuration: rank {} has {} = {} but rank 0 has {} (every rank "
                   "must be started with the same settings)",
                   r, mine[k].first, theirs, first);
    }
  }
}

std::vector<double> ParallelTrainer::measure_layer_costs() {
  const size_t L = model_.num_layers();
  std::vector<double> cost(L, 0.0);
  if (grid_.rank == 0) {
    compute::Backend& be = model_.backend();
    // Timed on a whole model of its own (released afterwards): model_ will hold only this rank's stage.
    nn::Model probe(model_.spec(), be, model_.seed(), model_.init_scheme());
    const int64_t n = std::max<int64_t>(1, config_.batch_size / pc_.micro_batches);
    const nn::SampleShape in = model_.spec().input;
    Tensor x = be.empty(in.h * in.w == 1 ? Shape{n, in.c} : Shape{n, in.c, in.h, in.w});
    be.fill(x, 0.5f);
    const int32_t last = static_cast<int32_t>(L) - 1;
    // One untimed pass creates the backend's primitives; then kTimedPasses, each layer's cost the mean of its
    // passes. Under a CPU quota a layer's wall time includes the throttled part of the periods it spans; a mean
    // charges throttling in proportion to CPU time, as the pipeline will see it (a median would drop it from short
    // layers and keep it in long ones), and several passes spread the odd preemption.
    constexpr int kTimedPasses = 5;
    std::vector<std::vector<double>> passes;
    for (int rep = 0; rep <= kTimedPasses; ++rep) {
      std::map<int32_t, Tensor> val{{nn::kModelInput, x}}, grad;
      std::vector<nn::Activations> acts(L);
      std::vector<double> t(L, 0.0);
      for (size_t i = 0; i < L; ++i) {
        std::vector<Tensor> ins;
        for (int32_t id : model_.spec().crossing(i)) ins.push_back(val.at(id));
        const auto t0 = Clock::now();
        std::vector<Tensor> outs = probe.forward_range(i, i + 1, ins, acts[i], true);
        be.synchronize();
        t[i] += seconds_since(t0);
        const std::vector<int32_t> ids = i + 1 == L ? std::vector<int32_t>{last} : model_.spec().crossing(i + 1);
        for (size_t k = 0; k < ids.size(); ++k) val[ids[k]] = outs[k];
      }
      {
        Tensor g = be.empty(val.at(last).shape());
        be.fill(g, 1e-3f);
        grad[last] = g;
      }
      for (size_t i = L; i-- > 0;) {
        const std::vector<int32_t> ids = i + 1 == L ? std::vector<int32_t>{last} : model_.spec().crossing(i + 1);
        std::vector<Tensor> gs;
        for (int32_t id : ids) {
          auto it = grad.find(id);
          gs.push_back(it != grad.end() && it->second.defined() ? it->second : be.zeros(be.to_plain(val.at(id)).shape()));
        }
        const auto t0 = Clock::now();
        std::vector<Tensor> back = probe.backward_range(gs, acts[i], false);
        be.synchronize();
        t[i] += seconds_since(t0);
        const std::vector<int32_t> in_ids = model_.spec().crossing(i);
        for (size_t k = 0; k < in_ids.size(); ++k) grad[in_ids[k]] = back[k];
      }
      if (rep > 0) passes.push_back(std::move(t));
    }
    for (const auto& t : passes)
      for (size_t i = 0; i < L; ++i) cost[i] += t[i] / static_cast<double>(passes.size());
  }
  if (grid_.rank == 0 && model_.backend().device().is_cpu()) {
    host_allocator().empty_cache();  // the probe's blocks: give them back rather than keep a whole model's worth
  }
  if (world_ != nullptr) world_->broadcast(cost.data(), cost.size(), DType::kF64, 0)->wait();
  return cost;
}

void ParallelTrainer::broadcast_replica_state() {
  if (!dp_comm_) return;
  compute::Backend& be = model_.backend();
  broadcast_tensor(*dp_comm_, be, model_.range_params(static_cast<size_t>(first_), static_cast<size_t>(end_)), 0);
  broadcast_tensor(*dp_comm_, be, model_.range_buffers(static_cast<size_t>(first_), static_cast<size_t>(end_)), 0);
}

int64_t ParallelTrainer::batches_per_epoch() const {
  const int64_t full = loader_->batches_per_epoch();
  return config_.limit_batches > 0 ? std::min(full, config_.limit_batches) : full;
}

bool ParallelTrainer::epoch_exhausted() const {
  if (sampler_.remaining() == 0) return true;
  const int64_t b = loader_->options().batch_size;
  const int64_t done = (sampler_.position() + b - 1) / b;
  return config_.limit_batches > 0 && done >= config_.limit_batches;
}

bool ParallelTrainer::end_epoch_if_exhausted() {
  if (!epoch_exhausted()) return false;
  ++completed_epochs_;
  // As the single trainer (issue #16): the queue of an epoch cut short is not held through the evaluation; the
  // next epoch restarts the loader anyway.
  loader_->reset();
  return true;
}

void ParallelTrainer::begin_epoch_if_needed() {
  if (sampler_.epoch() == completed_epochs_) return;
  sampler_.set_epoch(completed_epochs_);
  loader_->reset();
}

std::vector<MicroBatch> ParallelTrainer::make_micro_batches(const data::Batch& b, int count,
                                                             std::vector<Tensor>& keep) {
  compute::Backend& be = model_.backend();
  const nn::SampleShape in = model_.spec().input;
  const int64_t per = in.numel();
  const std::vector<int64_t> sizes = micro_batch_sizes(b.size, count);
  std::vector<MicroBatch> out;
  int64_t off = 0;
  const bool need_x = grid_.stage == 0, need_labels = grid_.stage == grid_.pp - 1;
  for (int64_t n : sizes) {
    MicroBatch mb;
    mb.size = n;
    const Shape xs = in.h * in.w == 1 ? Shape{n, in.c} : Shape{n, in.c, in.h, in.w};
    if (need_x) {
      mb.x = Tensor::wrap(const_cast<float*>(b.images.data() + off * per), xs, DType::kF32);
      if (!be.device().is_cpu()) {
        Tensor d = be.empty(xs);
        be.copy(mb.x, d);
        mb.x = d;
      }
      keep.push_back(mb.x);
    }
    if (need_labels) {
      mb.labels = Tensor::wrap(const_cast<int32_t*>(b.labels.data() + off), Shape{n}, DType::kI32);
      if (!be.device().is_cpu()) {
        Tensor d = be.empty(Shape{n}, DType::kI32);
        be.copy(mb.labels, d);
        mb.labels = d;
      }
      keep.push_back(mb.labels);
    }
    out.push_back(std::move(mb));
    off += n;
  }
  return out;
}

std::vector<double> ParallelTrainer::allreduce_sum(std::vector<double> v) {
  if (world_ != nullptr && !v.empty())
    world_->allreduce(v.data(), v.data(), v.size(), DType::kF64, ReduceOp::kSum)->wait();
  return v;
}

void ParallelTrainer::optimizer_step() {
  // Asynchronous EASGD (Zhang et al. 2015, Algorithm 1): at local step t with t % tau == 0, the elastic exchange with
  // the centre acts on the parameters the gradient was taken at; the local update follows.
  if (ps_ && elastic_centre() && !grid_.server && optimizer_->steps() % job_.sync.period == 0) ps_->elastic_exchange();
  compute::Backend& be = model_.backend();
  Tensor g = model_.range_grads(static_cast<size_t>(first_), static_cast<size_t>(end_));
  // fp16 loss scaling: unscale; a step with non-finite gradients on any rank is skipped on every rank.
  if (scaler_.enabled() && g.numel() > 0 && nonfinite_test_hook(world_rank(), ++scaled_steps_)) {
    Tensor first = g.slice(0, Shape{1});
    be.copy(Tensor::full({1}, std::numeric_limits<double>::quiet_NaN()), first);
  }
  last_skipped_ = !scaler_.unscale_and_update(be, g, [this](bool local) { return agree_nonfinite(local); });
  if (last_skipped_) return;
  if (config_.clip_norm > 0) {
    if (!pipe_comm_) {
      std::vector<Tensor> gs{g};
      optim::clip_grad_norm(be, gs, config_.clip_norm);
    } else {
      // The norm is global: every stage adds its share (replicas hold identical averaged gradients).
      double ss = be.sum_squares(g);
      pipe_comm_->allreduce(&ss, &ss, 1, DType::kF64, ReduceOp::kSum)->wait();
      const double norm = std::sqrt(ss);
      if (norm > config_.clip_norm) be.scale(g, static_cast<float>(config_.clip_norm / (norm + 1e-6)));
    }
  }
  optimizer_->step({g}, static_cast<float>(optim::lr_at(schedule_, optimizer_->steps()) * lr_scale_));
}

bool ParallelTrainer::agree_nonfinite(bool local) {
  if (world_ == nullptr) return local;
  int32_t flag = local ? 1 : 0;
  world_->allreduce(&flag, &flag, 1, DType::kI32, ReduceOp::kMax)->wait();
  return flag != 0;
}

std::string ParallelTrainer::in_world_ranks(const std::string& message) const {
  std::vector<int> world_of;  // group rank -> world rank of the communicator that failed with `message`
  if (pipe_comm_ && pipe_comm_->is_failed() && pipe_comm_->failure_message() == message) {
    for (int s = 0; s < grid_.pp; ++s) world_of.push_back(grid_.rank_of(grid_.dp_rank, s));
  } else if (dp_comm_ && dp_comm_->is_failed() && dp_comm_->failure_message() == message) {
    if (absorbing_ && grid_.pp == 1) {
      world_of = members_;  // after a shrink, group ranks are indices into the survivors (workers come first)
    } else {
      for (int d = 0; d < grid_.dp; ++d) world_of.push_back(grid_.rank_of(d, grid_.stage));
    }
  } else if (world_ != nullptr && world_->is_failed() && world_->failure_message() == message) {
    world_of = members_;
  } else {
    return message;
  }
  // "rank N" -> "world rank M", leaving text that already speaks of world ranks alone: "world rank N",
  // and everything from a transport's own message on ("ucx: ...", "zmq: ...": transport ranks are world ranks).
  size_t limit = message.size();
  for (const char* t : {"ucx: ", "zmq: ", "inproc: ", "rdma: "}) limit = std::min(limit, message.find(t));
  std::string out;
  size_t i = 0;
  for (size_t k; (k = message.find("rank ", i)) < limit;) {
    size_t e = k + 5;
    while (e < message.size() && std::isdigit(static_cast<unsigned char>(message[e]))) ++e;
    const bool world = k >= 6 && message.compare(k - 6, 6, "world ") == 0;
    out.append(message, i, k - i);
    if (e > k + 5 && !world) {
      const size_t n = std::stoul(message.substr(k + 5, e - k - 5));
      out += n < world_of.size() ? rank_label(world_of[n]) : message.substr(k, e - k);
    } else {
      out.append(message, k, e - k);
    }
    i = e;
  }
  out.append(message, i, std::string::npos);
  return out;
}

template <typename F>
auto ParallelTrainer::failing_loudly(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Error& e) {
    if (e.status() == Status::kInvalidArgument) throw;
    const std::string why = in_world_ranks(e.what());
    for (comm::Communicator* c : {world_, pipe_comm_.get(), dp_comm_.get()}) {
      if (c != nullptr && !c->is_failed()) c->abort(fmt::format("world rank {} stopped: {}", world_rank(), why));
    }
    const std::string role = grid_.server ? fmt::format("server {}", grid_.server_index)
                             : spare_     ? std::string("spare")
                                          : fmt::format("stage {}, replica {}", grid_.stage, grid_.dp_rank);
    throw Error(e.status(), fmt::format("world rank {} ({}): {}", world_rank(), role, why));
  }
}

train::StepResult ParallelTrainer::step() {
  TANDEM_CHECK(finished_below_min_.empty(), Status::kPeerFailure, "{}", finished_below_min_);
  skip_save_ = false;  // a save skipped only between the epoch's closing collectives and the next step
  return failing_loudly([&] {
    return elastic_retry(Phase::kStep, [&]() -> train::StepResult {
      if (spare_ && !wait_as_spare()) {  // a spare waits to be drafted; the job ended: a last, empty step
        train::StepResult r;
        r.epoch_end = true;
        return r;
      }
      maybe_admit();  // a step boundary: joiners come in here (elastic ddp, pipeline, hybrid)
      return step_impl();
    });
  });
}

// ------------------------------------------------------------------------------ elastic DDP (issue #17)

template <typename F>
auto ParallelTrainer::elastic_retry(Phase phase, F&& f) -> decltype(f()) {
  if (!absorbing_ || (trainer_comm() == nullptr && !spare_)) return f();
  bool again = false;
  // Each pass shrinks the group by at least one rank, or keeps it whole once per step (recover), so this loop is
  // bounded.
  for (;;) {
    take_snapshot();
    const Snapshot mine = snapshot_;
    const double lr_before = lr_scale_;  // a step completed before a re-form ran at its group's factor
    try {
      // Parameter servers after a re-form: every rank is back in the push/pull region; a rank redoing a world
      // collective leaves it first, as the others do at their next sync point.
      if (again && ps_ && phase != Phase::kStep && !adopted_closing_) ps_->sync_point();
      return f();
    } catch (const Error& e) {
      const bool peer_gone = e.status() == Status::kPeerFailure || e.status() == Status::kTimeout;
      if (!peer_gone || spare_ || left_admission_) throw;  // a spare in no group: its wait ran out
      stop_if_stopped_here(e);
      if (reforms_grid() ? !probe_loss(e.what()) : !trainer_comm()->is_failed()) throw;
      again = true;
      if (!recover(phase, in_world_ranks(e.what()))) continue;
      // The step in flight was completed: by the others (ddp, fedavg: its update is in the adopted state), or by
      // the servers (ps, ssp: its push was applied everywhere). Report it as done.
      if constexpr (std::is_same_v<decltype(f()), train::StepResult>) {
        train::StepResult r;
        const data::DistributedSampler old(train_.size(), mine.sampler_world, 0, false, 0);
        r.samples = rounds_ ? 0 : std::min(loader_->options().batch_size, old.shard_size() - mine.sampler.position);
        r.lr = static_cast<float>(optim::lr_at(schedule_, mine.steps) * lr_before);
        r.epoch_end = completed_epochs_ > mine.completed_epochs;
        return r;
      }
    }
  }
}

void ParallelTrainer::stop_if_stopped_here(const Error& e) const {
  // This rank's program aborted the job's communicator (a signal): that abort reached the trainer's own, shrunk or
  // grown, communicator, and no lost peer is recovered from. A peer's abort may be one of a job-wide stop (every rank
  // signalled at once, each aborting within milliseconds): this rank's own is given a moment before it counts as a
  // peer that left.
  comm::Communicator* c = trainer_comm();
  if (c == nullptr) return;
  const comm::FailureStatus f = c->failure_status();
  if (f.aborted && f.origin != c->rank())
    for (int i = 0; i < 25 && c->stopped_by().empty(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const std::string why = c->stopped_by();
  if (!why.empty())
    throw Error(e.status(), fmt::format("its communicator was aborted on this rank: {}", why));
}

void ParallelTrainer::take_snapshot() {
  if (spare_) return;  // holds no state
  compute::Backend& be = model_.backend();
  const auto first = static_cast<size_t>(first_), end = static_cast<size_t>(end_);
  if (grid_.pp > 1 || reforms_grid()) {
    prev_snapshot_ = std::move(snapshot_);
    has_prev_ = snapshot_valid_;  // a snapshot of this grid (none before the first, nor across a re-form)
    snapshot_valid_ = true;
  }
  Snapshot& s = snapshot_;
  // With parameter servers a failed step changes neither the parameters (workers take the servers' after a
  // re-form; an asynchronous EASGD worker's exchange comes before its local update) nor the optimizer.
  s.whole = !ps_;
  s.params = s.whole ? host_floats(be, model_.range_params(first, end)) : std::vector<float>{};
  s.buffers = host_floats(be, model_.range_buffers(first, end));
  const std::vector<Tensor> state = s.whole ? optimizer_->state_tensors() : std::vector<Tensor>{};
  s.state.resize(state.size());
  for (size_t k = 0; k < state.size(); ++k) s.state[k] = host_floats(be, state[k]);
  s.steps = optimizer_->steps();
  s.completed_epochs = completed_epochs_;
  s.sampler = sampler_.state();
  s.sampler_world = sampler_dp_;
  s.taken = taken_ >= 0 && sampler_.epoch() == taken_epoch_ && sampler_.position() == taken_position_ ? taken_ : -1;
  s.rng = rng_.state();
  s.figures = figures_;
}

void ParallelTrainer::restore_snapshot(bool reshard) {
  compute::Backend& be = model_.backend();
  const auto first = static_cast<size_t>(first_), end = static_cast<size_t>(end_);
  const Snapshot& s = snapshot_;
  if (s.whole) {
    copy_floats(be, s.params.data(), model_.range_params(first, end));
    std::vector<Tensor> state;
    for (const std::vector<float>& v : s.state)
      state.push_back(Tensor::wrap(const_cast<float*>(v.data()), Shape{static_cast<int64_t>(v.size())}, DType::kF32));
    optimizer_->restore(s.steps, state);
  }
  copy_floats(be, s.buffers.data(), model_.range_buffers(first, end));
  completed_epochs_ = s.completed_epochs;
  rng_.set_state(s.rng);
  model_.zero_grads();
  loader_->reset();
  if (reshard) {
    // The epoch's global order kept; g samples taken at the old width continue at floor(g / dp').
    data::SamplerState at = s.sampler;
    const data::DistributedSampler before(train_.size(), s.sampler_world, 0, false, 0);
    sampler_ = data::DistributedSampler(train_.size(), grid_.dp, grid_.dp_rank, true, config_.seed);
    const bool done = at.position >= before.shard_size();
    const int64_t g = s.taken >= 0 ? s.taken : at.position * s.sampler_world;
    at.position = done ? sampler_.shard_size() : g / grid_.dp;
    taken_ = done ? -1 : g;
    taken_epoch_ = at.epoch;
    taken_position_ = at.position;
    sampler_.restore(at);
    sampler_dp_ = grid_.dp;
  } else {
    sampler_.restore(s.sampler);  // each survivor keeps its own shard of the starting width
  }
  loader_->reset();
}

comm::Communicator* ParallelTrainer::trainer_comm() const noexcept {
  return own_comm_ ? own_comm_.get() : dp_comm_.get();
}

std::string ParallelTrainer::rank_label(int world_rank) const {
  const int workers = initial_dp_;  // with servers: the workers the job started with
  // Servers keep world ranks [workers, initial_world_); workers that joined later are numbered after them.
  if (parameter_server() && world_rank >= workers && world_rank < initial_world_)
    return fmt::format("world rank {} (server {})", world_rank, world_rank - workers);
  return fmt::format("world rank {}", world_rank);
}

int64_t ParallelTrainer::progress_of(const Snapshot& s) const noexcept {
  return rounds_ ? s.completed_epochs : s.steps;  // fedavg: one round per epoch, no optimizer steps of its own
}

void ParallelTrainer::note_ps_membership() {
  ps_labels_.clear();
  if (!ps_) return;
  ps_labels_ = members_;
  ps_workers_ = grid_.dp;
}

void ParallelTrainer::shrink_group(const std::string& why) {
  std::unique_ptr<comm::Communicator>& group = own_comm_ ? own_comm_ : dp_comm_;
  std::unique_ptr<comm::Communicator> next = group->shrink();
  for (const auto& [rank, note] : next->departures()) {
    // "reported=<epoch>" (train_epoch's standing note, or the destructor's departure): that rank reported the epochs
    // up to it (an unreadable note counts none)
    int64_t epoch = 0;
    const size_t at = note.find("reported=");
    if (at != std::string::npos) std::from_chars(note.data() + at + 9, note.data() + note.size(), epoch);
    reported_elsewhere_ = std::max(reported_elsewhere_, epoch);
  }
  std::vector<int> now;
  for (int p : next->parent_ranks()) now.push_back(members_[static_cast<size_t>(p)]);
  // It may keep every rank: a timeout blamed on ranks that all answered the agreement (membership.hpp); recover
  // bounds how often.
  if (now.size() == members_.size())
    log::info("elastic: world rank {}: every one of the {} ranks answered the survivors' agreement after ({})",
              world_rank(), now.size(), why);
  for (int r : members_)
    if (std::find(now.begin(), now.end(), r) == now.end()) lost_.push_back(r);
  retired_.push_back(std::move(group));
  group = std::move(next);
  world_ = group.get();
  members_ = std::move(now);
  grid_.world = world_->size();
  grid_.rank = world_->rank();
  if (!parameter_server() && !reforms_grid()) {  // a pipeline or hybrid grid is re-formed by reform_grid
    grid_.dp = grid_.world;
    grid_.dp_rank = grid_.rank;
  }
  config_.world = grid_.dp;
  config_.rank = grid_.dp_rank;
}

void ParallelTrainer::refuse_waiting_ranks(const std::string& why) noexcept {
  comm::Communicator* c = trainer_comm();
  refused_ = true;
  try {
    if (c != nullptr) c->refuse_joiners(fmt::format("{}: {}", kJobStopped, why));
  } catch (...) {
    // best effort: they stop at the end of their wait
  }
}

void ParallelTrainer::closed(Phase phase, std::vector<double> result) {
  ++closings_;
  closed_phase_ = phase;
  closed_result_ = std::move(result);
}

void ParallelTrainer::reform_test_point(const char* point) {
  const int leaves = reform_leave_test_hook(point);
  if (leaves < 0) return;
  if (std::strcmp(point, "split") == 0) {  // admit_workers: this rank's split cut off, the others' completed
    TANDEM_CHECK(leaves != world_rank(), Status::kPeerFailure,
                 "TANDEM_TEST_REFORM_LEAVE: world rank {}'s split of the grown world was cut off", leaves);
    return;
  }
  // "grow-voted" and "grow-committed" (ParameterServerSync::grow) behave as "voted" and "committed"
  const auto is = [point](const char* what) {
    const size_t n = std::strlen(point), m = std::strlen(what);
    return n >= m && std::strcmp(point + n - m, what) == 0;
  };
  if (is("committed")) {
    // The rank leaves once every survivor committed (not inside the vote, which "voted" tests).
    if (std::find(members_.begin(), members_.end(), leaves) == members_.end()) return;
    world_->barrier()->wait();
  }
  if (leaves == world_rank()) {
    // "replicating": the backup takes the replica's header while serving (it polls every 200 us) and waits for the
    // payload, which this rank never sends.
    if (std::strcmp(point, "replicating") == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    log::warn("TANDEM_TEST_REFORM_LEAVE: world rank {} leaves the job at point '{}'", leaves, point);
    abandon();
    TANDEM_THROW(Status::kInternal, "TANDEM_TEST_REFORM_LEAVE: world rank {} left the job at point '{}'", leaves, point);
  }
  const auto it = std::find(members_.begin(), members_.end(), leaves);
  const bool committed = is("committed");
  const bool closing = std::strcmp(point, "summed") == 0 || std::strcmp(point, "timed") == 0 ||
                       std::strcmp(point, "evaluated") == 0;  // an epoch's closing collectives, cut off as a vote
  if (!(committed || is("voted") || closing) || (!committed && leaves > world_rank()) || it == members_.end())
    return;
  // A receive the leaving rank never answers: it fails when that rank's loss surfaces here (its abort, or the
  // deadline). The buffer outlives the failed communicator.
  auto sink = std::make_shared<int64_t>(0);
  retired_buffers_.push_back(sink);
  try {
    world_->recv(sink.get(), 1, DType::kI64, static_cast<int>(it - members_.begin()), kTagVoteCut)->wait();
  } catch (const Error&) {
    // "committed": every survivor goes on with the committed view and meets the loss at its next operation, before
    // any server served in the new view (the re-seed must be complete by the commit)
    if (committed) return;
    throw;
  }
  TANDEM_THROW(Status::kInternal, "TANDEM_TEST_REFORM_LEAVE: world rank {} answered a receive it never sends", leaves);
}

void ParallelTrainer::save_test_fault() {
  const std::string what = save_fault_test_hook(world_rank(), ++saves_);
  if (what.empty()) return;
  if (what == "leave") {
    log::warn("TANDEM_TEST_SAVE_FAULT: world rank {} leaves the job in its checkpoint save {}", world_rank(), saves_);
    abandon();
    TANDEM_THROW(Status::kInternal, "TANDEM_TEST_SAVE_FAULT: world rank {} left the job in its checkpoint save {}",
                 world_rank(), saves_);
  }
  const double s = std::strtod(what.c_str(), nullptr);
  TANDEM_CHECK(s > 0, Status::kInvalidArgument,
               "TANDEM_TEST_SAVE_FAULT: '{}' is neither 'leave' nor a stall in seconds", what);
  log::warn("TANDEM_TEST_SAVE_FAULT: world rank {} stalls {:.3g} s in its checkpoint save {}", world_rank(), s, saves_);
  std::this_thread::sleep_for(std::chrono::duration<double>(s));
}

bool ParallelTrainer::settle_ps_view(const std::string& why) {
  const int64_t mine[2] = {ps_->view_epoch(), ps_->has_tentative() ? 1 : 0};
  std::vector<int64_t> all(2 * static_cast<size_t>(world_->size()));
  world_->allgather(mine, all.data(), 2, DType::kI64)->wait();
  int64_t top = mine[0];
  size_t newest = 0;  // the lowest rank holding the newest view
  for (size_t r = 0; r < all.size(); r += 2)
    if (all[r] > top || (all[r] == top && all[newest] != top)) top = all[r], newest = r;
  std::vector<int> astray;
  for (size_t r = 0; r < all.size(); r += 2)
    if (all[r] != top && !(all[r] + 1 == top && all[r + 1] != 0)) astray.push_back(members_[r / 2]);
  TANDEM_CHECK(astray.empty(), Status::kPeerFailure,
               "elastic: cannot re-form after {}: world rank(s) {} hold an older view of the parameter servers than "
               "world rank {} ({} re-form(s) against {}) and not the one it committed; the job stops rather than "
               "guess; restart it from the last checkpoint",
               why, fmt::join(astray, ", "), members_[newest / 2], all[2 * static_cast<size_t>(std::find(
                   members_.begin(), members_.end(), astray.empty() ? 0 : astray[0]) - members_.begin())], top);
  if (admission_undo_) {
    // An admission of workers cut short here (admit_workers): nobody committed it -> the state from before it;
    // a survivor committed it -> the grown view this rank built (adopted below, its trainer state is already grown).
    if (mine[0] == top) {
      ps_->drop_tentative();
      undo_admission();
      log::warn("elastic: world rank {}: the admission of workers was cut off before any survivor committed it: "
                "the job goes on from the view before it ({})",
                world_rank(), why);
      return false;
    }
    admission_undo_.reset();
    ps_->adopt_tentative();
    ps_labels_ = ps_voting_labels_;
    ps_workers_ = ps_voting_workers_;
    job_.sync = ps_->program();
    log::warn("elastic: world rank {}: the vote on the admission of workers was cut off here but another survivor "
              "committed it: this rank takes the grown view it had built (rolled forward)",
              world_rank());
    return false;
  }
  if (!ps_->has_tentative()) return false;
  if (mine[0] == top) {
    ps_->drop_tentative();
    log::warn("elastic: world rank {}: the vote on the last parameter-server re-form was cut off here and no "
              "survivor committed it: the view before it stands",
              world_rank());
    return false;
  }
  // Some survivor committed the re-form whose vote was cut off here: this rank takes the view it had built, as if
  // its vote had completed (ParallelTrainer::reform's commit, in short), then re-forms from it like that survivor.
  ParameterServerSync::Reformed r = ps_->adopt_tentative();
  ps_labels_ = ps_voting_labels_;
  ps_workers_ = ps_voting_workers_;
  job_.sync = ps_->program();
  log::warn("elastic: world rank {}: the vote on the last parameter-server re-form was cut off here but another "
            "survivor committed it: this rank takes the view it had built (rolled forward){}",
            world_rank(), r.from_checkpoint ? "; its restore from the checkpoint is still due" : "");
  if (!r.step_done) return false;
  optimizer_step();
  end_epoch_if_exhausted();
  take_snapshot();  // the step is done: a later restore_snapshot keeps it
  return true;
}

void ParallelTrainer::check_ps_views(const std::string& why) {
  // FNV-1a over the servers' last committed view: the membership (ps_labels_, ps_workers_) and the shards' owners.
  uint64_t h = 1469598103934665603ull;
  const auto mix = [&h](int64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (static_cast<uint64_t>(v) >> (8 * i)) & 0xffu;
      h *= 1099511628211ull;
    }
  };
  mix(ps_workers_);
  mix(static_cast<int64_t>(ps_labels_.size()));
  for (int r : ps_labels_) mix(r);
  for (const KeyRange& k : ps_->program().shards) mix(k.server);
  const auto mine = static_cast<int64_t>(h);
  std::vector<int64_t> all(static_cast<size_t>(world_->size()));
  world_->allgather(&mine, all.data(), 1, DType::kI64)->wait();
  std::vector<int> differ;
  for (size_t r = 0; r < all.size(); ++r)
    if (all[r] != all[0]) differ.push_back(members_[r]);
  TANDEM_CHECK(differ.empty(), Status::kPeerFailure,
               "elastic: cannot re-form after {}: a rank was lost while the survivors committed the previous "
               "parameter-server re-form, and world rank(s) {} hold another view of the membership and the shards' "
               "owners than world rank {}; the job stops rather than guess; restart it from the last checkpoint",
               why, fmt::join(differ, ", "), members_[0]);
}

void ParallelTrainer::count_servers(const std::string& why, const std::vector<int>& before) {
  {  // after shrink_group: members_, grid_.world and grid_.rank are the survivors'
    // Servers follow the workers in both lists. A lost server's shard is taken over in reform (ParameterServerSync).
    // The servers' indices are those of the servers' last completed re-form (ps_labels_), not of `before`: a rank
    // lost while the survivors re-formed shrinks again before the servers renumbered.
    const std::vector<int>& labels = ps_labels_.empty() ? before : ps_labels_;
    const size_t workers_before = ps_labels_.empty() ? before.size() - static_cast<size_t>(grid_.servers)
                                                     : static_cast<size_t>(ps_workers_);
    kept_servers_.clear();
    for (size_t i = workers_before; i < labels.size(); ++i)
      if (std::find(members_.begin(), members_.end(), labels[i]) != members_.end())
        kept_servers_.push_back(static_cast<int>(i - workers_before));
    if (kept_servers_.empty()) {
      std::vector<std::string> names;
      for (size_t i = workers_before; i < labels.size(); ++i)
        names.push_back(fmt::format("parameter server {} (world rank {})", i - workers_before, labels[i]));
      TANDEM_THROW(Status::kPeerFailure,
                   "{} was lost ({}): no server is left to hold the {}, so the job cannot go on; restart it from the "
                   "last checkpoint",
                   fmt::format("{}", fmt::join(names, ", ")), why,
                   elastic_centre() ? "elastic centre" : "parameters and optimizer state");
    }
    grid_.servers = static_cast<int>(kept_servers_.size());
    grid_.dp = grid_.world - grid_.servers;
    TANDEM_CHECK(grid_.dp >= 1, Status::kPeerFailure, "every worker was lost ({}): the parameter servers stop", why);
    grid_.server_index = grid_.server ? grid_.rank - grid_.dp : -1;
    if (!grid_.server) grid_.dp_rank = grid_.rank;
  }
  config_.world = grid_.dp;
  config_.rank = grid_.dp_rank;
}

bool ParallelTrainer::reform(Phase phase, const std::string& why, const std::vector<int>& before) {
  // Where every survivor was, in form_grid's table (every rank holds state; no previous snapshot): its progress
  // (steps; fedavg: rounds), the work it was cut off in and the epoch's closing collectives it completed.
  const int n = world_->size();
  const int64_t mine[kPlanWidth] = {0, progress_of(snapshot_), -1, static_cast<int64_t>(phase), closings_reported(),
                                    static_cast<int64_t>(closed_phase_)};
  std::vector<int64_t> all(kPlanWidth * static_cast<size_t>(n));
  world_->allgather(mine, all.data(), kPlanWidth, DType::kI64)->wait();
  const auto at = [&](int r, int k) { return all[kPlanWidth * static_cast<size_t>(r) + static_cast<size_t>(k)]; };
  int64_t P = std::numeric_limits<int64_t>::max();
  for (int r = 0; r < n; ++r) P = std::min(P, at(r, 1));
  // A closing collective (sums, time split, evaluation) that some survivors completed and the others were cut off in
  // (the loss came as the first ones left it): those behind take its result (closing_plan, as a grid's re-form does)
  // and go on with the others from the next work; they are held to nothing below.
  const int closed_from = closing_plan(why, all, kPlanWidth, members_, P);
  const auto behind = [&](int r) { return closed_from >= 0 && at(r, 4) < at(closed_from, 4); };
  if (closed_from >= 0)
    share_closing(*world_, closed_from, behind(world_->rank()), phase, members_[static_cast<size_t>(closed_from)],
                  static_cast<Phase>(at(closed_from, 3)));
  int root = -1;  // the lowest survivor with the most progress (of those not behind)
  for (int r = 0; r < n; ++r)
    if (!behind(r) && (root < 0 || at(r, 1) > at(root, 1))) root = r;
  const bool adopt = pc_.strategy == Strategy::kDdp || rounds_;
  const auto late = [](int64_t p) {
    return p == static_cast<int64_t>(Phase::kSplit) || p == static_cast<int64_t>(Phase::kEvaluate);
  };
  int64_t late_phase = 0;
  int late_rank = root;  // the rank the others are held to: ddp/fedavg, the one furthest on; else one past the sums
  for (int r = 0; r < n; ++r)
    if (!behind(r) && late(at(r, 3))) late_phase = at(r, 3), late_rank = r;
  const int other = adopt ? root : late_rank;
  for (int r = 0; r < n; ++r) {
    if (behind(r)) continue;
    const int64_t s = at(r, 1), p = at(r, 3), top = at(root, 1), top_phase = at(root, 3);
    // ddp, fedavg (replicas identical after each step or round): a survivor one step behind must have been in that
    // step. The others: ranks go on from where each was, but past the epoch's sums every rank must redo the same.
    const bool ok = adopt ? (s == top && p == top_phase) || (s + 1 == top && p == static_cast<int64_t>(Phase::kStep))
                          : late_phase == 0 || p == late_phase;
    TANDEM_CHECK(ok, Status::kPeerFailure,
                 "elastic: cannot re-form after {}: world rank {} was in phase {} after step {} while world rank {} "
                 "was in phase {} after step {} (phases: 1 step, 2 epoch sums, 3 time split, 4 evaluation, 5 sync "
                 "point); resume from the last checkpoint",
                 why, members_[static_cast<size_t>(r)], p, s, members_[static_cast<size_t>(other)], at(other, 3),
                 at(other, 1));
  }
  const int64_t my_progress = progress_of(snapshot_);
  if (ps_) {
    // A server counts a step once its pushes are in, a worker once its pulls are, and a worker may redo its step in
    // flight: after a loss the ranks may be a step apart, which serve() absorbs within a step. The polls for joiners
    // (collective at step boundaries) resume where every rank has gone past the most progress any rank had here.
    for (int r = 0; r < n; ++r) poll_from_ = std::max(poll_from_, at(r, 1) + 1);
    // kept: the worker index each surviving worker has in the servers' last completed re-form (workers come first
    // in both lists; see shrink_group).
    const std::vector<int>& labels = ps_labels_.empty() ? before : ps_labels_;
    std::vector<int> kept;
    for (int w = 0; w < grid_.dp; ++w)
      kept.push_back(static_cast<int>(std::find(labels.begin(), labels.end(), members_[static_cast<size_t>(w)]) -
                                       labels.begin()));
    retired_.push_back(std::move(dp_comm_));
    if (grid_.dp > 1) dp_comm_ = world_->split(grid_.server ? -1 : 0, grid_.dp_rank);
    const bool checkpoint = !pc_.elastic_checkpoint.empty() && std::filesystem::exists(pc_.elastic_checkpoint);
    ps_voting_labels_ = members_;
    ps_voting_workers_ = grid_.dp;
    ParameterServerSync::Reformed r = ps_->reform(*world_, kept, kept_servers_, snapshot_.steps, checkpoint);
    retired_buffers_.push_back(std::move(r.retired));
    const size_t workers_before = ps_labels_.empty() ? before.size() - kept_servers_.size() - r.lost_servers.size()
                                                     : static_cast<size_t>(ps_workers_);
    std::vector<std::string> names;
    for (int32_t s : r.lost_servers) names.push_back(rank_label(labels[workers_before + static_cast<size_t>(s)]));
    note_ps_membership();
    job_.sync = ps_->program();  // after a server loss: the job compiler's new ownership of the shards
    job_.world = grid_.world;
    if (!elastic_centre()) {
      // The learning rate follows the workers now training (growth's rule), so a shrink after a grow does not keep
      // the grown factor; every rank computes it from the same grid.
      lr_scale_ = workers_lr_scale();
      ps_->set_lr_scale(lr_scale_);
    }
    if (!r.lost_servers.empty()) {
      log::warn("elastic: lost parameter server(s) {}: {} {} now hold the model's {} shards ({} replica(s) each){}",
                fmt::join(names, ", "), grid_.servers, grid_.servers == 1 ? "server" : "servers", job_.sync.shards.size(),
                job_.sync.replicas, r.from_checkpoint ? fmt::format("; no replica survived, so every rank goes back to "
                                                                    "checkpoint '{}'", pc_.elastic_checkpoint)
                                                      : std::string("; each lost shard taken over from its replica"));
    }
    if (r.from_checkpoint && r.lost_servers.empty())
      log::warn("elastic: the restore from checkpoint '{}' that the last re-form started did not complete: every "
                "rank goes back to it again", pc_.elastic_checkpoint);
    if (r.from_checkpoint) {
      reform_test_point("restoring");
      load_checkpoint(pc_.elastic_checkpoint);
      return false;
    }
    if (r.step_done) {
      // This worker's push of the step in flight was applied on every server (only the pull was lost): the step
      // is done -- its batch consumed, counted -- and the reform gave it the servers' parameters.
      optimizer_step();
      end_epoch_if_exhausted();
      return true;
    }
    restore_snapshot(false);
    return false;
  }
  if (adopt) {
    if (rounds_) retired_buffers_.push_back(rounds_->rebind(dp_comm_.get()));
    adopt_state(root);
    return progress_of(snapshot_) > my_progress;
  }
  // localsgd, easgd, asgd: each survivor goes on from its own state; steps some survivor completed with the old
  // group run locally on the others (StepSync::rebind), so the next exchange is at the same step everywhere.
  retired_buffers_.push_back(sync_->rebind(dp_comm_.get(), at(root, 1), root));
  restore_snapshot(false);
  return false;
}

bool ParallelTrainer::recover(Phase phase, const std::string& why) {
  const auto t0 = Clock::now();
  const size_t lost_before = lost_.size();
  // The group's collective reducer goes first: it hooks the model and holds requests of the failed communicator.
  executor_->set_reducer(nullptr);
  reducer_.reset();
  bool behind = false;
  bool rolled = false;  // a re-form adopted by settle_ps_view completed this rank's step in flight
  // Each pass shrinks by at least one rank, or keeps every rank once per step (below), so the retries are bounded by
  // the job's width, and each is bounded by the communicator's deadline. With parameter servers a pass is a transaction
  // (ParameterServerSync::reform): a pass cut short by another loss leaves every survivor's committed view as it was,
  // and the next pass starts from it over the smaller membership.
  for (;;) {
    const std::vector<int> before = members_;
    shrink_group(why);
    if (members_.size() == before.size()) {
      // Every rank answered the agreement: the failure was a deadline missed while waiting for a rank that came back
      // (a stall), not a loss. The group re-forms as it was, once per step; a second time it stops.
      TANDEM_CHECK(kept_all_step_ != optimizer_->steps(), Status::kTimeout,
                   "elastic: world rank {}: the group failed again at step {} although every rank answered the "
                   "survivors' agreement twice ({}); the job stops rather than re-form without end",
                   world_rank(), optimizer_->steps(), why);
      kept_all_step_ = optimizer_->steps();
    }
    try {
      if (parameter_server()) {
        rolled = settle_ps_view(why) || rolled;
        check_ps_views(why);
        count_servers(why, before);
      }
      behind = reforms_grid() ? reform_grid(why, phase) : reform(phase, why, before);
      behind = behind || rolled;
      break;
    } catch (const Error& e) {
      if (ps_) retired_buffers_.push_back(ps_->take_retired());
      const bool peer_gone = e.status() == Status::kPeerFailure || e.status() == Status::kTimeout;
      if (!peer_gone) throw;
      if (!world_->is_failed()) {  // the survivors' decision (from what all of them gathered): the job stops
        refuse_waiting_ranks(e.what());
        throw;
      }
      log::warn("elastic: world rank {}: another rank failed while the survivors re-formed ({}); the attempt is "
                "abandoned and the survivors shrink again",
                world_rank(), in_world_ranks(e.what()));
    }
  }
  const std::vector<int> gone(lost_.begin() + static_cast<std::ptrdiff_t>(lost_before), lost_.end());
  if (static_cast<int>(members_.size()) < pc_.min_ranks && training_done(phase, behind)) {
    finished_below_min_ = fmt::format(
        "elastic training stopped: world rank(s) {} lost ({}) in the closing collectives of the job's last epoch; {} of "
        "{} ranks left, below min_ranks {}: the job's {} epoch(s) of training were done, so the survivors finished "
        "its evaluation and save, but no further step runs",
        fmt::join(lost_, ", "), why, members_.size(), initial_world_, pc_.min_ranks, config_.epochs);
    log::warn("elastic: world rank {}: {} of {} ranks left, below min_ranks {}, after a loss in the closing "
              "collectives of the job's last epoch ({}): its training is done, so the survivors finish it (a further "
              "step stops)",
              world_rank(), members_.size(), initial_world_, pc_.min_ranks, why);
  } else if (static_cast<int>(members_.size()) < pc_.min_ranks) {
    std::string where = "no checkpoint was asked for";
    if (!pc_.elastic_checkpoint.empty()) {
      save_checkpoint(pc_.elastic_checkpoint);
      // A further loss in that save gives it up (save_checkpoint): only the rank that wrote the file knows it holds
      // this step; the others say what they know.
      where = !save_given_up_ || checkpoint_written_
                  ? fmt::format("checkpoint '{}' holds step {} (resume it at any width)", pc_.elastic_checkpoint,
                                optimizer_->steps())
                  : fmt::format("checkpoint '{}' may not hold step {}: a rank was lost while the survivors wrote it "
                                "(it holds an earlier save's step, if one was written)",
                                pc_.elastic_checkpoint, optimizer_->steps());
    }
    const std::string stop =
        fmt::format("elastic training stopped: world rank(s) {} lost ({}); {} of {} ranks left, below min_ranks {}; {}",
                    fmt::join(lost_, ", "), why, members_.size(), initial_world_, pc_.min_ranks, where);
    refuse_waiting_ranks(stop);
    TANDEM_THROW(Status::kPeerFailure, "{}", stop);
  }
  attach_reducer();
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  // Every survivor logs the event, naming the lost rank(s) and how its strategy absorbed them.
  std::string how;
  switch (pc_.strategy) {
    case Strategy::kDdp:
      how = fmt::format("from step {}: learning rate x {:.4g}, epoch {} continues at sample {} of the new shards",
                        optimizer_->steps(), lr_scale_, sampler_.epoch(), sampler_.position());
      break;
    case Strategy::kPs:
    case Strategy::kPsAsync:
    case Strategy::kSsp:
      how = fmt::format("the servers expect {} worker(s) now{}; learning rate x {:.4g}; this rank continues from step {}",
                        grid_.dp,
                        pc_.strategy == Strategy::kPsAsync ? ""
                        : pc_.strategy == Strategy::kPs
                            ? " (each step averages the live workers' gradients)"
                            : fmt::format(" (the staleness bound of {} clocks holds over the live workers)", pc_.staleness),
                        lr_scale_, optimizer_->steps());
      break;
    case Strategy::kEasgd:
      how = pc_.easgd_async ? fmt::format("the centre's server expects {} worker(s) now", grid_.dp)
                            : fmt::format("the centre is averaged over {} worker(s) now", grid_.dp);
      break;
    case Strategy::kFedAvg:
      how = fmt::format("round {} is redone with the sampled clients dealt over {} worker(s)", completed_epochs_,
                        grid_.dp);
      break;
    case Strategy::kAsgd:
      how = fmt::format("gossip pairs only the {} live worker(s) from step {}", grid_.dp, optimizer_->steps());
      break;
    case Strategy::kLocalSgd:
      how = fmt::format("parameters are averaged over {} worker(s)", grid_.dp);
      break;
    default:
      break;
  }
  if (gone.empty())
    log::warn("elastic: no rank lost ({}): all {} ranks answered the survivors' agreement and go on after {:.0f} ms: "
              "{} (seen by {})",
              why, members_.size(), ms, how, rank_label(world_rank()));
  else
    log::warn("elastic: world rank(s) {} lost ({}); {} ranks go on (world ranks {}) after {:.0f} ms: {} (seen by {})",
              fmt::join(gone, ", "), why, members_.size(), fmt::join(members_, ", "), ms, how,
              rank_label(world_rank()));
  return behind;
}

bool ParallelTrainer::training_done(Phase phase, bool step_done) {
  // This rank is past the last epoch's steps: in a closing collective, or its last step was done by the others.
  int64_t done = completed_epochs_ >= config_.epochs && (phase != Phase::kStep || step_done) ? 1 : 0;
  // Every survivor decides alike (a step beyond config.epochs may be done on one and not on another).
  if (world_ != nullptr && !spare_) {
    try {
      world_->allreduce(&done, &done, 1, DType::kI64, ReduceOp::kMin)->wait();
    } catch (const Error& e) {
      log::warn("elastic: world rank {}: the survivors could not agree that the job's training is done ({}): it "
                "stops below min_ranks", world_rank(), in_world_ranks(e.what()));
      done = 0;
    }
  }
  return done != 0;
}

train::StepResult ParallelTrainer::step_impl() {
  if (rounds_) return fedavg_round();
  begin_epoch_if_needed();
  train::StepResult r;
  const int64_t t0 = tracer_.now_ns();
  data::Batch batch;
  // A server trains on no data: it only counts the epoch's batches as replica 0 does, loading none.
  const auto server_batch = [&] {
    batch.size = std::min(loader_->options().batch_size, sampler_.remaining());
    sampler_.advance(batch.size);
    return batch.size > 0;
  };
  if (epoch_exhausted() || !(grid_.server ? server_batch() : loader_->next(batch))) {
    r.epoch_end = true;
    ++completed_epochs_;
    return r;
  }
  TimeSplit t;
  const int64_t t_data = tracer_.now_ns();
  t.data_ns = t_data - t0;
  if (t.data_ns > 20000) tracer_.add("load batch", "data", t0, t_data);
  // The last batch of an epoch may be short: fewer micro-batches then (the same on every rank).
  const int count = static_cast<int>(std::min<int64_t>(pc_.micro_batches * pc_.accumulation, batch.size));
  std::vector<Tensor> keep;
  const std::vector<MicroBatch> mbs = grid_.server ? std::vector<MicroBatch>{} : make_micro_batches(batch, count, keep);
  r.lr = static_cast<float>(optim::lr_at(schedule_, optimizer_->steps()) * lr_scale_);
  StageResult s;
  if (grid_.server) {
    // A server rank serves the workers' pushes and pulls of this step (and of later steps of workers ahead).
    const int64_t t_serve = tracer_.now_ns();
    ps_->serve(optimizer_->steps() + 1);
    t.comm_ns += tracer_.now_ns() - t_serve;
    optimizer_step();
  } else {
    const int64_t steps_before = optimizer_->steps();
    if (sync_) {
      sync_->before_step(steps_before);
      executor_->set_reducer(sync_->synchronous(steps_before) ? reducer_.get() : nullptr);
    }
    executor_->set_loss_scale(scaler_.scale());
    if (leave_hook_)  // TANDEM_TEST_REFORM_LEAVE at "last-step"
      executor_->set_test_point([this] {
        if (epoch_exhausted()) reform_test_point("last-step");
      });
    last_skipped_ = false;
    s = executor_->train_step(job_.pipeline_for(count), mbs, batch.size, [this] { optimizer_step(); }, t);
    if (sync_) {
      const int64_t x0 = tracer_.now_ns();
      sync_->after_step(optimizer_->steps());
      const int64_t x1 = tracer_.now_ns();
      t.comm_ns += x1 - x0;
      if (x1 - x0 > 20000) tracer_.add("exchange", "allreduce", x0, x1);
    }
  }
  t.steps = 1;
  t.step_ns = tracer_.now_ns() - t0;
  local_ += t;
  r.samples = batch.size;
  r.skipped = last_skipped_;
  r.correct = s.correct;
  r.loss = s.samples > 0 ? s.loss_sum / static_cast<double>(s.samples) : std::numeric_limits<double>::quiet_NaN();
  r.epoch_end = end_epoch_if_exhausted();
  return r;
}

EpochSplit ParallelTrainer::reduce_split(const TimeSplit& s) {
  constexpr size_t K = 7;
  const double mine[K] = {static_cast<double>(s.steps), s.step_ns / 1e9, s.compute_ns / 1e9, s.bubble_ns / 1e9,
                          s.comm_ns / 1e9, s.data_ns / 1e9, s.allreduce_ns / 1e9};
  const int n = world_ != nullptr ? world_->size() : 1;
  std::vector<double> all(K * static_cast<size_t>(n));
  if (world_ != nullptr) {
    world_->allgather(mine, all.data(), K, DType::kF64)->wait();
  } else {
    std::copy(mine, mine + K, all.begin());
  }
  EpochSplit e;
  for (int r = 0; r < n; ++r) {
    const double* v = &all[static_cast<size_t>(r) * K];
    const double steps = std::max(v[0], 1.0);
    e.steps = std::max<int64_t>(e.steps, static_cast<int64_t>(v[0]));
    e.step_s += v[1] / steps / n;
    e.compute_s += v[2] / steps / n;
    e.bubble_s += v[3] / steps / n;
    e.comm_s += v[4] / steps / n;
    e.data_s += v[5] / steps / n;
    e.allreduce_s += v[6] / steps / n;
    const double frac = v[1] > 0 ? v[3] / v[1] : 0.0;
    e.bubble_fraction += frac / n;
    e.max_bubble_fraction = std::max(e.max_bubble_fraction, frac);
  }
  e.other_s = e.step_s - e.compute_s - e.bubble_s - e.comm_s - e.data_s;
  return e;
}

train::EpochResult ParallelTrainer::train_epoch(const train::ProgressFn& progress) {
  begin_epoch_if_needed();
  const auto t0 = Clock::now();
  const TimeSplit before = local_;
  train::EpochResult e;
  e.epoch = completed_epochs_ + 1;
  figures_ = EpochFigures{};  // a re-form rolls them back with the step and carries them over (form_grid)
  int64_t samples = 0;
  const int64_t total = batches_per_epoch();
  const int64_t b = loader_->options().batch_size;
  int64_t batch_index = (sampler_.position() + b - 1) / b;
  const auto train_to_epoch_end = [&] {
    for (;;) {
      const train::StepResult s = step();
      if (s.samples > 0) {
        samples += s.samples;
        if (!std::isnan(s.loss)) {
          figures_.loss_sum += s.loss * static_cast<double>(s.samples);
          figures_.correct += s.correct;
          figures_.scored += s.samples;
        }
        ++batch_index;
        if (progress) {
          train::Progress p;
          p.epoch = e.epoch;
          p.batch = batch_index;
          p.batches = total;
          p.loss = figures_.scored > 0 ? figures_.loss_sum / static_cast<double>(figures_.scored)
                                       : std::numeric_limits<double>::quiet_NaN();
          p.elapsed_s = seconds_since(t0);
          p.images_per_sec = static_cast<double>(samples * grid_.dp) / std::max(p.elapsed_s, 1e-9);
          progress(p);
        }
      }
      if (s.epoch_end) break;
    }
  };
  train_to_epoch_end();
  if (ps_) failing_loudly([&] { elastic_retry(Phase::kSyncPoint, [&] { ps_->sync_point(); }); });
  double my_train_s = seconds_since(t0);
  double train_s = my_train_s;
  // Global figures: the last stage of every replica scored its samples (elastic: the survivors' figures).
  const std::vector<double> g = failing_loudly([&] {
    return elastic_retry(Phase::kEpochSums, [&] {
      if (adopted_closing_) {  // the sums another survivor completed (reform, form_grid)
        std::vector<double> v = std::move(*adopted_closing_);
        adopted_closing_.reset();
        train_s = v[3];
        figures_ = EpochFigures{};
        closed(Phase::kEpochSums, v);
        v.resize(3);
        return v;
      }
      // A re-form took this rank back into the epoch's last step, which another survivor was cut off in: it redoes it
      // with the others first (form_grid).
      if (!spare_ && completed_epochs_ < e.epoch) {
        train_to_epoch_end();
        my_train_s = seconds_since(t0);
      }
      std::vector<double> sums = allreduce_sum(
          {figures_.loss_sum, static_cast<double>(figures_.correct), static_cast<double>(figures_.scored)});
      train_s = my_train_s;
      if (world_ != nullptr) world_->allreduce(&train_s, &train_s, 1, DType::kF64, ReduceOp::kMax)->wait();
      if (leave_hook_) reform_test_point("summed");
      figures_ = EpochFigures{};  // summed: no later re-form carries them over again
      closed(Phase::kEpochSums, {sums[0], sums[1], sums[2], train_s});
      return sums;
    });
  });
  e.train_s = train_s;
  e.train_samples = static_cast<int64_t>(g[2]);
  // Nothing scored (every scoring rank lost, or an epoch with no batch left): no figure, rather than a false 0.
  e.train_loss = g[2] > 0 ? g[0] / g[2] : std::numeric_limits<double>::quiet_NaN();
  e.train_accuracy = g[2] > 0 ? g[1] / g[2] : std::numeric_limits<double>::quiet_NaN();
  e.images_per_sec = g[2] / std::max(train_s, 1e-9);
  TimeSplit epoch = local_;
  epoch.steps -= before.steps;
  epoch.step_ns -= before.step_ns;
  epoch.compute_ns -= before.compute_ns;
  epoch.bubble_ns -= before.bubble_ns;
  epoch.comm_ns -= before.comm_ns;
  epoch.data_ns -= before.data_ns;
  epoch.allreduce_ns -= before.allreduce_ns;
  last_split_ = failing_loudly([&] {
    return elastic_retry(Phase::kSplit, [&] {
      EpochSplit x;
      if (adopted_closing_) {  // the time split another survivor completed (reform, form_grid)
        const std::vector<double> v = std::move(*adopted_closing_);
        adopted_closing_.reset();
        x = EpochSplit{static_cast<int64_t>(v[0]), v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9]};
        closed(Phase::kSplit, v);
        return x;
      }
      x = reduce_split(epoch);
      if (leave_hook_) reform_test_point("timed");
      closed(Phase::kSplit, {static_cast<double>(x.steps), x.step_s, x.compute_s, x.bubble_s, x.comm_s, x.data_s,
                             x.other_s, x.allreduce_s, x.bubble_fraction, x.max_bubble_fraction});
      return x;
    });
  });
  e.test_loss = e.test_accuracy = std::numeric_limits<double>::quiet_NaN();
  if (test_ != nullptr) {
    const train::EvalResult ev = evaluate(*test_);
    e.test_loss = ev.loss;
    e.test_accuracy = ev.accuracy;
  }
  e.wall_s = seconds_since(t0);
  e.already_reported = e.epoch <= reported_elsewhere_;
  if (grid_.rank == 0 && !spare_) reported_epoch_ = std::max(reported_epoch_, e.epoch);
  if (grid_.rank == 0 && !spare_ && !e.already_reported) {
    // Recorded in the job's store before the epoch goes to the program, so it outlives this rank however it ends --
    // killed right after reporting the epoch too: survivors that count it out redo no report (shrink_group). One
    // bounded store write per epoch, on this rank alone.
    if (comm::Communicator* c = trainer_comm(); absorbing_ && c != nullptr)
      c->set_note(fmt::format("reported={}", reported_epoch_));
  }
  return e;
}

train::EvalResult ParallelTrainer::evaluate(const data::Dataset& d, int64_t limit_batches) {
  return failing_loudly([&] {
    return elastic_retry(Phase::kEvaluate, [&] {
      if (adopted_closing_) {  // the evaluation another survivor completed (reform, form_grid)
        const std::vector<double> v = std::move(*adopted_closing_);
        adopted_closing_.reset();
        closed(Phase::kEvaluate, v);
        return train::EvalResult{v[0], v[1], static_cast<int64_t>(v[2])};
      }
      const train::EvalResult r = with_consensus([&] { return evaluate_impl(d, limit_batches); });
      if (leave_hook_) reform_test_point("evaluated");
      closed(Phase::kEvaluate, {r.loss, r.accuracy, static_cast<double>(r.samples)});
      return r;
    });
  });
}

template <typename F>
auto ParallelTrainer::with_consensus(F&& f) -> decltype(f()) {
  const std::vector<float> c = sync_ ? sync_->consensus() : std::vector<float>{};
  if (c.empty()) return f();
  const std::vector<float> own = replica_->get();
  replica_->set(c);
  try {
    auto r = f();
    replica_->set(own);
    return r;
  } catch (...) {
    replica_->set(own);
    throw;
  }
}

train::EvalResult ParallelTrainer::evaluate_impl(const data::Dataset& d, int64_t limit_batches) {
  if (spare_) return {};  // a spare scores nothing (it is in no group)
  if (ps_) ps_->sync_point();
  if (limit_batches < 0) limit_batches = config_.eval_limit_batches;
  // Replicas' batch-norm statistics drift apart (each saw its own samples): score with replica 0's,
  // as PyTorch DDP's buffer broadcast does.
  if (dp_comm_) {
    broadcast_tensor(*dp_comm_, model_.backend(),
                     model_.range_buffers(static_cast<size_t>(first_), static_cast<size_t>(end_)), 0);
  }
  data::Dataset shard;
  if (grid_.dp > 1 && !grid_.server) shard = shard_of(d, grid_.dp_rank, grid_.dp);
  const data::Dataset& mine = grid_.server ? shard : grid_.dp > 1 ? shard : d;  // a server scores nothing
  double loss_sum = 0;
  int64_t correct = 0, samples = 0;
  TimeSplit t;
  if (mine.size() > 0) {
    data::DistributedSampler s(mine.size(), 1, 0, false, 0);
    data::LoaderOptions lo;
    lo.batch_size = config_.eval_batch_size > 0 ? config_.eval_batch_size : config_.batch_size;
    lo.augment = train::default_augment(d, config_.normalize, false);
    lo.train = false;
    lo.prefetch = config_.prefetch;
    data::Loader loader(mine, s, lo);
    data::Batch b;
    for (int64_t k = 0; (limit_batches == 0 || k < limit_batches) && loader.next(b); ++k) {
      std::vector<Tensor> keep;
      const std::vector<MicroBatch> mbs = make_micro_batches(b, 1, keep);
      const StageResult r = executor_->eval_batch(mbs[0], k, t);
      loss_sum += r.loss_sum;
      correct += r.correct;
      samples += r.samples;
    }
    executor_->drain_sends(t);
  }
  const std::vector<double> g = allreduce_sum({loss_sum, static_cast<double>(correct), static_cast<double>(samples)});
  train::EvalResult r;
  r.samples = static_cast<int64_t>(g[2]);
  if (g[2] > 0) {
    r.loss = g[0] / g[2];
    r.accuracy = g[1] / g[2];
  }
  return r;
}

// ------------------------------------------------------------------------------ checkpoints

train::TrainingIdentity ParallelTrainer::identity() const {
  train::TrainingIdentity id;
  id.spec = &model_.spec();
  id.optimizer = optimizer_->config();
  id.schedule = config_.schedule;
  id.batch_size = config_.batch_size;
  return id;
}

void ParallelTrainer::save_checkpoint(const std::string& path) {
  if (spare_) return;  // the grid writes it
  if (skip_save_) {  // the others are past this save (share_closing): it would meet their next step
    skip_save_ = false;
    log::warn("elastic: world rank {} skips checkpoint '{}' at step {}: the ranks it took the epoch's last closing "
              "collective from had gone on past the save into the next step",
              world_rank(), path, optimizer_->steps());
    return;
  }
  save_given_up_ = false;
  if (!absorbing_) return write_checkpoint(path);
  // A rank lost (or stalled) while the ranks write: the save's collectives fail on the ranks that waited for it, while
  // others may have got through them and gone on to their next step. The save is not redone here (those others would
  // not join it); every survivor goes on as after a completed save, and the trainer's failed communicator makes the
  // next collective fail at once, in a step or phase elastic_retry re-forms from. Throwing instead stopped the ranks
  // that waited (the CLI exits on a failed save) while the others re-formed without them, healthy as they were.
  // Parameter servers alike (a server lost or stalled in the save's sync point or gathers): the next step's push,
  // pull or serve fails and the re-form takes a lost server's shards over from its replica or the checkpoint, as
  // after a loss in a step.
  try {
    write_checkpoint(path);
  } catch (const Error& e) {
    const bool peer_gone = e.status() == Status::kPeerFailure || e.status() == Status::kTimeout;
    comm::Communicator* c = trainer_comm();
    if (!peer_gone || c == nullptr || !c->is_failed() || left_admission_) throw;
    stop_if_stopped_here(e);
    save_given_up_ = true;
    log::warn("elastic: world rank {}: a rank was lost while the ranks wrote checkpoint '{}' at step {} ({}); {}; the "
              "survivors re-form at their next collective",
              world_rank(), path, optimizer_->steps(), in_world_ranks(e.what()),
              checkpoint_written_ ? "this rank wrote it" : "it may still hold an earlier step");
  }
}

void ParallelTrainer::write_checkpoint(const std::string& path) {
  checkpoint_written_ = false;
  save_test_fault();
  // Parameter servers: every worker leaves with the servers' parameters; rank 0 gathers their optimizer state.
  // Asynchronous EASGD: world rank 0 (worker 0) gathers the centre from the servers instead.
  // A job that absorbs a loss gives the save up on it (save_checkpoint) and re-forms at its next step: it aborts no
  // group here (the others would count this rank as gone). Otherwise a failed save stops the job's other groups too.
  const auto servers = [this](auto&& f) { return absorbing_ ? f() : failing_loudly(f); };
  std::vector<std::vector<float>> server_state;
  std::vector<float> centre;
  if (ps_) {
    servers([&] { ps_->sync_point(); });
    if (elastic_centre()) {
      centre = servers([&] { return ps_->gather_centre(0); });
    } else {
      server_state = servers([&] { return ps_->gather_state(0); });
    }
  }
  const int64_t server_updates = saved_server_updates();
  refuse_diverged(path);
  compute::Backend& be = model_.backend();
  const auto first = static_cast<size_t>(first_), end = static_cast<size_t>(end_);
  std::string error;
  Status error_status = Status::kOk;
  // The averaging strategies: the checkpoint's model is the strategy's (EASGD's centre, the workers' mean), and
  // every worker's own state rides along (collective over the workers, before rank 0 writes). Asynchronous EASGD
  // likewise: the centre (from the servers) is the model, and each worker's own parameters, buffers and optimizer
  // state are kept beside it.
  std::vector<float> consensus;
  train::Checkpoint replicas;
  if (sync_) {
    consensus = sync_->consensus();
    if (sync_->replicas_diverge()) save_replicas(grid_.dp_rank == 0 ? &replicas : nullptr);
  } else if (elastic_centre() && !grid_.server) {
    save_replicas(grid_.dp_rank == 0 ? &replicas : nullptr);
  }
  if (grid_.dp_rank == 0 && !grid_.server) {
    // This stage's share, packed: parameters, buffers, then each optimizer state tensor.
    std::vector<float> mine = host_floats(be, model_.range_params(first, end));
    const std::vector<float> buf = host_floats(be, model_.range_buffers(first, end));
    mine.insert(mine.end(), buf.begin(), buf.end());
    const std::vector<Tensor> state = optimizer_->state_tensors();
    for (const Tensor& st : state) {
      const std::vector<float> v = host_floats(be, st);
      mine.insert(mine.end(), v.begin(), v.end());
    }
    if (grid_.stage != 0) {
      pipe_comm_->send(mine.data(), mine.size(), DType::kF32, 0, kTagCheckpoint)->wait();
    } else {
      // Stage 0 of replica 0 assembles the whole model from every stage's share.
      const int64_t P = model_.total_params(), B = model_.total_buffers();
      std::vector<float> params(static_cast<size_t>(P)), buffers(static_cast<size_t>(B));
      std::vector<std::vector<float>> states(state.size(), std::vector<float>(static_cast<size_t>(P)));
      for (int s = 0; s < grid_.pp; ++s) {
        const auto f = static_cast<size_t>(job_.boundaries[static_cast<size_t>(s)]);
        const auto e = static_cast<size_t>(job_.boundaries[static_cast<size_t>(s) + 1]);
        const int64_t p0 = model_.param_offset(f), p1 = model_.param_offset(e);
        const int64_t q0 = model_.buffer_offset(f), q1 = model_.buffer_offset(e);
        const size_t np = static_cast<size_t>(p1 - p0), nb = static_cast<size_t>(q1 - q0);
        std::vector<float> theirs;
        if (s == 0) {
          theirs = std::move(mine);
        } else {
          theirs.resize(np + nb + state.size() * np);
          pipe_comm_->recv(theirs.data(), theirs.size(), DType::kF32, s, kTagCheckpoint)->wait();
        }
        std::copy_n(theirs.begin(), np, params.begin() + p0);
        std::copy_n(theirs.begin() + static_cast<std::ptrdiff_t>(np), nb, buffers.begin() + q0);
        for (size_t k = 0; k < state.size(); ++k)
          std::copy_n(theirs.begin() + static_cast<std::ptrdiff_t>(np + nb + k * np), np, states[k].begin() + p0);
      }
      if (ps_ && !elastic_centre()) states = std::move(server_state);
      train::TrainingProgress p;
      p.optimizer_steps = optimizer_->steps();
      p.completed_epochs = completed_epochs_;
      p.sampler = sampler_.state();
      p.sampler_world = sampler_dp_;
      p.sampler_rank = 0;
      p.rng = rng_.state();
      if (!consensus.empty()) {  // pp = 1: the whole model
        params.assign(consensus.begin(), consensus.begin() + P);
        buffers.assign(consensus.begin() + P, consensus.end());
      }
      if (!centre.empty()) params = std::move(centre);  // buffers: worker 0's, as evaluation scores with them
      train::Checkpoint ck =
          train::make_training_checkpoint(identity(), p, std::move(params), std::move(buffers), std::move(states));
      for (auto& [name, values] : replicas.tensors) ck.add(name, std::move(values));
      if (sync_) sync_->save(ck);
      ck.meta["parallel"] = {{"strategy", strategy_name(pc_.strategy)}, {"world", grid_.world}, {"dp", grid_.dp},
                             {"pp", grid_.pp}, {"micro_batches", pc_.micro_batches},
                             {"accumulation", pc_.accumulation}, {"boundaries", job_.boundaries}};
      if (pc_.strategy == Strategy::kFedAvg) {
        ck.meta["parallel"]["clients"] = pc_.clients;
        ck.meta["parallel"]["dirichlet_alpha"] = pc_.dirichlet_alpha;
        ck.meta["parallel"]["seed"] = config_.seed;
      }
      if (parameter_server()) ck.meta["parallel"]["servers"] = grid_.servers;
      // What a grow or a shrink changed and a resume at this width must continue with: the width the learning-rate
      // rule counts from (lr x dp / lr_base_dp), and ps-async's update count (not steps x workers after one).
      ck.meta["parallel"]["lr_base_dp"] = initial_dp_;
      if (server_updates >= 0) ck.meta["parallel"]["server_updates"] = server_updates;
      if (pc_.strategy == Strategy::kEasgd) ck.meta["parallel"]["easgd_async"] = pc_.easgd_async;
      if (scaler_.enabled()) ck.meta["loss_scale"] = scaler_.to_json();
      try {
        train::save_checkpoint(path, ck);
        checkpoint_written_ = true;
      } catch (const Error& e) {
        error = e.what();
        error_status = e.status();
      }
    }
  }
  if (world_ != nullptr) {
    int64_t failed = error.empty() ? 0 : 1;
    world_->broadcast(&failed, 1, DType::kI64, 0)->wait();
    TANDEM_CHECK(failed == 0 || !error.empty(), Status::kIo, "checkpoint '{}': rank 0 could not write it", path);
  }
  if (!error.empty()) throw Error(error_status, error);
}

int64_t ParallelTrainer::saved_server_updates() {
  // ps-async's servers count one optimizer update per push; the count goes into the file (world rank 0 writes it, a
  // server holds it: a max over the world, collective like the rest of the save).
  if (!ps_ || pc_.strategy != Strategy::kPsAsync) return -1;
  int64_t u = ps_->updates();
  if (world_ != nullptr) world_->allreduce(&u, &u, 1, DType::kI64, ReduceOp::kMax)->wait();
  return u;
}

void ParallelTrainer::restore_lr_base(int64_t lr_base_dp) {
  // A resume at the width that wrote the file continues its learning-rate rule: a job grown from 2 to 3 workers ran
  // at x 3/2 and goes on so (a resume at another width is a new launch there: its own width is the base).
  if (lr_base_dp <= 0 || lr_base_dp == initial_dp_) return;
  initial_dp_ = static_cast<int>(lr_base_dp);
  if (pc_.strategy == Strategy::kDdp) lr_scale_ = static_cast<double>(grid_.dp) / initial_dp_;
  if (ps_ && !elastic_centre()) {
    lr_scale_ = workers_lr_scale();
    ps_->set_lr_scale(lr_scale_);
  }
}

void ParallelTrainer::refuse_diverged(const std::string& path) {
  // A diverged run (the learning rate too high: inf/NaN parameters) must not overwrite the last good checkpoint. Each
  // rank looks at what it holds -- a worker its own parameters (after the sync point: the servers' for push/pull), a
  // server of asynchronous EASGD its shard of the centre -- and the world agrees on the lowest rank that diverged,
  // so every rank refuses the write alike (none is left waiting in the collective write) and names the same step.
  bool finite = true;
  if (!grid_.server) {
    const std::vector<float> x = host_floats(model_.backend(), model_.range_params(static_cast<size_t>(first_),
                                                                                   static_cast<size_t>(end_)));
    finite = std::all_of(x.begin(), x.end(), [](float v) { return std::isfinite(v); });
  } else if (elastic_centre()) {
    const std::vector<float>& c = ps_->shard();
    finite = std::all_of(c.begin(), c.end(), [](float v) { return std::isfinite(v); });
  }
  int64_t first_bad = finite ? INT64_MAX : world_rank();
  if (world_ != nullptr) world_->allreduce(&first_bad, &first_bad, 1, DType::kI64, ReduceOp::kMin)->wait();
  TANDEM_CHECK(first_bad == INT64_MAX, Status::kInvalidArgument,
               "checkpoint '{}' not written: the model diverged by step {} ({} epochs completed): world rank {} holds "
               "non-finite parameters{}; the last checkpoint is kept -- lower the learning rate or clip the gradients",
               path, optimizer_->steps(), completed_epochs_, first_bad,
               elastic_centre() && first_bad >= grid_.dp ? " (its shard of the elastic centre)" : "");
}

void ParallelTrainer::check_resharding(const train::Checkpoint& ck, int saved_dp) const {
  const nlohmann::json& meta = ck.meta;
  const nlohmann::json par = meta.value("parallel", nlohmann::json::object());
  const std::string wrote = par.value("strategy", "single");
  const auto refuse = [&](const std::string& why) {
    TANDEM_THROW(Status::kInvalidArgument,
                 "it was written by {} with {} data-parallel worker(s), this run has {}: {}; resume with {} workers",
                 wrote, saved_dp, grid_.dp, why, saved_dp);
  };
  // Per-worker state has no owner at another width: averaging it would change the run, dropping it would lose it.
  if (ck.has("replica.0.params"))
    refuse(fmt::format("{} keeps each worker's own parameters and optimizer state ({}), which cannot be split or "
                       "merged over another number of workers", wrote,
                       wrote == "easgd"      ? "they move apart from the elastic centre between exchanges"
                       : wrote == "localsgd" ? "they drift apart between averagings"
                                             : "they differ between exchanges"));
  if (pc_.strategy == Strategy::kPsAsync || wrote == "ps-async")
    refuse("ps-async applies one server update per worker push, so its optimizer's update count (steps x workers) "
           "depends on the number of workers");
}

void ParallelTrainer::check_client_split(const train::Checkpoint& ck) const {
  // FedAvg's clients are the training set's split (their count, the Dirichlet label skew and the seed): a resumed run
  // with another split would go on with other clients under the same round numbers, so it is refused naming the
  // setting (the workers may change; the sampled fraction, local epochs and deadline are the run's to change).
  const nlohmann::json par = ck.meta.value("parallel", nlohmann::json::object());
  if (pc_.strategy != Strategy::kFedAvg || par.value("strategy", "") != "fedavg") return;
  const auto differs = [&](const char* what, const std::string& then, const std::string& now, const char* flag) {
    TANDEM_THROW(Status::kInvalidArgument,
                 "FedAvg splits the training set among its clients by {}, {} then and {} now{}; resume with {} {}",
                 what, then, now, flag == std::string("--clients") ? " (clients default to the number of workers)" : "",
                 flag, then);
  };
  const int64_t clients = par.value("clients", int64_t{0});
  if (clients != pc_.clients) differs("count", std::to_string(clients), std::to_string(pc_.clients), "--clients");
  if (par.contains("dirichlet_alpha") && par.at("dirichlet_alpha").get<double>() != pc_.dirichlet_alpha) {
    const auto name = [](double a) { return a > 0 ? fmt::format("{}", a) : std::string("0 (IID)"); };
    differs("Dirichlet alpha", name(par.at("dirichlet_alpha").get<double>()), name(pc_.dirichlet_alpha),
            "--dirichlet-alpha");
  }
  if (par.contains("seed") && par.at("seed").get<uint64_t>() != config_.seed)
    differs("seed", std::to_string(par.at("seed").get<uint64_t>()), std::to_string(config_.seed), "--seed");
}

void ParallelTrainer::load_checkpoint(const std::string& path) {
  TANDEM_CHECK(!spare_, Status::kUnsupported, "load_checkpoint('{}'): world rank {} is a spare (it holds no stage)",
               path, world_rank());
  if (ps_) failing_loudly([&] { ps_->sync_point(); });
  std::string error;
  Status error_status = Status::kOk;
  int64_t steps = 0;
  try {
    // Every rank reads the whole file and takes its stage's slices.
    const train::TrainingCheckpoint ck = train::load_training_checkpoint(path, identity(), grid_.dp, -1);
    train::in_checkpoint(path, [&] {
      const auto first = static_cast<size_t>(first_), end = static_cast<size_t>(end_);
      const int64_t p0 = model_.param_offset(first), p1 = model_.param_offset(end);
      const int64_t q0 = model_.buffer_offset(first);
      std::vector<Tensor> state;  // a stage without parameters (activations, pooling only) has no optimizer state
      for (const std::vector<float>* v : p1 > p0 ? ck.optimizer_state : std::vector<const std::vector<float>*>{})
        state.push_back(Tensor::wrap(const_cast<float*>(v->data()) + p0, Shape{p1 - p0}, DType::kF32));
      steps = ck.progress.optimizer_steps;
      // The workers that wrote it: after a lost worker was absorbed without re-sharding, fewer than its sampler's
      // width (each worker's own state is kept for those).
      const int saved_dp = ck.file.meta.value("parallel", nlohmann::json::object()).value("dp", ck.progress.sampler_world);
      if (saved_dp != grid_.dp) check_resharding(ck.file, saved_dp);
      check_client_split(ck.file);
      const nlohmann::json saved_par = ck.file.meta.value("parallel", nlohmann::json::object());
      const data::SamplerState before = sampler_.state();
      sampler_.restore(train::reshard_sampler(ck.progress, train_.size(), grid_.dp));
      try {
        if (ps_) {
          // Asynchronous EASGD's workers step locally (their own state follows from the replica records).
          optimizer_->restore(steps, elastic_centre() && !grid_.server ? state : std::vector<Tensor>{});
          ps_->restore(steps, ck.params->data(), ck.optimizer_state, saved_par.value("server_updates", int64_t{-1}));
        } else {
          optimizer_->restore(steps, state);
        }
      } catch (...) {
        sampler_.restore(before);
        throw;
      }
      compute::Backend& be = model_.backend();
      copy_floats(be, ck.params->data() + p0, model_.range_params(first, end));
      copy_floats(be, ck.buffers->data() + q0, model_.range_buffers(first, end));
      rng_.set_state(ck.progress.rng);
      completed_epochs_ = ck.progress.completed_epochs;
      if (saved_dp == grid_.dp) restore_lr_base(saved_par.value("lr_base_dp", initial_dp_));
      if (scaler_.enabled() && ck.file.meta.contains("loss_scale")) scaler_.restore(ck.file.meta.at("loss_scale"));
      if (sync_ || (elastic_centre() && !grid_.server)) load_replica(ck.file, path);
      if (sync_) sync_->load(ck.file, path);
    });
    loader_->reset();
    model_.zero_grads();
  } catch (const Error& e) {
    if (world_ == nullptr) throw;
    error = e.what();
    error_status = e.status();
  }
  if (world_ == nullptr) return;
  // Every rank learns whether every other loaded the same state.
  const int64_t mine[4] = {error.empty() ? 0 : 1, steps, completed_epochs_, sampler_.position()};
  std::vector<int64_t> all(4 * static_cast<size_t>(world_->size()));
  world_->allgather(mine, all.data(), 4, DType::kI64)->wait();
  if (!error.empty()) throw Error(error_status, error);
  for (int r = 0; r < world_->size(); ++r) {
    const int64_t* v = &all[static_cast<size_t>(r) * 4];
    TANDEM_CHECK(v[0] == 0, Status::kIo, "checkpoint '{}': rank {} could not load it (see its error)", path, r);
    TANDEM_CHECK(v[1] == all[1] && v[2] == all[2] && v[3] == all[3], Status::kMismatch,
                 "checkpoint '{}': rank {} resumed at step {} (epoch {}, position {}) but rank 0 at step {} (epoch {}, "
                 "position {})",
                 path, r, v[1], v[2], v[3], all[1], all[2], all[3]);
  }
}

void ParallelTrainer::save_replicas(train::Checkpoint* ck) {
  compute::Backend& be = model_.backend();
  std::vector<float> mine = replica_->get();
  const std::vector<Tensor> state = optimizer_->state_tensors();
  for (const Tensor& st : state) {
    const std::vector<float> v = host_floats(be, st);
    mine.insert(mine.end(), v.begin(), v.end());
  }
  if (grid_.dp_rank != 0) {
    dp_comm_->send(mine.data(), mine.size(), DType::kF32, 0, kTagReplica)->wait();
    return;
  }
  const auto P = static_cast<size_t>(replica_->params()), S = static_cast<size_t>(replica_->size());
  for (int r = 0; r < grid_.dp; ++r) {
    std::vector<float> theirs(mine.size());
    if (r == 0) {
      theirs = mine;
    } else {
      dp_comm_->recv(theirs.data(), theirs.size(), DType::kF32, r, kTagReplica)->wait();
    }
    const auto at = [&](size_t a, size_t b) { return std::vector<float>(theirs.begin() + static_cast<std::ptrdiff_t>(a),
                                                                        theirs.begin() + static_cast<std::ptrdiff_t>(b)); };
    ck->add(fmt::format("replica.{}.params", r), at(0, P));
    ck->add(fmt::format("replica.{}.buffers", r), at(P, S));
    for (size_t k = 0; k < state.size(); ++k)
      ck->add(fmt::format("replica.{}.optimizer.state.{}", r, k), at(S + k * P, S + (k + 1) * P));
  }
}

void ParallelTrainer::load_replica(const train::Checkpoint& ck, const std::string& path) {
  const std::string pre = fmt::format("replica.{}.", grid_.dp_rank);
  if (!ck.has(pre + "params")) return;  // written without them (another strategy): every worker starts from the model
  std::vector<float> x = ck.tensor(pre + "params");
  const std::vector<float>& b = ck.tensor(pre + "buffers");
  x.insert(x.end(), b.begin(), b.end());
  TANDEM_CHECK(static_cast<int64_t>(x.size()) == replica_->size(), Status::kIo,
               "checkpoint '{}': {}params and buffers hold {} values, the model {}", path, pre, x.size(),
               replica_->size());
  std::vector<Tensor> state;
  const size_t n = optimizer_->state_tensors().size();
  for (size_t k = 0; k < n; ++k) {
    const std::vector<float>& v = ck.tensor(fmt::format("{}optimizer.state.{}", pre, k));
    TANDEM_CHECK(static_cast<int64_t>(v.size()) == replica_->params(), Status::kIo,
                 "checkpoint '{}': {}optimizer.state.{} has {} values, the model {}", path, pre, k, v.size(),
                 replica_->params());
    state.push_back(Tensor::wrap(const_cast<float*>(v.data()), Shape{replica_->params()}, DType::kF32));
  }
  optimizer_->restore(optimizer_->steps(), state);
  replica_->set(x);
}

train::StepResult ParallelTrainer::fedavg_round() {
  train::StepResult r;
  TimeSplit t;
  const int64_t t0 = tracer_.now_ns();
  const int64_t round = completed_epochs_;
  const std::vector<int32_t> sampled = sample_clients(pc_.clients, pc_.client_fraction, config_.seed, round);
  const std::vector<int32_t> mine = clients_of_worker(sampled, grid_.dp_rank, grid_.dp);
  const std::vector<float> global = replica_->get();
  rounds_->begin(round, global.size());
  r.lr = optim::lr_at(schedule_, round * batches_per_epoch());
  std::vector<double> acc(global.size(), 0.0);
  RoundReport report;
  compute::Backend& be = model_.backend();
  for (const int32_t k : mine) {
    const data::Dataset& d = clients_[static_cast<size_t>(k)];
    replica_->set(global);
    ++report.clients;
    if (d.size() == 0) continue;  // a client the label skew left empty: weight 0
    // A fresh optimizer per client and round, from the global model.
    optim::Optimizer opt(be, config_.optimizer, std::vector<Tensor>{model_.range_params(static_cast<size_t>(first_),
                                                                                        static_cast<size_t>(end_))});
    for (int32_t e = 0; e < pc_.local_epochs; ++e) {
      data::DistributedSampler s(d.size(), 1, 0, true, mix64(config_.seed, 0x636c69656e74ull + static_cast<uint64_t>(k)));
      s.set_epoch(round * pc_.local_epochs + e);
      data::LoaderOptions lo = loader_->options();
      data::Loader loader(d, s, lo);
      data::Batch b;
      for (int64_t nb = 0; (config_.limit_batches <= 0 || nb < config_.limit_batches) && loader.next(b); ++nb) {
        const int count = static_cast<int>(std::min<int64_t>(pc_.micro_batches * pc_.accumulation, b.size));
        std::vector<Tensor> keep;
        const std::vector<MicroBatch> mbs = make_micro_batches(b, count, keep);
        const StageResult sr = executor_->train_step(job_.pipeline_for(count), mbs, b.size, [&] {
          Tensor g = model_.range_grads(static_cast<size_t>(first_), static_cast<size_t>(end_));
          if (config_.clip_norm > 0) {
            std::vector<Tensor> gs{g};
            optim::clip_grad_norm(be, gs, config_.clip_norm);
          }
          opt.step({g}, r.lr);
        }, t);
        report.loss_sum += sr.loss_sum;
        report.correct += static_cast<double>(sr.correct);
        report.scored += static_cast<double>(sr.samples);
      }
    }
    const std::vector<float> x = replica_->get();
    const auto n = static_cast<double>(d.size());
    for (size_t i = 0; i < x.size(); ++i) acc[i] += n * x[i];
    report.samples += n;
  }
  fedavg_test_stall(grid_.rank, round);
  std::vector<float> sum(acc.begin(), acc.end());
  const int64_t x0 = tracer_.now_ns();
  last_round_ = rounds_->finish(sum, report, global);
  const int64_t x1 = tracer_.now_ns();
  t.comm_ns += x1 - x0;
  tracer_.add(fmt::format("round {} exchange", round), "allreduce", x0, x1);
  replica_->set(sum);
  t.steps = 1;
  t.step_ns = tracer_.now_ns() - t0;
  local_ += t;
  // Only an update that was averaged counts as trained: a straggler dropped at the deadline trained its clients'
  // samples for nothing, so its figures are left out (the epoch's sums and throughput then match last_round().total).
  if (last_round_.counted) {
    r.samples = static_cast<int64_t>(report.scored);
    r.correct = static_cast<int64_t>(report.correct);
    r.loss = report.scored > 0 ? report.loss_sum / report.scored : std::numeric_limits<double>::quiet_NaN();
  } else {
    r.loss = std::numeric_limits<double>::quiet_NaN();
  }
  r.epoch_end = true;  // job_.sync.rounds_per_epoch (1, checked at construction) rounds make an epoch
  ++completed_epochs_;
  return r;
}

void ParallelTrainer::write_trace(const std::string& path) {
  if (spare_) return;  // in no group: the grid writes it
  TANDEM_REQUIRE(tracer_.enabled(), "write_trace: tracing was not enabled in the parallel configuration");
  if (ps_) failing_loudly([&] { ps_->sync_point(); });
  const std::string body = tracer_.to_json(
      grid_.rank, fmt::format("rank {} (stage {}, replica {})", grid_.rank, grid_.stage, grid_.dp_rank));
  if (world_ == nullptr) {
    write_chrome_trace(path, {body});
    return;
  }
  std::string error;
  if (grid_.rank == 0) {
    std::vector<std::string> bodies{body};
    for (int r = 1; r < world_->size(); ++r) {
      int64_t n = 0;
      world_->recv(&n, 1, DType::kI64, r, kTagTraceSize)->wait();
      std::string b(static_cast<size_t>(n), '\0');
      if (n > 0) world_->recv(b.data(), b.size(), DType::kU8, r, kTagTraceBody)->wait();
      bodies.push_back(std::move(b));
    }
    try {
      write_chrome_trace(path, bodies);
    } catch (const Error& e) {
      error = e.what();
    }
  } else {
    const int64_t n = static_cast<int64_t>(body.size());
    world_->send(&n, 1, DType::kI64, 0, kTagTraceSize)->wait();
    if (n > 0) world_->send(body.data(), body.size(), DType::kU8, 0, kTagTraceBody)->wait();
  }
  int64_t failed = error.empty() ? 0 : 1;
  world_->broadcast(&failed, 1, DType::kI64, 0)->wait();
  if (!error.empty()) TANDEM_THROW(Status::kIo, "{}", error);
  TANDEM_CHECK(failed == 0, Status::kIo, "trace '{}': rank 0 could not write it", path);
}

}  // namespace tandem::engine::parallel
