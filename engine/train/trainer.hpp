#pragma once
// The single-process training loop: batches from the loader, forward, softmax cross-entropy, backward, optional
// clipping, an optimizer step at the scheduled learning rate; evaluation (loss, top-1) after each epoch; checkpoints
// that capture model, optimizer, schedule, sampler and RNG so that a resumed run continues bit-identically.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "engine/data/loader.hpp"
#include "engine/nn/model.hpp"
#include "engine/optim/optimizer.hpp"
#include "engine/optim/schedule.hpp"
#include "engine/train/checkpoint.hpp"
#include "engine/train/loss_scaler.hpp"

namespace tandem::engine::train {

struct TrainerConfig {
  int64_t batch_size = 64;
  int64_t epochs = 1;               // the run's length, for schedules that need it (cosine)
  optim::OptimizerConfig optimizer;
  std::string schedule = "constant";  // see optim::parse_schedule
  double clip_norm = 0;             // > 0: clip gradients to this global L2 norm
  uint64_t seed = 0;                // sampler shuffle and augmentation
  int64_t limit_batches = 0;        // > 0: an epoch ends after this many batches (quick runs)
  int64_t eval_limit_batches = 0;   // > 0: evaluate on at most this many batches
  int64_t eval_batch_size = 0;      // 0: batch_size
  bool augment = false;             // random crop (padding 4 for 32x32, else 2) and flips, training only
  bool normalize = true;            // per-channel normalisation with the dataset's usual statistics
  int prefetch = 2;
  int world = 1, rank = 0;          // data sharding (the data-parallel trainer uses these)
  LossScaleConfig loss_scale;       // fp16 training: loss scaling (loss_scaler.hpp); off by default
  void validate() const;
};

struct StepResult {
  double loss = 0;        // mean over the batch
  int64_t correct = 0;
  int64_t samples = 0;
  float lr = 0;
  bool epoch_end = false; // no batch was left: nothing was trained
  bool skipped = false;   // loss scaling: the gradients were not finite, the optimizer did not step
};

struct EvalResult {
  double loss = 0;       // mean over samples
  double accuracy = 0;   // top-1, in [0, 1]
  int64_t samples = 0;
};

struct EpochResult {
  int64_t epoch = 0;            // 1-based
  double train_loss = 0;        // mean over the epoch's samples (NaN when none was scored)
  double train_accuracy = 0;    // NaN when no sample was scored
  int64_t train_samples = 0;
  double test_loss = 0;         // NaN without a test set
  double test_accuracy = 0;     // NaN without a test set
  double images_per_sec = 0;    // training only (excludes evaluation)
  double train_s = 0;
  double wall_s = 0;            // training + evaluation
  // Elastic: a rank that has left the job reported this epoch already (it was rank 0 when the epoch closed there, and
  // said so as it left: Communicator::leave); the survivors' rank 0 does not report it again.
  bool already_reported = false;
};

struct Progress {
  int64_t epoch = 0;        // 1-based
  int64_t batch = 0;        // batches done in this epoch
  int64_t batches = 0;      // batches in this epoch
  double loss = 0;          // running mean
  double images_per_sec = 0;
  double elapsed_s = 0;
};
using ProgressFn = std::function<void(const Progress&)>;

class Trainer {
 public:
  // `model`, `train` and `test` (may be null) must outlive the trainer.
  Trainer(nn::Model& model, const data::Dataset& train, const data::Dataset* test, TrainerConfig config);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Trains on the next batch of the current epoch (starting the next epoch when the last one ended).
  StepResult step();
  // Trains the rest of the current epoch (or a whole new one), then evaluates on the test set.
  EpochResult train_epoch(const ProgressFn& progress = {});
  EvalResult evaluate(const data::Dataset& data, int64_t limit_batches = -1);  // -1: the config's eval limit

  int64_t completed_epochs() const noexcept { return completed_epochs_; }
  int64_t global_step() const noexcept { return optimizer_ ? optimizer_->steps() : 0; }
  int64_t batches_per_epoch() const;
  const TrainerConfig& config() const noexcept { return config_; }
  nn::Model& model() noexcept { return model_; }
  optim::Optimizer& optimizer();  // created on first use (the model's storage with it)
  data::DistributedSampler& sampler() noexcept { return sampler_; }
  const LossScaler& loss_scaler() const noexcept { return scaler_; }

  void save_checkpoint(const std::string& path);
  // Restores model, optimizer, schedule position, sampler and RNG. Throws kIo for bad files and kInvalidArgument
  // when the checkpoint belongs to another model or optimizer.
  void load_checkpoint(const std::string& path);

 private:
  TrainingIdentity identity() const;
  bool epoch_exhausted() const;
  void begin_epoch_if_needed();
  Tensor to_device(const data::Batch& b, Tensor& labels);

  nn::Model& model_;
  const data::Dataset& train_;
  const data::Dataset* test_;
  TrainerConfig config_;
  data::DistributedSampler sampler_;
  std::unique_ptr<data::Loader> loader_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  optim::ScheduleConfig schedule_;
  Rng rng_;
  LossScaler scaler_;
  int64_t completed_epochs_ = 0;
};

// Per-channel normalisation used for a dataset of this shape: Fashion-MNIST statistics for 1 channel, CIFAR-10's
// for 3, none otherwise.
data::Augment default_augment(const data::Dataset& d, bool normalize, bool augment);

}  // namespace tandem::engine::train
