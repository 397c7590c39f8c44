#pragma once
// Data-parallel gradient averaging with buckets, as PyTorch DDP does it: a stage's layers are grouped
// into buckets from its last layer backwards (schedule.hpp make_buckets -- the same buckets the plan
// and the simulator use); during the backward pass that completes a step's gradients, the model's
// grad-ready hook tells the reducer when a bucket's last layer is done, and the bucket's all-reduce
// starts right then, non-blocking, while backward continues through earlier layers. finish() waits
// for what is still running -- only that wait is exposed communication -- and averages.
//
// Gradient accumulation: backward passes that are not the last before a step run with the reducer
// disarmed, so no all-reduce happens on accumulation steps.
//
// Compression: with fp16/bf16, a bucket is scaled by 1/dp, converted on issue, summed in the
// compressed type on the wire, and converted back in finish().
//
// A watcher thread waits on the all-reduces in issue order and timestamps their completion, which
// gives the all-reduces' own duration (for the overlap figure and the trace) without polling.
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/comm/communicator.hpp"
#include "engine/nn/model.hpp"
#include "engine/parallel/gradient_sync.hpp"
#include "engine/parallel/parallel_config.hpp"
#include "engine/parallel/schedule.hpp"
#include "engine/parallel/step_trace.hpp"

namespace tandem::engine::parallel {

// The wire form of compressed gradients (kF16 / kBF16): dst[i] = 16-bit(src[i] * scale), and back. The reducer
// runs these on the training thread; calibration times the same functions for the simulator.
void compress_gradients(GradCompression c, const float* src, float scale, uint16_t* dst, size_t n);
void decompress_gradients(GradCompression c, const uint16_t* src, float* dst, size_t n);

class GradientReducer final : public GradientSync {
 public:
  // `comm`: the stage's data-parallel group (size >= 2); `model`, `comm` and `tracer` must outlive
  // the reducer. Installs the model's grad-ready hook (removed again by the destructor).
  GradientReducer(comm::Communicator& comm, nn::Model& model, std::vector<GradientBucket> buckets,
                  GradCompression compression, Tracer& tracer);
  ~GradientReducer() override;
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // While armed, the grad-ready hook starts each bucket's all-reduce as soon as it is complete.
  void arm(bool armed) noexcept override { armed_ = armed; }
  // Starts bucket b's all-reduce unless it already runs (kAllreduceBucket ops of a plan).
  void issue(int bucket) override;
  // Starts every bucket not yet started, waits for all, leaves averaged gradients in the model and
  // disarms. Returns the nanoseconds spent blocked. Rethrows a failed all-reduce (it names the peer).
  int64_t finish() override;
  // All-reduce time of the last finish(): the union of the buckets' [start, completion] intervals,
  // where a bucket starts when issued or when the one before it completed (they run one at a time).
  int64_t last_allreduce_ns() const noexcept override { return last_busy_ns_; }
  const std::vector<GradientBucket>& buckets() const noexcept { return buckets_; }

 private:
  struct Pending {
    int bucket = 0;
    int64_t issued_ns = 0;
    std::unique_ptr<comm::Work> work;
  };
  void on_grad_ready(size_t layer);
  void watch();

  comm::Communicator& comm_;
  nn::Model& model_;
  std::vector<GradientBucket> buckets_;
  GradCompression compression_;
  Tracer& tracer_;
  int dp_;
  bool host_memory_;                    // gradients live in host memory (else staged through the host)
  std::vector<int> trigger_bucket_;     // per layer: bucket whose all-reduce starts after it, or -1
  std::vector<bool> issued_;
  std::vector<std::vector<uint16_t>> wire16_;  // compressed staging per bucket
  std::vector<Tensor> host_stage_;             // device gradients staged in host memory per bucket
  bool armed_ = false;
  int64_t last_busy_ns_ = 0;

  // Shared with the watcher.
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> queue_;
  struct Done {
    int bucket;
    int64_t issued_ns, completed_ns;
  };
  std::vector<Done> done_;  // finished all-reduces, in issue order
  size_t outstanding_ = 0;
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread watcher_;
};

}  // namespace tandem::engine::parallel
