// C shims: optimizer configurations and trainers.
#include <algorithm>
#include <cmath>

#include "api/src/enums.hpp"
#include "api/src/guard.hpp"
#include "api/src/train_handles.hpp"
#include "engine/core/allocator.hpp"
#include "engine/core/host_info.hpp"

using tandem::Status;
using tandem::api::check_field_mask;
using tandem::api::checked;
using tandem::api::ContextScope;
using tandem::api::guarded;
using tandem::api::mask_through;
namespace optim = tandem::engine::optim;
namespace train = tandem::engine::train;

static_assert(offsetof(tandem_optimizer_params_t, field_mask) == 0);
static_assert(offsetof(tandem_trainer_params_t, field_mask) == 0);
static_assert(offsetof(tandem_step_result_t, field_mask) == 0);
static_assert(offsetof(tandem_epoch_result_t, field_mask) == 0);
static_assert(sizeof(tandem_progress_t) == 48);


double tandem::api::peak_rss_bytes() {
  return std::max(0.0, tandem::proc_kib_field_bytes("/proc/self/status", "VmHWM"));
}

extern "C" {

TANDEM_API tandem_status_t tandem_optimizer_create(tandem_context_t* ctx, const tandem_optimizer_params_t* params,
                                                   tandem_optimizer_t** out) TANDEM_NOEXCEPT {
  return guarded([&] {
    checked(ctx, "tandem_optimizer_create", "context");
    TANDEM_REQUIRE(out != nullptr, "tandem_optimizer_create: out must be non-null");
    auto h = std::make_unique<tandem_optimizer>();
    if (params != nullptr) {
      const uint64_t m = params->field_mask;
      check_field_mask(m, mask_through(TANDEM_OPTIMIZER_PARAM_CLIP_NORM), "tandem_optimizer_params_t");
      optim::OptimizerConfig& c = h->config;
      if (m & TANDEM_OPTIMIZER_PARAM_KIND) {
        c.kind = tandem::api::checked_enum(params->kind, "tandem_optimizer_create: params->kind");
      }
      if (m & TANDEM_OPTIMIZER_PARAM_LR) c.lr = params->lr;
      if (m & TANDEM_OPTIMIZER_PARAM_MOMENTUM) c.momentum = params->momentum;
      if (m & TANDEM_OPTIMIZER_PARAM_DAMPENING) c.dampening = params->dampening;
      if (m & TANDEM_OPTIMIZER_PARAM_NESTEROV) c.nesterov = params->nesterov != 0;
      if (m & TANDEM_OPTIMIZER_PARAM_WEIGHT_DECAY) c.weight_decay = params->weight_decay;
      if (m & TANDEM_OPTIMIZER_PARAM_BETAS) {
        c.beta1 = params->beta1;
        c.beta2 = params->beta2;
      }
      if (m & TANDEM_OPTIMIZER_PARAM_EPS) c.eps = params->eps;
      if (m & TANDEM_OPTIMIZER_PARAM_SCHEDULE) {
        TANDEM_REQUIRE(params->schedule != nullptr, "tandem_optimizer_create: schedule is NULL");
        h->schedule = params->schedule;
        optim::parse_schedule(h->schedule, c.lr, 1, 1);  // validates the text now
      }
      if (m & TANDEM_OPTIMIZER_PARAM_CLIP_NORM) {
        TANDEM_REQUIRE(params->clip_norm >= 0 && std::isfinite(params->clip_norm),
                       "tandem_optimizer_create: clip_norm must be >= 0 (got {})", params->clip_norm);
        h->clip_norm = params->clip_norm;
      }
    }
    h->config.validate();
    *out = h.release();
  });
}

TANDEM_API void tandem_optimizer_destroy(tandem_optimizer_t* optimizer) TANDEM_NOEXCEPT {
  tandem::api::destroy_handle(optimizer);
}

TANDEM_API tandem_status_t tandem_trainer_create(tandem_model_t* model, const tandem_dataset_t* train_set,
                                                 const tandem_dataset_t* test_set, const tandem_optimizer_t* optimizer,
                                                 const tandem_trainer_params_t* params,
                                                 tandem_trainer_t** out) TANDEM_NOEXCEPT {
  return guarded([&] {
    constexpr const char* fn = "tandem_trainer_create";
    auto& mh = checked(model, fn, "model");
    const ContextScope scope(mh.env);
    const auto& tr = checked(train_set, fn, "train_set");
    const tandem_dataset* te = test_set != nullptr ? &checked(test_set, fn, "test_set") : nullptr;
    const auto& oh = checked(optimizer, fn, "optimizer");
    TANDEM_REQUIRE(out != nullptr, "tandem_trainer_create: out must be non-null");
    TANDEM_REQUIRE(mh.model != nullptr, "tandem_trainer_create: model '{}' was created with backend 'none'",
                   mh.spec.name);
    train::TrainerConfig c;
    c.optimizer = oh.config;
    c.schedule = oh.schedule;
    c.clip_norm = oh.clip_norm;
    auto h = std::make_unique<tandem_trainer>();
    h->data_bytes = tr.data.resident_bytes() + (te != nullptr ? te->data.resident_bytes() : 0.0);
    h->train_samples = tr.data.size();
    if (params != nullptr) {
      const uint64_t m = params->field_mask;
      check_field_mask(m, mask_through(TANDEM_TRAINER_PARAM_LOSS_SCALER), "tandem_trainer_params_t");
      if (m & TANDEM_TRAINER_PARAM_BATCH_SIZE) c.batch_size = params->batch_size;
      if (m & TANDEM_TRAINER_PARAM_EPOCHS) c.epochs = params->epochs;
      if (m & TANDEM_TRAINER_PARAM_SEED) c.seed = params->seed;
      if (m & TANDEM_TRAINER_PARAM_LIMIT_BATCHES) c.limit_batches = params->limit_batches;
      if (m & TANDEM_TRAINER_PARAM_EVAL_LIMIT_BATCHES) c.eval_limit_batches = params->eval_limit_batches;
      if (m & TANDEM_TRAINER_PARAM_AUGMENT) c.augment = params->augment != 0;
      if (m & TANDEM_TRAINER_PARAM_NORMALIZE) c.normalize = params->normalize != 0;
      if (m & TANDEM_TRAINER_PARAM_PREFETCH) c.prefetch = params->prefetch;
      if (m & TANDEM_TRAINER_PARAM_LOSS_SCALE) {
        const double ls = params->loss_scale;
        TANDEM_REQUIRE(ls == 0 || ls == TANDEM_LOSS_SCALE_DYNAMIC || (std::isfinite(ls) && ls > 0),
                       "{}: params->loss_scale must be 0 (off), > 0 (a fixed scale) or TANDEM_LOSS_SCALE_DYNAMIC "
                       "(-1), got {}", "tandem_trainer_create", ls);
        c.loss_scale.mode = ls == 0 ? train::LossScaleConfig::Mode::kOff
                            : ls < 0 ? train::LossScaleConfig::Mode::kDynamic
                                     : train::LossScaleConfig::Mode::kFixed;
        if (ls > 0) c.loss_scale.scale = ls;
      }
      if (m & TANDEM_TRAINER_PARAM_LOSS_SCALER) {
        c.loss_scale.init = params->loss_scale_init;
        c.loss_scale.growth = params->loss_scale_growth;
        c.loss_scale.backoff = params->loss_scale_backoff;
        c.loss_scale.growth_interval = params->loss_scale_growth_interval;
        if (c.loss_scale.mode != train::LossScaleConfig::Mode::kDynamic) {
          // Checked here: validate() looks at these only under dynamic scaling.
          train::LossScaleConfig d = c.loss_scale;
          d.mode = train::LossScaleConfig::Mode::kDynamic;
          d.validate();
        }
      }
      if (m & TANDEM_TRAINER_PARAM_PROGRESS) {
        h->progress = params->progress;
        h->progress_user_data = params->progress_user_data;
      }
    }
    h->model = &mh;
    h->trainer = tandem::api::wrap_trainer(
        std::make_unique<train::Trainer>(*mh.model, tr.data, te != nullptr ? &te->data : nullptr, c));
    *out = h.release();
  });
}

TANDEM_API void tandem_trainer_destroy(tandem_trainer_t* trainer) TANDEM_NOEXCEPT {
  tandem::api::destroy_handle(trainer);
}

TANDEM_API tandem_status_t tandem_trainer_step(tandem_trainer_t* trainer, tandem_step_result_t* result) TANDEM_NOEXCEPT {
  return guarded([&] {
    auto& h = checked(trainer, "tandem_trainer_step", "trainer");
    const ContextScope scope(h.model->env);
    if (result != nullptr) {
      check_field_mask(result->field_mask, mask_through(TANDEM_STEP_RESULT_EPOCH_END), "tandem_step_result_t");
    }
    const train::StepResult r = h.trainer->step();
    if (result == nullptr) return;
    if (result->field_mask & TANDEM_STEP_RESULT_LOSS) {
      result->loss = r.loss;
      result->correct = r.correct;
      result->samples = r.samples;
    }
    if (result->field_mask & TANDEM_STEP_RESULT_LR) result->lr = r.lr;
    if (result->field_mask & TANDEM_STEP_RESULT_EPOCH_END) result->epoch_end = r.epoch_end ? 1 : 0;
  });
}

TANDEM_API tandem_status_t tandem_trainer_epoch(tandem_trainer_t* trainer,
                                                tandem_epoch_result_t* result) TANDEM_NOEXCEPT {
  return guarded([&] {
    auto& h = checked(trainer, "tandem_trainer_epoch", "trainer");
    const ContextScope scope(h.model->env);
    if (result != nullptr) {
      check_field_mask(result->field_mask, mask_through(TANDEM_EPOCH_RESULT_REPORT), "tandem_epoch_result_t");
    }
    train::ProgressFn progress;
    if (h.progress != nullptr) {
      progress = [&h](const train::Progress& p) {
        const tandem_progress_t cp{p.epoch, p.batch, p.batches, p.loss, p.images_per_sec, p.elapsed_s};
        h.progress(&cp, h.progress_user_data);
      };
    }
    const train::EpochResult e = h.trainer->train_epoch(progress);
    h.epoch_peak_rss_bytes = tandem::api::peak_rss_bytes();
    if (h.model->backend && !h.model->backend->device().is_cpu())
      h.epoch_device_bytes = tandem::process_device_memory_bytes(h.model->backend->device());
    if (result == nullptr) return;
    if (result->field_mask & TANDEM_EPOCH_RESULT_TRAIN) {
      result->epoch = e.epoch;
      result->train_loss = e.train_loss;
      result->train_accuracy = e.train_accuracy;
      result->train_samples = e.train_samples;
    }
    if (result->field_mask & TANDEM_EPOCH_RESULT_TEST) {
      result->test_loss = e.test_loss;
      result->test_accuracy = e.test_accuracy;
    }
    if (result->field_mask & TANDEM_EPOCH_RESULT_TIME) {
      result->images_per_sec = e.images_per_sec;
      result->train_s = e.train_s;
      result->wall_s = e.wall_s;
    }
    if (result->field_mask & TANDEM_EPOCH_RESULT_REPORT) result->already_reported = e.already_reported ? 1 : 0;
  });
}

TANDEM_API tandem_status_t tandem_trainer_evaluate(tandem_trainer_t* trainer, const tandem_dataset_t* dataset,
                                                   int64_t limit_batches, double* loss,
                                                   double* accuracy) TANDEM_NOEXCEPT {
  return guarded([&] {
    auto& h = checked(trainer, "tandem_trainer_evaluate", "trainer");
    const ContextScope scope(h.model->env);
    const auto& d = checked(dataset, "tandem_trainer_evaluate", "dataset");
    TANDEM_REQUIRE(limit_batches >= 0, "tandem_trainer_evaluate: limit_batches {} must be >= 0", limit_batches);
    const train::EvalResult r = h.trainer->evaluate(d.data, limit_batches);
    if (loss != nullptr) *loss = r.loss;
    if (accuracy != nullptr) *accuracy = r.accuracy;
  });
}

TANDEM_API tandem_status_t tandem_trainer_save_checkpoint(tandem_trainer_t* trainer, const char* path) TANDEM_NOEXCEPT {
  return guarded([&] {
    auto& h = checked(trainer, "tandem_trainer_save_checkpoint", "trainer");
    const ContextScope scope(h.model->env);
    TANDEM_REQUIRE(path != nullptr && *path != '\0', "tandem_trainer_save_checkpoint: path must be a non-empty string");
    h.trainer->save_checkpoint(path);
  });
}

TANDEM_API tandem_status_t tandem_trainer_load_checkpoint(tandem_trainer_t* trainer, const char* path) TANDEM_NOEXCEPT {
  return guarded([&] {
    auto& h = checked(trainer, "tandem_trainer_load_checkpoint", "trainer");
    const ContextScope scope(h.model->env);
    TANDEM_REQUIRE(path != nullptr && *path != '\0', "tandem_trainer_load_checkpoint: path must be a non-empty string");
    h.trainer->load_checkpoint(path);
  });
}

TANDEM_API tandem_status_t tandem_trainer_progress(const tandem_trainer_t* trainer, int64_t* epochs,
                                                   int64_t* steps) TANDEM_NOEXCEPT {
  return guarded([&] {
    const auto& h = checked(trainer, "tandem_trainer_progress", "trainer");
    const ContextScope scope(h.model->env);
    if (epochs != nullptr) *epochs = h.trainer->completed_epochs();
    if (steps != nullptr) *steps = h.trainer->global_step();
  });
}

TANDEM_API tandem_status_t tandem_trainer_loss_scale(const tandem_trainer_t* trainer, double* scale,
                                                     int64_t* skipped_steps) TANDEM_NOEXCEPT {
  return guarded([&] {
    const auto& h = checked(trainer, "tandem_trainer_loss_scale", "trainer");
    const ContextScope scope(h.model->env);
    const train::LossScaler& s = h.trainer->loss_scaler();
    if (scale != nullptr) *scale = s.enabled() ? s.state().scale : 1.0;
    if (skipped_steps != nullptr) *skipped_steps = s.state().skipped;
  });
}

}  // extern "C"
