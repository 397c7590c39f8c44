#include "engine/parallel/job.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "engine/core/error.hpp"
#include "engine/data/loader.hpp"
#include "engine/data/partition.hpp"
#include "engine/nn/cpu_storage.hpp"
#include "engine/train/memory_guard.hpp"

namespace tandem::engine::parallel {

namespace {

constexpr double kMiB = 1048576.0;

uint64_t mib_to_bytes(double mb) { return std::max<uint64_t>(1, static_cast<uint64_t>(mb * kMiB)); }
uint64_t bucket_cap_bytes(const ParallelConfig& c) { return mib_to_bytes(c.bucket_mb); }
// The most bytes one bucket may hold (what the bucket buffers are sized for).
double largest_bucket_cap_mb(const ParallelConfig& c) {
  double mb = std::max(c.bucket_mb, c.first_bucket_mb);
  for (double v : c.bucket_sizes_mb) mb = std::max(mb, v);
  return mb;
}
// The explicit sizes of the first buckets (bucket_sizes_mb, rounded to whole bytes: sizes given as another framework's
// bucket bytes / 2^20 come back exactly), else the first bucket's cap (first_bucket_mb) where set.
std::vector<uint64_t> bucket_caps_bytes(const ParallelConfig& c) {
  std::vector<uint64_t> caps;
  for (double mb : c.bucket_sizes_mb) caps.push_back(std::max<uint64_t>(1, static_cast<uint64_t>(std::llround(mb * kMiB))));
  if (caps.empty() && c.first_bucket_mb > 0) caps.push_back(mib_to_bytes(c.first_bucket_mb));
  return caps;
}

ScheduleRequest schedule_request(const CompiledJob& cj, int32_t micro_batches) {
  ScheduleRequest r;
  r.kind = cj.job.parallel.schedule;
  r.micro_batches = micro_batches;
  r.boundaries = cj.boundaries;
  // buckets: with data parallelism, and with servers even for one worker (its pushes are per bucket)
  r.data_parallel = cj.dp() > 1 || has_servers(cj.job.parallel.strategy, cj.job.parallel.easgd_async);
  r.bucket_bytes = bucket_cap_bytes(cj.job.parallel);
  r.bucket_caps = bucket_caps_bytes(cj.job.parallel);
  for (const nn::LayerSpec& l : cj.job.model.layers) r.layer_grad_bytes.push_back(static_cast<uint64_t>(l.param_bytes()));
  return r;
}

std::vector<int32_t> cut(const Job& job, int32_t pp, const LayerCostFn& measured) {
  const auto L = static_cast<int32_t>(job.model.layers.size());
  if (!job.parallel.boundaries.empty()) return job.parallel.boundaries;  // checked by resolve_grid
  if (pp == 1) return {0, L};
  std::vector<double> cost;
  if (job.parallel.partition == PartitionCost::kFlops) {
    for (const nn::LayerSpec& l : job.model.layers) cost.push_back(l.fwd_flops + l.bwd_flops());
  } else {
    TANDEM_REQUIRE(measured != nullptr, "a measured stage cut needs per-layer costs (none were measured)");
    cost = measured();
    TANDEM_REQUIRE(cost.size() == static_cast<size_t>(L), "measured stage cut: {} layer costs for a model of {} layers",
                   cost.size(), L);
  }
  return partition_layers(cost, pp);
}

// Bytes per activation element relative to f32: 16-bit under mixed precision.
double activation_scale(const MemoryConfig& m) { return m.precision == Precision::kF32 ? 1.0 : 0.5; }

// Bytes per sample crossing the cut before layer `cut`: the outputs of earlier layers (in the job's activation
// precision) or the model input (f32 data) that layers at or after it read.
double crossing_bytes(const nn::ModelSpec& spec, int32_t cut, double act_scale) {
  double b = 0;
  for (int32_t producer : spec.crossing(static_cast<size_t>(cut))) {
    b += producer == nn::kModelInput ? static_cast<double>(spec.input.numel()) * 4
                                     : act_scale * static_cast<double>(spec.layers[static_cast<size_t>(producer)].activation_bytes);
  }
  return b;
}

// Per sample, what recomputation keeps of the stage's layer outputs for every sample in flight (`kept`), and what
// it rebuilds for the one micro-batch being back-propagated (`rebuilt`: the largest segment's outputs besides the
// checkpoint that ends it). Without recomputation everything is kept. Outputs that share their producer's storage
// (ModelSpec::shared_outputs: in-place ReLUs, flatten views) add nothing, as in the runtime, except a checkpoint,
// which keeps its storage alive alone.
struct ActivationSplit {
  double kept = 0, rebuilt = 0;
};
// `stored` gives a layer's output as it is stored, per sample in f32: its activation_bytes, or as the cpu backend
// keeps it (nn::cpu_stored_output_bytes).
ActivationSplit split_activations(const Job& job, int32_t first, int32_t end, double (*stored)(const nn::LayerSpec&)) {
  const MemoryConfig& mc = job.memory;
  const double scale = activation_scale(mc);
  const std::vector<bool> shared = job.model.shared_outputs(static_cast<size_t>(first));
  const auto output = [&](int32_t i) { return scale * stored(job.model.layers[static_cast<size_t>(i)]); };
  const auto act = [&](int32_t i) { return shared[static_cast<size_t>(i)] ? 0.0 : output(i); };
  ActivationSplit a;
  if (mc.recompute == Recompute::kNone) {
    for (int32_t i = first; i < end; ++i) a.kept += act(i);
    return a;
  }
  const int32_t k = mc.recompute == Recompute::kStageInputs ? end - first + 1 : mc.recompute_every;  // no checkpoint inside
  double segment = 0;
  for (int32_t i = first; i < end; ++i) {
    if ((i - first + 1) % k == 0) {  // a checkpoint: kept, and it closes its segment
      a.kept += output(i);
      a.rebuilt = std::max(a.rebuilt, segment);
      segment = 0;
    } else {
      segment += act(i);
    }
  }
  a.rebuilt = std::max(a.rebuilt, segment);
  return a;
}

// CompiledJob::short_batch: a replica's shard (DistributedSampler: ceil(samples / dp)) modulo the step's batch, unless
// limit_batches ends the epoch before that batch.
int64_t short_batch(const Job& job, int64_t step_batch) {
  TANDEM_REQUIRE(job.train_samples >= 0, "job.train_samples: must be >= 0 (0: not known), got {}", job.train_samples);
  TANDEM_REQUIRE(job.limit_batches >= 0, "job.limit_batches: must be >= 0 (0: whole epochs), got {}", job.limit_batches);
  if (job.train_samples == 0 || job.parallel.strategy == Strategy::kFedAvg) return 0;
  const int64_t dp = std::max<int64_t>(1, job.parallel.dp);
  const int64_t shard = (job.train_samples + dp - 1) / dp;
  const int64_t batches = (shard + step_batch - 1) / step_batch;
  if (job.limit_batches > 0 && job.limit_batches < batches) return 0;
  return shard % step_batch;
}

StageMemory stage_memory(const CompiledJob& cj, int32_t stage) {
  const Job& job = cj.job;
  const MemoryConfig& mc = job.memory;
  const StagePlan& sp = cj.pipeline.stage_plans[static_cast<size_t>(stage)];
  StageMemory m;
  int64_t params = 0;
  for (int32_t i = sp.first_layer; i < sp.end_layer; ++i) params += job.model.layers[static_cast<size_t>(i)].params;
  const double P = static_cast<double>(params);
  const double shard = static_cast<double>((params + cj.dp() - 1) / cj.dp());  // ceil(P / D): one rank's share
  const double h = cj.mixed_precision() ? 2.0 : 4.0;
  const double master = cj.mixed_precision() ? 4.0 : 0.0;
  m.param_bytes = h * P;
  m.grad_bytes = h * (mc.zero >= 2 ? shard : P);
  m.optimizer_bytes = (optimizer_state_bytes_per_param(job.optimizer) + master) * (mc.zero >= 1 ? shard : P);
  // micro-batches whose activations are alive at once: all of them (GPipe), at most S - s (1F1B)
  int64_t in_flight = cj.step_micro_batches;
  if (job.parallel.schedule == ScheduleKind::kOneFOneB) in_flight = std::min<int64_t>(in_flight, cj.pp() - stage);
  for (int64_t k = 0; k < in_flight; ++k) m.samples_in_flight += cj.micro_batch_sizes[static_cast<size_t>(k)];
  m.micro_batch = cj.micro_batch_sizes.front();
  const double input = crossing_bytes(job.model, sp.first_layer, activation_scale(mc));
  const auto activations = [&](const ActivationSplit& a, double in) {
    return static_cast<double>(m.samples_in_flight) * (a.kept + in) + static_cast<double>(m.micro_batch) * a.rebuilt;
  };
  const auto plain = [](const nn::LayerSpec& l) { return static_cast<double>(l.activation_bytes); };
  m.activation_bytes = activations(split_activations(job, sp.first_layer, sp.end_layer, plain), input);
  // the cpu backend's figures (engine/nn/cpu_storage.hpp): its layouts of the same outputs, its scratch and weights
  m.layout_bytes = activations(split_activations(job, sp.first_layer, sp.end_layer, nn::cpu_stored_output_bytes), input) -
                   m.activation_bytes;
  const nn::CpuWorkspace w = nn::cpu_workspace(job.model, static_cast<size_t>(sp.first_layer),
                                               static_cast<size_t>(sp.end_layer), m.micro_batch, activation_scale(mc));
  m.scratch_bytes = w.scratch_bytes;
  m.conv_scratch_bytes = w.conv_scratch_bytes;
  m.conv_copy_bytes = w.conv_copy_bytes;
  m.loader_bytes = data::loader_bytes(cj.step_batch, job.prefetch, job.model.input.numel());
  // the short last batch: its micro-batches of a size no full step runs are a second shape for the backend
  if (cj.short_batch > 0) {
    const std::vector<int64_t> sizes =
        micro_batch_sizes(cj.short_batch, static_cast<int32_t>(std::min<int64_t>(cj.step_micro_batches, cj.short_batch)));
    for (int64_t n : std::set<int64_t>(sizes.begin(), sizes.end())) {
      if (std::find(cj.micro_batch_sizes.begin(), cj.micro_batch_sizes.end(), n) != cj.micro_batch_sizes.end()) continue;
      m.short_micro_batch = std::max(m.short_micro_batch, n);
      m.short_batch_bytes += nn::cpu_primitive_bytes(job.model, static_cast<size_t>(sp.first_layer),
                                                     static_cast<size_t>(sp.end_layer), n);
    }
  }
  if (cj.dp() > 1) {
    m.bucket_bytes = 2 * std::min(h * P, largest_bucket_cap_mb(job.parallel) * kMiB);  // bucket + receive scratch
    if (cj.converts()) m.bucket_bytes += P * 2;  // every bucket's 16-bit wire copy
  }
  return m;
}

}  // namespace

train::TrainingFootprint training_footprint(const StageProgram& s, double optimizer_state_bytes_per_param) {
  const StageMemory& m = s.memory;
  return {.first_layer = static_cast<size_t>(s.first_layer),
          .end_layer = static_cast<size_t>(s.end_layer),
          .samples_in_flight = m.samples_in_flight,
          .micro_batch = m.micro_batch,
          .loader_bytes = m.loader_bytes,
          .optimizer_state_bytes_per_param = optimizer_state_bytes_per_param,
          .bucket_bytes = m.bucket_bytes,
          .activation_bytes = m.activation_bytes,
          .layout_bytes = m.layout_bytes,
          .scratch_bytes = m.scratch_bytes,
          .conv_scratch_bytes = m.conv_scratch_bytes,
          .conv_copy_bytes = m.conv_copy_bytes,
          .short_batch_bytes = m.short_batch_bytes};
}

double StageMemory::cpu_activation_peak_bytes() const noexcept {
  return nn::kCpuActivationOverhead * (activation_bytes + layout_bytes) + scratch_bytes + conv_scratch_bytes;
}

namespace {

void check_memory_config(const Job& job) {
  const MemoryConfig& m = job.memory;
  TANDEM_REQUIRE(m.precision == Precision::kF32 || m.precision == Precision::kBF16 || m.precision == Precision::kF16,
                 "job.precision: {} is not a precision (0 f32, 1 bf16, 2 fp16)", static_cast<int>(m.precision));
  TANDEM_REQUIRE(m.recompute == Recompute::kNone || m.recompute == Recompute::kStageInputs || m.recompute == Recompute::kEveryK,
                 "job.recompute: {} is not a recomputation mode (0 none, 1 stage inputs, 2 every k layers)",
                 static_cast<int>(m.recompute));
  TANDEM_REQUIRE(m.recompute != Recompute::kEveryK || m.recompute_every >= 1,
                 "job.recompute_every: {} -- keeping every k-th layer's output needs k >= 1", m.recompute_every);
  TANDEM_REQUIRE(m.zero >= 0 && m.zero <= 2, "job.zero: {} is not a ZeRO stage (0, 1 or 2)", m.zero);
  const Strategy s = job.parallel.strategy;
  TANDEM_REQUIRE(m.zero == 0 || s == Strategy::kSingle || s == Strategy::kDdp || s == Strategy::kPipeline || s == Strategy::kHybrid,
                 "job.zero: sharding (zero {}) applies to all-reduce data parallelism (ddp, hybrid), not to strategy {}",
                 m.zero, strategy_name(s));
}

// What each server holds (ParameterServerSync) and sends to its backups, for the current ownership of the shards:
// the values of the key ranges it owns (parameters, or the centre for asynchronous easgd), their optimizer state
// (push-pull), the protocol's buffers -- each worker's receive and reply buffer, and for ps and ssp the pushes kept
// until their clock is complete (up to staleness + 1 clocks of every worker's push, summed in worker order) -- and,
// with replication, the backups it keeps of the shards of the servers before it (values and optimizer state). The
// runtime and the simulator both read these figures; fail_over_servers recomputes them after a loss.
void size_servers(SyncProgram& p, const optim::OptimizerConfig& optimizer) {
  const bool push_pull = p.exchange == Exchange::kPushPull;
  const double kept_clocks = push_pull && p.staleness >= 0 ? p.staleness + 1.0 : 0.0;
  const double state = push_pull ? optimizer_state_bytes_per_param(optimizer) : 0.0;
  std::vector<double> owned(static_cast<size_t>(p.servers), 0.0);
  for (const KeyRange& r : p.shards) owned[static_cast<size_t>(r.server)] += static_cast<double>(r.size());
  p.server_memory.assign(static_cast<size_t>(p.servers), StageMemory{});
  p.replica_bytes_per_update.assign(static_cast<size_t>(p.servers), 0.0);
  p.replica_bytes_per_param = push_pull && p.replicas > 0 ? 4.0 + state : 0.0;
  for (int32_t s = 0; s < p.servers; ++s) {
    StageMemory& sm = p.server_memory[static_cast<size_t>(s)];
    const double n = owned[static_cast<size_t>(s)];
    sm.param_bytes = 4.0 * n;
    sm.optimizer_bytes = n * state;
    sm.bucket_bytes = sm.param_bytes * p.workers * (2.0 + kept_clocks);
  }
  for (int32_t s = 0; s < p.servers; ++s) {
    const double n = owned[static_cast<size_t>(s)];
    const std::vector<int32_t> backups = replica_servers(s, p.servers, p.replicas);
    p.replica_bytes_per_update[static_cast<size_t>(s)] = static_cast<double>(backups.size()) * (4.0 * n + n * state);
    for (int32_t b : backups) {  // server b keeps a backup of what s owns
      p.server_memory[static_cast<size_t>(b)].param_bytes += 4.0 * n;
      p.server_memory[static_cast<size_t>(b)].optimizer_bytes += n * state;
    }
  }
}

SyncProgram sync_program(const CompiledJob& cj) {
  const ParallelConfig& c = cj.job.parallel;
  SyncProgram p;
  p.workers = cj.dp();
  p.servers = cj.world - cj.dp() * cj.pp();
  switch (c.strategy) {
    case Strategy::kSingle:
    case Strategy::kDdp:
    case Strategy::kPipeline:
    case Strategy::kHybrid: p.exchange = Exchange::kBucketAllreduce; break;
    case Strategy::kPs: p.exchange = Exchange::kPushPull; p.staleness = 0; break;
    case Strategy::kPsAsync:
      p.exchange = Exchange::kPushPull;
      p.staleness = -1;
      p.staleness_lr = c.staleness_lr;
      break;
    case Strategy::kSsp: p.exchange = Exchange::kPushPull; p.staleness = c.staleness; break;
    case Strategy::kAsgd: p.exchange = Exchange::kGossip; break;
    case Strategy::kEasgd: p.exchange = Exchange::kElastic; p.period = c.tau; break;
    case Strategy::kFedAvg:
      p.exchange = Exchange::kRound;
      p.rounds_per_epoch = 1;
      break;
    case Strategy::kLocalSgd:
      p.exchange = Exchange::kParamAverage;
      p.period = c.average_every;
      p.warmup_steps = c.warmup_steps;
      break;
  }
  if (p.servers > 0) {
    const nn::ModelSpec& m = cj.job.model;
    int64_t total = 0;
    std::vector<int64_t> layer_offset;
    for (const nn::LayerSpec& l : m.layers) {
      layer_offset.push_back(total);
      total += l.params;
    }
    layer_offset.push_back(total);
    p.shards = shard_key_ranges(total, p.servers);
    const StagePlan& sp = cj.pipeline.stage_plans.front();
    for (size_t b = 0; b < sp.buckets.size(); ++b) {
      const int64_t lo = layer_offset[static_cast<size_t>(sp.buckets[b].first_layer)];
      const int64_t hi = layer_offset[static_cast<size_t>(sp.buckets[b].end_layer)];
      for (const KeyRange& r : p.shards) {
        const int64_t x = std::max(lo, r.begin), y = std::min(hi, r.end);
        if (x < y) p.pieces.push_back({static_cast<int32_t>(b), r.server, x, y});
      }
    }
    p.replicas = std::min(c.server_replicas, p.servers - 1);
    size_servers(p, cj.job.optimizer);
  }
  // ParallelTrainer::grows_workers: elastic push-pull jobs given a bound to grow to (or a joiner) check for joiners
  if (p.exchange == Exchange::kPushPull && p.servers > 0 && c.elastic && (c.max_ranks > 0 || c.joining))
    p.join_check_every = c.join_poll_steps;
  // simulator figures (see SyncProgram)
  const StageMemory& m = cj.stages.front().memory;
  p.worker_memory = m;
  const bool averaging = p.exchange == Exchange::kParamAverage || (p.exchange == Exchange::kElastic && p.servers == 0);
  if (averaging && p.workers > 1) {
    for (comm::PlanRequest req : cj.stages.front().bucket_allreduces) {  // parameters travel as f32
      req.elem_bytes = 4;
      req.chunk_bytes = comm::effective_chunk_bytes(cj.job.chunk_bytes, req.count * req.elem_bytes);
      p.average_allreduces.push_back(std::move(req));
    }
  }
  if (p.exchange == Exchange::kPushPull) p.worker_memory.optimizer_bytes = 0;  // the optimizer runs on the servers
  if (p.exchange == Exchange::kElastic) p.worker_memory.optimizer_bytes += m.param_bytes;  // the centre variable
  return p;
}

}  // namespace

double optimizer_state_bytes_per_param(const optim::OptimizerConfig& c) noexcept {
  return optim::state_bytes_per_param(c);  // the Optimizer's own rule
}

double rank_data_bytes(const CompiledJob& job, int64_t train_samples, int64_t test_samples, int64_t sample_size) {
  double bytes = data::resident_bytes(train_samples, sample_size) + data::resident_bytes(test_samples, sample_size);
  if (job.sync.exchange == Exchange::kRound) bytes += data::client_subsets_resident_bytes(train_samples, sample_size);
  return bytes;
}

Grid CompiledJob::grid(int rank) const {
  TANDEM_REQUIRE(rank >= 0 && rank < world, "rank {} is outside a world of {}", rank, world);
  Grid g;
  g.world = world;
  g.rank = rank;
  g.dp = dp();
  g.pp = pp();
  g.stage = rank % g.pp;
  g.dp_rank = rank / g.pp;
  return g;
}

const PipelinePlan& CompiledJob::pipeline_for(int32_t micro_batches) const {
  if (micro_batches == step_micro_batches) return pipeline;
  auto it = short_plans_.find(micro_batches);
  if (it != short_plans_.end()) return it->second;
  PipelinePlan plan = make_pipeline_plan(schedule_request(*this, micro_batches));
  validate_pipeline_plan(plan);
  return short_plans_.emplace(micro_batches, std::move(plan)).first->second;
}

std::string CompiledJob::describe_partition() const {
  std::string out;
  const nn::ModelSpec& spec = job.model;
  for (size_t s = 0; s + 1 < boundaries.size(); ++s) {
    const auto b = static_cast<size_t>(boundaries[s]), e = static_cast<size_t>(boundaries[s + 1]);
    const nn::ModelTotals t = spec.totals(b, e);
    if (!out.empty()) out += " | ";
    out += fmt::format("stage {}: layers [{}, {}) {}..{} ({:.2f} MFLOP/sample, {} params)", s, b, e,
                       spec.layers[b].name, spec.layers[e - 1].name, (t.fwd_flops + t.bwd_flops) / 1e6, t.params);
  }
  return out;
}

CompiledJob compile_job(Job job, int world, const LayerCostFn& measured) {
  const auto L = static_cast<int64_t>(job.model.layers.size());
  TANDEM_REQUIRE(L > 0, "model '{}' has no layers", job.model.name);
  resolve_grid(job.parallel, world, 0, L, job.batch);
  check_memory_config(job);
  TANDEM_REQUIRE(job.prefetch >= 0 && job.prefetch <= 64, "job: prefetch {} is not a loader's batches ahead in [0, 64]",
                 job.prefetch);
  CompiledJob cj;
  cj.world = world;
  cj.boundaries = cut(job, job.parallel.pp, measured);
  job.parallel.boundaries = cj.boundaries;
  cj.step_micro_batches = job.parallel.micro_batches * job.parallel.accumulation;
  cj.step_batch = job.batch * job.parallel.accumulation;
  cj.micro_batch_sizes = micro_batch_sizes(cj.step_batch, cj.step_micro_batches);
  cj.short_batch = short_batch(job, cj.step_batch);
  cj.job = std::move(job);
  cj.pipeline = make_pipeline_plan(schedule_request(cj, cj.step_micro_batches));
  validate_pipeline_plan(cj.pipeline);
  const Job& j = cj.job;
  const uint64_t wire_elem = cj.compressed() || cj.mixed_precision() ? 2 : 4;
  for (int32_t s = 0; s < cj.pp(); ++s) {
    const StagePlan& sp = cj.pipeline.stage_plans[static_cast<size_t>(s)];
    StageProgram prog;
    prog.stage = s;
    prog.first_layer = sp.first_layer;
    prog.end_layer = sp.end_layer;
    for (const GradientBucket& bk : sp.buckets) {
      comm::PlanRequest req;
      req.collective = comm::Collective::kAllreduce;
      req.algorithm = j.algorithm;
      req.world = cj.dp();
      req.count = std::max<uint64_t>(bk.bytes / 4, 1);  // f32 gradients, sent as f32 or fp16/bf16
      req.elem_bytes = wire_elem;
      req.chunk_bytes = comm::effective_chunk_bytes(j.chunk_bytes, req.count * req.elem_bytes);
      req.in_place = true;
      prog.bucket_allreduces.push_back(std::move(req));
    }
    prog.memory = stage_memory(cj, s);
    cj.stages.push_back(std::move(prog));
    if (s + 1 < cj.pp()) cj.boundary_bytes_per_sample.push_back(crossing_bytes(j.model, sp.end_layer, activation_scale(j.memory)));
  }
  cj.sync = sync_program(cj);
  if (j.loss_scaling) {
    comm::PlanRequest& req = cj.agree_finite;
    req.collective = comm::Collective::kAllreduce;
    req.algorithm = j.algorithm;
    req.world = cj.world;
    req.count = 1;
    req.elem_bytes = 4;
    req.chunk_bytes = comm::effective_chunk_bytes(j.chunk_bytes, 4);
    req.in_place = true;
  }
  return cj;
}

const char* precision_name(Precision p) noexcept {
  switch (p) {
    case Precision::kF32: return "f32";
    case Precision::kBF16: return "bf16";
    case Precision::kF16: return "fp16";
  }
  return "?";
}

Precision parse_precision(std::string_view s) {
  if (s == "f32" || s == "fp32") return Precision::kF32;
  if (s == "bf16") return Precision::kBF16;
  if (s == "fp16" || s == "f16") return Precision::kF16;
  TANDEM_THROW(Status::kInvalidArgument, "unknown precision '{}' (f32, bf16, fp16)", s);
}

void parse_recompute(std::string_view s, MemoryConfig& m) {
  if (s == "none" || s == "stage") {
    m.recompute = s == "none" ? Recompute::kNone : Recompute::kStageInputs;
    m.recompute_every = 0;
    return;
  }
  int32_t k = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), k);
  TANDEM_REQUIRE(ec == std::errc() && end == s.data() + s.size() && k >= 1,
                 "recompute '{}': expected none, stage (keep only stage inputs) or a layer count k >= 1 (keep every "
                 "k-th layer's output)", s);
  m.recompute = Recompute::kEveryK;
  m.recompute_every = k;
}

std::string describe(const MemoryConfig& m) {
  std::vector<std::string> parts;
  if (m.precision != Precision::kF32) parts.push_back(fmt::format("precision {}", precision_name(m.precision)));
  if (m.recompute == Recompute::kStageInputs) parts.emplace_back("recompute from stage inputs");
  if (m.recompute == Recompute::kEveryK) parts.push_back(fmt::format("recompute every {} layers", m.recompute_every));
  if (m.zero > 0) parts.push_back(fmt::format("zero {}", m.zero));
  return fmt::format("{}", fmt::join(parts, ", "));
}

const char* exchange_name(Exchange e) noexcept {
  switch (e) {
    case Exchange::kBucketAllreduce: return "bucket-allreduce";
    case Exchange::kPushPull: return "push-pull";
    case Exchange::kParamAverage: return "param-average";
    case Exchange::kElastic: return "elastic";
    case Exchange::kGossip: return "gossip";
    case Exchange::kRound: return "round";
  }
  return "?";
}

std::vector<int32_t> replica_servers(int32_t owner, int32_t servers, int32_t replicas) {
  std::vector<int32_t> out;
  for (int32_t i = 1; i <= std::min(replicas, servers - 1); ++i) out.push_back((owner + i) % servers);
  return out;
}

void fail_over_servers(CompiledJob& cj, const std::vector<int32_t>& lost, bool any_survivor) {
  fail_over_servers(cj.sync, lost, any_survivor, cj.job.optimizer);
  cj.world = cj.sync.workers + cj.sync.servers;
}

void fail_over_servers(SyncProgram& p, const std::vector<int32_t>& lost, bool any_survivor,
                       const optim::OptimizerConfig& optimizer) {
  const int32_t S = p.servers;
  std::vector<int32_t> renumber(static_cast<size_t>(S), -1);  // old server index -> new, -1: lost
  int32_t live = 0;
  for (int32_t s = 0; s < S; ++s) {
    if (std::find(lost.begin(), lost.end(), s) == lost.end()) renumber[static_cast<size_t>(s)] = live++;
  }
  TANDEM_CHECK(live >= 1, Status::kPeerFailure, "every parameter server was lost: the model's shards exist nowhere");
  std::vector<int32_t> owner(p.shards.size());
  for (size_t k = 0; k < p.shards.size(); ++k) {
    const int32_t o = p.shards[k].server;
    int32_t to = renumber[static_cast<size_t>(o)];
    for (int32_t b : replica_servers(o, S, p.replicas)) {
      if (to >= 0) break;
      to = renumber[static_cast<size_t>(b)];
    }
    for (int32_t i = 1; to < 0 && any_survivor && i < S; ++i) to = renumber[static_cast<size_t>((o + i) % S)];
    TANDEM_CHECK(to >= 0, Status::kPeerFailure,
                 "parameter server {} was lost and its shard [{}, {}) has no surviving replica ({} replica(s) per "
                 "shard)",
                 o, p.shards[k].begin, p.shards[k].end, p.replicas);
    owner[k] = to;
  }
  for (size_t k = 0; k < p.shards.size(); ++k) p.shards[k].server = owner[k];
  for (BucketPiece& piece : p.pieces) {
    for (const KeyRange& r : p.shards)
      if (piece.begin >= r.begin && piece.end <= r.end) piece.server = r.server;
  }
  p.servers = live;
  p.replicas = std::min(p.replicas, live - 1);  // min(server_replicas, servers - 1) as compiled: servers only fall
  size_servers(p, optimizer);
}

void reshard_servers(SyncProgram& p, int32_t live, const optim::OptimizerConfig& optimizer) {
  TANDEM_REQUIRE(live > 0, "job: the centre cannot be re-sharded over {} servers", live);
  const int64_t total = p.shards.empty() ? 0 : p.shards.back().end;
  // Each bucket's keys: the span of its pieces (a bucket is one contiguous range of the parameters).
  std::vector<std::pair<int64_t, int64_t>> spans;
  std::vector<int32_t> buckets;
  for (const BucketPiece& piece : p.pieces) {
    if (buckets.empty() || buckets.back() != piece.bucket) {
      buckets.push_back(piece.bucket);
      spans.emplace_back(piece.begin, piece.end);
    }
    spans.back().first = std::min(spans.back().first, piece.begin);
    spans.back().second = std::max(spans.back().second, piece.end);
  }
  p.shards = shard_key_ranges(total, live);
  p.pieces.clear();
  for (size_t b = 0; b < buckets.size(); ++b)
    for (const KeyRange& r : p.shards) {
      const int64_t x = std::max(spans[b].first, r.begin), y = std::min(spans[b].second, r.end);
      if (x < y) p.pieces.push_back({buckets[b], r.server, x, y});
    }
  p.servers = live;
  p.replicas = std::min(p.replicas, live - 1);
  size_servers(p, optimizer);
}

void adopt_ownership(SyncProgram& p, std::vector<KeyRange> shards, std::vector<BucketPiece> pieces, int32_t replicas,
                     const optim::OptimizerConfig& optimizer) {
  const int64_t total = p.shards.empty() ? 0 : p.shards.back().end;
  TANDEM_REQUIRE(!shards.empty() && replicas >= 0 && replicas < std::max(p.servers, 1),
                 "job: {} shards with {} replica(s) do not fit {} servers", shards.size(), replicas, p.servers);
  int64_t at = 0;
  for (size_t k = 0; k < shards.size(); ++k) {
    const KeyRange& r = shards[k];
    TANDEM_REQUIRE(r.server >= 0 && r.server < p.servers && r.begin == at && r.end >= r.begin,
                   "job: shard {} [{}, {}) of server {} does not follow [0, {}) among {} servers", k, r.begin, r.end,
                   r.server, at, p.servers);
    at = r.end;
  }
  TANDEM_REQUIRE(at == total, "job: the shards cover [0, {}) but the model has {} parameters", at, total);
  for (size_t k = 0; k < pieces.size(); ++k) {
    const BucketPiece& bp = pieces[k];
    const bool inside = std::any_of(shards.begin(), shards.end(), [&](const KeyRange& r) {
      return r.server == bp.server && bp.begin >= r.begin && bp.end <= r.end;
    });
    TANDEM_REQUIRE(inside && bp.begin < bp.end, "job: piece {} [{}, {}) of server {} lies in no shard of that server",
                   k, bp.begin, bp.end, bp.server);
  }
  p.shards = std::move(shards);
  p.pieces = std::move(pieces);
  p.replicas = replicas;
  size_servers(p, optimizer);
}

std::vector<KeyRange> shard_key_ranges(int64_t total, int32_t servers) {
  TANDEM_REQUIRE(servers >= 1 && total >= 0, "cannot cut {} parameters over {} servers", total, servers);
  std::vector<KeyRange> r;
  const int64_t base = total / servers, extra = total % servers;
  int64_t at = 0;
  for (int32_t s = 0; s < servers; ++s) {
    const int64_t n = base + (s < extra ? 1 : 0);
    r.push_back({s, at, at + n});
    at += n;
  }
  return r;
}

std::string compare_compiled_jobs(const CompiledJob& a, const CompiledJob& b) {
  auto differ = [](const char* what, const auto& x, const auto& y) -> std::string {
    return x == y ? std::string() : fmt::format("{}: {} vs {}", what, x, y);
  };
  std::string d;
  auto first = [&d](std::string s) {
    if (d.empty()) d = std::move(s);
  };
  first(differ("model", a.job.model.name, b.job.model.name));
  first(differ("layers", a.job.model.layers.size(), b.job.model.layers.size()));
  first(differ("world", a.world, b.world));
  first(differ("dp", a.dp(), b.dp()));
  first(differ("pp", a.pp(), b.pp()));
  first(differ("stage cut", fmt::format("{}", fmt::join(a.boundaries, ",")), fmt::format("{}", fmt::join(b.boundaries, ","))));
  first(differ("micro-batches per step", a.step_micro_batches, b.step_micro_batches));
  first(differ("samples per step", a.step_batch, b.step_batch));
  first(differ("schedule", a.pipeline.describe(), b.pipeline.describe()));
  first(differ("memory options", describe(a.job.memory), describe(b.job.memory)));
  first(differ("loss scaling", a.job.loss_scaling, b.job.loss_scaling));
  first(differ("compression", compression_name(a.job.parallel.compression), compression_name(b.job.parallel.compression)));
  first(differ("optimizer state bytes", optimizer_state_bytes_per_param(a.job.optimizer),
               optimizer_state_bytes_per_param(b.job.optimizer)));
  first(differ("exchange", exchange_name(a.sync.exchange), exchange_name(b.sync.exchange)));
  first(differ("workers", a.sync.workers, b.sync.workers));
  first(differ("servers", a.sync.servers, b.sync.servers));
  first(differ("exchange period", a.sync.period, b.sync.period));
  first(differ("staleness", a.sync.staleness, b.sync.staleness));
  first(differ("staleness lr", std::string(staleness_lr_name(a.sync.staleness_lr)),
               std::string(staleness_lr_name(b.sync.staleness_lr))));
  first(differ("rounds per epoch", a.sync.rounds_per_epoch, b.sync.rounds_per_epoch));
  first(differ("server replicas", a.sync.replicas, b.sync.replicas));
  first(differ("replica bytes per parameter", a.sync.replica_bytes_per_param, b.sync.replica_bytes_per_param));
  first(differ("bucket pieces", a.sync.pieces.size(), b.sync.pieces.size()));
  for (size_t k = 0; k < a.sync.server_memory.size() && k < b.sync.server_memory.size() && d.empty(); ++k)
    first(differ(fmt::format("server {} bytes", k).c_str(), a.sync.server_memory[k].total(),
                 b.sync.server_memory[k].total()));
  for (size_t k = 0; k < a.sync.pieces.size() && k < b.sync.pieces.size() && d.empty(); ++k) {
    const BucketPiece &x = a.sync.pieces[k], &y = b.sync.pieces[k];
    first(differ(fmt::format("bucket piece {}", k).c_str(), fmt::format("b{} s{} [{}, {})", x.bucket, x.server, x.begin, x.end),
                 fmt::format("b{} s{} [{}, {})", y.bucket, y.server, y.begin, y.end)));
  }
  if (!d.empty() || a.stages.size() != b.stages.size()) return d.empty() ? "stage count differs" : d;
  for (size_t s = 0; s < a.stages.size() && d.empty(); ++s) {
    const StageProgram &x = a.stages[s], &y = b.stages[s];
    const StagePlan &px = a.pipeline.stage_plans[s], &py = b.pipeline.stage_plans[s];
    const std::string at = fmt::format("stage {} ", s);
    first(differ((at + "ops").c_str(), px.ops.size(), py.ops.size()));
    for (size_t k = 0; k < px.ops.size() && k < py.ops.size() && d.empty(); ++k) {
      const StageOp &o = px.ops[k], &p = py.ops[k];
      if (o.kind != p.kind || o.micro_batch != p.micro_batch || o.peer_stage != p.peer_stage || o.bucket != p.bucket)
        d = fmt::format("{}op {}: {} mb {} vs {} mb {}", at, k, stage_op_name(o.kind), o.micro_batch,
                        stage_op_name(p.kind), p.micro_batch);
    }
    first(differ((at + "buckets").c_str(), px.buckets.size(), py.buckets.size()));
    for (size_t k = 0; k < px.buckets.size() && k < py.buckets.size() && d.empty(); ++k) {
      const std::string bk = fmt::format("{}bucket {} ", at, k);
      first(differ((bk + "layers").c_str(), fmt::format("[{}, {})", px.buckets[k].first_layer, px.buckets[k].end_layer),
                   fmt::format("[{}, {})", py.buckets[k].first_layer, py.buckets[k].end_layer)));
      first(differ((bk + "bytes").c_str(), px.buckets[k].bytes, py.buckets[k].bytes));
      const comm::PlanRequest &r = x.bucket_allreduces[k], &q = y.bucket_allreduces[k];
      first(differ((bk + "request.algorithm").c_str(), comm::algorithm_name(r.algorithm), comm::algorithm_name(q.algorithm)));
      first(differ((bk + "request.world").c_str(), r.world, q.world));
      first(differ((bk + "request.count").c_str(), r.count, q.count));
      first(differ((bk + "request.elem_bytes").c_str(), r.elem_bytes, q.elem_bytes));
      first(differ((bk + "request.chunk_bytes").c_str(), r.chunk_bytes, q.chunk_bytes));
    }
    first(differ((at + "param bytes").c_str(), x.memory.param_bytes, y.memory.param_bytes));
    first(differ((at + "optimizer bytes").c_str(), x.memory.optimizer_bytes, y.memory.optimizer_bytes));
    first(differ((at + "activation bytes").c_str(), x.memory.activation_bytes, y.memory.activation_bytes));
    first(differ((at + "bucket bytes").c_str(), x.memory.bucket_bytes, y.memory.bucket_bytes));
    first(differ((at + "layout bytes").c_str(), x.memory.layout_bytes, y.memory.layout_bytes));
    first(differ((at + "scratch bytes").c_str(), x.memory.scratch_bytes, y.memory.scratch_bytes));
    first(differ((at + "conv scratch bytes").c_str(), x.memory.conv_scratch_bytes, y.memory.conv_scratch_bytes));
    first(differ((at + "conv copy bytes").c_str(), x.memory.conv_copy_bytes, y.memory.conv_copy_bytes));
    first(differ((at + "loader bytes").c_str(), x.memory.loader_bytes, y.memory.loader_bytes));
    first(differ((at + "samples in flight").c_str(), x.memory.samples_in_flight, y.memory.samples_in_flight));
  }
  if (d.empty() && a.boundary_bytes_per_sample != b.boundary_bytes_per_sample) d = "bytes crossing the cuts differ";
  return d;
}

}  // namespace tandem::engine::parallel
