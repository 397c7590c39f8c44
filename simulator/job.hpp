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
#include "engine/parallel/parallel_config.hpp"
#include "engine/parallel/schedule.hpp"
#include "simulator/compute/compute_model.hpp"
#include "simulator/presets.hpp"

namespace tandem::simulator {

// The runtime's strategies (single, ddp, pipeline, hybrid) and their names.
using Strategy = engine::parallel::Strategy;
using engine::parallel::parse_strategy;
using engine::parallel::strategy_name;

struct DatasetInfo {
  std::string name;
  int64_t samples = 0;
  engine::nn::SampleShape input;
  int64_t classes = 0;
};
// cifar10, cifar100, fashion-mnist, mnist, imagenet; throws listing them for an unknown name.
DatasetInfo find_dataset(const std::string& name);

struct JobSpec {
  std::string model = "mobilenetv2";  // zoo name, JSON model file, or JSON text
  double width_mult = 1.0;            // mobilenetv2
  std::string dataset = "cifar10";    // or empty with samples + input + classes
  int64_t samples = 0;                // 0: the dataset's training set
  std::optional<engine::nn::SampleShape> input;
  int64_t classes = 0;
  int64_t batch = 64;                 // per data-parallel replica
  double epochs = 1;
  Strategy strategy = Strategy::kSingle;
  int32_t dp = 0, pp = 0;             // 0: derived from the strategy and the cluster
  int32_t micro_batches = 1;
  engine::parallel::ScheduleKind schedule = engine::parallel::ScheduleKind::kOneFOneB;
  engine::comm::Algorithm algorithm = engine::comm::Algorithm::kAuto;
  double bucket_mb = 25;              // DDP gradient bucket (MiB)
  bool overlap = true;                // all-reduce buckets during backward
  uint64_t chunk_bytes = 0;           // collective pipelining chunk; 0: the runtime's default
  // DDP gradients on the wire (the runtime's ParallelConfig::compression): fp16/bf16 halve the
  // all-reduced bytes; each bucket is converted on the training thread before its all-reduce and
  // back before the optimizer, as engine/parallel/grad_reducer.cpp does.
  engine::parallel::GradCompression compression = engine::parallel::GradCompression::kNone;
  OptimizerKind optimizer = OptimizerKind::kMomentum;
  std::string profile;                // calibration profile path (replaces the roofline)
  bool profile_network = false;       // use the profile's measured p2p bandwidth/latency as every NIC
  double epoch_time_s = 0;            // > 0: scale compute so one full-speed single-node epoch takes this
  std::optional<CreditMode> credit_mode;      // override for every burstable node
  std::optional<double> initial_credits;      // override for every burstable node
  bool symmetric = true;              // allow symmetric execution of provably identical ranks
  // Where pipeline stages are cut, as the trainer does: by the layer specs' FLOPs (its default), or by
  // the compute model's per-layer times (kMeasured: the profile's measurements, else the roofline),
  // or at explicit boundaries (pp + 1 layer indices, 0 first, the layer count last).
  engine::parallel::PartitionCost partition = engine::parallel::PartitionCost::kFlops;
  std::vector<int32_t> boundaries;
};

// Fills derived fields (dp, pp) for `endpoints` ranks available and checks the job; errors name the
// field ("job.micro_batches: ...").
JobSpec resolve_job(const JobSpec& job, int32_t endpoints);

}  // namespace tandem::simulator

namespace tandem::simulator {
// A job as JSON (a file path or the text itself), keys as the CLI options: {"model": "mobilenetv2",
// "dataset": "cifar10", "samples": 50000, "input": [3, 32, 32], "classes": 10, "batch": 256, "epochs": 10,
// "strategy": "hybrid", "dp": 2, "pp": 2, "micro_batches": 4, "schedule": "1f1b", "algorithm": "ring",
// "bucket_mb": 25, "overlap": true, "optimizer": "momentum", "profile": "p.json", "profile_network": false,
// "epoch_time_s": 252.5, "credit_mode": "standard", "initial_credits": 30, "width_mult": 1.0,
// "chunk_bytes": 0, "partition": "flops", "boundaries": [0, 78, 151], "compression": "fp16"}. Fields absent keep `base`'s values; errors name the field ("job.batch: ...").
JobSpec job_from_json(const nlohmann::json& j, JobSpec base = {}, const std::string& where = "job");
JobSpec parse_job(const std::string& text_or_path, JobSpec base = {});
}  // namespace tandem::simulator
