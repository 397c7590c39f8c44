#pragma once
// Predicts a training job on a cluster: the job is compiled by the trainer's own job compiler
// (engine/parallel/job.hpp: stage cut, pipeline plan, buckets and their all-reduce requests, memory) and
// that compiled job is executed for one step on the modelled cluster, compute priced from the layer specs. Burstable CPUs are followed over the whole run: the
// run is split into phases at the instants a node's CPU credits run out, and each phase's step is
// simulated again with the throttled nodes slowed to their baseline share.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "simulator/cluster.hpp"
#include "simulator/compiled_plan.hpp"
#include "simulator/job.hpp"
#include "simulator/step.hpp"

namespace tandem::simulator {

// Memory a rank's runtime holds beyond its tensors, when neither the node (cluster JSON runtime_mib)
// nor the calibration profile (runtime_rss_bytes, CPU nodes) gives it. CPU: a PyTorch-class process
// with oneDNN (libraries, thread pools, allocator slack); Tandem's own measured here is lower, which
// is why a profile's figure is preferred. GPU: CUDA context and cuDNN/cuBLAS workspaces.
constexpr double kDefaultCpuRuntimeBytes = 150.0 * 1048576;
constexpr double kDefaultGpuRuntimeBytes = 600.0 * 1048576;
// --framework pytorch-ddp on a CPU node: a PyTorch process's resident size besides its tensors (libtorch, oneDNN,
// gloo, the Python interpreter), ~340 MiB as measured for issue #16; a Tandem profile's figure does not describe it.
constexpr double kPytorchCpuRuntimeBytes = 340.0 * 1048576;
// Tandem on a CPU node: a rank's activations at its step's peak are what the job compiler derives for its stage on
// the cpu backend (engine/parallel/job.hpp StageMemory::cpu_activation_peak_bytes: nn::kCpuActivationOverhead, 1.25,
// over the activations as that backend stores them -- channels padded, max-pool workspaces --, plus backward's scratch
// of the largest layer and the largest convolution's weight-gradient scratch), the same terms the runtime's memory
// guard charges; its runtime holds the stage's reordered convolution weights (StageMemory::conv_copy_bytes) beside the
// allowance. Without a profile of the job's model that derived peak is the figure. PyTorch's CPU allocator returns
// freed blocks to malloc and its kernels are not Tandem's: pytorch-ddp ranks (and GPU ranks) are charged the counted
// activations, StageMemory::activation_bytes.
// The factor that derived peak is multiplied by, for a rank whose micro-batch is `micro_batch` samples (< 1: the
// profile's batch): where the profile was measured for this model, the peak it gives for that many samples
// (activation_peak_at: its activation_peak_curve, else activation_peak_bytes in proportion) over the derived peak of one
// process of the whole model at that micro-batch (the job compiler's, f32) -- else 1. The measurement thus corrects
// the derived figure's scale while the job compiler says how it divides: a pipeline stage is charged its own
// activations, scratch and largest convolution, each micro-batch in flight its activations, the batch-independent
// scratch once. For one process of the whole model at the profile's batch the rank's peak is the measured one. The
// profile must name the same model (and, where it gives one, the same input shape); an old profile without either
// field, or one measured for another model, gives 1.
double tandem_cpu_activation_peak(const engine::nn::ModelSpec& model, const std::optional<CalibrationProfile>& profile,
                                  int64_t micro_batch = 0);
// What a Tandem rank on a CPU node keeps resident for the backend's primitives beyond its runtime allowance (issue
// #16), for a rank holding `stage` of `cj`:
// - an epoch that ends with a short batch builds that batch's shape too: StageMemory::short_batch_bytes (the job
//   compiler's derived figure), scaled, where the profile was measured for the job's model and has a
//   primitive_bytes_curve, by the curve's figure at the short micro-batch over the derived one of the whole model there;
// - where the allowance is the profile's runtime_rss_bytes (`runtime_measured`), which holds the primitives of the
//   profile's batch, the curve's difference between the job's micro-batch and that batch (0 without two points, and
//   where the curve falls towards the larger batch: a larger shape's primitives never take less).
double tandem_cpu_primitive_bytes(const engine::parallel::CompiledJob& cj, const engine::parallel::StageMemory& stage,
                                  const std::optional<CalibrationProfile>& profile, bool runtime_measured);
// Seconds per gradient element to convert f32 to fp16/bf16 and back on the training thread, when the
// profile does not give them (fp16_convert_s / bf16_convert_s): the runtime's scalar conversion loops
// measured on this project's 2-vCPU Xeon (AVX-512) VM, 11 M elements, best of three. A pass never
// runs faster than the node's memory bandwidth allows (6 bytes per element).
constexpr double kDefaultFp16ToS = 1.7e-9, kDefaultFp16BackS = 2.3e-9;
constexpr double kDefaultBf16ToS = 1.1e-9, kDefaultBf16BackS = 0.7e-9;

struct NodeReport {
  std::string name, preset;
  int32_t ranks = 0;                 // ranks of the job on this node (0: unused, not billed)
  double memory_bytes = 0;           // need: host memory (CPU node) or the largest per-GPU need
  double memory_capacity_bytes = 0;  // usable: host memory less the OS reserve, or GPU memory
  double runtime_bytes = 0;          // per rank, included in memory_bytes (node, profile or default)
  bool fits = true;
  bool swapping = false;             // over capacity but within swap: slowed by swap_slowdown
  std::optional<double> throttle_start_s;  // standard-mode credits ran out at this time
  double credits_start = 0, credits_end = 0;
  double surplus_usd = 0;            // unlimited-mode surplus credits billed
  double cpu_utilization = 0;        // of the first phase
};

// What one rank holds, by kind: the rank with the largest need on the node that fits worst (the largest need over
// capacity). The parts add up to total.
struct MemoryBreakdown {
  int32_t node = -1, rank = -1;
  double param_bytes = 0, grad_bytes = 0, optimizer_bytes = 0, activation_bytes = 0, runtime_bytes = 0, buffer_bytes = 0;
  double node_need_bytes = 0, node_capacity_bytes = 0;  // the node's: all its ranks (CPU) or the largest GPU's
  double data_bytes = 0;  // the data sets the rank holds (Tandem, CPU node; simulate.cpp rank_data_bytes)
  double loader_bytes = 0;  // its loader's batches assembled ahead (Tandem, CPU node; StageMemory::loader_bytes)
  double total() const noexcept {
    return param_bytes + grad_bytes + optimizer_bytes + activation_bytes + runtime_bytes + buffer_bytes + data_bytes +
           loader_bytes;
  }
};

struct PhaseReport {
  double start_s = 0, duration_s = 0, steps = 0, step_s = 0;
  std::vector<int32_t> throttled_nodes;
};

struct SimResult {
  std::string cluster, model, dataset, strategy, schedule, algorithm, compute_source, optimizer;
  std::string compression = "none";  // gradients on the wire (data-parallel jobs)
  int32_t dp = 1, pp = 1, micro_batches = 1, ranks = 1, nodes_used = 1;
  int64_t batch = 0, global_batch = 0, samples = 0, steps_per_epoch = 0;
  double epochs = 0, total_steps = 0;
  double step_time_s = 0;            // full-speed (first phase) step
  double epoch_time_s = 0;           // total / epochs
  double total_time_s = 0;
  double images_per_sec = 0;
  double speedup = 0, efficiency = 0, baseline_total_time_s = 0;
  // time split over the run, averaged over ranks; they add up to total_time_s
  double compute_s = 0, comm_exposed_s = 0, bubble_s = 0, throttled_s = 0, idle_s = 0;
  double memory_per_node_bytes = 0;  // the largest need of any used node
  MemoryBreakdown memory;            // where that need goes (the worst node's largest rank)
  // When the job does not fit: the smallest change that fits ("fits with --recompute stage", "fits with batch <= 96"),
  // or why none was found; "" when it fits. Filled by simulate(cluster, JobSpec) (SimOptions::advise).
  std::string memory_advice;
  double allreduce_bytes_per_rank = 0;  // bytes a rank sends in its stage's gradient all-reduces per step (mean)
  bool fits = true;
  double cost_usd = 0, surplus_usd = 0;
  double compute_scale = 1;
  std::vector<int32_t> stage_boundaries;
  std::vector<NodeReport> nodes;
  std::vector<PhaseReport> phases;
  std::vector<RankBreakdown> rank_step;  // first phase, per rank
  uint64_t events = 0, flows = 0;
  bool symmetric_used = false;
  double wall_s = 0;                 // simulator's own run time
  std::vector<TraceSpan> trace;      // first phase's step, when asked for
  std::shared_ptr<const engine::parallel::CompiledJob> job;  // the compiled job that was timed
  std::string bottleneck;    // what the run spends the most time on ("pipeline bubble (...) (41% of the run)")
  // What holds the used nodes' CPUs below full speed (throttled_s): "CPU credits", "a CFS quota of 0.5 core",
  // "4 ranks time-sliced on 2 vCPUs", joined by ", "; empty when nothing does.
  std::string cpu_slowdown;
  std::string scaling_note;  // why the speedup is super-linear, when it is (credits, memory); else empty

  // ---- the strategies of issue #13 (strategy.hpp) ----
  std::string exchange = "bucket-allreduce";  // the compiled job's SyncProgram exchange
  int32_t workers = 1, servers = 0;
  int32_t window_steps = 1;         // steps (fedavg: rounds) simulated per phase, figures are their mean
  double staleness_wait_s = 0;      // ssp: part of the time split (mean over ranks, over the run)
  // The NIC that carries the most bytes per step (fedavg: per round), either direction: pushes and pulls,
  // exchanges, uploads; for all-reduces the mean bytes a rank sends (a ring's are equal on every rank).
  double busiest_nic_bytes = 0;
  int32_t busiest_nic_rank = -1;
  std::string busiest_nic;          // "rank 3 (server 0): 1.2 MB in per step (incast of 3 workers)"
  // fedavg: the simulated rounds, the mean round and what a round counts
  std::vector<RoundReport> rounds;
  double round_time_s = 0, clients_sampled = 0, clients_counted = 0, clients_dropped = 0;
  std::string note;  // what the figures do not cover (statistical efficiency; Dirichlet skew for timing)

  nlohmann::json to_json() const;
};

struct SimOptions {
  bool baseline = true;  // also simulate one device of the first node's kind for speedup/efficiency
  bool trace = false;    // record the first phase's step as spans
  bool advise = true;    // a job description that does not fit: search the smallest change that fits (memory_advice)
};

// The smallest change to `job` that makes it fit on `cluster` (memory only, nothing is timed): recomputation,
// mixed precision, ZeRO sharding, then combinations, then the largest batch that fits with the job's options.
// "" when the job fits as it is.
std::string memory_advice(const ClusterSpec& cluster, const JobSpec& job);

// Shares compiled plans between the simulations of a sweep or a plan search.
class Simulation {
 public:
  // The description compiled by the trainer's own compiler (engine::parallel::compile_job) for the ranks it
  // takes on `cluster` (ranks_for); a measured cut balances the compute model's per-layer times.
  engine::parallel::CompiledJob compile(const ClusterSpec& cluster, const JobSpec& job);
  SimResult run(const ClusterSpec& cluster, const JobSpec& job, const SimOptions& options = {});
  // Times a compiled job -- a trainer's own (ParallelTrainer::job()) for a prediction -- rank r on the
  // cluster's endpoint r.
  SimResult run(const ClusterSpec& cluster, const engine::parallel::CompiledJob& job, const RunSpec& run,
                const SimOptions& options = {});
  // The job on one device of the cluster's first node kind (strategy single, the whole step batch at once): the
  // reference for speedup and efficiency.
  SimResult baseline(const ClusterSpec& cluster, const JobSpec& job);
  SimResult baseline(const ClusterSpec& cluster, const engine::parallel::CompiledJob& job, const RunSpec& run);
  PlanCache& plans() { return plans_; }

 private:
  PlanCache plans_;
};

SimResult simulate(const ClusterSpec& cluster, const JobSpec& job, const SimOptions& options = {});
// The largest part of a run's time split, or memory when it does not fit.
std::string name_bottleneck(const SimResult& r);
// Why `r` scales super-linearly against `one` (its one-device baseline), or "" when it does not.
std::string explain_scaling(const SimResult& r, const SimResult& one);
// `r`'s speedup against `one`: per trained sample. Most strategies' epoch trains the whole set, as the baseline's
// does, so this is the ratio of total times; a fedavg round (its epoch) trains only the sampled clients' data.
double speedup_against(const SimResult& r, const SimResult& one);
SimResult simulate(const ClusterSpec& cluster, const engine::parallel::CompiledJob& job, const RunSpec& run,
                   const SimOptions& options = {});

}  // namespace tandem::simulator
