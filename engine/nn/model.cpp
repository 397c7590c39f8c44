#include "engine/nn/model.hpp"

#include <algorithm>
#include <cmath>

#include "engine/core/error.hpp"
#include "engine/core/rng.hpp"

namespace tandem::engine::nn {

using compute::Activation;
using compute::ConvParams;
using compute::PoolKind;
using compute::PoolParams;

InitScheme parse_init(std::string_view s) {
  if (s == "kaiming") return InitScheme::kKaiming;
  if (s == "xavier") return InitScheme::kXavier;
  if (s == "uniform") return InitScheme::kUniformFanIn;
  TANDEM_THROW(Status::kInvalidArgument, "unknown initialisation '{}' (expected kaiming, xavier or uniform)", s);
}

void Activations::clear() {
  out.clear();
  extra1.clear();
  extra2.clear();
  external.clear();
  external_ids.clear();
  grad.clear();
  begin = end = 0;
  batch = 0;
}

namespace {

ConvParams conv_params(const LayerSpec& l) {
  ConvParams p;
  p.stride_h = p.stride_w = l.stride;
  p.pad_h = l.pad_h();
  p.pad_w = l.pad_w();
  p.groups = l.groups;
  return p;
}

PoolParams pool_params(const LayerSpec& l) {
  PoolParams p;
  p.kernel_h = l.kernel_h;
  p.kernel_w = l.kernel_w;
  p.stride_h = p.stride_w = l.stride;
  p.pad_h = l.pad_h();
  p.pad_w = l.pad_w();
  p.count_include_pad = true;
  return p;
}

bool is_relu(LayerKind k) { return k == LayerKind::kReLU || k == LayerKind::kReLU6; }
Activation activation_of(LayerKind k) { return k == LayerKind::kReLU ? Activation::kRelu : Activation::kRelu6; }

}  // namespace

Model::Model(ModelSpec spec, compute::Backend& backend, uint64_t seed, InitScheme init_scheme)
    : spec_(std::move(spec)), backend_(backend), seed_(seed), init_(init_scheme) {
  TANDEM_REQUIRE(!spec_.layers.empty(), "model '{}' has no layers", spec_.name);
  for (const LayerSpec& l : spec_.layers) {
    TANDEM_CHECK(!is_spec_only(l.kind), Status::kUnsupported,
                 "model '{}': layer '{}' ({}) is spec-only (model summary, simulator): backend '{}' cannot run it",
                 spec_.name, l.name, layer_kind_name(l.kind), backend_.name());
  }
  const size_t n = spec_.layers.size();
  held_end_ = n;
  param_off_.assign(n + 1, 0);
  buffer_off_.assign(n + 1, 0);
  for (size_t i = 0; i < n; ++i) {
    param_off_[i + 1] = param_off_[i] + spec_.layers[i].params;
    buffer_off_[i + 1] = buffer_off_[i] + spec_.layers[i].buffers;
  }
  // A relu overwrites its producer's output when nothing else reads it and the producer's backward does not need
  // it (ModelSpec::shared_outputs, the rule the memory figures count by).
  const std::vector<bool> shared = spec_.shared_outputs();
  inplace_relu_.assign(n, false);
  for (size_t i = 0; i < n; ++i) inplace_relu_[i] = is_relu(spec_.layers[i].kind) && shared[i];
}

Model::Storage& Model::storage() const {
  if (st_.allocated) return st_;
  Storage st;
  st.params = backend_.zeros(tandem::Shape{param_off_[held_end_] - param_off_[held_begin_]});
  st.grads = backend_.zeros(tandem::Shape{param_off_[held_end_] - param_off_[held_begin_]});
  st.buffers = backend_.zeros(tandem::Shape{buffer_off_[held_end_] - buffer_off_[held_begin_]});
  init_layers(st, held_begin_, held_begin_, held_end_);
  st.allocated = true;
  st_ = std::move(st);
  return st_;
}

void Model::hold(size_t begin, size_t end) {
  TANDEM_REQUIRE(begin < end && end <= num_layers(), "model '{}': cannot hold layers [{}, {}) of {}", spec_.name,
                 begin, end, num_layers());
  if (begin == held_begin_ && end == held_end_) return;
  if (!st_.allocated) {  // nothing to keep: allocate the new range on first use
    held_begin_ = begin;
    held_end_ = end;
    return;
  }
  Storage st;
  st.params = backend_.zeros(tandem::Shape{param_off_[end] - param_off_[begin]});
  st.grads = backend_.zeros(tandem::Shape{param_off_[end] - param_off_[begin]});
  st.buffers = backend_.zeros(tandem::Shape{buffer_off_[end] - buffer_off_[begin]});
  // Layers held before keep their (possibly trained or loaded) values; the rest start from their seeded values.
  const size_t kb = std::max(begin, held_begin_), ke = std::min(end, held_end_);
  if (kb < ke) {
    Tensor p = st.params.slice(param_off_[kb] - param_off_[begin], tandem::Shape{param_off_[ke] - param_off_[kb]});
    Tensor b = st.buffers.slice(buffer_off_[kb] - buffer_off_[begin], tandem::Shape{buffer_off_[ke] - buffer_off_[kb]});
    if (p.numel() > 0) backend_.copy(range_params(kb, ke), p);
    if (b.numel() > 0) backend_.copy(range_buffers(kb, ke), b);
    init_layers(st, begin, begin, kb);
    init_layers(st, begin, ke, end);
  } else {
    init_layers(st, begin, begin, end);
  }
  st.allocated = true;
  held_begin_ = begin;
  held_end_ = end;
  st_ = std::move(st);  // releases the old storage
}

void Model::require_held(size_t begin, size_t end, const char* what) const {
  TANDEM_REQUIRE(begin <= end && end <= num_layers(), "model '{}': {} over layer range [{}, {}) out of bounds",
                 spec_.name, what, begin, end);
  TANDEM_REQUIRE(begin == end || (begin >= held_begin_ && end <= held_end_),
                 "model '{}': {} over layers [{}, {}) but this model holds only layers [{}, {}) (a pipeline stage's)",
                 spec_.name, what, begin, end, held_begin_, held_end_);
}

Tensor Model::layer_params(size_t layer) const { return range_params(layer, layer + 1); }
Tensor Model::layer_grads(size_t layer) const { return range_grads(layer, layer + 1); }

Tensor Model::range_params(size_t begin, size_t end) const {
  require_held(begin, end, "parameters");
  if (begin == end) return storage().params.slice(0, tandem::Shape{0});
  return storage().params.slice(local_param(begin), tandem::Shape{param_off_[end] - param_off_[begin]});
}

Tensor Model::range_grads(size_t begin, size_t end) const {
  require_held(begin, end, "gradients");
  if (begin == end) return storage().grads.slice(0, tandem::Shape{0});
  return storage().grads.slice(local_param(begin), tandem::Shape{param_off_[end] - param_off_[begin]});
}

Tensor Model::range_buffers(size_t begin, size_t end) const {
  require_held(begin, end, "buffers");
  if (begin == end) return storage().buffers.slice(0, tandem::Shape{0});
  return storage().buffers.slice(local_buffer(begin), tandem::Shape{buffer_off_[end] - buffer_off_[begin]});
}

void Model::zero_grads() {
  Tensor& g = grads();
  if (g.numel() > 0) backend_.fill(g, 0.0f);
}

void Model::init(uint64_t seed, InitScheme scheme) {
  seed_ = seed;
  init_ = scheme;
  if (!st_.allocated) return;  // storage() initialises from (seed_, init_) when it allocates
  init_layers(st_, held_begin_, held_begin_, held_end_);
  zero_grads();
}

void Model::init_layers(Storage& st, size_t base, size_t begin, size_t end) const {
  for (size_t i = begin; i < end; ++i) {
    const LayerSpec& l = spec_.layers[i];
    if (l.params == 0) continue;
    Rng rng(mix64(seed_, i));
    std::vector<float> host(static_cast<size_t>(l.params));
    if (l.kind == LayerKind::kBatchNorm2d) {
      std::fill(host.begin(), host.begin() + l.params / 2, 1.0f);  // gamma 1, beta 0
    } else {
      const auto shapes = l.param_shapes();
      const auto& w = shapes[0];
      int64_t receptive = 1;
      for (size_t d = 2; d < w.size(); ++d) receptive *= w[d];
      const double fan_in = static_cast<double>(w[1] * receptive), fan_out = static_cast<double>(w[0] * receptive);
      const int64_t wn = fan_in > 0 ? w[0] * w[1] * receptive : 0;
      for (int64_t k = 0; k < wn; ++k) {
        double v = 0;
        switch (init_) {
          case InitScheme::kKaiming: v = rng.normal() * std::sqrt(2.0 / fan_in); break;
          case InitScheme::kXavier: v = (2 * rng.uniform() - 1) * std::sqrt(6.0 / (fan_in + fan_out)); break;
          case InitScheme::kUniformFanIn: v = (2 * rng.uniform() - 1) / std::sqrt(fan_in); break;
        }
        host[static_cast<size_t>(k)] = static_cast<float>(v);
      }
      if (init_ == InitScheme::kUniformFanIn) {
        for (int64_t k = wn; k < l.params; ++k) host[k] = static_cast<float>((2 * rng.uniform() - 1) / std::sqrt(fan_in));
      }
    }
    Tensor dst = st.params.slice(param_off_[i] - param_off_[base], tandem::Shape{l.params});
    backend_.copy(Tensor::wrap(host.data(), tandem::Shape{l.params}, DType::kF32), dst);
  }
  // Running statistics: mean 0, variance 1.
  for (size_t i = begin; i < end; ++i) {
    const LayerSpec& l = spec_.layers[i];
    if (l.buffers == 0) continue;
    std::vector<float> host(static_cast<size_t>(l.buffers), 0.0f);
    std::fill(host.begin() + l.buffers / 2, host.end(), 1.0f);
    Tensor dst = st.buffers.slice(buffer_off_[i] - buffer_off_[base], tandem::Shape{l.buffers});
    backend_.copy(Tensor::wrap(host.data(), tandem::Shape{l.buffers}, DType::kF32), dst);
  }
}

// ---- execution ------------------------------------------------------------------------------------

namespace {
// Views a 2-D [N, C] activation as [N, C, 1, 1] for the ops that need 4-D input.
Tensor as4d(compute::Backend& be, const Tensor& t) {
  if (t.rank() == 4) return t;
  return be.to_plain(t).view(tandem::Shape{t.dim(0), t.numel() / t.dim(0), 1, 1});
}
// `g` reshaped to `shape` when only the view differs ([N, C] vs [N, C, 1, 1]).
Tensor conform(compute::Backend& be, const Tensor& g, const tandem::Shape& shape) {
  if (g.shape() == shape) return g;
  TANDEM_CHECK(g.numel() == shape.numel(), Status::kInternal, "gradient {} cannot take the shape {}", g.str(),
               shape.str());
  return be.to_plain(g).view(shape);
}
// Concatenation as plain copies of each sample's channel block: every backend's copy() takes plain slices, so concat
// runs wherever copy does (reference, cpu, cuda), at one copy per sample and input.
Tensor concat_forward(compute::Backend& be, const std::vector<Tensor>& in, const LayerSpec& l) {
  const int64_t n = in[0].dim(0), hw = l.out_shape.h * l.out_shape.w, per_sample = l.out_shape.numel();
  Tensor y = be.empty(tandem::Shape{n, l.out_shape.c, l.out_shape.h, l.out_shape.w});
  int64_t offset = 0;
  for (size_t k = 0; k < in.size(); ++k) {
    const Tensor x = be.to_plain(in[k]);
    const int64_t block = l.in_shapes[k].c * hw;
    for (int64_t s = 0; s < n; ++s) {
      Tensor dst = y.slice(s * per_sample + offset, tandem::Shape{block});
      be.copy(x.slice(s * block, tandem::Shape{block}), dst);
    }
    offset += block;
  }
  return y;
}

// The gradient of input k: its channel block of every sample of dy.
Tensor concat_backward(compute::Backend& be, const Tensor& dy_any, const LayerSpec& l, size_t k) {
  const Tensor dy = be.to_plain(dy_any);
  const int64_t n = dy.dim(0), hw = l.out_shape.h * l.out_shape.w, per_sample = l.out_shape.numel();
  int64_t offset = 0;
  for (size_t j = 0; j < k; ++j) offset += l.in_shapes[j].c * hw;
  const SampleShape& xs = l.in_shapes[k];
  const int64_t block = xs.c * hw;
  Tensor dx = be.empty(tandem::Shape{n, xs.c, xs.h, xs.w});
  for (int64_t s = 0; s < n; ++s) {
    Tensor dst = dx.slice(s * block, tandem::Shape{block});
    be.copy(dy.slice(s * per_sample + offset, tandem::Shape{block}), dst);
  }
  return dx;
}
}  // namespace

Tensor Model::input_of(const Activations& a, int32_t producer) const {
  if (producer >= static_cast<int32_t>(a.begin)) return a.out[static_cast<size_t>(producer)];
  const auto it = std::find(a.external_ids.begin(), a.external_ids.end(), producer);
  TANDEM_CHECK(it != a.external_ids.end(), Status::kInternal, "layer input #{} is neither in the range nor given",
               producer);
  return a.external[static_cast<size_t>(it - a.external_ids.begin())];
}

Tensor Model::run_layer(size_t i, Activations& a, const std::vector<Tensor>& in) {
  const LayerSpec& l = spec_.layers[i];
  const Tensor& x = in[0];
  const int64_t po = local_param(i);
  switch (l.kind) {
    case LayerKind::kConv2d: {
      const auto shapes = l.param_shapes();
      const Tensor w = st_.params.slice(po, tandem::Shape(shapes[0]));
      const Tensor b = l.bias ? st_.params.slice(po + tandem::Shape(shapes[0]).numel(), tandem::Shape{l.out_channels}) : Tensor();
      return backend_.conv_forward(as4d(backend_, x), w, b, conv_params(l));
    }
    case LayerKind::kLinear: {
      const int64_t in_features = l.in_shapes[0].numel();
      const Tensor w = st_.params.slice(po, tandem::Shape{l.out_features, in_features});
      const Tensor b = l.bias ? st_.params.slice(po + l.out_features * in_features, tandem::Shape{l.out_features}) : Tensor();
      return backend_.linear_forward(x, w, b);
    }
    case LayerKind::kBatchNorm2d: {
      const int64_t c = l.in_shapes[0].c;
      const Tensor gamma = st_.params.slice(po, tandem::Shape{c}), beta = st_.params.slice(po + c, tandem::Shape{c});
      Tensor mean = st_.buffers.slice(local_buffer(i), tandem::Shape{c}), var = st_.buffers.slice(local_buffer(i) + c, tandem::Shape{c});
      if (!a.training) return backend_.batch_norm_forward_inference(x, gamma, beta, mean, var, l.eps);
      compute::BatchNormParams bp;
      bp.eps = l.eps;
      bp.momentum = l.momentum;
      auto r = backend_.batch_norm_forward_training(x, gamma, beta, mean, var, bp);
      a.extra1[i] = std::move(r.mean);
      a.extra2[i] = std::move(r.var);
      return std::move(r.y);
    }
    case LayerKind::kReLU:
    case LayerKind::kReLU6: {
      const bool inplace = inplace_relu_[i] && l.inputs[0] >= static_cast<int32_t>(a.begin);
      return backend_.activation_forward(activation_of(l.kind), x, inplace);
    }
    case LayerKind::kMaxPool2d:
    case LayerKind::kAvgPool2d: {
      auto r = backend_.pool_forward(l.kind == LayerKind::kMaxPool2d ? PoolKind::kMax : PoolKind::kAvg,
                                     as4d(backend_, x), pool_params(l));
      if (a.training) a.extra1[i] = std::move(r.workspace);
      return std::move(r.y);
    }
    case LayerKind::kGlobalAvgPool:
      return backend_.global_avg_pool_forward(as4d(backend_, x));
    case LayerKind::kFlatten:
      return backend_.to_plain(x).view(tandem::Shape{x.dim(0), x.numel() / x.dim(0)});
    case LayerKind::kAdd:
      return backend_.add(x, conform(backend_, in[1], x.shape()));
    case LayerKind::kConcat:
      return concat_forward(backend_, in, l);
    default:
      break;  // spec-only kinds: refused by the constructor
  }
  TANDEM_THROW(Status::kInternal, "layer '{}': unhandled kind", l.name);
}

std::vector<Tensor> Model::forward_range(size_t begin, size_t end, const std::vector<Tensor>& inputs,
                                         Activations& a, bool training) {
  TANDEM_REQUIRE(begin < end && end <= num_layers(), "model '{}': forward over layers [{}, {}) of {}", spec_.name,
                 begin, end, num_layers());
  require_held(begin, end, "forward");
  storage();
  a.clear();
  a.begin = begin;
  a.end = end;
  a.training = training;
  a.external_ids = spec_.crossing(begin);
  TANDEM_REQUIRE(inputs.size() == a.external_ids.size(), "model '{}': layers [{}, {}) take {} input tensor(s), got {}",
                 spec_.name, begin, end, a.external_ids.size(), inputs.size());
  a.external = inputs;
  for (size_t k = 0; k < inputs.size(); ++k) {
    TANDEM_REQUIRE(inputs[k].defined() && inputs[k].rank() >= 2, "model '{}': input {} of layer {} must be [N, ...]",
                   spec_.name, k, begin);
  }
  a.batch = inputs[0].dim(0);
  const size_t n = num_layers();
  a.out.assign(n, Tensor());
  a.extra1.assign(n, Tensor());
  a.extra2.assign(n, Tensor());
  const std::vector<int32_t> outputs = end == n ? std::vector<int32_t>{static_cast<int32_t>(n - 1)} : spec_.crossing(end);
  // In inference, outputs are released once every reader in the range has run.
  std::vector<int> pending(n, 0);
  if (!training) {
    for (size_t i = begin; i < end; ++i) {
      for (int32_t p : spec_.layers[i].inputs) {
        if (p >= static_cast<int32_t>(begin)) ++pending[static_cast<size_t>(p)];
      }
    }
  }
  std::vector<Tensor> in;
  for (size_t i = begin; i < end; ++i) {
    in.clear();
    for (int32_t p : spec_.layers[i].inputs) in.push_back(input_of(a, p));
    a.out[i] = run_layer(i, a, in);
    if (training) continue;
    for (int32_t p : spec_.layers[i].inputs) {
      if (p < static_cast<int32_t>(begin) || --pending[static_cast<size_t>(p)] > 0) continue;
      if (std::find(outputs.begin(), outputs.end(), p) == outputs.end()) a.out[static_cast<size_t>(p)] = Tensor();
    }
  }
  std::vector<Tensor> result;
  for (int32_t id : outputs) result.push_back(input_of(a, id));
  if (end == n) {
    Tensor y = backend_.to_plain(result[0]);
    result[0] = y.view(tandem::Shape{y.dim(0), y.numel() / y.dim(0)});
  }
  return result;
}

void Model::add_grad(Activations& a, int32_t producer, Tensor g) {
  if (producer == kModelInput) return;  // nobody needs the gradient of the data
  Tensor* slot;
  tandem::Shape shape;
  if (producer >= static_cast<int32_t>(a.begin)) {
    slot = &a.grad[static_cast<size_t>(producer)];
    shape = a.out[static_cast<size_t>(producer)].shape();
  } else {
    const auto k = static_cast<size_t>(
        std::find(a.external_ids.begin(), a.external_ids.end(), producer) - a.external_ids.begin());
    slot = &a.grad[num_layers() + k];
    shape = a.external[k].shape();
  }
  g = conform(backend_, g, shape);
  // A fresh sum, never in place: the existing gradient may share storage with another branch's.
  *slot = slot->defined() ? backend_.add(*slot, g) : std::move(g);
}

void Model::backward_layer(size_t i, Activations& a, bool accumulate) {
  const LayerSpec& l = spec_.layers[i];
  const auto release = [&] {
    a.out[i] = Tensor();
    a.grad[i] = Tensor();
    a.extra1[i] = Tensor();
    a.extra2[i] = Tensor();
  };
  // A gradient is wanted for an input from before this range (a pipeline stage sends it back
  // whatever that stage holds) or from a layer with parameters at or before it (layers are in
  // topological order). Skipping the rest saves, e.g., the dx GEMM of the MLP's first linear
  // layer (it reads a flatten of the input): 15% of the MLP's GEMM time.
  const auto wanted = [&](int32_t p) {
    return p != kModelInput && (p < static_cast<int32_t>(a.begin) || param_off_[static_cast<size_t>(p) + 1] > 0);
  };
  if (l.params == 0 && std::none_of(l.inputs.begin(), l.inputs.end(), wanted)) return release();  // nothing to do
  Tensor dy = a.grad[i];
  if (!dy.defined()) dy = backend_.zeros(a.out[i].shape());  // output unused downstream
  const Tensor x = input_of(a, l.inputs[0]);
  const bool want_dx = wanted(l.inputs[0]);
  const int64_t po = local_param(i);
  switch (l.kind) {
    case LayerKind::kConv2d: {
      const auto shapes = l.param_shapes();
      const tandem::Shape ws(shapes[0]);
      const Tensor w = st_.params.slice(po, ws);
      const Tensor x4 = as4d(backend_, x);
      Tensor dw = st_.grads.slice(po, ws);
      Tensor db = l.bias ? st_.grads.slice(po + ws.numel(), tandem::Shape{l.out_channels}) : Tensor();
      backend_.conv_backward_weights(x4, dy, dw, db, conv_params(l), accumulate);
      if (want_dx) add_grad(a, l.inputs[0], backend_.conv_backward_data(dy, w, x4.shape(), conv_params(l)));
      break;
    }
    case LayerKind::kLinear: {
      const int64_t in_features = l.in_shapes[0].numel();
      const tandem::Shape ws{l.out_features, in_features};
      dy = conform(backend_, dy, tandem::Shape{a.batch, l.out_features});
      Tensor dw = st_.grads.slice(po, ws);
      Tensor db = l.bias ? st_.grads.slice(po + ws.numel(), tandem::Shape{l.out_features}) : Tensor();
      backend_.linear_backward_weights(x, dy, dw, db, accumulate);
      if (want_dx) add_grad(a, l.inputs[0], backend_.linear_backward_data(dy, st_.params.slice(po, ws), x.shape()));
      break;
    }
    case LayerKind::kBatchNorm2d: {
      const int64_t c = l.in_shapes[0].c;
      Tensor dgamma = st_.grads.slice(po, tandem::Shape{c}), dbeta = st_.grads.slice(po + c, tandem::Shape{c});
      Tensor dx = backend_.batch_norm_backward(dy, x, st_.params.slice(po, tandem::Shape{c}), a.extra1[i], a.extra2[i], l.eps,
                                               dgamma, dbeta, accumulate);
      if (want_dx) add_grad(a, l.inputs[0], std::move(dx));
      break;
    }
    case LayerKind::kReLU:
    case LayerKind::kReLU6:
      if (want_dx) add_grad(a, l.inputs[0], backend_.activation_backward(activation_of(l.kind), dy, a.out[i]));
      break;
    case LayerKind::kMaxPool2d:
    case LayerKind::kAvgPool2d:
      if (want_dx) {
        add_grad(a, l.inputs[0],
                 backend_.pool_backward(l.kind == LayerKind::kMaxPool2d ? PoolKind::kMax : PoolKind::kAvg, dy,
                                        a.extra1[i], as4d(backend_, x).shape(), pool_params(l)));
      }
      break;
    case LayerKind::kGlobalAvgPool:
      if (want_dx) {
        const Tensor x4 = as4d(backend_, x);
        add_grad(a, l.inputs[0],
                 backend_.global_avg_pool_backward(conform(backend_, dy, tandem::Shape{a.batch, x4.dim(1)}), x4.shape()));
      }
      break;
    case LayerKind::kFlatten:
      if (want_dx) add_grad(a, l.inputs[0], conform(backend_, dy, x.shape()));
      break;
    case LayerKind::kAdd:
      add_grad(a, l.inputs[0], dy);
      add_grad(a, l.inputs[1], dy);
      break;
    case LayerKind::kConcat:
      for (size_t k = 0; k < l.inputs.size(); ++k) {
        if (l.inputs[k] != kModelInput) add_grad(a, l.inputs[k], concat_backward(backend_, dy, l, k));
      }
      break;
    default:
      TANDEM_THROW(Status::kInternal, "layer '{}': unhandled kind", l.name);
  }
  release();
  if (l.params > 0 && grad_ready_) grad_ready_(i);
}

std::vector<Tensor> Model::backward_range(const std::vector<Tensor>& grads, Activations& a, bool accumulate) {
  TANDEM_REQUIRE(a.training && a.end > a.begin && !a.out.empty(),
                 "model '{}': backward needs the activations of a training forward pass", spec_.name);
  require_held(a.begin, a.end, "backward");
  storage();
  const size_t n = num_layers();
  const std::vector<int32_t> outputs =
      a.end == n ? std::vector<int32_t>{static_cast<int32_t>(n - 1)} : spec_.crossing(a.end);
  TANDEM_REQUIRE(grads.size() == outputs.size(), "model '{}': backward over [{}, {}) takes {} gradient(s), got {}",
                 spec_.name, a.begin, a.end, outputs.size(), grads.size());
  a.grad.assign(n + a.external_ids.size(), Tensor());
  for (size_t k = 0; k < outputs.size(); ++k) {
    TANDEM_REQUIRE(grads[k].defined() && grads[k].dim(0) == a.batch,
                   "model '{}': gradient {} must be defined with batch {}", spec_.name, k, a.batch);
    add_grad(a, outputs[k], grads[k]);
  }
  for (size_t i = a.end; i-- > a.begin;) backward_layer(i, a, accumulate);
  std::vector<Tensor> result(a.external_ids.size());
  for (size_t k = 0; k < result.size(); ++k) result[k] = a.grad[n + k];
  a.clear();
  return result;
}

Tensor Model::forward(const Tensor& x, bool training) {
  return forward_range(0, num_layers(), {x}, acts_, training)[0];
}

void Model::backward(const Tensor& dlogits, bool accumulate) { backward_range({dlogits}, acts_, accumulate); }

}  // namespace tandem::engine::nn
