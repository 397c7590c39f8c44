// C shims: parallel trainers (DDP, pipeline, hybrid DP x PP over a communicator), and the trainer
// interface that lets every tandem_trainer_* call drive single-process and parallel trainers alike.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "api/src/enums.hpp"
#include "api/src/guard.hpp"
#include "api/src/parallel_handles.hpp"
#include "api/src/strategy_fields.hpp"
#include "api/src/train_handles.hpp"

using tandem::Status;
using tandem::api::check_field_mask;
using tandem::api::checked;
using tandem::api::ContextScope;
using tandem::api::guarded;
using tandem::api::mask_through;
using tandem::api::require_read;
namespace par = tandem::engine::parallel;
namespace train = tandem::engine::train;

static_assert(offsetof(tandem_parallel_params_t, field_mask) == 0);
static_assert(offsetof(tandem_parallel_attr_t, field_mask) == 0);

namespace tandem::api {
namespace {

// Forwards the interface to a trainer type with the same member functions.
template <typename T>
class Forwarding : public AnyTrainer {
 public:
  explicit Forwarding(std::unique_ptr<T> t) : t_(std::move(t)) {}
  train::StepResult step() override { return t_->step(); }
  train::EpochResult train_epoch(const train::ProgressFn& p) override { return t_->train_epoch(p); }
  train::EvalResult evaluate(const engine::data::Dataset& d, int64_t limit) override { return t_->evaluate(d, limit); }
  void save_checkpoint(const std::string& path) override { t_->save_checkpoint(path); }
  void load_checkpoint(const std::string& path) override { t_->load_checkpoint(path); }
  int64_t completed_epochs() const override { return t_->completed_epochs(); }
  int64_t global_step() const override { return t_->global_step(); }
  const train::TrainerConfig& config() const override { return t_->config(); }
  const train::LossScaler& loss_scaler() const override { return t_->loss_scaler(); }

 protected:
  std::unique_ptr<T> t_;
};

class ParallelAdapter final : public Forwarding<par::ParallelTrainer> {
 public:
  ParallelAdapter(StateRef comm, std::unique_ptr<par::ParallelTrainer> t)
      : Forwarding(std::move(t)), comm_(std::move(comm)), partition_(t_->describe_partition()) {}
  ~ParallelAdapter() override { t_.reset(); }  // before the communicator it uses
  par::ParallelTrainer* parallel() override { return t_.get(); }
  const std::string& partition() const { return partition_; }

 private:
  StateRef comm_;  // keeps the engine communicator alive (empty for a one-rank job)
  std::string partition_;
};


par::ParallelConfig to_config(const tandem_parallel_params_t* p) {
  par::ParallelConfig c;
  if (p == nullptr) return c;
  const char* fn = "tandem_trainer_create_parallel";
  const uint64_t m = p->field_mask;
  check_field_mask(m, mask_through(TANDEM_PARALLEL_PARAM_STALENESS_LR), "tandem_parallel_params_t");
  if (m & TANDEM_PARALLEL_PARAM_STRATEGY) {
    c.strategy = checked_enum(p->strategy, "tandem_trainer_create_parallel: parallel->strategy");
  }
  if (m & TANDEM_PARALLEL_PARAM_GRID) {
    c.dp = p->dp;
    c.pp = p->pp;
  }
  if (m & TANDEM_PARALLEL_PARAM_MICRO_BATCHES) c.micro_batches = p->micro_batches;
  if (m & TANDEM_PARALLEL_PARAM_SCHEDULE) {
    c.schedule = checked_enum(p->schedule, "tandem_trainer_create_parallel: parallel->schedule");
  }
  if (m & TANDEM_PARALLEL_PARAM_BUCKET_MB) c.bucket_mb = p->bucket_mb;
  if (m & TANDEM_PARALLEL_PARAM_BUCKETS) {  // ranges checked by validate_config, in its words
    TANDEM_REQUIRE(p->bucket_sizes_mb != nullptr || p->num_bucket_sizes == 0,
                   "{}: parallel->bucket_sizes_mb is NULL with num_bucket_sizes {}", fn, p->num_bucket_sizes);
    TANDEM_REQUIRE(p->num_bucket_sizes <= 65536, "{}: parallel->num_bucket_sizes {} is more than the 65536 allowed", fn,
                   p->num_bucket_sizes);
    c.first_bucket_mb = p->first_bucket_mb;
    c.bucket_sizes_mb.assign(p->bucket_sizes_mb, p->bucket_sizes_mb + p->num_bucket_sizes);
  }
  if (m & TANDEM_PARALLEL_PARAM_COMPRESSION) {
    c.compression = checked_enum(p->compression, "tandem_trainer_create_parallel: parallel->compression");
  }
  if (m & TANDEM_PARALLEL_PARAM_ACCUMULATION) c.accumulation = p->accumulation;
  if (m & TANDEM_PARALLEL_PARAM_PARTITION) {
    c.partition = checked_enum(p->partition, "tandem_trainer_create_parallel: parallel->partition");
  }
  if (m & TANDEM_PARALLEL_PARAM_BOUNDARIES) {
    TANDEM_REQUIRE(p->boundaries != nullptr || p->num_boundaries == 0, "{}: boundaries is NULL", fn);
    TANDEM_REQUIRE(p->num_boundaries <= 65536, "{}: {} boundaries is implausible", fn, p->num_boundaries);
    c.boundaries.assign(p->boundaries, p->boundaries + p->num_boundaries);
  }
  if (m & TANDEM_PARALLEL_PARAM_TRACE) c.trace = p->trace != 0;
  // The strategies of issue #13: each field checked here, named as the C caller knows it (resolve_grid checks the
  // same ranges again, in the command line's words, for every caller).
  const auto finite = [](double v) { return std::isfinite(v); };
  if (m & TANDEM_PARALLEL_PARAM_SERVERS) {
    TANDEM_REQUIRE(p->servers >= 1, "{}: parallel->servers must be >= 1 (got {})", fn, p->servers);
    c.servers = p->servers;
  }
  if (m & TANDEM_PARALLEL_PARAM_STALENESS) {
    TANDEM_REQUIRE(p->staleness >= 0, "{}: parallel->staleness must be >= 0 (got {})", fn, p->staleness);
    c.staleness = p->staleness;
  }
  if (m & TANDEM_PARALLEL_PARAM_STALENESS_LR) {
    c.staleness_lr = checked_enum(p->staleness_lr, "tandem_trainer_create_parallel: parallel->staleness_lr");
  }
  if (m & TANDEM_PARALLEL_PARAM_EASGD) {
    TANDEM_REQUIRE(p->tau >= 1, "{}: parallel->tau must be >= 1 step (got {})", fn, p->tau);
    TANDEM_REQUIRE(finite(p->alpha) && p->alpha >= 0 && p->alpha < 1,
                   "{}: parallel->alpha must be in [0, 1) (0: 0.9 / workers; got {})", fn, p->alpha);
    c.tau = p->tau;
    c.alpha = p->alpha;
    c.easgd_async = p->easgd_async != 0;
  }
  if (m & TANDEM_PARALLEL_PARAM_FEDAVG) {
    TANDEM_REQUIRE(p->clients >= 0, "{}: parallel->clients must be >= 0 (0: one per worker; got {})", fn, p->clients);
    TANDEM_REQUIRE(finite(p->dirichlet_alpha) && p->dirichlet_alpha >= 0,
                   "{}: parallel->dirichlet_alpha must be >= 0 (0: IID; got {})", fn, p->dirichlet_alpha);
    TANDEM_REQUIRE(finite(p->client_fraction) && p->client_fraction > 0 && p->client_fraction <= 1,
                   "{}: parallel->client_fraction must be in (0, 1] (got {})", fn, p->client_fraction);
    TANDEM_REQUIRE(p->local_epochs >= 1, "{}: parallel->local_epochs must be >= 1 (got {})", fn, p->local_epochs);
    TANDEM_REQUIRE(finite(p->round_deadline_s) && p->round_deadline_s >= 0,
                   "{}: parallel->round_deadline_s must be >= 0 (0: the communicator's timeout; got {})", fn,
                   p->round_deadline_s);
    c.clients = p->clients;
    c.dirichlet_alpha = p->dirichlet_alpha;
    c.client_fraction = p->client_fraction;
    c.local_epochs = p->local_epochs;
    c.round_deadline_s = p->round_deadline_s;
  }
  if (m & TANDEM_PARALLEL_PARAM_LOCALSGD) {
    TANDEM_REQUIRE(p->average_every >= 1, "{}: parallel->average_every must be >= 1 step (got {})", fn,
                   p->average_every);
    TANDEM_REQUIRE(p->warmup_steps >= 0, "{}: parallel->warmup_steps must be >= 0 (got {})", fn, p->warmup_steps);
    c.average_every = p->average_every;
    c.warmup_steps = p->warmup_steps;
  }
  if (m & TANDEM_PARALLEL_PARAM_ELASTIC) {
    TANDEM_REQUIRE(p->min_ranks >= 1, "{}: parallel->min_ranks must be >= 1 (got {})", fn, p->min_ranks);
    c.elastic = p->elastic != 0;
    c.min_ranks = p->min_ranks;
    c.elastic_checkpoint = p->elastic_checkpoint != nullptr ? p->elastic_checkpoint : "";
  }
  if (m & TANDEM_PARALLEL_PARAM_GROW) {
    TANDEM_REQUIRE(p->max_ranks >= 0, "{}: parallel->max_ranks must be >= 0 (0: no bound; got {})", fn, p->max_ranks);
    TANDEM_REQUIRE(p->join_poll_steps >= 0, "{}: parallel->join_poll_steps must be >= 0 (0: every step; got {})", fn,
                   p->join_poll_steps);
    c.max_ranks = p->max_ranks;
    c.join_poll_steps = std::max(1, p->join_poll_steps);
    c.joining = p->joining != 0;
  }
  if (m & TANDEM_PARALLEL_PARAM_SERVER_REPLICAS) {
    TANDEM_REQUIRE(p->server_replicas >= 0, "{}: parallel->server_replicas must be >= 0 (got {})", fn,
                   p->server_replicas);
    c.server_replicas = p->server_replicas;
  }
  // A strategy field given to a strategy that does not read it is refused, naming it (strategy_fields.hpp).
  const std::string_view prefix = "tandem_trainer_create_parallel: parallel->";
  const auto given = [&](uint64_t bit, const char* name, std::initializer_list<std::string_view> fields) {
    if (m & bit) require_read(c.strategy, c.easgd_async, fields, prefix, name);
  };
  given(TANDEM_PARALLEL_PARAM_SERVERS, "TANDEM_PARALLEL_PARAM_SERVERS", {"servers"});
  given(TANDEM_PARALLEL_PARAM_STALENESS, "TANDEM_PARALLEL_PARAM_STALENESS", {"staleness"});
  given(TANDEM_PARALLEL_PARAM_STALENESS_LR, "TANDEM_PARALLEL_PARAM_STALENESS_LR", {"staleness_lr"});
  given(TANDEM_PARALLEL_PARAM_EASGD, "TANDEM_PARALLEL_PARAM_EASGD", {"tau", "alpha", "easgd_async"});
  given(TANDEM_PARALLEL_PARAM_FEDAVG, "TANDEM_PARALLEL_PARAM_FEDAVG",
        {"clients", "dirichlet_alpha", "client_fraction", "local_epochs", "round_deadline_s"});
  given(TANDEM_PARALLEL_PARAM_LOCALSGD, "TANDEM_PARALLEL_PARAM_LOCALSGD", {"average_every", "warmup_steps"});
  return c;
}

}  // namespace

std::unique_ptr<AnyTrainer> wrap_trainer(std::unique_ptr<train::Trainer> trainer) {
  return std::make_unique<Forwarding<train::Trainer>>(std::move(trainer));
}

}  // namespace tandem::api

extern "C" {

TANDEM_API tandem_status_t tandem_trainer_create_parallel(tandem_model_t* model, const tandem_dataset_t* train_set,
                                                          const tandem_dataset_t* test_set,
                                                          const tandem_optimizer_t* optimizer,
                                                          const tandem_trainer_params_t* params,
                                                          const tandem_parallel_params_t* parallel,
                                                          tandem_comm_t* comm, tandem_trainer_t** out) TANDEM_NOEXCEPT {
  return guarded([&] {
    constexpr const char* fn = "tandem_trainer_create_parallel";
    TANDEM_REQUIRE(out != nullptr, "{}: out must be non-null", fn);
    par::ParallelConfig pc = tandem::api::to_config(parallel);
    tandem::api::StateRef state;
    tandem::engine::comm::Communicator* world = nullptr;
    if (comm != nullptr) {
      auto& c = checked(comm, fn, "comm");
      state = c.state;
      world = state->comm.get();
    }
    // The trainer settings are read and validated exactly as tandem_trainer_create does it.
    tandem_trainer_t* base = nullptr;
    const tandem_status_t st = tandem_trainer_create(model, train_set, test_set, optimizer, params, &base);
    if (st != TANDEM_OK) throw tandem::Error(tandem::api::from_c(st), tandem_last_error_message());
    std::unique_ptr<tandem_trainer, void (*)(tandem_trainer*)> guard(base, tandem_trainer_destroy);
    const train::TrainerConfig config = base->trainer->config();
    auto& mh = checked(model, fn, "model");
    const auto& train_data = checked(train_set, fn, "train_set").data;
    if (pc.strategy == par::Strategy::kFedAvg)
      tandem::api::require_clients_fit(pc.clients, train_data.size(), "tandem_trainer_create_parallel: parallel->");
    const ContextScope scope(mh.env);
    auto pt = std::make_unique<par::ParallelTrainer>(*mh.model, train_data,
                                                     test_set != nullptr ? &checked(test_set, fn, "test_set").data
                                                                         : nullptr,
                                                     config, pc, world);
    auto h = std::make_unique<tandem_trainer>();
    h->model = &mh;
    h->progress = base->progress;
    h->progress_user_data = base->progress_user_data;
    h->data_bytes = pt->data_bytes();  // the sets it was given and its FedAvg clients' subsets
    h->trainer = std::make_unique<tandem::api::ParallelAdapter>(state, std::move(pt));
    *out = h.release();
  });
}

TANDEM_API tandem_status_t tandem_trainer_parallel_query(tandem_trainer_t* trainer,
                                                         tandem_parallel_attr_t* attr) TANDEM_NOEXCEPT {
  return guarded([&] {
    auto& h = checked(trainer, "tandem_trainer_parallel_query", "trainer");
    const ContextScope scope(h.model->env);
    TANDEM_REQUIRE(attr != nullptr, "tandem_trainer_parallel_query: attr must be non-null");
    check_field_mask(attr->field_mask, mask_through(TANDEM_PARALLEL_ATTR_ASYNC), "tandem_parallel_attr_t");
    par::ParallelTrainer* t = h.trainer->parallel();
    TANDEM_REQUIRE(t != nullptr,
                   "tandem_trainer_parallel_query: the trainer was made by tandem_trainer_create (single process); "
                   "only tandem_trainer_create_parallel trainers have parallel attributes");
    const par::Grid& g = t->grid();
    const par::ParallelConfig& c = t->parallel_config();
    if (attr->field_mask & TANDEM_PARALLEL_ATTR_GRID) {
      attr->world = g.world;
      attr->rank = g.rank;
      attr->dp = g.dp;
      attr->pp = g.pp;
      attr->stage = g.stage;
      attr->replica = g.dp_rank;
    }
    if (attr->field_mask & TANDEM_PARALLEL_ATTR_PLAN) {
      attr->strategy = par::strategy_name(c.strategy);
      attr->schedule = par::schedule_name(c.schedule);
      attr->micro_batches = c.micro_batches;
      attr->accumulation = c.accumulation;
      attr->first_layer = t->boundaries()[static_cast<size_t>(g.stage)];
      attr->end_layer = t->boundaries()[static_cast<size_t>(g.stage) + 1];
      attr->partition = static_cast<tandem::api::ParallelAdapter&>(*h.trainer).partition().c_str();
    }
    if (attr->field_mask & TANDEM_PARALLEL_ATTR_SPLIT) {
      const par::EpochSplit& s = t->last_split();
      attr->steps = s.steps;
      attr->step_s = s.step_s;
      attr->compute_s = s.compute_s;
      attr->bubble_s = s.bubble_s;
      attr->comm_s = s.comm_s;
      attr->data_s = s.data_s;
      attr->other_s = s.other_s;
      attr->allreduce_s = s.allreduce_s;
      attr->bubble_fraction = s.bubble_fraction;
      attr->max_bubble_fraction = s.max_bubble_fraction;
    }
    if (attr->field_mask & TANDEM_PARALLEL_ATTR_SYNC) {
      attr->workers = g.dp;
      attr->servers = g.servers;
      attr->staleness = c.staleness;
      attr->tau = c.tau;
      attr->alpha = c.alpha;
      attr->easgd_async = c.easgd_async ? 1 : 0;
      attr->clients = c.clients;
      attr->dirichlet_alpha = c.dirichlet_alpha;
      attr->client_fraction = c.client_fraction;
      attr->local_epochs = c.local_epochs;
      attr->round_deadline_s = c.round_deadline_s;
      attr->average_every = c.average_every;
      attr->warmup_steps = c.warmup_steps;
    }
    if (attr->field_mask & TANDEM_PARALLEL_ATTR_REPLICAS) {
      attr->server_replicas = t->job().sync.replicas;
      attr->shards = static_cast<int32_t>(t->job().sync.shards.size());
    }
    if (attr->field_mask & TANDEM_PARALLEL_ATTR_ASYNC) attr->staleness_lr = tandem::api::to_c(c.staleness_lr);
    if (attr->field_mask & TANDEM_PARALLEL_ATTR_ELASTIC) {
      attr->elastic = c.elastic ? 1 : 0;
      attr->min_ranks = c.min_ranks;
      attr->lost_ranks = static_cast<int32_t>(t->lost_ranks().size());
      attr->world_rank = t->world_rank();
      attr->lr_scale = t->lr_scale();
    }
  });
}

TANDEM_API tandem_status_t tandem_trainer_write_trace(tandem_trainer_t* trainer, const char* path) TANDEM_NOEXCEPT {
  return guarded([&] {
    auto& h = checked(trainer, "tandem_trainer_write_trace", "trainer");
    const ContextScope scope(h.model->env);
    TANDEM_REQUIRE(path != nullptr && *path != '\0', "tandem_trainer_write_trace: path must be a non-empty string");
    par::ParallelTrainer* t = h.trainer->parallel();
    TANDEM_REQUIRE(t != nullptr, "tandem_trainer_write_trace: the trainer was made by tandem_trainer_create; traces "
                                 "need tandem_trainer_create_parallel with TANDEM_PARALLEL_PARAM_TRACE");
    t->write_trace(path);
  });
}

}  // extern "C"
