#pragma once
// Runs one pipeline stage's part of a PipelinePlan (schedule.hpp) on a real model and communicator:
// the ops in list order -- forward / backward of micro-batches over the stage's layer range,
// non-blocking sends and blocking receives of activations and their gradients, all-reduces of the
// stage's gradient buckets, then the optimizer step. The simulator executes the same plans. A stage
// never waits on its own sends during training: they complete in the background (across steps);
// only evaluation's end and destruction wait for them.
//
// Math: the last stage scales each micro-batch's loss gradient by 1 / (samples in the whole step),
// and backward accumulates parameter gradients over micro-batches, so after the flush the gradients
// are those of the full batch -- single-device training. Batch norm normalises each micro-batch
// with its own statistics (as GPipe does), so models with batch norm match single-device training
// only when the micro-batch is the batch.
//
// Messages: activations and gradients of micro-batch m crossing the cut before stage s travel
// between pipeline ranks s-1 and s with tag (kind, m, tensor index); messages with one tag arrive
// in order, so the plan's matching rule (k-th send pairs with k-th receive) holds.
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "engine/comm/communicator.hpp"
#include "engine/nn/model.hpp"
#include "engine/parallel/grad_reducer.hpp"
#include "engine/parallel/schedule.hpp"
#include "engine/parallel/step_trace.hpp"

namespace tandem::engine::parallel {

struct MicroBatch {
  Tensor x;           // stage 0: the input [n, ...] on the backend's device
  Tensor labels;      // last stage: [n] i32 on the device
  int64_t size = 0;
};

struct StageResult {
  double loss_sum = 0;  // last stage: sum over samples of the cross-entropy
  int64_t correct = 0;  // last stage: top-1 hits
  int64_t samples = 0;
};

class StageExecutor {
 public:
  // `pipe`: the pipeline's communicator, ranked by stage (null when there is one stage); `reducer`:
  // the stage's data-parallel gradient reducer or parameter-server push/pull (null without data
  // parallelism). All borrowed.
  StageExecutor(nn::Model& model, int stage, int stages, int32_t first_layer, int32_t end_layer,
                comm::Communicator* pipe, GradientSync* reducer, Tracer& tracer);
  ~StageExecutor();
  StageExecutor(const StageExecutor&) = delete;
  StageExecutor& operator=(const StageExecutor&) = delete;

  // One training step: the stage's ops of `plan` (whose stage_plans[stage] must cover this
  // executor's layers). `mbs` holds the plan's micro-batches (every stage gets their sizes; only
  // stage 0 reads x and only the last stage labels). `normalizer`: samples in the step on this
  // replica. `optimizer_step` runs at kOptimizerStep once the all-reduces are done.
  StageResult train_step(const PipelinePlan& plan, const std::vector<MicroBatch>& mbs, int64_t normalizer,
                         const std::function<void()>& optimizer_step, TimeSplit& times);

  // Forward only (evaluation): stage 0 feeds mb.x, later stages receive; the last stage scores.
  // Consecutive calls pipeline across batches (sends do not wait for the next stage).
  StageResult eval_batch(const MicroBatch& mb, int64_t index, TimeSplit& times);
  // Waits for every send still in flight (end of an evaluation).
  void drain_sends(TimeSplit& times);

  // The data-parallel reducer of the next train_step calls; null: local steps (the plan's bucket all-reduces are
  // skipped and each replica keeps its own gradients) -- the averaging strategies of issue #13.
  void set_reducer(GradientSync* reducer) noexcept { reducer_ = reducer; }
  // fp16 loss scaling (train::LossScaler): the last stage multiplies each micro-batch's loss gradient by `scale`
  // before its backward (1: untouched).
  void set_loss_scale(float scale) noexcept { loss_scale_ = scale; }
  // Test hook (ParallelTrainer's TANDEM_TEST_REFORM_LEAVE): called before each gradient receive of train_step.
  void set_test_point(std::function<void()> f) { before_grad_recv_ = std::move(f); }

  int stage() const noexcept { return stage_; }
  int32_t first_layer() const noexcept { return first_; }
  int32_t end_layer() const noexcept { return end_; }

 private:
  float loss_scale_ = 1.0f;
  std::function<void()> before_grad_recv_;
  enum Kind : uint32_t { kActivation = 0, kGradient = 1, kEvalActivation = 2 };
  static uint32_t tag(Kind kind, int64_t micro_batch, size_t index);
  Shape boundary_shape(int32_t producer, int64_t n) const;
  std::vector<Tensor> receive(Kind kind, int from_stage, const std::vector<int32_t>& ids, int64_t n, int64_t mb,
                              TimeSplit& times);
  void send(Kind kind, int to_stage, const std::vector<Tensor>& tensors, const std::vector<int32_t>& ids, int64_t mb,
            size_t max_in_flight);
  void reap_sends(size_t keep);

  nn::Model& model_;
  compute::Backend& be_;
  const int stage_, stages_;
  const int32_t first_, end_;
  comm::Communicator* pipe_;
  GradientSync* reducer_;
  Tracer& tracer_;
  std::vector<int32_t> in_ids_, out_ids_;  // crossing(first_), crossing(end_) (out: logits on the last stage)

  struct InFlight {
    std::vector<Tensor> keep;  // host buffers the send reads
    std::unique_ptr<comm::Work> work;
  };
  std::vector<InFlight> sends_;
};

}  // namespace tandem::engine::parallel
