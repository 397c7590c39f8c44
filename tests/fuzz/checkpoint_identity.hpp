#pragma once
// The run whose checkpoints the checkpoint fuzz target reads, and make_fuzz_seeds writes: a small model, SGD.
#include "engine/nn/model_spec.hpp"
#include "engine/train/checkpoint.hpp"

namespace tandem::fuzz {

struct CheckpointIdentity {
  engine::nn::ModelSpec spec = engine::nn::model_from_json_text(
      R"({"name": "fuzz", "input": [1, 4, 4], "layers": [{"type": "flatten"}, {"type": "linear", "out_features": 3}]})");
  engine::train::TrainingIdentity identity{&spec, {}, "constant", 8};

  CheckpointIdentity() = default;
  CheckpointIdentity(const CheckpointIdentity&) = delete;  // identity points at spec
  CheckpointIdentity& operator=(const CheckpointIdentity&) = delete;
};

}  // namespace tandem::fuzz
