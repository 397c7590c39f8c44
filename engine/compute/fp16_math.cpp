#include "engine/compute/fp16_math.hpp"

#include <algorithm>
#include <string>

#include "engine/core/dtype.hpp"
#include "engine/core/error.hpp"

namespace tandem::engine::compute {

void round_to_half(float* x, int64_t n) noexcept {
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) x[i] = half_to_float(float_to_half(x[i]));
}

namespace {

class Fp16Emulation final : public Backend {
 public:
  explicit Fp16Emulation(std::unique_ptr<Backend> inner) : be_(std::move(inner)) {
    TANDEM_REQUIRE(be_ && be_->device().is_cpu(), "fp16 emulation: wraps a host backend (cpu or reference), not {}",
                   be_ ? std::string(be_->name()) : std::string("nothing"));
  }

  std::string_view name() const override { return be_->name(); }
  Device device() const override { return be_->device(); }
  void set_num_threads(int n) override { be_->set_num_threads(n); }
  int num_threads() const override { return be_->num_threads(); }
  void synchronize() override { be_->synchronize(); }
  Tensor empty(const Shape& s, DType t) override { return be_->empty(s, t); }
  Tensor zeros(const Shape& s, DType t) override { return be_->zeros(s, t); }
  Tensor to_plain(const Tensor& x) override { return be_->to_plain(x); }
  void copy(const Tensor& src, Tensor& dst) override { be_->copy(src, dst); }
  Tensor to_host(const Tensor& x) override { return be_->to_host(x); }

  // ---- convolution: fp16 operands and fp16 results, bias in f32 ----
  Tensor conv_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const ConvParams& p) override {
    if (x.dtype() != DType::kF32) return be_->conv_forward(x, w, bias, p);
    // The wrapped backend's result is fresh (or its fresh plain copy): rounded in place.
    Tensor y = be_->to_plain(be_->conv_forward(half(x), half(w), Tensor(), p));
    round_to_half(y.data<float>(), y.numel());
    if (bias.defined()) add_bias(y, bias);
    return y;
  }
  Tensor conv_backward_data(const Tensor& dy, const Tensor& w, const Shape& x_shape, const ConvParams& p) override {
    Tensor dx = be_->to_plain(be_->conv_backward_data(half(dy), half(w), x_shape, p));
    round_to_half(dx.data<float>(), dx.numel());
    return dx;
  }
  void conv_backward_weights(const Tensor& x, const Tensor& dy, Tensor& dw, Tensor& dbias, const ConvParams& p,
                             bool accumulate) override {
    Tensor g = be_->empty(dw.shape(), DType::kF32), none;
    be_->conv_backward_weights(half(x), half(dy), g, none, p, false);
    round_to_half(g.data<float>(), g.numel());
    if (accumulate) {
      be_->add_inplace(dw, g);
    } else {
      be_->copy(g, dw);
    }
    if (dbias.defined()) bias_grad(dy, dbias, accumulate);
  }

  // ---- linear: fp16 operands, f32 result ----
  Tensor linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias) override {
    if (x.dtype() != DType::kF32) return be_->linear_forward(x, w, bias);
    return be_->linear_forward(half(x), half(w), bias);
  }
  Tensor linear_backward_data(const Tensor& dy, const Tensor& w, const Shape& x_shape) override {
    return be_->linear_backward_data(half(dy), half(w), x_shape);
  }
  void linear_backward_weights(const Tensor& x, const Tensor& dy, Tensor& dw, Tensor& dbias,
                               bool accumulate) override {
    Tensor none;
    be_->linear_backward_weights(half(x), half(dy), dw, none, accumulate);
    if (dbias.defined()) bias_grad(dy, dbias, accumulate);
  }

  // ---- the rest: the wrapped backend's f32 ----
  BatchNormForward batch_norm_forward_training(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                               Tensor& running_mean, Tensor& running_var,
                                               const BatchNormParams& p) override {
    return be_->batch_norm_forward_training(x, gamma, beta, running_mean, running_var, p);
  }
  Tensor batch_norm_forward_inference(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                      const Tensor& running_mean, const Tensor& running_var, float eps) override {
    return be_->batch_norm_forward_inference(x, gamma, beta, running_mean, running_var, eps);
  }
  Tensor batch_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                             const Tensor& var, float eps, Tensor& dgamma, Tensor& dbeta, bool accumulate) override {
    return be_->batch_norm_backward(dy, x, gamma, mean, var, eps, dgamma, dbeta, accumulate);
  }
  Tensor activation_forward(Activation a, const Tensor& x, bool in_place) override {
    return be_->activation_forward(a, x, in_place);
  }
  Tensor activation_backward(Activation a, const Tensor& dy, const Tensor& y) override {
    return be_->activation_backward(a, dy, y);
  }
  PoolForward pool_forward(PoolKind kind, const Tensor& x, const PoolParams& p) override {
    return be_->pool_forward(kind, x, p);
  }
  Tensor pool_backward(PoolKind kind, const Tensor& dy, const Tensor& ws, const Shape& x_shape,
                       const PoolParams& p) override {
    return be_->pool_backward(kind, dy, ws, x_shape, p);
  }
  Tensor global_avg_pool_forward(const Tensor& x) override { return be_->global_avg_pool_forward(x); }
  Tensor global_avg_pool_backward(const Tensor& dy, const Shape& x_shape) override {
    return be_->global_avg_pool_backward(dy, x_shape);
  }
  DropoutForward dropout_forward(const Tensor& x, float p, uint64_t seed) override {
    return be_->dropout_forward(x, p, seed);
  }
  Tensor dropout_backward(const Tensor& dy, const Tensor& mask, float p) override {
    return be_->dropout_backward(dy, mask, p);
  }
  LossOutput softmax_cross_entropy(const Tensor& logits, const Tensor& labels, bool want_grad,
                                   int64_t normalizer) override {
    return be_->softmax_cross_entropy(logits, labels, want_grad, normalizer);
  }
  Tensor add(const Tensor& a, const Tensor& b) override { return be_->add(a, b); }
  void add_inplace(Tensor& a, const Tensor& b) override { be_->add_inplace(a, b); }
  void scale(Tensor& x, float alpha) override { be_->scale(x, alpha); }
  void axpy(float alpha, const Tensor& x, Tensor& y) override { be_->axpy(alpha, x, y); }
  void fill(Tensor& x, float value) override { be_->fill(x, value); }
  double sum_squares(const Tensor& x) override { return be_->sum_squares(x); }
  void sgd_update(Tensor& param, const Tensor& grad, Tensor& buf, const SgdParams& p) override {
    be_->sgd_update(param, grad, buf, p);
  }
  void adam_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamParams& p) override {
    be_->adam_update(param, grad, m, v, p);
  }

 private:
  // A plain f32 copy of x rounded to half (x itself is never changed: it is the caller's f32 tensor).
  Tensor half(const Tensor& x) {
    TANDEM_REQUIRE(x.defined() && x.dtype() == DType::kF32, "fp16 emulation: operands must be f32 tensors, got {}",
                   x.defined() ? x.str() : std::string("an undefined tensor"));
    const Tensor p = be_->to_plain(x);
    Tensor h = be_->empty(x.shape(), DType::kF32);
    be_->copy(p, h);
    round_to_half(h.data<float>(), h.numel());
    return h;
  }
  // y [N, O, ...] += bias[o] (plain y).
  static void add_bias(Tensor& y, const Tensor& bias) {
    const Tensor b = bias;
    const float* pb = b.data<float>();
    float* py = y.data<float>();
    const int64_t N = y.dim(0), O = y.dim(1), S = y.numel() / std::max<int64_t>(N * O, 1);
#pragma omp parallel for collapse(2) schedule(static) if (y.numel() > (1 << 16))
    for (int64_t n = 0; n < N; ++n)
      for (int64_t o = 0; o < O; ++o) {
        float* row = py + (n * O + o) * S;
        for (int64_t s = 0; s < S; ++s) row[s] += pb[o];
      }
  }
  // dbias[o] (+)= sum over n and space of the f32 dy, accumulated in double.
  void bias_grad(const Tensor& dy, Tensor& dbias, bool accumulate) {
    const Tensor d = be_->to_plain(dy);
    const float* pd = d.data<float>();
    float* pb = dbias.data<float>();
    const int64_t N = d.dim(0), O = dbias.numel(), S = d.numel() / std::max<int64_t>(N * O, 1);
    for (int64_t o = 0; o < O; ++o) {
      double s = 0;
      for (int64_t n = 0; n < N; ++n) {
        const float* row = pd + (n * O + o) * S;
        for (int64_t k = 0; k < S; ++k) s += row[k];
      }
      pb[o] = static_cast<float>(accumulate ? pb[o] + s : s);
    }
  }

  std::unique_ptr<Backend> be_;
};

}  // namespace

std::unique_ptr<Backend> make_fp16_emulation(std::unique_ptr<Backend> inner) {
  return std::make_unique<Fp16Emulation>(std::move(inner));
}

bool is_fp16_emulation(const Backend& be) noexcept { return dynamic_cast<const Fp16Emulation*>(&be) != nullptr; }

}  // namespace tandem::engine::compute
