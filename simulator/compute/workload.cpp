#include "simulator/compute/workload.hpp"

namespace tandem::simulator {

double Workload::param_bytes(size_t first, size_t end) const {
  double b = 0;
  for (size_t i = first; i < end; ++i) b += layers[i].param_bytes;
  return b;
}

double Workload::act_bytes(size_t first, size_t end) const {
  double b = 0;
  for (size_t i = first; i < end; ++i) b += layers[i].act_bytes;
  return b;
}

double Workload::boundary_bytes(size_t cut) const {
  double b = 0;
  for (int32_t producer : spec.crossing(cut)) {
    b += producer == engine::nn::kModelInput ? static_cast<double>(spec.input.numel()) * 4
                                             : static_cast<double>(spec.layers[static_cast<size_t>(producer)].activation_bytes);
  }
  return b;
}

Workload make_workload(engine::nn::ModelSpec spec) {
  Workload w;
  w.model = spec.name;
  w.input = spec.input;
  for (const auto& l : spec.layers) {
    LayerCost c;
    c.name = l.name;
    c.fwd_flops = l.fwd_flops;
    c.bwd_flops = l.bwd_flops();
    double in_bytes = 0;
    for (const auto& s : l.in_shapes) in_bytes += static_cast<double>(s.numel()) * 4;
    const double out_bytes = static_cast<double>(l.activation_bytes);
    // forward reads its inputs and writes its output; backward reads the output gradient and the
    // saved input and writes the input gradient (when needed)
    c.fwd_bytes = in_bytes + out_bytes;
    c.bwd_bytes = out_bytes + in_bytes + (l.needs_input_grad ? in_bytes : 0);
    c.param_bytes = static_cast<double>(l.param_bytes());
    c.act_bytes = out_bytes;
    w.layers.push_back(std::move(c));
  }
  w.spec = std::move(spec);
  return w;
}

}  // namespace tandem::simulator
