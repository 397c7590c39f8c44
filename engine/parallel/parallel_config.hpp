#pragma once
// How a job is spread over ranks: the strategy (single, DDP, pipeline, hybrid DP x PP), the grid it
// implies, micro-batches, schedule, gradient buckets and their compression -- and the checks that
// turn a configuration that cannot work into a clear error on every rank before any work starts.
//
// The grid: world = dp * pp ranks; rank r holds pipeline stage r % pp of data-parallel replica
// r / pp. Consecutive ranks form one pipeline (point-to-point traffic stays on a host when ranks
// are placed host by host); the ranks holding one stage form its data-parallel group.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/parallel/schedule.hpp"

namespace tandem::engine::parallel {

enum class Strategy : int32_t { kSingle = 0, kDdp = 1, kPipeline = 2, kHybrid = 3 };
const char* strategy_name(Strategy s) noexcept;    // "single", "ddp", "pipeline", "hybrid"
Strategy parse_strategy(std::string_view s);       // kInvalidArgument listing the valid names

// Gradients on the wire: f32, or halved to f16 / bf16 (converted before the all-reduce and back
// after; the sum is taken in the compressed type).
enum class GradCompression : int32_t { kNone = 0, kF16 = 1, kBF16 = 2 };
const char* compression_name(GradCompression c) noexcept;  // "none", "fp16", "bf16"
GradCompression parse_compression(std::string_view s);      // "none", "fp16"/"f16", "bf16"

// Cost per layer used to cut the model into balanced stages.
enum class PartitionCost : int32_t {
  kFlops = 0,     // forward + backward FLOPs of the layer specs (the same on every machine)
  kMeasured = 1,  // forward + backward time of each layer measured on rank 0, broadcast to all
};
PartitionCost parse_partition_cost(std::string_view s);  // "flops", "measured"

struct ParallelConfig {
  Strategy strategy = Strategy::kSingle;
  int dp = 0;                 // 0: derived from the strategy and the world size
  int pp = 0;                 // 0: derived likewise
  int micro_batches = 1;      // per optimizer step and replica (pipeline: M)
  ScheduleKind schedule = ScheduleKind::kOneFOneB;
  double bucket_mb = 25.0;    // DDP gradient bucket size in MiB (PyTorch's default)
  GradCompression compression = GradCompression::kNone;
  int accumulation = 1;       // batches whose gradients are summed before one all-reduce and step
  PartitionCost partition = PartitionCost::kFlops;
  std::vector<int32_t> boundaries;  // explicit stage cut (S + 1 entries) instead of the partitioner
  bool trace = false;         // record spans for a Chrome trace
};

struct Grid {
  int world = 1, rank = 0;
  int dp = 1, pp = 1;
  int stage = 0;    // rank % pp
  int dp_rank = 0;  // rank / pp
  int rank_of(int dp_index, int stage_index) const noexcept { return dp_index * pp + stage_index; }
};

// Fills dp/pp from the strategy and world size and checks everything that can be checked locally:
// world != dp * pp (or not divisible by the one given), a strategy that contradicts dp/pp, more
// stages than layers, more micro-batches than samples in a batch, bad bucket size or accumulation.
// Throws kInvalidArgument; the message says what was given and what would work. The checks depend
// only on their arguments, so every rank given the same command line fails the same way.
Grid resolve_grid(ParallelConfig& config, int world, int rank, int64_t num_layers, int64_t batch_size);

// The config as a short line for logs: "hybrid dp=2 pp=2 micro_batches=4 schedule=1f1b ...".
std::string describe(const ParallelConfig& config);

}  // namespace tandem::engine::parallel
