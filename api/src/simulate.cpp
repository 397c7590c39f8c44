// The simulation section of the C ABI: clusters, typed jobs, simulate, plan search, typed results (the JSON
// text is an extra).
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>

#include <fmt/format.h>

#include "api/src/calibrate_handles.hpp"
#include "api/src/guard.hpp"
#include "api/src/sim_handles.hpp"
#include "api/src/strategy_fields.hpp"
#include "api/src/train_handles.hpp"
#include "simulator/report/chrome_trace.hpp"
#include "simulator/search.hpp"
#include "simulator/simulate.hpp"

namespace sim = tandem::simulator;
namespace par = tandem::engine::parallel;
namespace comm = tandem::engine::comm;
using tandem::api::checked;
using tandem::api::guarded;

namespace {

constexpr uint64_t kKnownJobBits = ((TANDEM_SIM_JOB_WARMUP_STEPS << 1) - 1) | TANDEM_SIM_JOB_PRECISION |
                                   TANDEM_SIM_JOB_RECOMPUTE | TANDEM_SIM_JOB_ZERO | TANDEM_SIM_JOB_FRAMEWORK |
                                   TANDEM_SIM_JOB_SEED | TANDEM_SIM_JOB_LIMIT_BATCHES |
                                   TANDEM_SIM_JOB_BROADCAST_BUFFERS | TANDEM_SIM_JOB_BUCKETS |
                                   TANDEM_SIM_JOB_COMM_CYCLE | TANDEM_SIM_JOB_COMM_NEGOTIATION |
                                   TANDEM_SIM_JOB_HOST_STAGING;
constexpr uint64_t kKnownSummaryBits = (TANDEM_SIM_SUMMARY_MEMORY_DATA << 1) - 1;
constexpr uint64_t kKnownNodeBits = (TANDEM_SIM_NODE_CREDITS << 1) - 1;

// The C enums are the engine's values (checked at compile time where they are declared together).
static_assert(TANDEM_STRATEGY_HYBRID == static_cast<int>(par::Strategy::kHybrid));
static_assert(TANDEM_STRATEGY_LOCALSGD == static_cast<int>(par::Strategy::kLocalSgd));
static_assert(TANDEM_SCHEDULE_1F1B == static_cast<int>(par::ScheduleKind::kOneFOneB));
static_assert(TANDEM_COMPRESSION_BF16 == static_cast<int>(par::GradCompression::kBF16));
static_assert(TANDEM_PARTITION_MEASURED == static_cast<int>(par::PartitionCost::kMeasured));
static_assert(TANDEM_PRECISION_FP16 == static_cast<int>(par::Precision::kF16));
static_assert(TANDEM_RECOMPUTE_EVERY_K == static_cast<int>(par::Recompute::kEveryK));
static_assert(TANDEM_FRAMEWORK_PYTORCH_DDP == static_cast<int>(sim::Framework::kPytorchDdp));
static_assert(TANDEM_ALGO_DETERMINISTIC == static_cast<int>(comm::Algorithm::kDeterministic));

template <typename E>
E enum_value(int value, int last, const char* field, const char* type) {
  TANDEM_REQUIRE(value >= 0 && value <= last, "job.{}: {} is not a {} (0..{})", field, value, type, last);
  return static_cast<E>(value);
}

// `one_strategy`: the job is simulated as given (tandem_simulate), so its strategy fields must be its strategy's; a plan
// search's base job (every strategy is tried) is not checked so.
sim::JobSpec to_job(const tandem_sim_job_params_t* p, bool one_strategy) {
  sim::JobSpec j;
  if (p == nullptr) return j;
  TANDEM_CHECK((p->field_mask & ~kKnownJobBits) == 0, tandem::Status::kUnsupported,
               "tandem_sim_job_params_t: unknown field_mask bits 0x{:x}", p->field_mask & ~kKnownJobBits);
  const uint64_t m = p->field_mask;
  if (m & TANDEM_SIM_JOB_JSON) {
    TANDEM_REQUIRE(p->job_json != nullptr, "job.job_json: flagged in field_mask but NULL");
    j = sim::parse_job_text(p->job_json);
  }
  if (m & TANDEM_SIM_JOB_MODEL) j.model_spec = checked(p->model, "job.model").spec;
  if (m & TANDEM_SIM_JOB_DATASET) {
    TANDEM_REQUIRE(p->dataset != nullptr, "job.dataset: flagged in field_mask but NULL");
    j.dataset = p->dataset;
  }
  if (m & TANDEM_SIM_JOB_SAMPLES) {
    TANDEM_REQUIRE(p->samples >= 1, "job.samples: must be >= 1, got {}", p->samples);
    j.samples = p->samples;
  }
  if (m & TANDEM_SIM_JOB_BATCH) j.batch = p->batch;
  if (m & TANDEM_SIM_JOB_EPOCHS) j.epochs = p->epochs;
  if (m & TANDEM_SIM_JOB_STRATEGY)
    j.strategy = enum_value<par::Strategy>(p->strategy, TANDEM_STRATEGY_LOCALSGD, "strategy", "tandem_strategy_t");
  if (m & TANDEM_SIM_JOB_DP) j.dp = p->dp;
  if (m & TANDEM_SIM_JOB_PP) j.pp = p->pp;
  if (m & TANDEM_SIM_JOB_MICRO_BATCHES) j.micro_batches = p->micro_batches;
  if (m & TANDEM_SIM_JOB_SCHEDULE)
    j.schedule = enum_value<par::ScheduleKind>(p->schedule, TANDEM_SCHEDULE_1F1B, "schedule", "tandem_schedule_t");
  if (m & TANDEM_SIM_JOB_ALGORITHM)
    j.algorithm = enum_value<comm::Algorithm>(p->algorithm, TANDEM_ALGO_DETERMINISTIC, "algorithm", "tandem_algo_t");
  if (m & TANDEM_SIM_JOB_BUCKET_MB) j.bucket_mb = p->bucket_mb;
  if (m & TANDEM_SIM_JOB_OVERLAP) j.overlap = p->overlap != 0;
  if (m & TANDEM_SIM_JOB_OPTIMIZER) j.optimizer = sim::optimizer_kind(checked(p->optimizer, "job.optimizer").config);
  if (m & TANDEM_SIM_JOB_PROFILE) {
    TANDEM_REQUIRE(p->profile != nullptr, "job.profile: flagged in field_mask but NULL");
    j.profile = p->profile;
    j.profile_network = p->profile_network != 0;
  }
  if (m & TANDEM_SIM_JOB_EPOCH_TIME) j.epoch_time_s = p->epoch_time_s;
  if (m & TANDEM_SIM_JOB_CREDIT_MODE) {
    switch (p->credit_mode) {
      case TANDEM_CREDIT_MODE_PRESET: j.credit_mode.reset(); break;
      case TANDEM_CREDIT_MODE_STANDARD: j.credit_mode = sim::CreditMode::kStandard; break;
      case TANDEM_CREDIT_MODE_UNLIMITED: j.credit_mode = sim::CreditMode::kUnlimited; break;
      default:
        TANDEM_THROW(tandem::Status::kInvalidArgument, "job.credit_mode: {} is not a tandem_credit_mode_t (0..2)",
                     static_cast<int>(p->credit_mode));
    }
  }
  if (m & TANDEM_SIM_JOB_INITIAL_CREDITS) {
    TANDEM_REQUIRE(p->initial_credits >= 0, "job.initial_credits: must be >= 0, got {}", p->initial_credits);
    j.initial_credits = p->initial_credits;
  }
  if (m & TANDEM_SIM_JOB_CHUNK_BYTES) j.chunk_bytes = p->chunk_bytes;
  if (m & TANDEM_SIM_JOB_PARTITION)
    j.partition = enum_value<par::PartitionCost>(p->partition, TANDEM_PARTITION_MEASURED, "partition",
                                                 "tandem_partition_t");
  if (m & TANDEM_SIM_JOB_BOUNDARIES) {
    TANDEM_REQUIRE(p->boundaries != nullptr && p->num_boundaries >= 2 && p->num_boundaries <= 65536,
                   "job.boundaries: need a non-null array of pp + 1 (>= 2) layer indices, got {}", p->num_boundaries);
    j.boundaries.assign(p->boundaries, p->boundaries + p->num_boundaries);
  }
  if (m & TANDEM_SIM_JOB_COMPRESSION)
    j.compression = enum_value<par::GradCompression>(p->compression, TANDEM_COMPRESSION_BF16, "compression",
                                                     "tandem_compression_t");
  if (m & TANDEM_SIM_JOB_ACCUMULATION) {
    TANDEM_REQUIRE(p->accumulation >= 1, "job.accumulation: must be >= 1, got {}", p->accumulation);
    j.accumulation = p->accumulation;
  }
  // issue #13's strategies: resolve_grid checks the ranges (the trainer's messages)
  if (m & TANDEM_SIM_JOB_SERVERS) j.servers = p->servers;
  if (m & TANDEM_SIM_JOB_STALENESS) j.staleness = p->staleness;
  if (m & TANDEM_SIM_JOB_TAU) j.tau = p->tau;
  if (m & TANDEM_SIM_JOB_ALPHA) j.alpha = p->alpha;
  if (m & TANDEM_SIM_JOB_EASGD_ASYNC) j.easgd_async = p->easgd_async != 0;
  if (m & TANDEM_SIM_JOB_CLIENTS) j.clients = p->clients;
  if (m & TANDEM_SIM_JOB_DIRICHLET_ALPHA) j.dirichlet_alpha = p->dirichlet_alpha;
  if (m & TANDEM_SIM_JOB_CLIENT_FRACTION) j.client_fraction = p->client_fraction;
  if (m & TANDEM_SIM_JOB_LOCAL_EPOCHS) j.local_epochs = p->local_epochs;
  if (m & TANDEM_SIM_JOB_ROUND_DEADLINE) j.round_deadline_s = p->round_deadline_s;
  if (m & TANDEM_SIM_JOB_AVERAGE_EVERY) j.average_every = p->average_every;
  if (m & TANDEM_SIM_JOB_WARMUP_STEPS) j.warmup_steps = p->warmup_steps;
  if (m & TANDEM_SIM_JOB_PRECISION)
    j.memory.precision = enum_value<par::Precision>(p->precision, TANDEM_PRECISION_FP16, "precision", "tandem_precision_t");
  if (m & TANDEM_SIM_JOB_RECOMPUTE) {
    j.memory.recompute = enum_value<par::Recompute>(p->recompute, TANDEM_RECOMPUTE_EVERY_K, "recompute", "tandem_recompute_t");
    j.memory.recompute_every = p->recompute_every;
  }
  if (m & TANDEM_SIM_JOB_ZERO) j.memory.zero = p->zero;  // checked by the job compiler ("job.zero: ...")
  if (m & TANDEM_SIM_JOB_SEED) j.seed = p->seed;
  if (m & TANDEM_SIM_JOB_LIMIT_BATCHES) {
    TANDEM_REQUIRE(p->limit_batches >= 0, "job.limit_batches: must be >= 0 (0: whole epochs), got {}", p->limit_batches);
    j.limit_batches = p->limit_batches;
  }
  if (m & TANDEM_SIM_JOB_BROADCAST_BUFFERS) {
    TANDEM_REQUIRE(p->broadcast_buffers == 0 || p->broadcast_buffers == 1,
                   "job.broadcast_buffers: must be 0 or 1, got {}", p->broadcast_buffers);
    j.broadcast_buffers = p->broadcast_buffers == 1;
  }
  if (m & TANDEM_SIM_JOB_BUCKETS) {  // ranges checked by the job compiler
    TANDEM_REQUIRE(p->bucket_sizes_mb != nullptr || p->num_bucket_sizes == 0,
                   "job.bucket_sizes_mb: NULL with num_bucket_sizes {}", p->num_bucket_sizes);
    TANDEM_REQUIRE(p->num_bucket_sizes <= 65536, "job.num_bucket_sizes: {} is more than the 65536 allowed",
                   p->num_bucket_sizes);
    j.first_bucket_mb = p->first_bucket_mb;
    j.bucket_sizes_mb.assign(p->bucket_sizes_mb, p->bucket_sizes_mb + p->num_bucket_sizes);
  }
  // range checked by the job compiler
  if (m & TANDEM_SIM_JOB_COMM_CYCLE) j.comm_cycle_ms = p->comm_cycle_ms;
  if (m & TANDEM_SIM_JOB_COMM_NEGOTIATION) j.comm_negotiation_ms = p->comm_negotiation_ms;
  if (m & TANDEM_SIM_JOB_HOST_STAGING) j.host_staging_gbps = p->host_staging_gbps;
  if (m & TANDEM_SIM_JOB_FRAMEWORK)
    j.framework = enum_value<sim::Framework>(p->framework, TANDEM_FRAMEWORK_PYTORCH_DDP, "framework", "tandem_framework_t");
  // A strategy field given (its bit, or its key in job_json) to a strategy that does not read it is refused, naming it
  // (strategy_fields.hpp: the trainer's rule).
  if (one_strategy) {
    nlohmann::json keys = nlohmann::json::object();
    if (m & TANDEM_SIM_JOB_JSON) keys = nlohmann::json::parse(p->job_json, nullptr, false);
    struct Field {
      uint64_t bit;
      const char* bit_name;
      const char* field;
    };
#define TANDEM_SIM_FIELD(BIT, field) Field{TANDEM_SIM_JOB_##BIT, "TANDEM_SIM_JOB_" #BIT, field}
    for (const Field& f : {TANDEM_SIM_FIELD(SERVERS, "servers"), TANDEM_SIM_FIELD(STALENESS, "staleness"),
                           TANDEM_SIM_FIELD(TAU, "tau"), TANDEM_SIM_FIELD(ALPHA, "alpha"),
                           TANDEM_SIM_FIELD(EASGD_ASYNC, "easgd_async"), TANDEM_SIM_FIELD(CLIENTS, "clients"),
                           TANDEM_SIM_FIELD(DIRICHLET_ALPHA, "dirichlet_alpha"),
                           TANDEM_SIM_FIELD(CLIENT_FRACTION, "client_fraction"),
                           TANDEM_SIM_FIELD(LOCAL_EPOCHS, "local_epochs"),
                           TANDEM_SIM_FIELD(ROUND_DEADLINE, "round_deadline_s"),
                           TANDEM_SIM_FIELD(AVERAGE_EVERY, "average_every"),
                           TANDEM_SIM_FIELD(WARMUP_STEPS, "warmup_steps")}) {
      if (m & f.bit) {
        tandem::api::require_read(j.strategy, j.easgd_async, {f.field}, "job.", f.bit_name);
      } else if (keys.is_object() && keys.contains(f.field)) {
        tandem::api::require_read(j.strategy, j.easgd_async, {f.field}, "job.", "a key of job_json");
      }
    }
#undef TANDEM_SIM_FIELD
    if (j.strategy == par::Strategy::kFedAvg) {
      const int64_t samples = j.samples > 0 ? j.samples : j.dataset.empty() ? 0 : sim::find_dataset(j.dataset).samples;
      if (samples > 0) tandem::api::require_clients_fit(j.clients, samples, "job.");
    }
  }
  if (j.dataset.empty() && j.model_spec && !j.input) {
    // no named dataset: the samples are shaped as the given model takes them
    j.input = j.model_spec->input;
    j.classes = j.model_spec->num_classes();
  }
  return j;
}

sim::SimOptions to_options(const tandem_sim_job_params_t* p) {
  sim::SimOptions o;
  if (p == nullptr) return o;
  if (p->field_mask & TANDEM_SIM_JOB_TRACE) o.trace = p->trace != 0;
  if (p->field_mask & TANDEM_SIM_JOB_BASELINE) o.baseline = p->baseline != 0;
  return o;
}

tandem_algo_t resolved_algorithm(const sim::SimResult& r) {
  if (r.job == nullptr || r.job->dp() <= 1 || r.job->stages.empty() || r.job->stages[0].bucket_allreduces.empty())
    return TANDEM_ALGO_AUTO;
  const bool allreduce = r.exchange == "bucket-allreduce" || r.exchange == "param-average" ||
                         (r.exchange == "elastic" && r.servers == 0);
  if (!allreduce) return TANDEM_ALGO_AUTO;  // pushes and pulls, gossip, uploads: no all-reduce
  return static_cast<tandem_algo_t>(comm::choose_algorithm(r.job->stages[0].bucket_allreduces[0]));
}

void fill_summary(const sim::SimResult& r, tandem_sim_summary_t& o) {
  const uint64_t m = o.field_mask;
  if (m & TANDEM_SIM_SUMMARY_TIMES) {
    o.step_time_s = r.step_time_s;
    o.epoch_time_s = r.epoch_time_s;
    o.total_time_s = r.total_time_s;
    o.images_per_sec = r.images_per_sec;
  }
  if (m & TANDEM_SIM_SUMMARY_SCALING) {
    o.speedup = r.speedup;
    o.efficiency = r.efficiency;
    o.baseline_total_time_s = r.baseline_total_time_s;
  }
  if (m & TANDEM_SIM_SUMMARY_SPLIT) {
    o.compute_s = r.compute_s;
    o.comm_exposed_s = r.comm_exposed_s;
    o.bubble_s = r.bubble_s;
    o.throttled_s = r.throttled_s;
    o.idle_s = r.idle_s;
  }
  if (m & TANDEM_SIM_SUMMARY_MEMORY) {
    o.memory_per_node_bytes = r.memory_per_node_bytes;
    o.fits = r.fits ? 1 : 0;
  }
  if (m & TANDEM_SIM_SUMMARY_COST) {
    o.cost_usd = r.cost_usd;
    o.surplus_usd = r.surplus_usd;
  }
  if (m & TANDEM_SIM_SUMMARY_LAYOUT) {
    o.dp = r.dp;
    o.pp = r.pp;
    o.micro_batches = r.micro_batches;
    o.ranks = r.ranks;
    o.nodes_used = r.nodes_used;
    o.num_nodes = static_cast<int32_t>(r.nodes.size());
  }
  if (m & TANDEM_SIM_SUMMARY_JOB) {
    const par::Job* j = r.job != nullptr ? &r.job->job : nullptr;
    o.strategy = static_cast<tandem_strategy_t>(j != nullptr ? j->parallel.strategy : par::Strategy::kSingle);
    o.schedule = static_cast<tandem_schedule_t>(j != nullptr ? j->parallel.schedule : par::ScheduleKind::kOneFOneB);
    o.compression = r.dp > 1 && j != nullptr ? static_cast<tandem_compression_t>(j->parallel.compression)
                                             : TANDEM_COMPRESSION_NONE;
    o.algorithm = resolved_algorithm(r);
    o.batch = r.batch;
    o.global_batch = r.global_batch;
    o.samples = r.samples;
    o.steps_per_epoch = r.steps_per_epoch;
    o.epochs = r.epochs;
    o.total_steps = r.total_steps;
    o.num_stages = r.pp;
  }
  if (m & TANDEM_SIM_SUMMARY_NAMES) {
    o.cluster = r.cluster.c_str();
    o.model = r.model.c_str();
    o.dataset = r.dataset.c_str();
    o.allreduce = r.algorithm.c_str();
    o.compute_source = r.compute_source.c_str();
    o.bottleneck = r.bottleneck.c_str();
    o.scaling_note = r.scaling_note.c_str();
  }
  if (m & TANDEM_SIM_SUMMARY_STRATEGY) {
    o.workers = r.workers;
    o.servers = r.servers;
    o.window_steps = r.window_steps;
    o.staleness_wait_s = r.staleness_wait_s;
    o.busiest_nic_bytes = r.busiest_nic_bytes;
    o.busiest_nic_rank = r.busiest_nic_rank;
    o.round_time_s = r.round_time_s;
    o.clients_sampled = r.clients_sampled;
    o.clients_counted = r.clients_counted;
    o.clients_dropped = r.clients_dropped;
    o.exchange = r.exchange.c_str();
    o.busiest_nic = r.busiest_nic.c_str();
    o.note = r.note.c_str();
  }
  if (m & TANDEM_SIM_SUMMARY_MEMORY_DETAIL) {
    o.memory_node = r.memory.node;
    o.memory_rank = r.memory.rank;
    o.memory_param_bytes = r.memory.param_bytes;
    o.memory_grad_bytes = r.memory.grad_bytes;
    o.memory_optimizer_bytes = r.memory.optimizer_bytes;
    o.memory_activation_bytes = r.memory.activation_bytes;
    // the rank's data sets and its loader's batches ahead counted with its runtime, so that the parts add up to its
    // need for 0.4's callers too; MEMORY_DATA says how much of it is the data sets
    o.memory_runtime_bytes = r.memory.runtime_bytes + r.memory.data_bytes + r.memory.loader_bytes;
    o.memory_buffer_bytes = r.memory.buffer_bytes;
    o.memory_advice = r.memory_advice.c_str();
  }
  if (m & TANDEM_SIM_SUMMARY_MEMORY_DATA) o.memory_data_bytes = r.memory.data_bytes;
}

// The byte just past a summary field: a group's fields all lie before the end of its last one.
#define TANDEM_SUMMARY_END(field) (offsetof(tandem_sim_summary_t, field) + sizeof(tandem_sim_summary_t::field))
struct SummaryGroup {
  uint64_t bit;
  const char* name;
  size_t end;
};
constexpr SummaryGroup kSummaryGroups[] = {
    {TANDEM_SIM_SUMMARY_TIMES, "TIMES", TANDEM_SUMMARY_END(images_per_sec)},
    {TANDEM_SIM_SUMMARY_SCALING, "SCALING", TANDEM_SUMMARY_END(baseline_total_time_s)},
    {TANDEM_SIM_SUMMARY_SPLIT, "SPLIT", TANDEM_SUMMARY_END(idle_s)},
    {TANDEM_SIM_SUMMARY_MEMORY, "MEMORY", TANDEM_SUMMARY_END(fits)},
    {TANDEM_SIM_SUMMARY_COST, "COST", TANDEM_SUMMARY_END(surplus_usd)},
    {TANDEM_SIM_SUMMARY_LAYOUT, "LAYOUT", TANDEM_SUMMARY_END(num_nodes)},
    {TANDEM_SIM_SUMMARY_JOB, "JOB", TANDEM_SUMMARY_END(num_stages)},
    {TANDEM_SIM_SUMMARY_NAMES, "NAMES", TANDEM_SUMMARY_END(scaling_note)},
    {TANDEM_SIM_SUMMARY_SEARCH, "SEARCH", TANDEM_SUMMARY_END(search_wall_s)},
    {TANDEM_SIM_SUMMARY_STRATEGY, "STRATEGY", TANDEM_SUMMARY_END(note)},
    {TANDEM_SIM_SUMMARY_MEMORY_DETAIL, "MEMORY_DETAIL", TANDEM_SUMMARY_END(memory_advice)},
    {TANDEM_SIM_SUMMARY_MEMORY_DATA, "MEMORY_DATA", TANDEM_SUMMARY_END(memory_data_bytes)},
};
// 0.4's struct, which tandem_sim_result_query and _candidate fill: up to memory_advice.
constexpr size_t kSummarySize04 = TANDEM_SUMMARY_END(memory_advice);
static_assert(kSummarySize04 == offsetof(tandem_sim_summary_t, memory_data_bytes));
static_assert(sizeof(kSummaryGroups) / sizeof(kSummaryGroups[0]) == 12 &&
              kSummaryGroups[11].bit == TANDEM_SIM_SUMMARY_MEMORY_DATA && (TANDEM_SIM_SUMMARY_MEMORY_DATA << 1) - 1 ==
                                                                              kKnownSummaryBits,
              "every summary bit has its group's end here");
#undef TANDEM_SUMMARY_END

// Reads only field_mask (the callers' structs may be shorter than this header's) and refuses a group the caller's
// struct of `size` bytes does not hold.
void check_summary(size_t size, const tandem_sim_summary_t* s, const char* fn) {
  TANDEM_REQUIRE(s != nullptr, "{}: summary must be non-null", fn);
  TANDEM_REQUIRE(size >= sizeof(s->field_mask), "{}: summary_size {} cannot hold field_mask ({} bytes)", fn, size,
                 sizeof(s->field_mask));
  TANDEM_CHECK((s->field_mask & ~kKnownSummaryBits) == 0, tandem::Status::kUnsupported,
               "tandem_sim_summary_t: unknown field_mask bits 0x{:x}", s->field_mask & ~kKnownSummaryBits);
  for (const SummaryGroup& g : kSummaryGroups)
    TANDEM_REQUIRE((s->field_mask & g.bit) == 0 || g.end <= size,
                   "{}: field_mask bit TANDEM_SIM_SUMMARY_{} asks for fields up to byte {} of tandem_sim_summary_t, "
                   "past the caller's {}-byte struct ({}; the 0.4 calls fill 0.4's {} bytes: use the _v calls with "
                   "sizeof)",
                   fn, g.name, g.end, size, size < sizeof(tandem_sim_summary_t) ? "an older header's" : "as told",
                   kSummarySize04);
}

// Writes only the fields of the groups asked for, straight into the caller's struct (checked by check_summary).
void query_summary(const tandem_sim_result& r, tandem_sim_summary_t* s) {
  fill_summary(r.results.front(), *s);
  if (s->field_mask & TANDEM_SIM_SUMMARY_SEARCH) {
    s->evaluated = r.evaluated;
    s->fitting = r.fitting;
    s->candidates = r.search ? static_cast<int32_t>(r.results.size()) : 0;
    s->search_wall_s = r.search_wall_s;
  }
}

void candidate_summary(const tandem_sim_result& r, int32_t index, tandem_sim_summary_t* s) {
  TANDEM_REQUIRE(r.search, "tandem_sim_result_candidate: not a plan search result (tandem_sim_plan)");
  TANDEM_REQUIRE(index >= 0 && index < static_cast<int32_t>(r.results.size()),
                 "tandem_sim_result_candidate: index {} outside the {} candidates", index, r.results.size());
  fill_summary(r.results[static_cast<size_t>(index)], *s);
}

}  // namespace

extern "C" {

TANDEM_API tandem_status_t tandem_sim_dataset_info(const char* name, int64_t* samples, int64_t* channels,
                                                   int64_t* height, int64_t* width,
                                                   int64_t* num_classes) TANDEM_NOEXCEPT {
  return guarded([&] {
    TANDEM_REQUIRE(name != nullptr, "tandem_sim_dataset_info: name must be non-null");
    const sim::DatasetInfo d = sim::find_dataset(name);
    if (samples != nullptr) *samples = d.samples;
    if (channels != nullptr) *channels = d.input.c;
    if (height != nullptr) *height = d.input.h;
    if (width != nullptr) *width = d.input.w;
    if (num_classes != nullptr) *num_classes = d.classes;
  });
}

TANDEM_API tandem_status_t tandem_sim_cluster_create(tandem_context_t* ctx, const char* spec,
                                                     tandem_sim_cluster_t** out) TANDEM_NOEXCEPT {
  return guarded([&] {
    checked(ctx, "context");
    TANDEM_REQUIRE(spec != nullptr && out != nullptr, "tandem_sim_cluster_create: spec and out must be non-null");
    auto c = std::make_unique<tandem_sim_cluster>();
    c->spec = sim::parse_cluster(spec);
    *out = c.release();
  });
}

TANDEM_API tandem_status_t tandem_sim_cluster_resize(const tandem_sim_cluster_t* cluster, int32_t nodes,
                                                     tandem_sim_cluster_t** out) TANDEM_NOEXCEPT {
  return guarded([&] {
    const auto& c = checked(cluster, "simulation cluster");
    TANDEM_REQUIRE(out != nullptr, "tandem_sim_cluster_resize: out must be non-null");
    auto r = std::make_unique<tandem_sim_cluster>();
    r->spec = sim::resize_cluster(c.spec, nodes);
    *out = r.release();
  });
}

TANDEM_API tandem_status_t tandem_sim_cluster_info(const tandem_sim_cluster_t* cluster, int32_t* nodes,
                                                   int32_t* devices) TANDEM_NOEXCEPT {
  return guarded([&] {
    const auto& c = checked(cluster, "simulation cluster");
    if (nodes != nullptr) *nodes = static_cast<int32_t>(c.spec.nodes.size());
    if (devices != nullptr) *devices = c.spec.endpoints();
  });
}

TANDEM_API void tandem_sim_cluster_destroy(tandem_sim_cluster_t* cluster) TANDEM_NOEXCEPT {
  tandem::api::destroy_handle(cluster);
}

TANDEM_API tandem_status_t tandem_simulate(const tandem_sim_cluster_t* cluster, const tandem_sim_job_params_t* job,
                                           tandem_sim_result_t** out) TANDEM_NOEXCEPT {
  return guarded([&] {
    const auto& c = checked(cluster, "simulation cluster");
    TANDEM_REQUIRE(out != nullptr, "tandem_simulate: out must be non-null");
    const sim::SimOptions opt = to_options(job);
    auto h = std::make_unique<tandem_sim_result>();
    h->results.push_back(sim::simulate(c.spec, to_job(job, true), opt));
    const sim::SimResult& r = h->results.front();
    h->text = r.to_json().dump();
    h->has_trace = opt.trace;
    for (int32_t rk = 0; rk < r.ranks; ++rk) {
      const int32_t node = c.spec.node_of_endpoint(rk);
      h->rank_names.push_back(fmt::format("rank {} (stage {}, replica {}) on {} {}", rk, rk % r.pp, rk / r.pp,
                                          c.spec.nodes[node].name, c.spec.nodes[node].hw.name));
    }
    *out = h.release();
  });
}

TANDEM_API tandem_status_t tandem_sim_plan(const tandem_sim_cluster_t* cluster, const tandem_sim_job_params_t* job,
                                           int32_t top, tandem_sim_result_t** out) TANDEM_NOEXCEPT {
  return guarded([&] {
    const auto& c = checked(cluster, "simulation cluster");
    TANDEM_REQUIRE(out != nullptr, "tandem_sim_plan: out must be non-null");
    TANDEM_REQUIRE(top >= 1, "tandem_sim_plan: top must be >= 1, got {}", top);
    sim::SearchOptions so;
    so.top = top;
    sim::SearchResult s = sim::search_plans(c.spec, to_job(job, false), so);
    auto h = std::make_unique<tandem_sim_result>();
    h->search = true;
    h->evaluated = s.evaluated;
    h->fitting = s.fitting;
    h->search_wall_s = s.wall_s;
    h->text = s.to_json().dump();
    for (sim::Candidate& cand : s.best) h->results.push_back(std::move(cand.result));
    *out = h.release();
  });
}

TANDEM_API tandem_status_t tandem_sim_result_query_v(size_t summary_size, const tandem_sim_result_t* result,
                                                     tandem_sim_summary_t* s) TANDEM_NOEXCEPT {
  return guarded([&] {
    const auto& r = checked(result, "simulation result");
    check_summary(summary_size, s, "tandem_sim_result_query_v");
    query_summary(r, s);
  });
}

TANDEM_API tandem_status_t tandem_sim_result_candidate_v(size_t summary_size, const tandem_sim_result_t* result,
                                                         int32_t index, tandem_sim_summary_t* s) TANDEM_NOEXCEPT {
  return guarded([&] {
    const auto& r = checked(result, "simulation result");
    check_summary(summary_size, s, "tandem_sim_result_candidate_v");
    candidate_summary(r, index, s);
  });
}

TANDEM_API tandem_status_t tandem_sim_result_query(const tandem_sim_result_t* result,
                                                   tandem_sim_summary_t* s) TANDEM_NOEXCEPT {
  return guarded([&] {
    const auto& r = checked(result, "simulation result");
    check_summary(kSummarySize04, s, "tandem_sim_result_query");
    query_summary(r, s);
  });
}

TANDEM_API tandem_status_t tandem_sim_result_candidate(const tandem_sim_result_t* result, int32_t index,
                                                       tandem_sim_summary_t* s) TANDEM_NOEXCEPT {
  return guarded([&] {
    const auto& r = checked(result, "simulation result");
    check_summary(kSummarySize04, s, "tandem_sim_result_candidate");
    candidate_summary(r, index, s);
  });
}

TANDEM_API tandem_status_t tandem_sim_result_node(const tandem_sim_result_t* result, int32_t index,
                                                  tandem_sim_node_t* node) TANDEM_NOEXCEPT {
  return guarded([&] {
    const auto& r = checked(result, "simulation result");
    TANDEM_REQUIRE(node != nullptr, "tandem_sim_result_node: node must be non-null");
    TANDEM_CHECK((node->field_mask & ~kKnownNodeBits) == 0, tandem::Status::kUnsupported,
                 "tandem_sim_node_t: unknown field_mask bits 0x{:x}", node->field_mask & ~kKnownNodeBits);
    TANDEM_REQUIRE(!r.search, "tandem_sim_result_node: a plan search keeps no per-node figures");
    const auto& nodes = r.results.front().nodes;
    TANDEM_REQUIRE(index >= 0 && index < static_cast<int32_t>(nodes.size()),
                   "tandem_sim_result_node: index {} outside the cluster's {} nodes", index, nodes.size());
    const sim::NodeReport& n = nodes[static_cast<size_t>(index)];
    tandem_sim_node_t o = *node;
    if (o.field_mask & TANDEM_SIM_NODE_MEMORY) {
      o.name = n.name.c_str();
      o.preset = n.preset.c_str();
      o.ranks = n.ranks;
      o.memory_bytes = n.memory_bytes;
      o.memory_capacity_bytes = n.memory_capacity_bytes;
      o.runtime_bytes = n.runtime_bytes;
      o.fits = n.fits ? 1 : 0;
      o.swapping = n.swapping ? 1 : 0;
    }
    if (o.field_mask & TANDEM_SIM_NODE_CREDITS) {
      o.cpu_utilization = n.cpu_utilization;
      o.credits_start = n.credits_start;
      o.credits_end = n.credits_end;
      o.throttled = n.throttle_start_s ? 1 : 0;
      o.throttle_start_s = n.throttle_start_s.value_or(0.0);
      o.surplus_usd = n.surplus_usd;
    }
    *node = o;
  });
}

TANDEM_API tandem_status_t tandem_sim_result_stage_cut(const tandem_sim_result_t* result, int32_t* boundaries,
                                                       size_t* count) TANDEM_NOEXCEPT {
  return guarded([&] {
    const auto& r = checked(result, "simulation result");
    TANDEM_REQUIRE(count != nullptr, "tandem_sim_result_stage_cut: count must be non-null");
    const std::vector<int32_t>& cut = r.results.front().stage_boundaries;
    if (boundaries != nullptr) std::copy_n(cut.begin(), std::min(*count, cut.size()), boundaries);
    *count = cut.size();
  });
}

TANDEM_API tandem_status_t tandem_sim_result_json(const tandem_sim_result_t* result, char* json,
                                                  size_t* json_bytes) TANDEM_NOEXCEPT {
  return guarded([&] {
    const auto& r = checked(result, "simulation result");
    TANDEM_REQUIRE(json_bytes != nullptr, "tandem_sim_result_json: json_bytes must be non-null");
    tandem::api::copy_text_out(r.text, *json_bytes > 0 ? json : nullptr, json_bytes);
  });
}

TANDEM_API tandem_status_t tandem_sim_result_write_trace(const tandem_sim_result_t* result,
                                                         const char* path) TANDEM_NOEXCEPT {
  return guarded([&] {
    const auto& r = checked(result, "simulation result");
    TANDEM_REQUIRE(path != nullptr, "tandem_sim_result_write_trace: path must be non-null");
    TANDEM_REQUIRE(r.has_trace, "tandem_sim_result_write_trace: the job did not ask for a trace (set trace)");
    const sim::SimResult& s = r.results.front();
    const nlohmann::json other = {{"source", "tandem simulator"}, {"cluster", s.cluster}, {"model", s.model},
                                  {"strategy", s.strategy},       {"dp", s.dp},           {"pp", s.pp},
                                  {"micro_batches", s.micro_batches}, {"schedule", s.schedule},
                                  {"step_time_s", s.step_time_s}};
    sim::write_chrome_trace(path, sim::chrome_trace(s.trace, r.rank_names, other));
  });
}

TANDEM_API void tandem_sim_result_destroy(tandem_sim_result_t* result) TANDEM_NOEXCEPT {
  tandem::api::destroy_handle(result);
}

}  // extern "C"
