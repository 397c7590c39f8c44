#include "engine/train/trainer.hpp"

#include <cmath>
#include <limits>

#include "engine/core/error.hpp"
#include "engine/train/checkpoint.hpp"
#include "engine/train/memory_guard.hpp"

namespace tandem::engine::train {

using Clock = std::chrono::steady_clock;

namespace {
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::vector<float> to_host_vector(compute::Backend& be, const Tensor& t) {
  const Tensor h = be.to_host(t);
  const float* p = h.data<float>();
  return {p, p + h.numel()};
}

void copy_into(compute::Backend& be, const std::vector<float>& src, Tensor& dst, const std::string& what) {
  TANDEM_REQUIRE(static_cast<int64_t>(src.size()) == dst.numel(), "checkpoint: {} has {} values, the model needs {}",
                 what, src.size(), dst.numel());
  if (dst.numel() == 0) return;
  be.copy(Tensor::wrap(const_cast<float*>(src.data()), dst.shape(), DType::kF32), dst);
}
}  // namespace

void TrainerConfig::validate() const {
  TANDEM_REQUIRE(batch_size > 0, "trainer: batch size must be positive (got {})", batch_size);
  TANDEM_REQUIRE(epochs > 0, "trainer: epochs must be positive (got {})", epochs);
  TANDEM_REQUIRE(clip_norm >= 0 && std::isfinite(clip_norm), "trainer: clip norm must be >= 0 (got {})", clip_norm);
  TANDEM_REQUIRE(limit_batches >= 0 && eval_limit_batches >= 0 && eval_batch_size >= 0,
                 "trainer: batch limits and the evaluation batch size must be >= 0");
  TANDEM_REQUIRE(world >= 1 && rank >= 0 && rank < world, "trainer: rank {} outside world of {}", rank, world);
  optimizer.validate();
  loss_scale.validate();
}

data::Augment default_augment(const data::Dataset& d, bool normalize, bool augment) {
  data::Augment a;
  if (normalize && d.channels == 1) a = data::fashion_mnist_normalization();
  if (normalize && d.channels == 3) a = data::cifar10_normalization();
  if (augment) {
    a.crop_padding = d.height >= 32 ? 4 : 2;
    a.hflip = d.channels == 3;
  }
  return a;
}

Trainer::Trainer(nn::Model& model, const data::Dataset& train, const data::Dataset* test, TrainerConfig config)
    : model_(model),
      train_(train),
      test_(test),
      config_(std::move(config)),
      sampler_(train.size(), config_.world, config_.rank, true, config_.seed),
      rng_(mix64(config_.seed, 0x747261696e)),
      scaler_(config_.loss_scale) {
  config_.validate();
  const nn::SampleShape in = model.spec().input;
  auto check_data = [&](const data::Dataset& d) {
    TANDEM_REQUIRE(d.channels * d.height * d.width == in.numel() &&
                       (in.h * in.w == 1 || (d.channels == in.c && d.height == in.h && d.width == in.w)),
                   "trainer: dataset '{}' has samples {}x{}x{} but model '{}' takes {}", d.name, d.channels, d.height,
                   d.width, model.spec().name, nn::to_string(in));
    TANDEM_REQUIRE(d.num_classes <= model.spec().num_classes(),
                   "trainer: dataset '{}' has {} classes but model '{}' outputs {}", d.name, d.num_classes,
                   model.spec().name, model.spec().num_classes());
  };
  check_data(train);
  if (test != nullptr) check_data(*test);
  data::LoaderOptions lo;
  lo.batch_size = config_.batch_size;
  lo.augment = default_augment(train, config_.normalize, config_.augment);
  lo.train = true;
  lo.prefetch = config_.prefetch;
  lo.seed = config_.seed;
  loader_ = std::make_unique<data::Loader>(train_, sampler_, lo);
  schedule_ = optim::parse_schedule(config_.schedule, config_.optimizer.lr, batches_per_epoch(), config_.epochs);
}

optim::Optimizer& Trainer::optimizer() {
  if (optimizer_) return *optimizer_;
  // Created on first use, so that a trainer made only to validate settings (tandem_trainer_create_parallel does)
  // allocates neither the model's storage nor optimizer state.
  TANDEM_REQUIRE(model_.holds_all(),
                 "trainer: model '{}' holds only layers [{}, {}) (a pipeline stage's); single-process training needs "
                 "every layer", model_.spec().name, model_.held_begin(), model_.held_end());
  optimizer_ = std::make_unique<optim::Optimizer>(model_.backend(), config_.optimizer, std::vector<Tensor>{model_.params()});
  return *optimizer_;
}

Trainer::~Trainer() = default;

int64_t Trainer::batches_per_epoch() const {
  const int64_t full = loader_->batches_per_epoch();
  return config_.limit_batches > 0 ? std::min(full, config_.limit_batches) : full;
}

bool Trainer::epoch_exhausted() const {
  if (sampler_.remaining() == 0) return true;
  const int64_t done = (sampler_.position() + config_.batch_size - 1) / config_.batch_size;
  return config_.limit_batches > 0 && done >= config_.limit_batches;
}

void Trainer::begin_epoch_if_needed() {
  if (sampler_.epoch() == completed_epochs_) return;
  sampler_.set_epoch(completed_epochs_);
  loader_->reset();
}

Tensor Trainer::to_device(const data::Batch& b, Tensor& labels) {
  compute::Backend& be = model_.backend();
  const nn::SampleShape in = model_.spec().input;
  const Shape xs = in.h * in.w == 1 ? Shape{b.size, in.c} : Shape{b.size, in.c, in.h, in.w};
  Tensor x = Tensor::wrap(const_cast<float*>(b.images.data()), xs, DType::kF32);
  labels = Tensor::wrap(const_cast<int32_t*>(b.labels.data()), Shape{b.size}, DType::kI32);
  if (be.device().is_cpu()) return x;
  Tensor dx = be.empty(xs), dl = be.empty(Shape{b.size}, DType::kI32);
  be.copy(x, dx);
  be.copy(labels, dl);
  labels = dl;
  return dx;
}

StepResult Trainer::step() {
  // Memory guard (issue #6): before the first step allocates activations, fail with kOutOfMemory if the job
  // cannot fit under this host's limit, instead of being killed by the kernel.
  if (global_step() == 0)
    check_training_memory(model_,
                          single_footprint(model_.spec(), config_.batch_size, config_.prefetch,
                                           optimizer_ ? 0.0 : optim::state_bytes_per_param(config_.optimizer)),
                          "trainer");
  optim::Optimizer& opt = optimizer();  // the model's storage and the optimizer state, on the first step
  begin_epoch_if_needed();
  StepResult r;
  data::Batch batch;
  if (epoch_exhausted() || !loader_->next(batch)) {
    r.epoch_end = true;
    ++completed_epochs_;
    return r;
  }
  compute::Backend& be = model_.backend();
  Tensor labels;
  const Tensor x = to_device(batch, labels);
  const Tensor logits = model_.forward(x, true);
  compute::LossOutput loss = be.softmax_cross_entropy(logits, labels, true, 0);
  if (scaler_.enabled()) be.scale(loss.dlogits, scaler_.scale());  // fp16: small gradients kept above half's floor
  model_.backward(loss.dlogits);
  r.lr = optim::lr_at(schedule_, opt.steps());
  Tensor grads = model_.grads();
  r.skipped = !scaler_.unscale_and_update(be, grads);  // f32 gradients again; a non-finite step is skipped
  if (!r.skipped) {
    if (config_.clip_norm > 0) {
      std::vector<Tensor> g{grads};
      optim::clip_grad_norm(be, g, config_.clip_norm);
    }
    opt.step({grads}, r.lr);
  }
  r.loss = loss.loss;
  r.correct = loss.correct;
  r.samples = batch.size;
  if (epoch_exhausted()) {
    r.epoch_end = true;
    ++completed_epochs_;
    // An epoch cut short by limit_batches: the loader thread would otherwise go on assembling the rest of the
    // sampler's epoch and hold its queue through the evaluation beside the evaluation loader's (issue #16: mlp at
    // batch 128, --limit-batches 2, peaked 1.1 MiB higher for it); the next epoch restarts it anyway.
    loader_->reset();
  }
  return r;
}

EpochResult Trainer::train_epoch(const ProgressFn& progress) {
  begin_epoch_if_needed();
  const auto t0 = Clock::now();
  EpochResult e;
  e.epoch = completed_epochs_ + 1;
  double loss_sum = 0;
  int64_t correct = 0;
  const int64_t total = batches_per_epoch();
  int64_t batch_index = (sampler_.position() + config_.batch_size - 1) / config_.batch_size;
  for (;;) {
    const StepResult s = step();
    if (s.samples > 0) {
      loss_sum += s.loss * static_cast<double>(s.samples);
      correct += s.correct;
      e.train_samples += s.samples;
      ++batch_index;
      if (progress) {
        Progress p;
        p.epoch = e.epoch;
        p.batch = batch_index;
        p.batches = total;
        p.loss = loss_sum / static_cast<double>(e.train_samples);
        p.elapsed_s = seconds_since(t0);
        p.images_per_sec = static_cast<double>(e.train_samples) / std::max(p.elapsed_s, 1e-9);
        progress(p);
      }
    }
    if (s.epoch_end) break;
  }
  e.train_s = seconds_since(t0);
  const double none = std::numeric_limits<double>::quiet_NaN();  // no sample trained: no figure (not 0)
  e.train_loss = e.train_samples > 0 ? loss_sum / static_cast<double>(e.train_samples) : none;
  e.train_accuracy = e.train_samples > 0 ? static_cast<double>(correct) / static_cast<double>(e.train_samples) : none;
  e.images_per_sec = static_cast<double>(e.train_samples) / std::max(e.train_s, 1e-9);
  e.test_loss = e.test_accuracy = std::numeric_limits<double>::quiet_NaN();
  if (test_ != nullptr) {
    const EvalResult ev = evaluate(*test_);
    e.test_loss = ev.loss;
    e.test_accuracy = ev.accuracy;
  }
  e.wall_s = seconds_since(t0);
  return e;
}

EvalResult Trainer::evaluate(const data::Dataset& d, int64_t limit_batches) {
  if (limit_batches < 0) limit_batches = config_.eval_limit_batches;
  data::DistributedSampler s(d.size(), 1, 0, false, 0);
  data::LoaderOptions lo;
  lo.batch_size = config_.eval_batch_size > 0 ? config_.eval_batch_size : config_.batch_size;
  lo.augment = default_augment(d, config_.normalize, false);
  lo.train = false;
  lo.prefetch = config_.prefetch;
  data::Loader loader(d, s, lo);
  compute::Backend& be = model_.backend();
  EvalResult r;
  double loss_sum = 0;
  int64_t correct = 0;
  data::Batch b;
  for (int64_t k = 0; (limit_batches == 0 || k < limit_batches) && loader.next(b); ++k) {
    Tensor labels;
    const Tensor x = to_device(b, labels);
    const Tensor logits = model_.forward(x, false);
    const compute::LossOutput out = be.softmax_cross_entropy(logits, labels, false, 0);
    loss_sum += out.loss * static_cast<double>(b.size);
    correct += out.correct;
    r.samples += b.size;
  }
  if (r.samples > 0) {
    r.loss = loss_sum / static_cast<double>(r.samples);
    r.accuracy = static_cast<double>(correct) / static_cast<double>(r.samples);
  }
  return r;
}

TrainingIdentity Trainer::identity() const {
  TrainingIdentity id;
  id.spec = &model_.spec();
  id.optimizer = config_.optimizer;
  id.schedule = config_.schedule;
  id.batch_size = config_.batch_size;
  return id;
}

void Trainer::save_checkpoint(const std::string& path) {
  compute::Backend& be = model_.backend();
  TrainingProgress p;
  p.optimizer_steps = global_step();
  p.completed_epochs = completed_epochs_;
  p.sampler = sampler_.state();
  p.sampler_world = config_.world;
  p.sampler_rank = config_.rank;
  p.rng = rng_.state();
  std::vector<std::vector<float>> state;
  for (const Tensor& t : optimizer().state_tensors()) state.push_back(to_host_vector(be, t));
  Checkpoint ck = make_training_checkpoint(identity(), p, to_host_vector(be, model_.params()),
                                           to_host_vector(be, model_.buffers()), std::move(state));
  if (scaler_.enabled()) ck.meta["loss_scale"] = scaler_.to_json();
  train::save_checkpoint(path, ck);
}

void Trainer::load_checkpoint(const std::string& path) {
  const TrainingCheckpoint ck = load_training_checkpoint(path, identity(), config_.world, config_.rank);
  compute::Backend& be = model_.backend();
  in_checkpoint(path, [&] {
    std::vector<Tensor> opt_state;
    for (const std::vector<float>* v : ck.optimizer_state)
      opt_state.push_back(Tensor::wrap(const_cast<float*>(v->data()), Shape{static_cast<int64_t>(v->size())}, DType::kF32));
    const data::SamplerState before = sampler_.state();
    sampler_.restore(ck.progress.sampler);
    try {
      optimizer().restore(ck.progress.optimizer_steps, opt_state);  // validates every size before copying
    } catch (...) {
      sampler_.restore(before);
      throw;
    }
    copy_into(be, *ck.params, model_.params(), "model.params");
    copy_into(be, *ck.buffers, model_.buffers(), "model.buffers");
    rng_.set_state(ck.progress.rng);
    completed_epochs_ = ck.progress.completed_epochs;
    if (scaler_.enabled() && ck.file.meta.contains("loss_scale")) scaler_.restore(ck.file.meta.at("loss_scale"));
  });
  loader_->reset();
  model_.zero_grads();
}

}  // namespace tandem::engine::train
