#pragma once
// A ModelSpec executed on a compute backend. Parameters and their gradients live in one flat plain f32 buffer each,
// layer after layer, so a layer's (or a stage's, or a DDP bucket's) parameters are a contiguous slice. Batch-norm
// running statistics live in a third flat buffer.
//
// A model may hold only a range of layers (hold(): a pipeline stage keeps its own parameters, gradients and
// statistics, not the whole model's). Offsets (param_offset, buffer_offset) are always those of the whole model's
// layout; params(), grads() and buffers() are the held layers' part of it. Storage is allocated on first use, so a
// model handed straight to a pipeline trainer never allocates the other stages' layers. Initial values depend only on
// (seed, layer index): a stage gets exactly the weights the whole model would have.
//
// Forward and backward run over any layer range [begin, end) with an explicit Activations context, so a pipeline
// stage can keep several micro-batches in flight; forward()/backward() are the whole-model shorthands.
#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

#include "engine/compute/backend.hpp"
#include "engine/nn/model_spec.hpp"

namespace tandem::engine::nn {

enum class InitScheme : int32_t {
  kKaiming = 0,      // weights N(0, 2 / fan_in) (He et al., for ReLU nets); biases 0
  kXavier = 1,       // weights U(+-sqrt(6 / (fan_in + fan_out))) (Glorot); biases 0
  kUniformFanIn = 2, // weights and biases U(+-1 / sqrt(fan_in)) (PyTorch's default for conv and linear)
};
InitScheme parse_init(std::string_view s);  // "kaiming", "xavier", "uniform"

// What one forward pass keeps for backward: every layer's output plus per-layer extras.
struct Activations {
  std::vector<Tensor> out;        // per layer (index = layer); released by backward as it passes
  std::vector<Tensor> extra1;     // pool workspace or batch-norm mean
  std::vector<Tensor> extra2;     // batch-norm variance
  std::vector<Tensor> external;   // inputs from before the range (by crossing(begin) order)
  std::vector<int32_t> external_ids;
  std::vector<Tensor> grad;       // backward scratch: gradient w.r.t. each layer's output
  size_t begin = 0, end = 0;
  int64_t batch = 0;
  bool training = true;
  void clear();
};

class Model {
 public:
  Model(ModelSpec spec, compute::Backend& backend, uint64_t seed = 0, InitScheme init = InitScheme::kKaiming);
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelSpec& spec() const noexcept { return spec_; }
  compute::Backend& backend() const noexcept { return backend_; }
  size_t num_layers() const noexcept { return spec_.layers.size(); }

  // ---- held layers ----
  // Keeps only layers [begin, end): layers held before keep their values, newly held ones get their seeded initial
  // values, the others' storage is released. Gradients restart at zero.
  void hold(size_t begin, size_t end);
  size_t held_begin() const noexcept { return held_begin_; }
  size_t held_end() const noexcept { return held_end_; }
  bool holds_all() const noexcept { return held_begin_ == 0 && held_end_ == num_layers(); }
  // Whether the held layers' parameters, gradients and buffers are allocated yet (they are on first use).
  bool storage_allocated() const noexcept { return st_.allocated; }
  // Whole-model sizes (every layer, held or not).
  int64_t total_params() const noexcept { return param_off_.back(); }
  int64_t total_buffers() const noexcept { return buffer_off_.back(); }
  uint64_t seed() const noexcept { return seed_; }
  InitScheme init_scheme() const noexcept { return init_; }

  // ---- parameters, gradients, buffers (of the held layers) ----
  Tensor& params() { return storage().params; }   // [P held] plain f32, every learnable scalar of the held layers
  Tensor& grads() { return storage().grads; }     // same layout
  Tensor& buffers() { return storage().buffers; } // [B held], batch-norm running mean then variance per layer
  // Offsets in the whole model's layout: param_offset(num_layers()) == total_params().
  int64_t param_offset(size_t layer) const { return param_off_.at(layer); }
  int64_t buffer_offset(size_t layer) const { return buffer_off_.at(layer); }
  Tensor layer_params(size_t layer) const;  // [params of the layer] view (may be empty); the layer must be held
  Tensor layer_grads(size_t layer) const;
  // Contiguous views over layers [begin, end) (a pipeline stage's or a DDP bucket's share); the layers must be held.
  Tensor range_params(size_t begin, size_t end) const;
  Tensor range_grads(size_t begin, size_t end) const;
  Tensor range_buffers(size_t begin, size_t end) const;
  void zero_grads();
  // Re-initialises every held parameter from (seed, layer index), so a stage built alone gets the same weights as
  // the whole model; batch-norm gamma 1, beta 0, running mean 0, variance 1.
  void init(uint64_t seed, InitScheme scheme);

  // ---- execution ----
  // Whole model: x [N, C, H, W] (or [N, features]) -> logits [N, K] (plain).
  Tensor forward(const Tensor& x, bool training = true);
  // dlogits [N, K] -> parameter gradients (overwritten, or added when accumulate) in grads().
  void backward(const Tensor& dlogits, bool accumulate = false);
  Activations& activations() noexcept { return acts_; }

  // Layers [begin, end): inputs are the tensors named by spec().crossing(begin), in that order (the model input for
  // kModelInput); returns the tensors named by spec().crossing(end) (for end == num_layers(): the last layer's
  // output, plain).
  std::vector<Tensor> forward_range(size_t begin, size_t end, const std::vector<Tensor>& inputs, Activations& acts,
                                    bool training = true);
  // grads: gradients of the tensors forward_range returned, same order. Returns gradients of its inputs (undefined
  // for the model input). `acts` is consumed (released as backward passes).
  std::vector<Tensor> backward_range(const std::vector<Tensor>& grads, Activations& acts, bool accumulate = false);

  // Called during backward right after a layer's parameter gradients are final (DDP starts all-reduces there).
  void set_grad_ready_hook(std::function<void(size_t layer)> hook) { grad_ready_ = std::move(hook); }

 private:
  struct Storage {
    Tensor params, grads, buffers;
    bool allocated = false;
  };
  // The held layers' storage, allocated and initialised on first use.
  Storage& storage() const;
  // Seeded initial values of layers [begin, end) into `st`, which holds layers from `base` on.
  void init_layers(Storage& st, size_t base, size_t begin, size_t end) const;
  void require_held(size_t begin, size_t end, const char* what) const;
  int64_t local_param(size_t layer) const { return param_off_[layer] - param_off_[held_begin_]; }
  int64_t local_buffer(size_t layer) const { return buffer_off_[layer] - buffer_off_[held_begin_]; }
  Tensor run_layer(size_t i, Activations& a, const std::vector<Tensor>& in);
  void backward_layer(size_t i, Activations& a, bool accumulate);
  Tensor input_of(const Activations& a, int32_t producer) const;
  void add_grad(Activations& a, int32_t producer, Tensor g);

  ModelSpec spec_;
  compute::Backend& backend_;
  uint64_t seed_;
  InitScheme init_;
  size_t held_begin_ = 0, held_end_ = 0;
  mutable Storage st_;  // lazily allocated (storage()): logically part of the model from construction on
  std::vector<int64_t> param_off_, buffer_off_;
  std::vector<bool> inplace_relu_;    // per layer: relu may overwrite its input
  Activations acts_;
  std::function<void(size_t)> grad_ready_;
};

}  // namespace tandem::engine::nn
