#pragma once
// The compute-backend interface: every op a layer, loss or optimizer needs, implemented by
//   "reference"  plain loops, no dependencies; the yardstick for tests,
//   "cpu"        oneDNN primitives cached per shape, activations in blocked layouts,
//   "cuda"       cuDNN / cuBLAS / CUDA kernels (built when a CUDA toolkit is found).
//
// Conventions
// - Activations are NCHW by shape ([N, C, H, W]); 2-D activations are [N, features].
//   Conv weights are [O, C/groups, KH, KW]; linear weights [out, in] (y = x W^T + b).
// - Ops RETURN new activation tensors, which may carry an opaque backend layout (see
//   engine/core/tensor.hpp): pass them on to the same backend's ops freely; call to_plain()
//   before reading values. Ops accept plain inputs and this backend's own layouts.
// - Parameter gradients are written into caller-provided PLAIN tensors (views into a flat
//   gradient buffer are fine): overwritten, or added to when `accumulate` is true (micro-batches).
// - Parameters, gradients and optimizer state are plain f32.
// - Inputs live on the backend's device(); labels are i32 or i64.
// - A Backend instance is used by one thread at a time (Threads: per instance). Caches of
//   primitives are per instance.
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/tensor.hpp"

namespace tandem::engine::compute {

struct ConvParams {
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;        // symmetric: top = bottom = pad_h, left = right = pad_w
  int64_t dilation_h = 1, dilation_w = 1;  // 1 = dense kernel (PyTorch convention)
  int64_t groups = 1;                  // groups == C == O: depthwise
};
// [N, O, OH, OW] for x [N, C, H, W] and w [O, C/groups, KH, KW]; validates everything and
// throws kInvalidArgument naming the mismatch.
Shape conv_output_shape(const Shape& x, const Shape& w, const ConvParams& p);

enum class PoolKind : int32_t { kMax = 0, kAvg = 1 };
struct PoolParams {
  int64_t kernel_h = 2, kernel_w = 2;
  int64_t stride_h = 2, stride_w = 2;
  int64_t pad_h = 0, pad_w = 0;
  bool count_include_pad = true;  // average pooling divisor (PyTorch's default: include padding)
};
Shape pool_output_shape(const Shape& x, const PoolParams& p);  // floor mode

struct PoolForward {
  Tensor y;
  Tensor workspace;  // max pooling: where each maximum came from (backend-specific); pass to backward
};

struct BatchNormParams {
  float eps = 1e-5f;
  float momentum = 0.1f;  // running = (1 - momentum) * running + momentum * batch (PyTorch convention);
                          // the running variance uses the unbiased batch variance n / (n - 1)
};
struct BatchNormForward {
  Tensor y;
  Tensor mean;  // [C] batch mean, saved for backward
  Tensor var;   // [C] biased batch variance, saved for backward
};

enum class Activation : int32_t { kRelu = 0, kRelu6 = 1 };

struct LossOutput {
  double loss = 0;      // sum over the batch of -log softmax(logits)[label], divided by the normalizer
  int64_t correct = 0;  // rows whose arg-max equals the label
  Tensor dlogits;       // [N, K] plain: (softmax - onehot) / normalizer; undefined unless asked for
};

struct DropoutForward {
  Tensor y;     // x * mask / (1 - p)
  Tensor mask;  // u8, x's shape, 1 = kept; the same (seed, element index) gives the same mask on every backend
};

struct SgdParams {
  float lr = 0.01f;
  float momentum = 0.0f;
  float dampening = 0.0f;
  float weight_decay = 0.0f;  // L2 added to the gradient (PyTorch SGD)
  bool nesterov = false;
  int64_t step = 1;           // 1-based; on step 1 the momentum buffer is set to the gradient
};
struct AdamParams {
  float lr = 1e-3f;
  float beta1 = 0.9f, beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  bool decoupled_weight_decay = false;  // true: AdamW (param *= 1 - lr * wd); false: L2 in the gradient
  int64_t step = 1;                     // 1-based, for bias correction
};

struct BackendOptions {
  int num_threads = 0;     // 0: leave the process default (OMP_NUM_THREADS or all cores)
  int device_index = 0;    // cuda:N
};

// Interface: pure virtuals only.
class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string_view name() const = 0;  // "reference", "cpu", "cuda"
  virtual Device device() const = 0;
  // Threads used by this backend's ops on the calling thread (cpu: OpenMP threads used by
  // oneDNN and the elementwise loops). n >= 1.
  virtual void set_num_threads(int n) = 0;
  virtual int num_threads() const = 0;
  // Waits until queued device work is done (no-op on the host backends).
  virtual void synchronize() = 0;

  // ---- memory ----
  virtual Tensor empty(const Shape& shape, DType dtype = DType::kF32) = 0;  // plain, on device()
  virtual Tensor zeros(const Shape& shape, DType dtype = DType::kF32) = 0;
  // Plain copy of x on device(); returns x itself when it already is plain on device().
  virtual Tensor to_plain(const Tensor& x) = 0;
  // Copies plain src into plain dst (same shape and dtype); host <-> device where supported.
  virtual void copy(const Tensor& src, Tensor& dst) = 0;
  // Plain host copy of x (for reading values, checkpoints, tests).
  virtual Tensor to_host(const Tensor& x) = 0;

  // ---- convolution ----
  // x [N, C, H, W], w [O, C/groups, KH, KW], bias [O] or undefined -> y [N, O, OH, OW].
  virtual Tensor conv_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const ConvParams& p) = 0;
  // dy [N, O, OH, OW] -> dx of x_shape.
  virtual Tensor conv_backward_data(const Tensor& dy, const Tensor& w, const Shape& x_shape,
                                    const ConvParams& p) = 0;
  // dw (plain, w's shape) and dbias ([O] or undefined to skip) from x and dy.
  virtual void conv_backward_weights(const Tensor& x, const Tensor& dy, Tensor& dw, Tensor& dbias,
                                     const ConvParams& p, bool accumulate = false) = 0;

  // ---- batch normalization (x [N, C, H, W] or [N, C]; gamma, beta, running stats [C]) ----
  // Training: normalises with batch statistics and updates running_mean / running_var in place.
  virtual BatchNormForward batch_norm_forward_training(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                                       Tensor& running_mean, Tensor& running_var,
                                                       const BatchNormParams& p) = 0;
  virtual Tensor batch_norm_forward_inference(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                              const Tensor& running_mean, const Tensor& running_var,
                                              float eps) = 0;
  // Returns dx; writes dgamma, dbeta.
  virtual Tensor batch_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                                     const Tensor& var, float eps, Tensor& dgamma, Tensor& dbeta,
                                     bool accumulate = false) = 0;

  // ---- activations ----
  // in_place: the result reuses x's storage (x's values are then gone; backward needs only y).
  virtual Tensor activation_forward(Activation a, const Tensor& x, bool in_place = false) = 0;
  // dx from dy and the forward OUTPUT y: relu dx = dy * (y > 0); relu6 dx = dy * (0 < y < 6).
  virtual Tensor activation_backward(Activation a, const Tensor& dy, const Tensor& y) = 0;

  // ---- pooling ----
  virtual PoolForward pool_forward(PoolKind kind, const Tensor& x, const PoolParams& p) = 0;
  virtual Tensor pool_backward(PoolKind kind, const Tensor& dy, const Tensor& workspace, const Shape& x_shape,
                               const PoolParams& p) = 0;
  // x [N, C, H, W] -> plain [N, C] (mean over H, W); backward takes dy [N, C] -> dx of x_shape.
  virtual Tensor global_avg_pool_forward(const Tensor& x) = 0;
  virtual Tensor global_avg_pool_backward(const Tensor& dy, const Shape& x_shape) = 0;

  // ---- linear: x [N, ...] (flattened to [N, in]), w [out, in], bias [out] or undefined ----
  virtual Tensor linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias) = 0;  // plain [N, out]
  virtual Tensor linear_backward_data(const Tensor& dy, const Tensor& w, const Shape& x_shape) = 0;
  virtual void linear_backward_weights(const Tensor& x, const Tensor& dy, Tensor& dw, Tensor& dbias,
                                       bool accumulate = false) = 0;

  // ---- dropout (training only; p in [0, 1)) ----
  virtual DropoutForward dropout_forward(const Tensor& x, float p, uint64_t seed) = 0;
  virtual Tensor dropout_backward(const Tensor& dy, const Tensor& mask, float p) = 0;

  // ---- loss: softmax cross-entropy over logits [N, K] and labels [N] (i32/i64, in [0, K)) ----
  // normalizer 0 means N (mean over the batch); pass the global batch size for micro-batches.
  virtual LossOutput softmax_cross_entropy(const Tensor& logits, const Tensor& labels, bool want_grad = true,
                                           int64_t normalizer = 0) = 0;

  // ---- elementwise (f32; same shapes; layouts may differ, the result takes a's) ----
  virtual Tensor add(const Tensor& a, const Tensor& b) = 0;
  virtual void add_inplace(Tensor& a, const Tensor& b) = 0;          // a += b
  virtual void scale(Tensor& x, float alpha) = 0;                    // x *= alpha
  virtual void axpy(float alpha, const Tensor& x, Tensor& y) = 0;    // y += alpha * x
  virtual void fill(Tensor& x, float value) = 0;
  virtual double sum_squares(const Tensor& x) = 0;                   // for gradient-norm clipping

  // ---- fused optimizer updates over flat plain f32 buffers of equal numel ----
  // SGD (PyTorch semantics): g = grad + wd * param; buf = step == 1 ? g : momentum * buf + (1 - dampening) * g;
  // d = nesterov ? g + momentum * buf : buf; param -= lr * d. momentum_buf is unused when momentum == 0.
  virtual void sgd_update(Tensor& param, const Tensor& grad, Tensor& momentum_buf, const SgdParams& p) = 0;
  // Adam / AdamW (PyTorch semantics), m and v updated in place.
  virtual void adam_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamParams& p) = 0;
};

// ---- registry (built-ins: "reference", "cpu", and "cuda" when compiled in) ----
using BackendFactory = std::function<std::unique_ptr<Backend>(const BackendOptions&)>;
// Throws kInvalidArgument listing the known names when `name` is unknown, kUnsupported when the
// backend is compiled in but unusable here (e.g. "cuda" without a device), with the reason.
// `name` may be "cuda:N": the device index N (kInvalidArgument for another backend or a malformed index).
std::unique_ptr<Backend> make_backend(std::string_view name, const BackendOptions& options = {});
void register_backend(const std::string& name, BackendFactory factory);  // replaces an existing one
std::vector<std::string> backend_names();
bool backend_compiled(std::string_view name);

}  // namespace tandem::engine::compute
