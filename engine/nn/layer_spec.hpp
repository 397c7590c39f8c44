#pragma once
// FLOPs are per sample: a multiply-add is 2 FLOPs; backward ~= 2x forward, split into the data gradient (~= forward) and
// the weight gradient (~= forward); elementwise layers count their arithmetic per element (see layer_spec.cpp).
//
// Layer specs are pure data (no compute): shapes, parameter counts, FLOPs and activation bytes. The engine executes
// them and the simulator prices them, so both see the same workload.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::engine::nn {

// One sample's shape (the batch dimension is implicit; tandem::Shape is a tensor's full shape). Flat features are {features, 1, 1}.
struct SampleShape {
  int64_t c = 0, h = 1, w = 1;
  int64_t numel() const noexcept { return c * h * w; }
  friend bool operator==(const SampleShape&, const SampleShape&) = default;
};
std::string to_string(const SampleShape& s);  // "3x32x32"
// The first commit called it Shape, which clashes with tandem::Shape under using-directives.
using Shape [[deprecated("use engine::nn::SampleShape (tandem::Shape is a tensor's shape)")]] = SampleShape;

enum class LayerKind : int32_t {
  kConv2d = 0,         // groups make it depthwise; optional bias
  kBatchNorm2d = 1,    // per-channel affine, running statistics
  kReLU = 2,
  kReLU6 = 3,
  kMaxPool2d = 4,
  kAvgPool2d = 5,
  kGlobalAvgPool = 6,  // CxHxW -> Cx1x1
  kFlatten = 7,        // CxHxW -> (C*H*W)x1x1 (a view; no compute)
  kLinear = 8,         // consumes its input flattened
  kAdd = 9,            // elementwise sum of two inputs (residual connections)
  kConcat = 10,        // channel concatenation of two or more inputs with equal HxW (inception branches)
  // Transformer layers, spec-only (model summary, simulator; no compute backend runs them). A sequence of L tokens of
  // width D is the map D x L x 1; a per-token linear layer is a 1x1 conv2d over it.
  kEmbedding = 11,     // token ids 1 x L x 1 -> out_channels x L x 1: a table of num_embeddings rows
  kLayerNorm = 12,     // per token over the channels; gamma, beta
  kGELU = 13,
  kAttention = 14,     // multi-head self-attention: Q, K, V and output projections D -> D with biases; `heads`
};
constexpr int kNumLayerKinds = 15;
// Kinds that only specs know (no backend computes them).
constexpr bool is_spec_only(LayerKind k) noexcept { return static_cast<int32_t>(k) >= 11; }

std::string_view layer_kind_name(LayerKind k) noexcept;  // "conv2d", "batchnorm2d", ...
// Parses a kind name; throws kInvalidArgument listing the valid names.
LayerKind parse_layer_kind(std::string_view s);

// The model input as a producer index in LayerSpec::inputs.
constexpr int32_t kModelInput = -1;

struct LayerSpec {
  // --- given ---
  std::string name;
  LayerKind kind = LayerKind::kReLU;
  std::vector<int32_t> inputs;  // producer layer indices (earlier layers) or kModelInput; kAdd takes two, kConcat 2+
  int64_t out_channels = 0;     // conv2d
  int64_t out_features = 0;     // linear
  int64_t kernel_h = 1, kernel_w = 1, stride = 1, padding = 0, groups = 1;  // conv2d / pooling
  int64_t padding_w = -1;       // conv2d / pooling: width padding when it differs from `padding` (1x7 convs); -1: same
  bool bias = true;             // conv2d / linear
  int64_t num_embeddings = 0;   // embedding: rows of the table
  int64_t heads = 0;            // attention: heads (dividing the width)
  float eps = 1e-5f;            // batchnorm2d, layernorm
  float momentum = 0.1f;        // batchnorm2d: running = (1 - momentum) * running + momentum * batch

  // --- derived by infer() ---
  std::vector<SampleShape> in_shapes;
  SampleShape out_shape;
  int64_t params = 0;             // learnable scalars
  int64_t buffers = 0;            // non-learnable state (batch norm running mean and variance)
  int64_t macs = 0;               // multiply-adds in the forward pass (conv2d / linear only)
  double fwd_flops = 0;           // per sample
  double bwd_data_flops = 0;      // per sample; 0 when no input needs a gradient (fed by the model input)
  double bwd_weight_flops = 0;    // per sample; 0 for layers without parameters
  int64_t activation_bytes = 0;   // per sample: the f32 output this layer produces
  bool needs_input_grad = true;   // false when every input is the model input

  double bwd_flops() const noexcept { return bwd_data_flops + bwd_weight_flops; }
  int64_t pad_h() const noexcept { return padding; }
  int64_t pad_w() const noexcept { return padding_w < 0 ? padding : padding_w; }
  int64_t param_bytes() const noexcept { return params * 4; }
  // Learnable tensor shapes in order (weight, then bias; batch norm: gamma, beta); their sizes sum to params.
  std::vector<std::vector<int64_t>> param_shapes() const;
};

// Fills the derived fields of `layer` from the shapes of its inputs. Throws kInvalidArgument naming the layer and
// the reason (bad kernel, output smaller than 1x1, channel mismatch, ...).
void infer(LayerSpec& layer, const std::vector<SampleShape>& inputs);

}  // namespace tandem::engine::nn
