#pragma once
// Checkpoint files: a header (magic "TNDMCKPT", format version, record count) and named records (a JSON metadata
// record and f32 tensors), each with its byte length and CRC32. Written to "<path>.tmp", fsync'd, renamed over
// <path> and the directory fsync'd, so a crash leaves either the old or the new file. Loading checks everything and
// refuses a corrupted, truncated or foreign file with kIo naming the file and the record.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/core/error.hpp"
#include "engine/core/rng.hpp"
#include "engine/data/sampler.hpp"
#include "engine/nn/model_spec.hpp"
#include "engine/optim/optimizer.hpp"

namespace tandem::engine::train {

constexpr uint32_t kCheckpointVersion = 1;

struct Checkpoint {
  nlohmann::json meta;
  std::vector<std::pair<std::string, std::vector<float>>> tensors;

  void add(std::string name, std::vector<float> values) { tensors.emplace_back(std::move(name), std::move(values)); }
  // The named tensor; throws kIo naming the checkpoint's missing record.
  const std::vector<float>& tensor(const std::string& name) const;
  bool has(const std::string& name) const;
};

void save_checkpoint(const std::string& path, const Checkpoint& ckpt);
Checkpoint load_checkpoint(const std::string& path);

// ---- trainer checkpoints ----
// train::Trainer and parallel::ParallelTrainer write the same records: "meta" (format "tandem-checkpoint", the model
// spec, the optimizer, the schedule, progress, sampler and RNG state, the batch size; the parallel trainer adds a
// "parallel" object), "model.params" and "model.buffers" (the whole model's), and "optimizer.state.<k>" (each the
// size of model.params).

// Where a run stands: what a checkpoint restores besides the tensors.
struct TrainingProgress {
  int64_t optimizer_steps = 0;
  int64_t completed_epochs = 0;
  data::SamplerState sampler;
  int sampler_world = 1;  // the sampler's shards: data-parallel replicas
  int sampler_rank = 0;
  Rng::State rng{};
};

// What the run was: recorded, and checked on load.
struct TrainingIdentity {
  const nn::ModelSpec* spec = nullptr;
  optim::OptimizerConfig optimizer;
  std::string schedule;
  int64_t batch_size = 0;
};

// A checkpoint with the metadata record of `id` at `progress` and the whole model's tensors.
Checkpoint make_training_checkpoint(const TrainingIdentity& id, const TrainingProgress& progress,
                                    std::vector<float> params, std::vector<float> buffers,
                                    std::vector<std::vector<float>> optimizer_state);

// A trainer checkpoint read back and checked against this run.
struct TrainingCheckpoint {
  Checkpoint file;
  TrainingProgress progress;
  const std::vector<float>* params = nullptr;   // the whole model's
  const std::vector<float>* buffers = nullptr;
  std::vector<const std::vector<float>*> optimizer_state;  // each the size of params
};

// Reads `path` and checks that it belongs to a run of `id`: the same model spec, optimizer kind, data sharding
// (sampler world and rank; unless sampler_rank < 0: a parallel checkpoint holds replica 0's, and its trainer reshards
// the sampler to its own width with reshard_sampler) and whole-model tensor sizes. Throws kIo naming the file for a damaged or incomplete file, kInvalidArgument naming what
// differs for another run's.
TrainingCheckpoint load_training_checkpoint(const std::string& path, const TrainingIdentity& id, int sampler_world,
                                            int sampler_rank);

// Resuming at another data-parallel width: the sampler state of `progress` (written with progress.sampler_world
// shards of a `dataset_size`-sample set) for a run with `world` shards. The rule: the global sample position is kept.
// A shard position p of w shards has handed out entries [0, p*w) of the epoch's permutation (shard r takes entries
// r, r+w, ...), so each of the new shards starts at p*w / world and the resumed run sees the samples the uninterrupted
// run would; an exhausted epoch stays exhausted. When p*w is not a multiple of `world`, each new shard starts at
// floor(p*w / world): the fewer than `world` entries between that and p*w are trained a second time, and a warning
// says which (a job that lost a rank mid-epoch resumes at any width). Throws kInvalidArgument naming the numbers when
// the position lies past the new shards.
data::SamplerState reshard_sampler(const TrainingProgress& progress, int64_t dataset_size, int world);

// Runs f; an error becomes one naming the checkpoint ("checkpoint '<path>': ...", JSON errors kIo "metadata is
// incomplete").
template <typename F>
auto in_checkpoint(const std::string& path, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const nlohmann::json::exception& e) {
    TANDEM_THROW(Status::kIo, "checkpoint '{}': metadata is incomplete: {}", path, e.what());
  } catch (const Error& e) {
    if (std::string(e.what()).rfind("checkpoint '", 0) == 0) throw;
    TANDEM_THROW(e.status(), "checkpoint '{}': {}", path, e.what());
  }
}

}  // namespace tandem::engine::train
