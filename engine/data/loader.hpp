#pragma once
// A loader thread that assembles batches (f32 NCHW images, int32 labels) ahead of the consumer. It walks the rest of
// the sampler's current epoch; the sampler advances only as batches are consumed, so its state always says where to
// resume. Augmentation draws from (seed, epoch, sample index), so a resumed run sees the same crops and flips.
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/data/augment.hpp"
#include "engine/data/dataset.hpp"
#include "engine/data/sampler.hpp"

namespace tandem::engine::data {

struct Batch {
  int64_t size = 0;
  int64_t channels = 0, height = 0, width = 0;
  std::vector<float> images;    // size * channels * height * width, NCHW
  std::vector<int32_t> labels;  // size
};

struct LoaderOptions {
  int64_t batch_size = 64;
  Augment augment;          // normalisation always; crop and flip only when `train`
  bool train = true;
  bool drop_last = false;   // drop the epoch's last partial batch
  int prefetch = 2;         // batches assembled ahead; 0 assembles on the caller's thread
  uint64_t seed = 0;        // augmentation randomness
  int64_t timeout_ms = 120000;  // next() gives up (kTimeout) when no batch arrives in this time
};

// The bytes of one assembled batch of `batch` samples of `sample_size` values: f32 images and int32 labels (Batch).
constexpr double batch_bytes(int64_t batch, int64_t sample_size) noexcept {
  return static_cast<double>(batch) *
         static_cast<double>(sample_size * int64_t{sizeof(float)} + int64_t{sizeof(int32_t)});
}

// The bytes a loader of `batch`-sample batches of `sample_size` values holds besides the batch its caller trains on
// (which the trainer wraps as the model's input: the job compiler counts it with the activations): with a thread
// (prefetch > 0) its queue of `prefetch` batches and the one the thread has assembled and waits to queue; none
// without one (prefetch 0 assembles the caller's batch on its thread).
constexpr double prefetched_bytes(int64_t batch, int prefetch, int64_t sample_size) noexcept {
  if (prefetch <= 0) return 0;
  return static_cast<double>(prefetch + 1) * batch_bytes(batch, sample_size);
}

// What a training process's loaders add at their most to the memory its training steps hold: the training loader's
// batches ahead (prefetched_bytes) and the epoch's evaluation batch, one of `batch` samples. The evaluation runs
// with the training's memory still resident (the host allocator keeps the step's blocks, malloc its freed batches)
// and its batch takes new pages beside it: `tandem train` measured +1 batch at the evaluation with prefetch 0 and 2
// (issue #16: mlp at batch 128, 0.38 MiB; the evaluation loader's own batches ahead reuse the training loader's
// freed ones). The one figure of it: the job compiler's StageMemory::loader_bytes (engine/parallel/job.hpp) and the
// single trainer's memory guard (engine/train/memory_guard.cpp) take it from here.
constexpr double loader_bytes(int64_t batch, int prefetch, int64_t sample_size) noexcept {
  return prefetched_bytes(batch, prefetch, sample_size) + batch_bytes(batch, sample_size);
}

class Loader {
 public:
  // `data` and `sampler` must outlive the loader.
  Loader(const Dataset& data, DistributedSampler& sampler, LoaderOptions options);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // The next batch of the sampler's current epoch; false when the epoch is exhausted (the caller then moves the
  // sampler to the next epoch). Rethrows a failure of the loader thread.
  bool next(Batch& out);
  // Stops prefetching; call after changing the sampler's state from outside (restore, set_epoch).
  void reset();
  // Batches in a full epoch for this rank.
  int64_t batches_per_epoch() const;
  const LoaderOptions& options() const noexcept { return opts_; }

 private:
  void start();
  void run(std::vector<int64_t> indices, int64_t epoch);
  Batch assemble(const int64_t* idx, int64_t n, int64_t epoch) const;

  const Dataset& data_;
  DistributedSampler& sampler_;
  LoaderOptions opts_;
  SampleConverter converter_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Batch> queue_;
  std::exception_ptr error_;
  bool running_ = false, stop_ = false, producer_done_ = false;
  int64_t pending_ = 0;  // batches the current thread will produce (or has), not yet consumed
  std::thread thread_;
};

}  // namespace tandem::engine::data
