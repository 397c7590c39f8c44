#pragma once
// A backend that hands every op to another one: the base of backends that change a few ops and keep the rest (the
// fp16 emulation, fp16_math.cpp; test doubles that count or inspect calls). Subclasses override what they change and
// call inner() for the rest. Threads: as the inner backend's (per instance).
#include <memory>
#include <utility>

#include "engine/compute/backend.hpp"
#include "engine/core/error.hpp"

namespace tandem::engine::compute {

class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {
    TANDEM_REQUIRE(inner_ != nullptr, "ForwardingBackend: no backend to forward to");
  }

  std::string_view name() const override { return inner_->name(); }
  Device device() const override { return inner_->device(); }
  void set_num_threads(int n) override { inner_->set_num_threads(n); }
  int num_threads() const override { return inner_->num_threads(); }
  void synchronize() override { inner_->synchronize(); }
  Tensor empty(const Shape& s, DType t) override { return inner_->empty(s, t); }
  Tensor zeros(const Shape& s, DType t) override { return inner_->zeros(s, t); }
  Tensor to_plain(const Tensor& x) override { return inner_->to_plain(x); }
  void copy(const Tensor& src, Tensor& dst) override { inner_->copy(src, dst); }
  Tensor to_host(const Tensor& x) override { return inner_->to_host(x); }
  Tensor conv_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const ConvParams& p) override {
    return inner_->conv_forward(x, w, bias, p);
  }
  Tensor conv_backward_data(const Tensor& dy, const Tensor& w, const Shape& x_shape, const ConvParams& p) override {
    return inner_->conv_backward_data(dy, w, x_shape, p);
  }
  void conv_backward_weights(const Tensor& x, const Tensor& dy, Tensor& dw, Tensor& dbias, const ConvParams& p,
                             bool accumulate) override {
    inner_->conv_backward_weights(x, dy, dw, dbias, p, accumulate);
  }
  BatchNormForward batch_norm_forward_training(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                               Tensor& running_mean, Tensor& running_var,
                                               const BatchNormParams& p) override {
    return inner_->batch_norm_forward_training(x, gamma, beta, running_mean, running_var, p);
  }
  Tensor batch_norm_forward_inference(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                      const Tensor& running_mean, const Tensor& running_var, float eps) override {
    return inner_->batch_norm_forward_inference(x, gamma, beta, running_mean, running_var, eps);
  }
  Tensor batch_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                             const Tensor& var, float eps, Tensor& dgamma, Tensor& dbeta, bool accumulate) override {
    return inner_->batch_norm_backward(dy, x, gamma, mean, var, eps, dgamma, dbeta, accumulate);
  }
  Tensor activation_forward(Activation a, const Tensor& x, bool in_place) override {
    return inner_->activation_forward(a, x, in_place);
  }
  Tensor activation_backward(Activation a, const Tensor& dy, const Tensor& y) override {
    return inner_->activation_backward(a, dy, y);
  }
  PoolForward pool_forward(PoolKind kind, const Tensor& x, const PoolParams& p) override {
    return inner_->pool_forward(kind, x, p);
  }
  Tensor pool_backward(PoolKind kind, const Tensor& dy, const Tensor& ws, const Shape& x_shape,
                       const PoolParams& p) override {
    return inner_->pool_backward(kind, dy, ws, x_shape, p);
  }
  Tensor global_avg_pool_forward(const Tensor& x) override { return inner_->global_avg_pool_forward(x); }
  Tensor global_avg_pool_backward(const Tensor& dy, const Shape& x_shape) override {
    return inner_->global_avg_pool_backward(dy, x_shape);
  }
  Tensor linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias) override {
    return inner_->linear_forward(x, w, bias);
  }
  Tensor linear_backward_data(const Tensor& dy, const Tensor& w, const Shape& x_shape) override {
    return inner_->linear_backward_data(dy, w, x_shape);
  }
  void linear_backward_weights(const Tensor& x, const Tensor& dy, Tensor& dw, Tensor& dbias,
                               bool accumulate) override {
    inner_->linear_backward_weights(x, dy, dw, dbias, accumulate);
  }
  DropoutForward dropout_forward(const Tensor& x, float p, uint64_t seed) override {
    return inner_->dropout_forward(x, p, seed);
  }
  Tensor dropout_backward(const Tensor& dy, const Tensor& mask, float p) override {
    return inner_->dropout_backward(dy, mask, p);
  }
  LossOutput softmax_cross_entropy(const Tensor& logits, const Tensor& labels, bool want_grad,
                                   int64_t normalizer) override {
    return inner_->softmax_cross_entropy(logits, labels, want_grad, normalizer);
  }
  Tensor add(const Tensor& a, const Tensor& b) override { return inner_->add(a, b); }
  void add_inplace(Tensor& a, const Tensor& b) override { inner_->add_inplace(a, b); }
  void scale(Tensor& x, float alpha) override { inner_->scale(x, alpha); }
  void axpy(float alpha, const Tensor& x, Tensor& y) override { inner_->axpy(alpha, x, y); }
  void fill(Tensor& x, float value) override { inner_->fill(x, value); }
  double sum_squares(const Tensor& x) override { return inner_->sum_squares(x); }
  void sgd_update(Tensor& param, const Tensor& grad, Tensor& buf, const SgdParams& p) override {
    inner_->sgd_update(param, grad, buf, p);
  }
  void adam_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamParams& p) override {
    inner_->adam_update(param, grad, m, v, p);
  }

 protected:
  Backend& inner() noexcept { return *inner_; }

 private:
  std::unique_ptr<Backend> inner_;
};

}  // namespace tandem::engine::compute
