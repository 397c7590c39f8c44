#pragma once
// Pipeline schedules as plans: plain data listing, for every stage, the operations it performs in
// one training step -- forward and backward of micro-batches, point-to-point sends and receives of
// activations and their gradients, all-reduces of the stage's gradient buckets over its
// data-parallel group, and the optimizer step. The runtime's pipeline executor runs these plans on
// real transports and backends; the simulator runs the very same plans on a modelled cluster.
//
// Execution rules (shared by both executors):
//   - a stage runs its ops in list order;
//   - kSend* ops are non-blocking (the data leaves as soon as it is produced);
//   - kRecv* ops block until the matching send has arrived; the k-th send from stage a to stage b of
//     a given kind matches the k-th receive of that kind on b from a (micro-batch indices agree);
//   - kAllreduceBucket(b) is non-blocking and may be issued as soon as bucket b's gradients are final,
//     i.e. once the stage's last kBackward op has gone past the bucket's first layer (backward runs from
//     the stage's last layer to its first). All-reduces of one stage run one at a time in bucket order;
//   - kOptimizerStep waits for every all-reduce of the stage, then updates its parameters.
#include <cstdint>
#include <string>
#include <vector>

namespace tandem::engine::parallel {

enum class ScheduleKind : uint8_t {
  kGPipe = 0,     // all forwards, then all backwards (in reverse micro-batch order)
  kOneFOneB = 1,  // warm-up forwards, then alternate one forward / one backward, then cool-down
};
const char* schedule_name(ScheduleKind k) noexcept;  // "gpipe", "1f1b"
ScheduleKind parse_schedule(const std::string& s);   // throws kInvalidArgument naming the valid values

enum class StageOpKind : uint8_t {
  kForward = 0,
  kBackward = 1,
  kSendActivation = 2,  // to stage + 1
  kRecvActivation = 3,  // from stage - 1
  kSendGradient = 4,    // to stage - 1
  kRecvGradient = 5,    // from stage + 1
  kAllreduceBucket = 6,
  kOptimizerStep = 7,
};
const char* stage_op_name(StageOpKind k) noexcept;

struct StageOp {
  StageOpKind kind = StageOpKind::kForward;
  int32_t micro_batch = -1;  // forward/backward/send/recv
  int32_t peer_stage = -1;   // send/recv
  int32_t bucket = -1;       // kAllreduceBucket
};

// A contiguous range of layers whose gradients are all-reduced together. Buckets are formed from the
// stage's last layer backwards (the order backward produces gradients), as PyTorch DDP does.
struct GradientBucket {
  int32_t first_layer = 0;  // global layer indices [first_layer, end_layer)
  int32_t end_layer = 0;
  uint64_t bytes = 0;
};

struct StagePlan {
  int32_t stage = 0;
  int32_t first_layer = 0;  // the stage owns layers [first_layer, end_layer)
  int32_t end_layer = 0;
  std::vector<StageOp> ops;
  std::vector<GradientBucket> buckets;  // empty without data parallelism
  int32_t last_backward_op = -1;        // index in ops of the final kBackward (gradients final after it)
};

struct PipelinePlan {
  ScheduleKind kind = ScheduleKind::kOneFOneB;
  int32_t stages = 1;
  int32_t micro_batches = 1;
  std::vector<StagePlan> stage_plans;
  std::string describe() const;  // one line: schedule, stages, micro-batches, ops, buckets
};

struct ScheduleRequest {
  ScheduleKind kind = ScheduleKind::kOneFOneB;
  int32_t micro_batches = 1;
  // Stage boundaries: stage s owns layers [boundaries[s], boundaries[s + 1]); S + 1 entries,
  // strictly increasing (see partition_layers).
  std::vector<int32_t> boundaries;
  // Gradient bytes of every layer of the model (only needed with data_parallel).
  std::vector<uint64_t> layer_grad_bytes;
  uint64_t bucket_bytes = 25ull << 20;  // PyTorch DDP's default bucket_cap_mb = 25
  // The caps of the first buckets formed, in gradient-ready order (bucket k closes at >= bucket_caps[k] bytes); the
  // buckets after them close at bucket_bytes. PyTorch DDP: {1 MiB}. Empty: every bucket at bucket_bytes.
  std::vector<uint64_t> bucket_caps;
  bool data_parallel = false;           // add all-reduces of gradient buckets before the optimizer step
};

// Builds the plan of every stage. Throws kInvalidArgument for bad requests (micro-batches < 1,
// boundaries not increasing, gradient sizes missing, ...).
PipelinePlan make_pipeline_plan(const ScheduleRequest& request);

// Checks a plan: every stage forwards and backwards each micro-batch exactly once (forward first),
// sends and receives pair up, and running the stages with unit-time ops completes (no stage waits
// forever). Throws kInternal describing the first flaw.
void validate_pipeline_plan(const PipelinePlan& plan);

// Splits `cost` (one entry per layer, >= 0) into `stages` non-empty contiguous ranges minimising the
// largest range's cost (exact, by dynamic programming); returns the S + 1 boundaries. Among optimal
// cuts the one that puts cuts as early as possible is returned, so results are deterministic.
std::vector<int32_t> partition_layers(const std::vector<double>& cost, int32_t stages);

// Reverse-order buckets over layers [first, end): the k-th bucket formed closes once it holds >= caps[k] bytes, every
// bucket after the caps at >= bucket_bytes. Layers without gradients join the bucket in progress; a stage without
// gradients has no bucket. This is PyTorch DDP's rule (Reducer::compute_bucket_assignment_by_size over the
// gradients in ready order, limits {first bucket, bucket_cap}) at layer granularity: PyTorch cuts between a layer's
// tensors (its bias is ready before its weight) where the bias alone reaches the cap. Caps equal to the bytes of
// another framework's buckets (DDP's logged bucket sizes) rebuild exactly those buckets where they end at layers.
std::vector<GradientBucket> make_buckets(int32_t first, int32_t end, const std::vector<uint64_t>& layer_grad_bytes,
                                         uint64_t bucket_bytes, const std::vector<uint64_t>& caps = {});

// Sizes of `micro_batches` micro-batches of `batch` samples: as equal as possible, larger ones first.
std::vector<int64_t> micro_batch_sizes(int64_t batch, int32_t micro_batches);

}  // namespace tandem::engine::parallel
