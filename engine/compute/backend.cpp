#include "engine/compute/backend.hpp"

#include <algorithm>
#include <charconv>
#include <map>
#include <mutex>

#include "engine/compute/fp16_math.hpp"
#include "engine/compute/validate.hpp"
#include "engine/core/settings.hpp"
#include "engine/core/error.hpp"

namespace tandem::engine::compute {

// Built-ins live in their own folders; declared here so the registry can list them without
// static initializers (which the linker would drop from the archives).
std::unique_ptr<Backend> make_reference_backend(const BackendOptions& options);
std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& options);
#if TANDEM_HAVE_CUDA_BACKEND
std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options);
#endif

Shape conv_output_shape(const Shape& x, const Shape& w, const ConvParams& p) {
  validate::conv_params(p);
  TANDEM_REQUIRE(x.rank() == 4, "conv: input must be [N, C, H, W], got {}", x.str());
  TANDEM_REQUIRE(w.rank() == 4, "conv: weights must be [O, C/groups, KH, KW], got {}", w.str());
  const int64_t C = x[1], O = w[0];
  TANDEM_REQUIRE(C % p.groups == 0 && O % p.groups == 0, "conv: groups {} must divide input channels {} and output channels {}",
                 p.groups, C, O);
  TANDEM_REQUIRE(w[1] * p.groups == C, "conv: weights {} expect {} input channels (groups {}), input {} has {}",
                 w.str(), w[1] * p.groups, p.groups, x.str(), C);
  const int64_t ekh = (w[2] - 1) * p.dilation_h + 1, ekw = (w[3] - 1) * p.dilation_w + 1;
  const int64_t hp = x[2] + 2 * p.pad_h, wp = x[3] + 2 * p.pad_w;
  TANDEM_REQUIRE(w[2] > 0 && w[3] > 0 && hp >= ekh && wp >= ekw,
                 "conv: kernel {}x{} (dilated {}x{}) larger than padded input {}x{} of {}", w[2], w[3], ekh, ekw, hp, wp,
                 x.str());
  return Shape{x[0], O, (hp - ekh) / p.stride_h + 1, (wp - ekw) / p.stride_w + 1};
}

Shape pool_output_shape(const Shape& x, const PoolParams& p) {
  TANDEM_REQUIRE(x.rank() == 4, "pool: input must be [N, C, H, W], got {}", x.str());
  TANDEM_REQUIRE(p.kernel_h > 0 && p.kernel_w > 0 && p.stride_h > 0 && p.stride_w > 0 && p.pad_h >= 0 && p.pad_w >= 0,
                 "pool: kernel {}x{}, stride {}x{} must be positive and padding {}x{} non-negative", p.kernel_h,
                 p.kernel_w, p.stride_h, p.stride_w, p.pad_h, p.pad_w);
  TANDEM_REQUIRE(2 * p.pad_h <= p.kernel_h && 2 * p.pad_w <= p.kernel_w,
                 "pool: padding {}x{} must be at most half the kernel {}x{}", p.pad_h, p.pad_w, p.kernel_h, p.kernel_w);
  const int64_t hp = x[2] + 2 * p.pad_h, wp = x[3] + 2 * p.pad_w;
  TANDEM_REQUIRE(hp >= p.kernel_h && wp >= p.kernel_w, "pool: kernel {}x{} larger than padded input {}x{} of {}",
                 p.kernel_h, p.kernel_w, hp, wp, x.str());
  return Shape{x[0], x[1], (hp - p.kernel_h) / p.stride_h + 1, (wp - p.kernel_w) / p.stride_w + 1};
}

// ---------------------------------------------------------------- validation

namespace validate {

void tensor(const Tensor& t, const char* op, const char* arg, Device device, int rank, bool allow_f64) {
  TANDEM_REQUIRE(t.defined(), "{}: {} is undefined", op, arg);
  TANDEM_REQUIRE(t.device() == device, "{}: {} {} is on {}, the backend on {}", op, arg, t.str(), t.device().str(),
                 device.str());
  TANDEM_REQUIRE(t.dtype() == DType::kF32 || (allow_f64 && t.dtype() == DType::kF64), "{}: {} {} must be f32{}", op,
                 arg, t.str(), allow_f64 ? " or f64" : "");
  TANDEM_REQUIRE(rank < 0 || t.rank() == rank, "{}: {} must have {} dims, got {}", op, arg, rank, t.shape().str());
}

void same_shape(const Tensor& a, const Tensor& b, const char* op, const char* a_name, const char* b_name) {
  TANDEM_REQUIRE(a.shape() == b.shape(), "{}: {} {} and {} {} differ in shape", op, a_name, a.shape().str(), b_name,
                 b.shape().str());
}

void same_dtype(const Tensor& a, const Tensor& b, const char* op, const char* a_name, const char* b_name) {
  TANDEM_REQUIRE(a.dtype() == b.dtype(), "{}: {} is {} but {} is {}", op, a_name, dtype_name(a.dtype()), b_name,
                 dtype_name(b.dtype()));
}

void plain(const Tensor& t, const char* op, const char* arg, Device device, const Shape& shape, DType dtype) {
  TANDEM_REQUIRE(t.defined(), "{}: {} is undefined (expected {}{})", op, arg, dtype_name(dtype), shape.str());
  TANDEM_REQUIRE(t.device() == device, "{}: {} {} is on {}, the backend on {}", op, arg, t.str(), t.device().str(),
                 device.str());
  TANDEM_REQUIRE(t.is_plain(), "{}: {} {} must be plain", op, arg, t.str());
  TANDEM_REQUIRE(t.dtype() == dtype, "{}: {} must be {}, got {}", op, arg, dtype_name(dtype), dtype_name(t.dtype()));
  TANDEM_REQUIRE(t.shape() == shape, "{}: {} must have shape {}, got {}", op, arg, shape.str(), t.shape().str());
}

void conv_params(const ConvParams& p) {
  TANDEM_REQUIRE(p.stride_h > 0 && p.stride_w > 0, "conv: stride {}x{} must be positive", p.stride_h, p.stride_w);
  TANDEM_REQUIRE(p.pad_h >= 0 && p.pad_w >= 0, "conv: padding {}x{} must be non-negative", p.pad_h, p.pad_w);
  TANDEM_REQUIRE(p.dilation_h > 0 && p.dilation_w > 0, "conv: dilation {}x{} must be positive", p.dilation_h,
                 p.dilation_w);
  TANDEM_REQUIRE(p.groups > 0, "conv: groups {} must be positive", p.groups);
}

Shape conv(const Tensor& x, const Tensor& w, const Tensor& bias, const ConvParams& p, Device device) {
  tensor(x, "conv", "input", device, 4, true);
  tensor(w, "conv", "weights", device, 4, true);
  same_dtype(x, w, "conv", "input", "weights");
  Shape y = conv_output_shape(x.shape(), w.shape(), p);
  if (bias.defined()) plain(bias, "conv", "bias", device, Shape{w.dim(0)}, w.dtype());
  return y;
}

Shape pool(const Tensor& x, const PoolParams& p, Device device) {
  tensor(x, "pool", "input", device, 4, true);
  return pool_output_shape(x.shape(), p);
}

int64_t batch_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, Device device) {
  tensor(x, "batch_norm", "input", device, -1, true);
  TANDEM_REQUIRE(x.rank() == 2 || x.rank() == 4, "batch_norm: input must be [N, C] or [N, C, H, W], got {}",
                 x.shape().str());
  const int64_t C = x.dim(1);
  plain(gamma, "batch_norm", "gamma", device, Shape{C}, x.dtype());
  plain(beta, "batch_norm", "beta", device, Shape{C}, x.dtype());
  return C;
}

std::pair<int64_t, int64_t> linear(const Tensor& x, const Tensor& w, const Tensor& bias, Device device) {
  tensor(x, "linear", "input", device, -1, true);
  tensor(w, "linear", "weights", device, 2, true);
  same_dtype(x, w, "linear", "input", "weights");
  TANDEM_REQUIRE(x.rank() >= 2, "linear: input must be [N, ...], got {}", x.shape().str());
  const int64_t n = x.dim(0), in = x.numel() / std::max<int64_t>(n, 1);
  TANDEM_REQUIRE(in == w.dim(1), "linear: input {} has {} features per sample, weights {} expect {}", x.shape().str(),
                 in, w.shape().str(), w.dim(1));
  if (bias.defined()) plain(bias, "linear", "bias", device, Shape{w.dim(0)}, w.dtype());
  return {n, in};
}

LinearDims linear_data(const Tensor& dy, const Tensor& w, const Shape& x_shape, Device device, bool allow_f64) {
  tensor(dy, "linear_backward_data", "dy", device, 2, allow_f64);
  tensor(w, "linear_backward_data", "weights", device, 2, allow_f64);
  const int64_t N = dy.dim(0), Out = w.dim(0), In = w.dim(1);
  TANDEM_REQUIRE(dy.dim(1) == Out && x_shape.rank() >= 2 && x_shape[0] == N && x_shape.numel() == N * In,
                 "linear_backward_data: dy {} and weights {} do not match input shape {}", dy.shape().str(),
                 w.shape().str(), x_shape.str());
  return {N, In, Out};
}

LinearDims linear_weights(const Tensor& x, const Tensor& dy, const Tensor& dw, const Tensor& dbias, Device device) {
  const auto [N, In] = linear(x, dw, dbias, device);
  plain(dw, "linear_backward_weights", "dw", device, dw.shape(), x.dtype());
  const int64_t Out = dw.dim(0);
  TANDEM_REQUIRE(dy.rank() == 2 && dy.dim(0) == N && dy.dim(1) == Out,
                 "linear_backward_weights: dy must be [{}, {}], got {}", N, Out, dy.shape().str());
  return {N, In, Out};
}

std::pair<int64_t, int64_t> loss(const Tensor& logits, const Tensor& labels, Device device) {
  tensor(logits, "softmax_cross_entropy", "logits", device, 2, true);
  TANDEM_REQUIRE(labels.defined(), "softmax_cross_entropy: labels are undefined");
  TANDEM_REQUIRE(labels.dtype() == DType::kI32 || labels.dtype() == DType::kI64,
                 "softmax_cross_entropy: labels must be i32 or i64, got {}", dtype_name(labels.dtype()));
  TANDEM_REQUIRE(labels.rank() == 1 && labels.dim(0) == logits.dim(0),
                 "softmax_cross_entropy: labels {} must be [N] for logits {}", labels.shape().str(),
                 logits.shape().str());
  TANDEM_REQUIRE(labels.device() == device, "softmax_cross_entropy: labels on {}, backend on {}",
                 labels.device().str(), device.str());
  TANDEM_REQUIRE(logits.dim(1) > 0, "softmax_cross_entropy: logits {} have no classes", logits.shape().str());
  return {logits.dim(0), logits.dim(1)};
}

void optimizer_buffers(const Tensor& param, const Tensor& grad, const Tensor* state1, const Tensor* state2,
                       const char* op, Device device) {
  TANDEM_REQUIRE(param.defined(), "{}: param is undefined", op);
  TANDEM_REQUIRE(param.dtype() == DType::kF32 || param.dtype() == DType::kF64, "{}: param {} must be f32", op,
                 param.str());
  plain(param, op, "param", device, param.shape(), param.dtype());
  auto same = [&](const Tensor& t, const char* name) {
    TANDEM_REQUIRE(t.defined(), "{}: {} is undefined", op, name);
    TANDEM_REQUIRE(t.numel() == param.numel(), "{}: {} has {} elements, param {}", op, name, t.numel(), param.numel());
    plain(t, op, name, device, t.shape(), param.dtype());
  };
  same(grad, "grad");
  if (state1) same(*state1, "state (momentum / m)");
  if (state2) same(*state2, "state (v)");
}

void sgd(const SgdParams& p) {
  TANDEM_REQUIRE(p.lr >= 0 && p.momentum >= 0 && p.weight_decay >= 0 && p.dampening >= 0,
                 "sgd: lr {}, momentum {}, dampening {}, weight_decay {} must be non-negative", p.lr, p.momentum,
                 p.dampening, p.weight_decay);
  TANDEM_REQUIRE(!p.nesterov || (p.momentum > 0 && p.dampening == 0),
                 "sgd: nesterov needs momentum > 0 and zero dampening (momentum {}, dampening {})", p.momentum,
                 p.dampening);
  TANDEM_REQUIRE(p.step >= 1, "sgd: step {} must be >= 1", p.step);
}

void adam(const AdamParams& p) {
  TANDEM_REQUIRE(p.lr >= 0 && p.eps >= 0 && p.weight_decay >= 0, "adam: lr {}, eps {}, weight_decay {} must be non-negative",
                 p.lr, p.eps, p.weight_decay);
  TANDEM_REQUIRE(p.beta1 >= 0 && p.beta1 < 1 && p.beta2 >= 0 && p.beta2 < 1, "adam: betas ({}, {}) must be in [0, 1)",
                 p.beta1, p.beta2);
  TANDEM_REQUIRE(p.step >= 1, "adam: step {} must be >= 1", p.step);
}

void dropout_p(float p) { TANDEM_REQUIRE(p >= 0.0f && p < 1.0f, "dropout: p {} must be in [0, 1)", p); }

}  // namespace validate

// ---------------------------------------------------------------- registry

namespace {

struct Registry {
  std::mutex mu;
  std::map<std::string, BackendFactory, std::less<>> factories;
  Registry() {
    factories["reference"] = make_reference_backend;
    factories["cpu"] = make_cpu_backend;
#if TANDEM_HAVE_CUDA_BACKEND
    factories["cuda"] = make_cuda_backend;
#endif
  }
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

std::unique_ptr<Backend> make_backend(std::string_view spec, const BackendOptions& given) {
  // "cuda:N" names the device too (as `tandem train --device cuda:N`); the index wins over options.device_index.
  BackendOptions options = given;
  std::string_view name = spec;
  if (const size_t colon = spec.find(':'); colon != std::string_view::npos) {
    name = spec.substr(0, colon);
    const std::string_view index = spec.substr(colon + 1);
    TANDEM_REQUIRE(name == "cuda", "compute backend '{}': only cuda takes a device index (cuda:N)", std::string(spec));
    int n = 0;
    const auto [end, ec] = std::from_chars(index.data(), index.data() + index.size(), n);
    TANDEM_REQUIRE(ec == std::errc() && end == index.data() + index.size() && n >= 0 && !index.empty(),
                   "compute backend '{}': the device index '{}' is not a number >= 0", std::string(spec),
                   std::string(index));
    options.device_index = n;
  }
  BackendFactory f;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.factories.find(name);
    if (it == r.factories.end()) {
      std::string known;
      for (auto& [n, _] : r.factories) known += (known.empty() ? "" : ", ") + n;
      TANDEM_THROW(Status::kInvalidArgument, "unknown compute backend '{}' (known: {}{})", std::string(name), known,
                   name == "cuda" ? "; this build has no CUDA backend" : "");
    }
    f = it->second;
  }
  TANDEM_REQUIRE(options.num_threads >= 0, "backend '{}': num_threads {} must be >= 0", std::string(name),
                 options.num_threads);
  std::unique_ptr<Backend> be = f(options);
  // TANDEM_CPU_MATH=fp16: the host backends emulate the cuda backend's fp16 math (fp16_math.hpp).
  if ((name == "cpu" || name == "reference") && settings::current()->text("TANDEM_CPU_MATH").value_or("f32") == "fp16")
    be = make_fp16_emulation(std::move(be));
  return be;
}

void register_backend(const std::string& name, BackendFactory factory) {
  TANDEM_REQUIRE(!name.empty() && factory, "register_backend: needs a name and a factory");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.factories[name] = std::move(factory);
}

std::vector<std::string> backend_names() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::string> out;
  for (auto& [n, _] : r.factories) out.push_back(n);
  return out;
}

bool backend_compiled(std::string_view name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.factories.find(name) != r.factories.end();
}

}  // namespace tandem::engine::compute
