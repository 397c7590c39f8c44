#pragma once
// What a tandem_trainer_t runs: a single-process train::Trainer (tandem_trainer_create) or a
// parallel::ParallelTrainer over a communicator (tandem_trainer_create_parallel). The trainer shims
// of train.cpp call this one interface, so every tandem_trainer_* call works for both.
#include <cstdint>
#include <memory>
#include <string>

#include "api/src/comm_handles.hpp"
#include "engine/data/dataset.hpp"
#include "engine/parallel/parallel_trainer.hpp"
#include "engine/train/trainer.hpp"

namespace tandem::api {

class AnyTrainer {
 public:
  virtual ~AnyTrainer() = default;
  virtual engine::train::StepResult step() = 0;
  virtual engine::train::EpochResult train_epoch(const engine::train::ProgressFn& progress) = 0;
  virtual engine::train::EvalResult evaluate(const engine::data::Dataset& data, int64_t limit_batches) = 0;
  virtual void save_checkpoint(const std::string& path) = 0;
  virtual void load_checkpoint(const std::string& path) = 0;
  virtual int64_t completed_epochs() const = 0;
  virtual int64_t global_step() const = 0;
  virtual const engine::train::TrainerConfig& config() const = 0;
  virtual const engine::train::LossScaler& loss_scaler() const = 0;
  // The parallel trainer, or null for a single-process one.
  virtual engine::parallel::ParallelTrainer* parallel() { return nullptr; }
};

// A single-process trainer behind the interface (parallel_train.cpp).
std::unique_ptr<AnyTrainer> wrap_trainer(std::unique_ptr<engine::train::Trainer> trainer);

}  // namespace tandem::api
