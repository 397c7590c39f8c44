#pragma once
// The structs behind tandem_model_t, tandem_dataset_t, tandem_optimizer_t and tandem_trainer_t.
#include <cstdint>
#include <memory>
#include <string>

#include "api/src/handles.hpp"
#include "api/src/parallel_handles.hpp"
#include "engine/compute/backend.hpp"
#include "engine/data/dataset.hpp"
#include "engine/nn/model.hpp"
#include "engine/optim/optimizer.hpp"
#include "engine/train/trainer.hpp"
#include "tandem/tandem.h"

namespace tandem::api {
constexpr uint32_t kModelMagic = 0x544d444c;      // "TMDL"
constexpr uint32_t kDatasetMagic = 0x54445354;    // "TDST"
constexpr uint32_t kOptimizerMagic = 0x544f5054;  // "TOPT"
constexpr uint32_t kTrainerMagic = 0x54545252;    // "TTRR"
}  // namespace tandem::api

struct tandem_model : tandem::api::Handle<tandem::api::kModelMagic> {
  std::string backend_name;  // "none" when the model is a spec only
  tandem::engine::nn::ModelSpec spec;
  std::unique_ptr<tandem::engine::compute::Backend> backend;  // null for "none"
  std::unique_ptr<tandem::engine::nn::Model> model;           // null for "none"
  tandem::api::ContextEnv env;  // the creating context's settings and logger (ContextScope)
};

struct tandem_dataset : tandem::api::Handle<tandem::api::kDatasetMagic> {
  tandem::engine::data::Dataset data;
};

struct tandem_optimizer : tandem::api::Handle<tandem::api::kOptimizerMagic> {
  tandem::engine::optim::OptimizerConfig config;
  std::string schedule = "constant";
  double clip_norm = 0;
};

struct tandem_trainer : tandem::api::Handle<tandem::api::kTrainerMagic> {
  tandem_model* model = nullptr;
  std::unique_ptr<tandem::api::AnyTrainer> trainer;  // single-process or parallel (parallel_handles.hpp)
  tandem_progress_fn progress = nullptr;
  void* progress_user_data = nullptr;
  double data_bytes = 0;  // the data sets it holds (Dataset::resident_bytes; FedAvg's client subsets too), for
                          // tandem_trainer_predict
  int64_t train_samples = 0;  // its training set's samples (single-process: the job tandem_trainer_predict compiles)
  // This process's peak resident size (peak_rss_bytes) when its last tandem_trainer_epoch returned (0: none yet):
  // tandem_trainer_predict's measured memory, so that what the caller's own work touches after training (issue #16:
  // `tandem train --predict` describing this machine as a cluster faulted in 0.42 MiB of code first) is not counted.
  double epoch_peak_rss_bytes = 0;
  // On a device backend, the device memory this process held when that epoch returned (the driver's per-process
  // count, process_device_memory_bytes; the caching allocator keeps its blocks, so it is the epoch's peak): 0 on a
  // CPU, or when the driver does not tell. tandem_trainer_predict compares the prediction with it, not with host RSS.
  double epoch_device_bytes = 0;
};

namespace tandem::api {
// This process's peak resident size (VmHWM), bytes; 0 when /proc is unavailable.
double peak_rss_bytes();
}  // namespace tandem::api
