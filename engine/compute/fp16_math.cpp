#include "engine/compute/fp16_math.hpp"

#include "engine/compute/forwarding_backend.hpp"

#include <algorithm>
#include <string>

#include "engine/core/dtype.hpp"
#include "engine/core/error.hpp"
#include "engine/core/settings.hpp"

namespace tandem::engine::compute {

void round_to_half(float* x, int64_t n) noexcept {
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) x[i] = half_to_float(float_to_half(x[i]));
}

bool half_math_for_conv(const ConvParams& p) {
  return p.groups <= 1 || settings::current()->flag("TANDEM_HALF_GROUPED_CONV").value_or(false);
}

namespace {

class Fp16Emulation final : public ForwardingBackend {
 public:
  // Everything but convolutions and GEMMs is the wrapped backend's f32 (ForwardingBackend).
  explicit Fp16Emulation(std::unique_ptr<Backend> inner) : ForwardingBackend(std::move(inner)), be_(&this->inner()) {
    TANDEM_REQUIRE(be_->device().is_cpu(), "fp16 emulation: wraps a host backend (cpu or reference), not {}",
                   be_->name());
  }

  // ---- convolution: fp16 operands and fp16 results, bias in f32 ----
  Tensor conv_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const ConvParams& p) override {
    if (x.dtype() != DType::kF32 || !half_math_for_conv(p)) return be_->conv_forward(x, w, bias, p);
    // The wrapped backend's result is fresh (or its fresh plain copy): rounded in place.
    Tensor y = be_->to_plain(be_->conv_forward(half(x), half(w), Tensor(), p));
    round_to_half(y.data<float>(), y.numel());
    if (bias.defined()) add_bias(y, bias);
    return y;
  }
  Tensor conv_backward_data(const Tensor& dy, const Tensor& w, const Shape& x_shape, const ConvParams& p) override {
    if (!half_math_for_conv(p)) return be_->conv_backward_data(dy, w, x_shape, p);
    Tensor dx = be_->to_plain(be_->conv_backward_data(half(dy), half(w), x_shape, p));
    round_to_half(dx.data<float>(), dx.numel());
    return dx;
  }
  void conv_backward_weights(const Tensor& x, const Tensor& dy, Tensor& dw, Tensor& dbias, const ConvParams& p,
                             bool accumulate) override {
    if (!half_math_for_conv(p)) return be_->conv_backward_weights(x, dy, dw, dbias, p, accumulate);
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

  Backend* be_;  // the wrapped backend (inner())
};

}  // namespace

std::unique_ptr<Backend> make_fp16_emulation(std::unique_ptr<Backend> inner) {
  return std::make_unique<Fp16Emulation>(std::move(inner));
}

bool is_fp16_emulation(const Backend& be) noexcept { return dynamic_cast<const Fp16Emulation*>(&be) != nullptr; }

}  // namespace tandem::engine::compute
