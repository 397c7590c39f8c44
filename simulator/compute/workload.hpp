#pragma once
// The model as the simulator prices it, derived from the engine's layer specs (engine/nn): per
// layer and per sample, FLOPs and bytes moved forward and backward, parameter bytes and the output
// kept for backward. Both the runtime and the simulator read the same ModelSpec.
#include <cstdint>
#include <string>
#include <vector>

#include "engine/nn/model_spec.hpp"

namespace tandem::simulator {

struct LayerCost {
  std::string name;
  double fwd_flops = 0, bwd_flops = 0;  // per sample
  double fwd_bytes = 0, bwd_bytes = 0;  // per sample: activations read and written
  double param_bytes = 0;               // f32 parameters (gradients are as large)
  double act_bytes = 0;                 // per sample: output kept for backward
};

struct Workload {
  std::string model;
  engine::nn::SampleShape input;
  std::vector<LayerCost> layers;
  engine::nn::ModelSpec spec;           // for stage boundaries

  double param_bytes(size_t first, size_t end) const;
  double act_bytes(size_t first, size_t end) const;
  // Bytes per sample crossing the cut before layer `cut` (activations forward, gradients back).
  double boundary_bytes(size_t cut) const;
};

Workload make_workload(engine::nn::ModelSpec spec);

}  // namespace tandem::simulator
