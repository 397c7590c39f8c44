#pragma once
// A training job to simulate: model, data, batch, strategy and its knobs -- the same meanings as for
// `tandem train`. --batch is per data-parallel replica, as in PyTorch DDP.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/comm/plan.hpp"
#include "engine/nn/layer_spec.hpp"
#include "engine/nn/model_spec.hpp"
#include "engine/optim/optimizer.hpp"
#include "engine/parallel/job.hpp"
#include "engine/parallel/parallel_config.hpp"
#include "engine/parallel/schedule.hpp"
#include "simulator/compute/compute_model.hpp"
#include "simulator/presets.hpp"

namespace tandem::simulator {

// The runtime's strategies (single, ddp, pipeline, hybrid) and their names.
using Strategy = engine::parallel::Strategy;
using engine::parallel::parse_strategy;
using engine::parallel::strategy_name;

// Whose training process the job describes: its runtime allowance (memory a process holds beyond its tensors) and,
// for pytorch-ddp, PyTorch DDP's bucket policy and buffer broadcast.
enum class Framework : int32_t { kTandem = 0, kPytorchDdp = 1 };
const char* framework_name(Framework f) noexcept;  // "tandem", "pytorch-ddp"
Framework parse_framework(const std::string& s);   // kInvalidArgument listing the names

struct DatasetInfo {
  std::string name;
  int64_t samples = 0;
  engine::nn::SampleShape input;
  int64_t classes = 0;
  int64_t test_samples = 0;  // the test set the trainer loads beside the training set (0: none known)
  // Whether a loader holds the sets in memory (charged to every rank). ImageNet is streamed from disk by every real
  // loader, and Tandem's trainer has no ImageNet reader (it trains on synthetic data of ImageNet's shape): no charge.
  bool in_memory = true;
};
// cifar10, cifar100, fashion-mnist, mnist, imagenet; throws listing them for an unknown name.
DatasetInfo find_dataset(const std::string& name);

// What a simulated run needs beyond the compiled job (engine/parallel/job.hpp): the data, how long,
// and how compute and CPU credits are modelled.
struct RunSpec {
  std::string dataset = "cifar10";    // or empty with samples + input + classes
  int64_t samples = 0;                // 0: the dataset's training set
  std::optional<engine::nn::SampleShape> input;  // the samples' shape: the dataset's unless given
  int64_t classes = 0;                // 0: the dataset's
  double epochs = 1;
  std::string profile;                // calibration profile path (replaces the roofline)
  bool profile_network = false;       // use the profile's measured p2p bandwidth/latency as every NIC
  double epoch_time_s = 0;            // > 0: scale compute so one full-speed single-node epoch takes this
  std::optional<CreditMode> credit_mode;      // override for every burstable node
  std::optional<double> initial_credits;      // override for every burstable node
  bool symmetric = true;              // allow symmetric execution of provably identical ranks
  uint64_t seed = 0;                  // the runtime's seed (its default is 0): FedAvg's client draw and shards
  int64_t limit_batches = 0;          // > 0: the runtime's --limit-batches (a FedAvg client's local epoch)
  // whose process (issue #16): its runtime allowance, and for pytorch-ddp PyTorch DDP's buckets -- the first bucket
  // formed (the last layers' gradients) capped at kPytorchFirstBucketMb, the others at bucket_mb
  Framework framework = Framework::kTandem;
  // pytorch-ddp: DDP's broadcast_buffers (its default True): rank 0's module buffers are broadcast before every
  // forward pass (simulator/broadcast.hpp); job JSON "broadcast_buffers"
  bool broadcast_buffers = true;
  // A framework that launches its collectives from a background loop in cycles of this many milliseconds (Horovod:
  // HOROVOD_CYCLE_TIME, 5 by default): a ready bucket's all-reduce waits for the next cycle (StepSetup::comm_cycle_s);
  // job JSON "comm_cycle_ms"; 0 (default): none, as Tandem's and PyTorch DDP's
  double comm_cycle_ms = 0;
  // The loop's coordination per cycle in milliseconds (Horovod's NEGOTIATE_ALLREDUCE in its timeline: rank 0 gathers
  // the ranks' ready lists and broadcasts the plan): a cycle's all-reduces start this long after its tick
  // (StepSetup::comm_negotiation_s); job JSON "comm_negotiation_ms", needs comm_cycle_ms > 0; 0 (default): none
  double comm_negotiation_ms = 0;
  // A framework whose all-reduces run from host memory (Caffe2's Gloo CUDA all-reduces, host workspace): each bucket
  // is copied to the host before its all-reduce and back after it at this rate in Gbit/s, as the cluster's link
  // rates (StepSetup::host_staging_bytes_per_s); job JSON "host_staging_gbps"; 0 (default): none
  double host_staging_gbps = 0;
  // The bytes of data sets each rank holds (a trainer's loaded train + test sets, engine::data::Dataset::
  // resident_bytes); unset: the dataset's training and test sets as the loader stores them.
  std::optional<double> data_bytes;
};
// PyTorch DDP's first bucket (torch.distributed._DEFAULT_FIRST_BUCKET_BYTES, 1 MiB; its buckets are rebuilt after the
// first iteration in gradient-ready order with this cap first, then bucket_cap_mb).
constexpr double kPytorchFirstBucketMb = 1.0;

// A job as a description (the CLI's flags, a job JSON, the C ABI's fields): compiled by the simulator into the
// same CompiledJob the trainer runs (engine::parallel::compile_job), never interpreted on its own.
struct JobSpec : RunSpec {
  std::string model = "mobilenetv2";  // a zoo model name (engine/nn/zoo.hpp); never a path or JSON text
  std::optional<engine::nn::ModelSpec> model_spec;  // a typed model instead of the zoo name (C ABI: a model handle)
  double width_mult = 1.0;            // mobilenetv2
  int64_t batch = 64;                 // per data-parallel replica
  Strategy strategy = Strategy::kSingle;
  int32_t dp = 0, pp = 0;             // 0: derived from the strategy and the cluster
  int32_t micro_batches = 1;
  int32_t accumulation = 1;           // batches per optimizer step (one all-reduce)
  engine::parallel::ScheduleKind schedule = engine::parallel::ScheduleKind::kOneFOneB;
  engine::comm::Algorithm algorithm = engine::comm::Algorithm::kAuto;
  double bucket_mb = 25;              // DDP gradient bucket (MiB)
  // The bucket policy beside bucket_mb (engine/parallel/parallel_config.hpp): the first bucket's cap (unset: the
  // framework's, 1 MiB for pytorch-ddp, none for tandem), or the explicit sizes of the first buckets in ready order.
  std::optional<double> first_bucket_mb;
  std::vector<double> bucket_sizes_mb;
  bool overlap = true;                // all-reduce buckets during backward
  uint64_t chunk_bytes = 0;           // collective pipelining chunk; 0: the runtime's default
  // DDP gradients on the wire (the runtime's ParallelConfig::compression): fp16/bf16 halve the
  // all-reduced bytes; each bucket is converted on the training thread before its all-reduce and
  // back before the optimizer, as engine/parallel/grad_reducer.cpp does.
  engine::parallel::GradCompression compression = engine::parallel::GradCompression::kNone;
  OptimizerKind optimizer = OptimizerKind::kMomentum;
  // Where pipeline stages are cut, as the trainer does: by the layer specs' FLOPs (its default), or by
  // the compute model's per-layer times (kMeasured: the profile's measurements, else the roofline),
  // or at explicit boundaries (pp + 1 layer indices, 0 first, the layer count last).
  engine::parallel::PartitionCost partition = engine::parallel::PartitionCost::kFlops;
  std::vector<int32_t> boundaries;
  // The strategies of issue #13 (engine/parallel/parallel_config.hpp, the same meanings and defaults): ps,
  // ps-async and ssp (and easgd with easgd_async) take `servers` ranks, the last ones, beside dp workers.
  int32_t servers = 1;
  int32_t server_replicas = 0;    // ps, ps-async, ssp: backups of each shard (replicas and acknowledgements timed)
  // issue #17, the trainer's --elastic, --max-ranks and --join-poll-steps: an elastic ps, ps-async or ssp job with a
  // bound to grow to checks for joiners every join_poll_steps steps (SyncProgram::join_check_every; timed)
  bool elastic = false;
  int32_t max_ranks = 0;
  int32_t join_poll_steps = 1;
  int32_t staleness = 2;          // ssp
  // ps-async: each push's rate scaled by its staleness (update math only: not timed; the job compiler checks it)
  engine::parallel::StalenessLr staleness_lr = engine::parallel::StalenessLr::kNone;
  int32_t tau = 4;                // easgd
  double alpha = 0;               // easgd (update math only: not timed)
  bool easgd_async = false;
  int32_t clients = 0;            // fedavg: 0 one per worker
  double dirichlet_alpha = 0;     // fedavg: label skew, not timed
  double client_fraction = 1.0;   // fedavg
  int32_t local_epochs = 1;       // fedavg
  double round_deadline_s = 0;    // fedavg: 0 none
  int32_t average_every = 8;      // localsgd: H
  int32_t warmup_steps = 0;       // localsgd: DDP steps first
  // issue #16: precision, recomputation, sharding (engine/parallel/job.hpp)
  engine::parallel::MemoryConfig memory;
  // the trainer's loader: batches its thread assembles ahead (tandem train --prefetch; engine::parallel::Job::prefetch,
  // charged per rank as StageMemory::loader_bytes); job JSON "prefetch"
  int32_t prefetch = 2;
};

// The optimizer a simulated job names, as the trainer configures it (momentum: SGD with momentum 0.9), and back.
engine::optim::OptimizerConfig optimizer_config(OptimizerKind k);
OptimizerKind optimizer_kind(const engine::optim::OptimizerConfig& c) noexcept;

// The ranks a job uses on a cluster of `endpoints` devices: dp x pp where both are given, else as many as the
// strategy can take (a hybrid job's given factor times the most replicas or stages that fit). Checks the
// description's own fields first; errors name the field ("job.micro_batches: ...").
int32_t ranks_for(const JobSpec& job, int32_t endpoints);

// The description as the engine's job (model built: the typed spec, else the zoo model for the data's shape).
engine::parallel::Job engine_job(const JobSpec& job, const engine::nn::SampleShape& input, int64_t classes);

}  // namespace tandem::simulator

namespace tandem::simulator {
// A job as JSON, keys as the CLI options (the model: a zoo name, a spec object, or "model_file"): {"model": "mobilenetv2",
// "dataset": "cifar10", "samples": 50000, "input": [3, 32, 32], "classes": 10, "batch": 256, "epochs": 10,
// "strategy": "hybrid", "dp": 2, "pp": 2, "micro_batches": 4, "schedule": "1f1b", "algorithm": "ring",
// "bucket_mb": 25, "overlap": true, "optimizer": "momentum", "profile": "p.json", "profile_network": false,
// "epoch_time_s": 252.5, "credit_mode": "standard", "initial_credits": 30, "width_mult": 1.0,
// "chunk_bytes": 0, "partition": "flops", "boundaries": [0, 78, 151], "compression": "fp16", "accumulation": 1,
// "servers": 1, "server_replicas": 0, "elastic": false, "max_ranks": 0, "join_poll_steps": 1, "staleness": 2,
// "staleness_lr": "none", "tau": 4, "alpha": 0, "easgd_async": false, "clients": 0, "dirichlet_alpha": 0,
// "client_fraction": 1, "local_epochs": 1, "round_deadline_s": 0, "average_every": 8, "warmup_steps": 0,
// "precision": "bf16", "recompute": "stage" (or a layer count k: every k-th output kept), "zero": 1,
// "framework": "pytorch-ddp"}. Fields absent keep `base`'s values; errors name the field ("job.batch: ...").
JobSpec job_from_json(const nlohmann::json& j, JobSpec base = {}, const std::string& where = "job");
JobSpec parse_job_text(const std::string& text, JobSpec base = {});  // JSON text
JobSpec load_job_file(const std::string& path, JobSpec base = {});   // a JSON file; unreadable: kIo naming it
}  // namespace tandem::simulator
