#pragma once
// A model as data: a graph of LayerSpecs in topological order (every layer reads earlier layers or the model input),
// with per-layer and total parameters, FLOPs and activation bytes. Pipeline stages are contiguous layer ranges
// [begin, end); crossing() says which tensors cross a cut.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "engine/nn/layer_spec.hpp"

namespace tandem::engine::nn {

struct ModelTotals {
  int64_t params = 0;
  int64_t buffers = 0;
  int64_t macs = 0;
  double fwd_flops = 0;         // per sample
  double bwd_flops = 0;         // per sample (data + weight gradients)
  int64_t activation_bytes = 0; // per sample, sum of layer outputs (what training keeps for backward, roughly)
};

struct ModelSpec {
  std::string name;
  SampleShape input;
  std::vector<LayerSpec> layers;

  const SampleShape& output() const;     // the last layer's output shape
  int64_t num_classes() const;     // output().numel() (a classifier's logits)
  ModelTotals totals() const { return totals(0, layers.size()); }
  ModelTotals totals(size_t begin, size_t end) const;  // a stage [begin, end)
  // Indices of the layer outputs produced before `cut` and read at or after it (kModelInput for the input), in
  // ascending order: what a pipeline stage boundary at `cut` must send forward (and their gradients backward).
  std::vector<int32_t> crossing(size_t cut) const;
  // Per layer: whether training layers [begin, ...) gives its output no storage of its own, as nn::Model runs them --
  // a flatten (a view of its input) and a ReLU/ReLU6 that overwrites its producer's output, which it may when the
  // producer lies in the range, has no other reader and is neither a ReLU (whose backward needs its own output) nor a
  // flatten. False before `begin`. The memory figures (job compiler, memory guard) count only the other outputs.
  std::vector<bool> shared_outputs(size_t begin = 0) const;
  // Per sample, the bytes of the outputs of layers [begin, end) that training keeps with storage of their own (the
  // sum of activation_bytes less the shared_outputs(begin)).
  int64_t stored_activation_bytes(size_t begin, size_t end) const;
  // Index of the layer with this name; throws kInvalidArgument when absent.
  int32_t find(const std::string& layer_name) const;
  // Re-runs shape inference for every layer (after editing fields); throws naming the layer.
  void infer_all();
};

// Builds a ModelSpec layer by layer, inferring shapes as it goes (errors name the layer). Each call returns the new
// layer's index; `from` defaults to the previous layer (or the model input for the first layer).
class ModelBuilder {
 public:
  static constexpr int32_t kPrev = -2;
  ModelBuilder(std::string name, SampleShape input);

  int32_t conv(int64_t out_channels, int64_t kernel, int64_t stride, int64_t padding, int64_t groups = 1,
               bool bias = true, int32_t from = kPrev, std::string name = "");
  // A kh x kw kernel with padding ph x pw (inception's 1x7 and 7x1 convolutions).
  int32_t conv2(int64_t out_channels, int64_t kernel_h, int64_t kernel_w, int64_t stride, int64_t padding_h,
                int64_t padding_w, bool bias = true, int32_t from = kPrev, std::string name = "");
  int32_t batchnorm(int32_t from = kPrev, std::string name = "", float eps = 1e-5f);
  int32_t relu(int32_t from = kPrev, std::string name = "");
  int32_t relu6(int32_t from = kPrev, std::string name = "");
  int32_t maxpool(int64_t kernel, int64_t stride, int64_t padding = 0, int32_t from = kPrev, std::string name = "");
  int32_t avgpool(int64_t kernel, int64_t stride, int64_t padding = 0, int32_t from = kPrev, std::string name = "");
  int32_t global_avgpool(int32_t from = kPrev, std::string name = "");
  int32_t flatten(int32_t from = kPrev, std::string name = "");
  int32_t linear(int64_t out_features, bool bias = true, int32_t from = kPrev, std::string name = "");
  int32_t add(int32_t a, int32_t b, std::string name = "");
  // Transformer layers (spec-only kinds; see LayerKind).
  int32_t embedding(int64_t num_embeddings, int64_t dim, int32_t from = kPrev, std::string name = "");
  int32_t layernorm(float eps = 1e-5f, int32_t from = kPrev, std::string name = "");
  int32_t gelu(int32_t from = kPrev, std::string name = "");
  int32_t attention(int64_t heads, int32_t from = kPrev, std::string name = "");
  // Channel concatenation of `from` in order (branches that end at this layer).
  int32_t concat(const std::vector<int32_t>& from, std::string name = "");
  // Adds a fully described layer (kind and hyper-parameters set; inputs resolved; name may be empty).
  int32_t push(LayerSpec layer);

  int32_t last() const { return static_cast<int32_t>(spec_.layers.size()) - 1; }
  const SampleShape& shape_of(int32_t index) const;
  const ModelSpec& spec() const { return spec_; }
  ModelSpec build() &&;

 private:
  int32_t resolve(int32_t from) const;
  ModelSpec spec_;
};

// JSON form:
//   {"name": "net", "input": [C, H, W],
//    "layers": [{"type": "conv2d", "name": "c1", "out_channels": 6, "kernel": 5, "stride": 1, "padding": 2,
//                "groups": 1, "bias": true, "inputs": ["input"]}, {"type": "relu"}, ...]}
// "inputs" names earlier layers or "input" and defaults to the previous layer (add takes two, concat two or more);
// "kernel" and "padding" may be [h, w]; unnamed
// layers are called "<type><index>". Errors are kInvalidArgument naming the field ("layers[3].kernel: ...").
ModelSpec model_from_json(const nlohmann::json& j);
ModelSpec model_from_json_text(const std::string& text);  // parse errors: kInvalidArgument with the position
ModelSpec load_model_file(const std::string& path);       // unreadable file: kIo naming it
nlohmann::json model_to_json(const ModelSpec& spec);      // the given fields only; model_from_json reads it back

}  // namespace tandem::engine::nn
