#pragma once
// Memory guard: before a trainer allocates its optimizer state and runs its first step, estimate the
// process's peak memory and compare it with what the host allows, so that a job that cannot fit fails
// with Tandem's own out-of-memory error naming both figures -- instead of being killed by the kernel
// (exit 137, no message) somewhere in its first step.
//
// The estimate, for the layers [first, end) this rank trains (the whole model, or a pipeline stage):
//   resident now  : what the process already holds (libraries, data sets, whatever tensors exist), from
//                   /proc/self/status VmRSS;
//   parameters    : the stage's parameters and batch-norm statistics (f32), and
//   gradients     : as many gradients -- both counted from the model's shapes while the Model has not allocated
//                   them yet (it does on first use, i.e. in the first step), else part of "resident now";
//   optimizer     : state per parameter of the stage (momentum: 4 bytes, Adam: 8; optim::state_bytes_per_param),
//                   unless the caller says it is already allocated;
//   activations   : nn::kCpuActivationOverhead (1.25: what backward and the allocator hold on top) x the stage's
//                   activations as the cpu backend stores them (activation_bytes + layout_bytes: the outputs with
//                   storage of their own of the samples in flight and the stage's input, channels padded, max-pool
//                   workspaces added);
//   workspace     : backward scratch of the largest layer (scratch_bytes), the loaders' batches (the prefetched
//                   ones and the evaluation's: loader_bytes, data::loader_bytes, engine/data/loader.hpp), the
//                   data-parallel bucket buffers (bucket_bytes), the backend's JIT code and caches the first step
//                   creates (a measured constant, see the .cpp), and on the cpu backend the convolutions' reordered
//                   weights (conv_copy_bytes) and the largest one's weight-gradient scratch (conv_scratch_bytes).
// Where each term is derived: the footprint's byte figures are the job compiler's (engine/parallel/job.hpp
// StageMemory, from the shapes through engine/nn/cpu_storage.hpp, which also holds the measured factors); a parallel
// rank's footprint copies its stage's StageMemory, and layer_footprint() gives the same figures for the single-process
// trainer, which cannot call the job compiler (engine/parallel depends on engine/train); tests/parallel holds them equal
// to compile_job's. The simulator charges the same StageMemory terms (simulator/simulate.hpp).
// Only the first-step constant and the process's measured size are the guard's own; the fixed
// runtime allowance of the simulator is replaced by that measured size.
//
// The limit, the smallest of:
//   TANDEM_MEMORY_LIMIT_BYTES (an integer, bytes; for tests and for operators who know better);
//   the memory cgroup's limit: v1 memory.limit_in_bytes, v2 memory.max, of the process's own cgroup
//   (/proc/self/cgroup) and its ancestors up to the mount's root (a parent's limit binds the child); where
//   this mount namespace lacks the cgroup file systems (`ip netns exec` remounts /sys), through the view of
//   the nearest ancestor process that has them (/proc/<pid>/root);
//   MemAvailable (/proc/meminfo) plus what the process already holds.
// TANDEM_MEMORY_GUARD=0 turns the check off (the estimate is then only logged at debug level).
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "engine/nn/model.hpp"
#include "engine/optim/optimizer.hpp"

namespace tandem::engine::train {

// What one rank trains, for the estimate.
struct TrainingFootprint {
  size_t first_layer = 0, end_layer = 0;  // end 0: the whole model
  int64_t samples_in_flight = 0;          // whose activations are alive at once (batch; pipeline: per schedule)
  int64_t micro_batch = 0;                // the largest micro-batch
  double loader_bytes = 0;                // the loaders' batches beside the trained one (StageMemory::loader_bytes)
  double optimizer_state_bytes_per_param = 0;  // of state not allocated yet (0: none, or already resident)
  double bucket_bytes = 0;                // data-parallel bucket buffers (StageMemory::bucket_bytes; 0 without DP)
  // The stage's activations and the cpu backend's figures: the fields of the same names of the job compiler's
  // StageMemory (engine/parallel/job.hpp), f32 and nothing recomputed, as the runtime trains.
  double activation_bytes = 0, layout_bytes = 0, scratch_bytes = 0, conv_scratch_bytes = 0, conv_copy_bytes = 0;
  // The primitives of the epoch's short last batch (StageMemory::short_batch_bytes; the job compiler's alone: 0 in
  // single_footprint, which cannot call it).
  double short_batch_bytes = 0;
};

struct MemoryEstimate {
  double resident_bytes = 0;
  double param_bytes = 0;  // parameters and statistics not allocated yet (0 once resident)
  double grad_bytes = 0;   // their gradients, likewise
  double optimizer_bytes = 0;
  double activation_bytes = 0;
  double workspace_bytes = 0;
  int64_t samples_in_flight = 0;
  double total() const noexcept {
    return resident_bytes + param_bytes + grad_bytes + optimizer_bytes + activation_bytes + workspace_bytes;
  }
  // "3.05 GiB (resident now 212 MiB, parameters 1.00 GiB, gradients 1.00 GiB, optimizer state 1.00 GiB,
  // activations of 128 samples in flight 24.0 MiB, workspace 40 MiB)"; "parameters and gradients resident" once
  // the model holds them.
  std::string describe() const;
};

struct MemoryLimit {
  double bytes = 0;
  std::string source;  // "cgroup v1 memory.limit_in_bytes of /sys/fs/cgroup/memory/...", "MemAvailable ...", ...
};

// Layers [first, end) of `spec` with `samples_in_flight` samples' activations alive and micro-batches of
// `micro_batch` (0: samples_in_flight): the byte figures the job compiler's stage_memory() gives such a stage of an
// f32 job (the loader, optimizer and bucket fields left at their defaults).
TrainingFootprint layer_footprint(const nn::ModelSpec& spec, size_t first, size_t end, int64_t samples_in_flight,
                                  int64_t micro_batch = 0);
// What the single-process trainer holds: the whole model, `batch_size` samples in flight, optimizer state of
// `optimizer_state_bytes_per_param` still to allocate. (A pipeline stage's or a data-parallel rank's footprint
// comes from the job compiler's StageMemory: engine/parallel/job.hpp.)
TrainingFootprint single_footprint(const nn::ModelSpec& spec, int64_t batch_size, int prefetch,
                                   double optimizer_state_bytes_per_param = 0);

// The estimate for `f` on `model` (reads /proc/self/status for the resident size).
MemoryEstimate estimate_training_memory(const nn::Model& model, const TrainingFootprint& f);

// The binding limit, or nullopt when nothing limits the process (no cgroup limit, no /proc/meminfo).
// Throws kInvalidArgument for a malformed TANDEM_MEMORY_LIMIT_BYTES.
std::optional<MemoryLimit> memory_limit();

// Throws Error{kOutOfMemory} when the estimate exceeds the limit: "<who>: the job needs an estimated
// <estimate breakdown> but <limit> allows <n>: ...what to do...". Returns the estimate otherwise.
MemoryEstimate check_training_memory(const nn::Model& model, const TrainingFootprint& f, std::string_view who);

// "1.25 GiB", "840 MiB", "12 KiB".
std::string format_bytes(double bytes);

}  // namespace tandem::engine::train
