// SampleShape inference and cost figures of single layers.
//
// Elementwise FLOP counts per output element (forward / data gradient / weight gradient):
//   batchnorm2d 4 / 5 / 2 (mean, variance, normalise + affine; backward needs both reductions),
//   relu, relu6 1 / 1 / 0, add 1 / 0 / 0 (its gradient is a copy), max pool k*k compares / 1 / 0,
//   avg pool k*k / k*k / 0, global average pool 1 per input element both ways, flatten 0, concat 0 / 0 / 0 (copies
//   into and out of channel slices: bytes, not arithmetic), layernorm 5 / 8 / 2, gelu 8 / 10 / 0 (tanh form),
//   embedding 0 / 0 / 1 (a gather; the weight gradient a scatter-add). Attention per sample of L tokens of width D
//   with H heads: 4 L D^2 projection MACs plus 2 L^2 D for QK^T and AV, 5 H L^2 for scaling and softmax.
#include "engine/nn/layer_spec.hpp"

#include <algorithm>
#include <array>

#include <fmt/format.h>

#include "engine/core/error.hpp"

namespace tandem::engine::nn {

std::string to_string(const SampleShape& s) { return fmt::format("{}x{}x{}", s.c, s.h, s.w); }

namespace {
constexpr std::array<std::string_view, kNumLayerKinds> kKindNames = {
    "conv2d", "batchnorm2d", "relu", "relu6", "maxpool2d", "avgpool2d", "global_avgpool", "flatten", "linear", "add",
    "concat", "embedding", "layernorm", "gelu", "attention"};

int64_t pooled(int64_t in, int64_t k, int64_t stride, int64_t pad) { return (in + 2 * pad - k) / stride + 1; }

// Sizes read from a spec are claims: every extent, element, parameter and MAC count of a layer stays at or below
// 2^48 (far above any real model; thousands of such layers still sum without overflow), checked before use.
constexpr int64_t kMaxCount = int64_t{1} << 48;

int64_t product(const LayerSpec& l, std::string_view kind, std::string_view what, std::initializer_list<int64_t> fs) {
  int64_t p = 1;
  for (int64_t f : fs) {
    TANDEM_REQUIRE(f >= 0 && !__builtin_mul_overflow(p, f, &p) && p <= kMaxCount,
                   "layer '{}' ({}): its {} exceed 2^48 (a size in the spec is far too large)", l.name, kind, what);
  }
  return p;
}

void check_extent(const LayerSpec& l, std::string_view kind, std::string_view field, int64_t v) {
  TANDEM_REQUIRE(v <= kMaxCount, "layer '{}' ({}): {} {} is above 2^48", l.name, kind, field, v);
}

// Elementwise costs: FLOPs per element of `numel` forward, for the data gradient and for the weight gradient.
void per_element(LayerSpec& l, int64_t numel, double fwd, double data, double weight) {
  const auto n = static_cast<double>(numel);
  l.fwd_flops = fwd * n;
  l.bwd_data_flops = data * n;
  l.bwd_weight_flops = weight * n;
}
}  // namespace

std::string_view layer_kind_name(LayerKind k) noexcept {
  const auto i = static_cast<size_t>(k);
  return i < kKindNames.size() ? kKindNames[i] : std::string_view("unknown");
}

LayerKind parse_layer_kind(std::string_view s) {
  for (size_t i = 0; i < kKindNames.size(); ++i) {
    if (kKindNames[i] == s) return static_cast<LayerKind>(i);
  }
  TANDEM_THROW(Status::kInvalidArgument, "unknown layer type '{}' (expected one of: {})", s,
               fmt::join(kKindNames, ", "));
}

std::vector<std::vector<int64_t>> LayerSpec::param_shapes() const {
  switch (kind) {
    case LayerKind::kConv2d: {
      std::vector<std::vector<int64_t>> p{{out_channels, in_shapes.at(0).c / groups, kernel_h, kernel_w}};
      if (bias) p.push_back({out_channels});
      return p;
    }
    case LayerKind::kLinear: {
      std::vector<std::vector<int64_t>> p{{out_features, in_shapes.at(0).numel()}};
      if (bias) p.push_back({out_features});
      return p;
    }
    case LayerKind::kBatchNorm2d:
    case LayerKind::kLayerNorm:
      return {{in_shapes.at(0).c}, {in_shapes.at(0).c}};
    case LayerKind::kEmbedding:
      return {{num_embeddings, out_channels}};
    case LayerKind::kAttention: {  // PyTorch's MultiheadAttention: packed Q, K, V projection, then the output one
      const int64_t d = in_shapes.at(0).c;
      return {{3 * d, d}, {3 * d}, {d, d}, {d}};
    }
    default:
      return {};
  }
}

void infer(LayerSpec& l, const std::vector<SampleShape>& in) {
  const std::string_view kind = layer_kind_name(l.kind);
  if (l.kind == LayerKind::kConcat) {
    TANDEM_REQUIRE(in.size() >= 2, "layer '{}' (concat): takes 2 or more inputs, got {}", l.name, in.size());
  } else {
    const size_t want_inputs = l.kind == LayerKind::kAdd ? 2 : 1;
    TANDEM_REQUIRE(in.size() == want_inputs, "layer '{}' ({}): takes {} input(s), got {}", l.name, kind, want_inputs,
                   in.size());
  }
  for (const SampleShape& s : in) {
    TANDEM_REQUIRE(s.c > 0 && s.h > 0 && s.w > 0, "layer '{}' ({}): input shape {} is empty", l.name, kind,
                   to_string(s));
    (void)product(l, kind, "input elements", {s.c, s.h, s.w});
  }
  for (const auto& [field, v] : {std::pair<const char*, int64_t>{"kernel_h", l.kernel_h}, {"kernel_w", l.kernel_w},
                                 {"stride", l.stride}, {"padding", l.pad_h()}, {"padding", l.pad_w()},
                                 {"out_channels", l.out_channels}, {"out_features", l.out_features},
                                 {"groups", l.groups}, {"num_embeddings", l.num_embeddings}, {"heads", l.heads}})
    check_extent(l, kind, field, v);
  const SampleShape x = in[0];
  l.in_shapes = in;
  l.params = l.buffers = l.macs = 0;
  l.fwd_flops = l.bwd_data_flops = l.bwd_weight_flops = 0;
  SampleShape y = x;
  auto check_window = [&] {
    TANDEM_REQUIRE(l.kernel_h > 0 && l.kernel_w > 0, "layer '{}' ({}): kernel must be positive (got {}x{})", l.name,
                   kind, l.kernel_h, l.kernel_w);
    TANDEM_REQUIRE(l.stride > 0, "layer '{}' ({}): stride must be positive (got {})", l.name, kind, l.stride);
    TANDEM_REQUIRE(l.pad_h() >= 0 && l.pad_w() >= 0, "layer '{}' ({}): padding must be >= 0 (got {}x{})", l.name,
                   kind, l.pad_h(), l.pad_w());
    y.h = pooled(x.h, l.kernel_h, l.stride, l.pad_h());
    y.w = pooled(x.w, l.kernel_w, l.stride, l.pad_w());
    TANDEM_REQUIRE(x.h + 2 * l.pad_h() >= l.kernel_h && x.w + 2 * l.pad_w() >= l.kernel_w && y.h > 0 && y.w > 0,
                   "layer '{}' ({}): a {}x{} window (stride {}, padding {}x{}) does not fit input {}", l.name, kind,
                   l.kernel_h, l.kernel_w, l.stride, l.pad_h(), l.pad_w(), to_string(x));
  };
  switch (l.kind) {
    case LayerKind::kConv2d: {
      check_window();
      TANDEM_REQUIRE(l.out_channels > 0, "layer '{}' (conv2d): out_channels must be positive (got {})", l.name,
                     l.out_channels);
      TANDEM_REQUIRE(l.groups > 0 && x.c % l.groups == 0 && l.out_channels % l.groups == 0,
                     "layer '{}' (conv2d): groups {} must divide input channels {} and out_channels {}", l.name,
                     l.groups, x.c, l.out_channels);
      y.c = l.out_channels;
      const int64_t outputs = product(l, kind, "output elements", {y.c, y.h, y.w});
      l.macs = product(l, kind, "multiply-adds", {outputs, x.c / l.groups, l.kernel_h, l.kernel_w});
      l.params = product(l, kind, "parameters", {l.out_channels, x.c / l.groups, l.kernel_h, l.kernel_w}) +
                 (l.bias ? l.out_channels : 0);
      l.fwd_flops = 2.0 * l.macs + (l.bias ? outputs : 0);
      l.bwd_data_flops = 2.0 * l.macs;
      l.bwd_weight_flops = 2.0 * l.macs + (l.bias ? outputs : 0);
      break;
    }
    case LayerKind::kLinear: {
      TANDEM_REQUIRE(l.out_features > 0, "layer '{}' (linear): out_features must be positive (got {})", l.name,
                     l.out_features);
      y = SampleShape{l.out_features, 1, 1};
      l.macs = product(l, kind, "multiply-adds", {x.numel(), l.out_features});
      l.params = l.macs + (l.bias ? l.out_features : 0);
      l.fwd_flops = 2.0 * l.macs + (l.bias ? l.out_features : 0);
      l.bwd_data_flops = 2.0 * l.macs;
      l.bwd_weight_flops = 2.0 * l.macs + (l.bias ? l.out_features : 0);
      break;
    }
    case LayerKind::kBatchNorm2d: {
      TANDEM_REQUIRE(l.eps > 0, "layer '{}' (batchnorm2d): eps must be positive (got {})", l.name, l.eps);
      TANDEM_REQUIRE(l.momentum >= 0 && l.momentum <= 1, "layer '{}' (batchnorm2d): momentum must be in [0, 1] (got {})",
                     l.name, l.momentum);
      l.params = 2 * x.c;
      l.buffers = 2 * x.c;
      per_element(l, x.numel(), 4, 5, 2);
      break;
    }
    case LayerKind::kReLU:
    case LayerKind::kReLU6:
      l.fwd_flops = l.bwd_data_flops = static_cast<double>(x.numel());
      break;
    case LayerKind::kMaxPool2d:
    case LayerKind::kAvgPool2d: {
      check_window();
      TANDEM_REQUIRE(2 * l.pad_h() <= l.kernel_h && 2 * l.pad_w() <= l.kernel_w,
                     "layer '{}' ({}): padding {}x{} must be at most half the {}x{} window", l.name, kind, l.pad_h(),
                     l.pad_w(), l.kernel_h, l.kernel_w);
      const double window = static_cast<double>(product(l, kind, "window elements", {l.kernel_h, l.kernel_w}));
      const auto outputs = static_cast<double>(product(l, kind, "output elements", {y.c, y.h, y.w}));
      l.fwd_flops = window * outputs;
      l.bwd_data_flops = l.kind == LayerKind::kMaxPool2d ? outputs : window * outputs;
      break;
    }
    case LayerKind::kGlobalAvgPool:
      y = SampleShape{x.c, 1, 1};
      l.fwd_flops = l.bwd_data_flops = static_cast<double>(x.numel());
      break;
    case LayerKind::kFlatten:
      y = SampleShape{x.numel(), 1, 1};
      break;
    case LayerKind::kAdd:
      TANDEM_REQUIRE(in[0] == in[1], "layer '{}' (add): input shapes differ ({} vs {})", l.name, to_string(in[0]),
                     to_string(in[1]));
      l.fwd_flops = static_cast<double>(x.numel());
      break;
    case LayerKind::kEmbedding: {
      TANDEM_REQUIRE(x.c == 1, "layer '{}' (embedding): reads token ids as 1xLx1 (got {})", l.name, to_string(x));
      TANDEM_REQUIRE(l.num_embeddings > 0 && l.out_channels > 0,
                     "layer '{}' (embedding): num_embeddings and out_channels must be positive (got {} and {})",
                     l.name, l.num_embeddings, l.out_channels);
      y.c = l.out_channels;
      l.params = product(l, kind, "parameters", {l.num_embeddings, l.out_channels});
      l.bwd_weight_flops = static_cast<double>(y.numel());
      break;
    }
    case LayerKind::kLayerNorm:
      TANDEM_REQUIRE(l.eps > 0, "layer '{}' (layernorm): eps must be positive (got {})", l.name, l.eps);
      l.params = 2 * x.c;
      per_element(l, x.numel(), 5, 8, 2);
      break;
    case LayerKind::kGELU:
      per_element(l, x.numel(), 8, 10, 0);
      break;
    case LayerKind::kAttention: {
      TANDEM_REQUIRE(l.heads > 0 && x.c % l.heads == 0, "layer '{}' (attention): heads {} must divide the width {}",
                     l.name, l.heads, x.c);
      const double d = static_cast<double>(x.c), tokens = static_cast<double>(x.h) * static_cast<double>(x.w);
      const double proj = 4 * tokens * d * d, mix = 2 * tokens * tokens * d, softmax = 5.0 * l.heads * tokens * tokens;
      l.params = product(l, kind, "parameters", {4, x.c, x.c}) + 4 * x.c;
      l.macs = static_cast<int64_t>(proj + mix);
      l.fwd_flops = 2 * (proj + mix) + 4 * tokens * d + softmax;
      l.bwd_data_flops = 2 * proj + 4 * mix + softmax;
      l.bwd_weight_flops = 2 * proj + 4 * tokens * d;
      break;
    }
    case LayerKind::kConcat:
      y.c = 0;
      for (size_t k = 0; k < in.size(); ++k) {
        TANDEM_REQUIRE(in[k].h == x.h && in[k].w == x.w,
                       "layer '{}' (concat): input {} is {} but input 0 is {} (height and width must match)", l.name,
                       k, to_string(in[k]), to_string(x));
        y.c += in[k].c;
      }
      break;
  }
  l.out_shape = y;
  l.activation_bytes = product(l, kind, "output elements", {y.c, y.h, y.w}) * 4;
  l.needs_input_grad = false;
  for (int32_t p : l.inputs) l.needs_input_grad = l.needs_input_grad || p != kModelInput;
  if (l.inputs.empty()) l.needs_input_grad = true;  // not wired yet: assume an inner layer
  if (!l.needs_input_grad) l.bwd_data_flops = 0;
}

}  // namespace tandem::engine::nn
