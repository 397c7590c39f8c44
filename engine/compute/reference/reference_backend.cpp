// The reference backend: plain loops over plain host tensors, f32 or f64 (f64 makes the
// finite-difference gradient checks sharp), accumulating in double. Slow on purpose: it is the
// yardstick the other backends are tested against.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "engine/compute/backend.hpp"
#include "engine/compute/dropout_mask.hpp"
#include "engine/compute/validate.hpp"
#include "engine/core/error.hpp"

namespace tandem::engine::compute {
namespace {

constexpr const char* kName = "reference";

void require_plain(const Tensor& t, const char* op, const char* arg) {
  TANDEM_REQUIRE(!t.defined() || t.is_plain(), "{} (reference backend): {} {} is in a backend layout; call to_plain on "
                 "the backend that produced it", op, arg, t.str());
}

// Calls f(T{}) with T = float or double after the tensor's dtype.
template <typename F> auto dispatch(DType t, F&& f) {
  if (t == DType::kF64) return f(double{});
  return f(float{});
}

template <typename T> T* ptr(const Tensor& t) { return static_cast<T*>(t.raw_data()); }

template <typename T> void store_grad(T* dst, const double* src, int64_t n, bool accumulate) {
  for (int64_t i = 0; i < n; ++i) dst[i] = accumulate ? static_cast<T>(dst[i] + src[i]) : static_cast<T>(src[i]);
}

int64_t label_at(const Tensor& labels, int64_t i, int64_t K) {
  const int64_t l = labels.dtype() == DType::kI32 ? static_cast<const int32_t*>(labels.raw_data())[i]
                                                  : static_cast<const int64_t*>(labels.raw_data())[i];
  TANDEM_REQUIRE(l >= 0 && l < K, "softmax_cross_entropy: label {} of row {} is outside [0, {})", l, i, K);
  return l;
}

class ReferenceBackend final : public Backend {
 public:
  explicit ReferenceBackend(const BackendOptions&) {}

  std::string_view name() const override { return kName; }
  Device device() const override { return Device::cpu(); }
  void set_num_threads(int n) override { TANDEM_REQUIRE(n >= 1, "set_num_threads: {} must be >= 1", n); }
  int num_threads() const override { return 1; }
  void synchronize() override {}

  Tensor empty(const Shape& shape, DType dtype) override { return Tensor::empty(shape, dtype); }
  Tensor zeros(const Shape& shape, DType dtype) override { return Tensor::zeros(shape, dtype); }
  Tensor to_plain(const Tensor& x) override {
    TANDEM_REQUIRE(x.defined(), "to_plain: undefined tensor");
    require_plain(x, "to_plain", "input");
    TANDEM_REQUIRE(x.device().is_cpu(), "to_plain (reference): {} is not on the host", x.str());
    return x;
  }
  void copy(const Tensor& src, Tensor& dst) override {
    require_plain(src, "copy", "src");
    require_plain(dst, "copy", "dst");
    dst.copy_from(src);
  }
  Tensor to_host(const Tensor& x) override { return to_plain(x); }

  // ---------------------------------------------------------------- convolution
  Tensor conv_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const ConvParams& p) override {
    require_plain(x, "conv_forward", "input");
    require_plain(w, "conv_forward", "weights");
    const Shape ys = validate::conv(x, w, bias, p, device());
    Tensor y = Tensor::empty(ys, x.dtype());
    dispatch(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* xp = ptr<T>(x);
      const T* wp = ptr<T>(w);
      std::vector<double> acc(static_cast<size_t>(ys.numel()), 0.0);
      if (bias.defined()) {
        const int64_t plane = ys[2] * ys[3];
        for (int64_t i = 0; i < ys.numel(); ++i) acc[i] = ptr<T>(bias)[(i / plane) % ys[1]];
      }
      conv_loop<T>(x.shape(), w.shape(), ys, p, [&](int64_t yi, int64_t xi, int64_t wi, bool) {
        acc[yi] += static_cast<double>(xp[xi]) * wp[wi];
      });
      store_grad(ptr<T>(y), acc.data(), ys.numel(), false);
      return 0;
    });
    return y;
  }

  Tensor conv_backward_data(const Tensor& dy, const Tensor& w, const Shape& x_shape, const ConvParams& p) override {
    require_plain(dy, "conv_backward_data", "dy");
    require_plain(w, "conv_backward_data", "weights");
    validate::tensor(dy, "conv_backward_data", "dy", device(), 4, true);
    validate::tensor(w, "conv_backward_data", "weights", device(), 4, true);
    const Shape ys = conv_output_shape(x_shape, w.shape(), p);
    TANDEM_REQUIRE(dy.shape() == ys, "conv_backward_data: dy must be {}, got {}", ys.str(), dy.shape().str());
    Tensor dx = Tensor::empty(x_shape, dy.dtype());
    dispatch(dy.dtype(), [&](auto tag) {
      using T = decltype(tag);
      std::vector<double> acc(static_cast<size_t>(x_shape.numel()), 0.0);
      const T* dyp = ptr<T>(dy);
      const T* wp = ptr<T>(w);
      conv_loop<T>(x_shape, w.shape(), ys, p, [&](int64_t yi, int64_t xi, int64_t wi, bool) {
        acc[xi] += static_cast<double>(dyp[yi]) * wp[wi];
      });
      store_grad(ptr<T>(dx), acc.data(), x_shape.numel(), false);
      return 0;
    });
    return dx;
  }

  void conv_backward_weights(const Tensor& x, const Tensor& dy, Tensor& dw, Tensor& dbias, const ConvParams& p,
                             bool accumulate) override {
    require_plain(x, "conv_backward_weights", "input");
    require_plain(dy, "conv_backward_weights", "dy");
    validate::tensor(x, "conv_backward_weights", "input", device(), 4, true);
    validate::plain(dw, "conv_backward_weights", "dw", device(), dw.shape(), x.dtype());
    const Shape ys = conv_output_shape(x.shape(), dw.shape(), p);
    TANDEM_REQUIRE(dy.shape() == ys, "conv_backward_weights: dy must be {}, got {}", ys.str(), dy.shape().str());
    if (dbias.defined()) validate::plain(dbias, "conv_backward_weights", "dbias", device(), Shape{ys[1]}, x.dtype());
    dispatch(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      std::vector<double> acc(static_cast<size_t>(dw.numel()), 0.0);
      const T* dyp = ptr<T>(dy);
      const T* xp = ptr<T>(x);
      conv_loop<T>(x.shape(), dw.shape(), ys, p, [&](int64_t yi, int64_t xi, int64_t wi, bool) {
        acc[wi] += static_cast<double>(dyp[yi]) * xp[xi];
      });
      store_grad(ptr<T>(dw), acc.data(), dw.numel(), accumulate);
      if (dbias.defined()) {
        std::vector<double> b(static_cast<size_t>(ys[1]), 0.0);
        const int64_t plane = ys[2] * ys[3];
        for (int64_t n = 0; n < ys[0]; ++n)
          for (int64_t o = 0; o < ys[1]; ++o)
            for (int64_t i = 0; i < plane; ++i) b[o] += dyp[(n * ys[1] + o) * plane + i];
        store_grad(ptr<T>(dbias), b.data(), ys[1], accumulate);
      }
      return 0;
    });
  }

  // ---------------------------------------------------------------- batch norm
  BatchNormForward batch_norm_forward_training(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                               Tensor& running_mean, Tensor& running_var,
                                               const BatchNormParams& p) override {
    require_plain(x, "batch_norm_forward_training", "input");
    const int64_t C = validate::batch_norm(x, gamma, beta, device());
    validate::plain(running_mean, "batch_norm", "running_mean", device(), Shape{C}, x.dtype());
    validate::plain(running_var, "batch_norm", "running_var", device(), Shape{C}, x.dtype());
    TANDEM_REQUIRE(p.eps > 0 && p.momentum >= 0 && p.momentum <= 1, "batch_norm: eps {} must be > 0, momentum {} in [0, 1]",
                   p.eps, p.momentum);
    const auto dims = bn_dims(x);  // named, not bound: clang 14 cannot capture bindings in lambdas
    const int64_t N = dims.first, S = dims.second;
    TANDEM_REQUIRE(N * S > 1, "batch_norm: training needs more than one value per channel, input {}", x.shape().str());
    BatchNormForward out{Tensor::empty(x.shape(), x.dtype()), Tensor::empty({C}, x.dtype()),
                         Tensor::empty({C}, x.dtype())};
    dispatch(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* xp = ptr<T>(x);
      const double M = static_cast<double>(N * S);
      for (int64_t c = 0; c < C; ++c) {
        double sum = 0, sq = 0;
        for (int64_t n = 0; n < N; ++n)
          for (int64_t s = 0; s < S; ++s) sum += xp[(n * C + c) * S + s];
        const double mean = sum / M;
        for (int64_t n = 0; n < N; ++n)
          for (int64_t s = 0; s < S; ++s) {
            const double d = xp[(n * C + c) * S + s] - mean;
            sq += d * d;
          }
        const double var = sq / M;
        ptr<T>(out.mean)[c] = static_cast<T>(mean);
        ptr<T>(out.var)[c] = static_cast<T>(var);
        T& rm = ptr<T>(running_mean)[c];
        T& rv = ptr<T>(running_var)[c];
        rm = static_cast<T>((1.0 - p.momentum) * rm + p.momentum * mean);
        rv = static_cast<T>((1.0 - p.momentum) * rv + p.momentum * var * M / (M - 1.0));
      }
      bn_apply<T>(x, gamma, beta, ptr<T>(out.mean), ptr<T>(out.var), p.eps, out.y);
      return 0;
    });
    return out;
  }

  Tensor batch_norm_forward_inference(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                      const Tensor& running_mean, const Tensor& running_var, float eps) override {
    require_plain(x, "batch_norm_forward_inference", "input");
    const int64_t C = validate::batch_norm(x, gamma, beta, device());
    validate::plain(running_mean, "batch_norm", "running_mean", device(), Shape{C}, x.dtype());
    validate::plain(running_var, "batch_norm", "running_var", device(), Shape{C}, x.dtype());
    TANDEM_REQUIRE(eps > 0, "batch_norm: eps {} must be > 0", eps);
    Tensor y = Tensor::empty(x.shape(), x.dtype());
    dispatch(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      bn_apply<T>(x, gamma, beta, ptr<T>(running_mean), ptr<T>(running_var), eps, y);
      return 0;
    });
    return y;
  }

  Tensor batch_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                             const Tensor& var, float eps, Tensor& dgamma, Tensor& dbeta, bool accumulate) override {
    require_plain(dy, "batch_norm_backward", "dy");
    require_plain(x, "batch_norm_backward", "input");
    const int64_t C = validate::batch_norm(x, gamma, gamma, device());
    validate::same_shape(dy, x, "batch_norm_backward", "dy", "input");
    for (const Tensor* t : std::initializer_list<const Tensor*>{&mean, &var, &dgamma, &dbeta})
      validate::plain(*t, "batch_norm_backward", "statistics/gradients", device(), Shape{C}, x.dtype());
    const auto dims = bn_dims(x);  // named, not bound: clang 14 cannot capture bindings in lambdas
    const int64_t N = dims.first, S = dims.second;
    Tensor dx = Tensor::empty(x.shape(), x.dtype());
    dispatch(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T *xp = ptr<T>(x), *dyp = ptr<T>(dy), *gp = ptr<T>(gamma);
      T* dxp = ptr<T>(dx);
      std::vector<double> dg(C), db(C);
      const double M = static_cast<double>(N * S);
      for (int64_t c = 0; c < C; ++c) {
        const double mu = ptr<T>(mean)[c], istd = 1.0 / std::sqrt(static_cast<double>(ptr<T>(var)[c]) + eps);
        double sdy = 0, sdyx = 0;
        for (int64_t n = 0; n < N; ++n)
          for (int64_t s = 0; s < S; ++s) {
            const int64_t i = (n * C + c) * S + s;
            sdy += dyp[i];
            sdyx += dyp[i] * (xp[i] - mu) * istd;
          }
        dg[c] = sdyx;
        db[c] = sdy;
        for (int64_t n = 0; n < N; ++n)
          for (int64_t s = 0; s < S; ++s) {
            const int64_t i = (n * C + c) * S + s;
            const double xhat = (xp[i] - mu) * istd;
            dxp[i] = static_cast<T>(gp[c] * istd / M * (M * dyp[i] - sdy - xhat * sdyx));
          }
      }
      store_grad(ptr<T>(dgamma), dg.data(), C, accumulate);
      store_grad(ptr<T>(dbeta), db.data(), C, accumulate);
      return 0;
    });
    return dx;
  }

  // ---------------------------------------------------------------- activations
  Tensor activation_forward(Activation a, const Tensor& x, bool in_place) override {
    require_plain(x, "activation_forward", "input");
    validate::tensor(x, "activation_forward", "input", device(), -1, true);
    Tensor y = in_place ? x : Tensor::empty(x.shape(), x.dtype());
    dispatch(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* xp = ptr<T>(x);
      T* yp = ptr<T>(y);
      const T hi = a == Activation::kRelu6 ? T(6) : std::numeric_limits<T>::infinity();
      for (int64_t i = 0; i < x.numel(); ++i) yp[i] = std::min(std::max(xp[i], T(0)), hi);
      return 0;
    });
    return y;
  }

  Tensor activation_backward(Activation a, const Tensor& dy, const Tensor& y) override {
    require_plain(dy, "activation_backward", "dy");
    require_plain(y, "activation_backward", "y");
    validate::tensor(dy, "activation_backward", "dy", device(), -1, true);
    validate::tensor(y, "activation_backward", "y", device(), -1, true);
    validate::same_shape(dy, y, "activation_backward", "dy", "y");
    Tensor dx = Tensor::empty(y.shape(), y.dtype());
    dispatch(y.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T *dyp = ptr<T>(dy), *yp = ptr<T>(y);
      T* dxp = ptr<T>(dx);
      const T hi = a == Activation::kRelu6 ? T(6) : std::numeric_limits<T>::infinity();
      for (int64_t i = 0; i < y.numel(); ++i) dxp[i] = (yp[i] > T(0) && yp[i] < hi) ? dyp[i] : T(0);
      return 0;
    });
    return dx;
  }

  // ---------------------------------------------------------------- pooling
  PoolForward pool_forward(PoolKind kind, const Tensor& x, const PoolParams& p) override {
    require_plain(x, "pool_forward", "input");
    const Shape ys = validate::pool(x, p, device());
    PoolForward out{Tensor::empty(ys, x.dtype()), Tensor()};
    if (kind == PoolKind::kMax) out.workspace = Tensor::empty(ys, DType::kI64);
    dispatch(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* xp = ptr<T>(x);
      T* yp = ptr<T>(out.y);
      int64_t* ws = kind == PoolKind::kMax ? ptr<int64_t>(out.workspace) : nullptr;
      pool_loop(x.shape(), ys, p, [&](int64_t yi, int64_t plane, const std::vector<int64_t>& idx, int64_t div) {
        if (kind == PoolKind::kMax) {
          int64_t best = idx.front();
          for (int64_t i : idx)
            if (xp[plane + i] > xp[plane + best]) best = i;
          yp[yi] = xp[plane + best];
          ws[yi] = best;
        } else {
          double s = 0;
          for (int64_t i : idx) s += xp[plane + i];
          yp[yi] = static_cast<T>(s / div);
        }
      });
      return 0;
    });
    return out;
  }

  Tensor pool_backward(PoolKind kind, const Tensor& dy, const Tensor& workspace, const Shape& x_shape,
                       const PoolParams& p) override {
    require_plain(dy, "pool_backward", "dy");
    validate::tensor(dy, "pool_backward", "dy", device(), 4, true);
    const Shape ys = pool_output_shape(x_shape, p);
    TANDEM_REQUIRE(dy.shape() == ys, "pool_backward: dy must be {}, got {}", ys.str(), dy.shape().str());
    if (kind == PoolKind::kMax) validate::plain(workspace, "pool_backward", "workspace", device(), ys, DType::kI64);
    Tensor dx = Tensor::zeros(x_shape, dy.dtype());
    dispatch(dy.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* dyp = ptr<T>(dy);
      T* dxp = ptr<T>(dx);
      const int64_t* ws = kind == PoolKind::kMax ? ptr<int64_t>(workspace) : nullptr;
      pool_loop(x_shape, ys, p, [&](int64_t yi, int64_t plane, const std::vector<int64_t>& idx, int64_t div) {
        if (kind == PoolKind::kMax) {
          dxp[plane + ws[yi]] += dyp[yi];
        } else {
          for (int64_t i : idx) dxp[plane + i] += static_cast<T>(static_cast<double>(dyp[yi]) / div);
        }
      });
      return 0;
    });
    return dx;
  }

  Tensor global_avg_pool_forward(const Tensor& x) override {
    require_plain(x, "global_avg_pool_forward", "input");
    validate::tensor(x, "global_avg_pool_forward", "input", device(), 4, true);
    const int64_t NC = x.dim(0) * x.dim(1), S = x.dim(2) * x.dim(3);
    Tensor y = Tensor::empty({x.dim(0), x.dim(1)}, x.dtype());
    dispatch(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      for (int64_t i = 0; i < NC; ++i) {
        double s = 0;
        for (int64_t j = 0; j < S; ++j) s += ptr<T>(x)[i * S + j];
        ptr<T>(y)[i] = static_cast<T>(s / S);
      }
      return 0;
    });
    return y;
  }

  Tensor global_avg_pool_backward(const Tensor& dy, const Shape& x_shape) override {
    require_plain(dy, "global_avg_pool_backward", "dy");
    validate::tensor(dy, "global_avg_pool_backward", "dy", device(), 2, true);
    TANDEM_REQUIRE(x_shape.rank() == 4 && dy.dim(0) == x_shape[0] && dy.dim(1) == x_shape[1],
                   "global_avg_pool_backward: dy {} does not match input shape {}", dy.shape().str(), x_shape.str());
    Tensor dx = Tensor::empty(x_shape, dy.dtype());
    const int64_t NC = x_shape[0] * x_shape[1], S = x_shape[2] * x_shape[3];
    dispatch(dy.dtype(), [&](auto tag) {
      using T = decltype(tag);
      for (int64_t i = 0; i < NC; ++i)
        for (int64_t j = 0; j < S; ++j) ptr<T>(dx)[i * S + j] = static_cast<T>(static_cast<double>(ptr<T>(dy)[i]) / S);
      return 0;
    });
    return dx;
  }

  // ---------------------------------------------------------------- linear
  Tensor linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias) override {
    require_plain(x, "linear_forward", "input");
    require_plain(w, "linear_forward", "weights");
    const auto [N0, In0] = validate::linear(x, w, bias, device());
    const int64_t N = N0, In = In0;  // copies: clang 14 cannot capture bindings in lambdas
    const int64_t Out = w.dim(0);
    Tensor y = Tensor::empty({N, Out}, x.dtype());
    dispatch(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t o = 0; o < Out; ++o) {
          double acc = bias.defined() ? ptr<T>(bias)[o] : 0.0;
          for (int64_t i = 0; i < In; ++i) acc += static_cast<double>(ptr<T>(x)[n * In + i]) * ptr<T>(w)[o * In + i];
          ptr<T>(y)[n * Out + o] = static_cast<T>(acc);
        }
      return 0;
    });
    return y;
  }

  Tensor linear_backward_data(const Tensor& dy, const Tensor& w, const Shape& x_shape) override {
    require_plain(dy, "linear_backward_data", "dy");
    const auto [N0, In0, Out0] = validate::linear_data(dy, w, x_shape, device(), true);
    const int64_t N = N0, In = In0, Out = Out0;  // copies: clang 14 cannot capture bindings in lambdas
    Tensor dx = Tensor::empty(x_shape, dy.dtype());
    dispatch(dy.dtype(), [&](auto tag) {
      using T = decltype(tag);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t i = 0; i < In; ++i) {
          double acc = 0;
          for (int64_t o = 0; o < Out; ++o) acc += static_cast<double>(ptr<T>(dy)[n * Out + o]) * ptr<T>(w)[o * In + i];
          ptr<T>(dx)[n * In + i] = static_cast<T>(acc);
        }
      return 0;
    });
    return dx;
  }

  void linear_backward_weights(const Tensor& x, const Tensor& dy, Tensor& dw, Tensor& dbias, bool accumulate) override {
    require_plain(x, "linear_backward_weights", "input");
    require_plain(dy, "linear_backward_weights", "dy");
    const auto [N0, In0, Out0] = validate::linear_weights(x, dy, dw, dbias, device());
    const int64_t N = N0, In = In0, Out = Out0;  // copies: clang 14 cannot capture bindings in lambdas
    dispatch(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      std::vector<double> g(static_cast<size_t>(Out * In), 0.0), b(static_cast<size_t>(Out), 0.0);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t o = 0; o < Out; ++o) {
          const double d = ptr<T>(dy)[n * Out + o];
          b[o] += d;
          for (int64_t i = 0; i < In; ++i) g[o * In + i] += d * ptr<T>(x)[n * In + i];
        }
      store_grad(ptr<T>(dw), g.data(), Out * In, accumulate);
      if (dbias.defined()) store_grad(ptr<T>(dbias), b.data(), Out, accumulate);
      return 0;
    });
  }

  // ---------------------------------------------------------------- dropout
  DropoutForward dropout_forward(const Tensor& x, float p, uint64_t seed) override {
    require_plain(x, "dropout_forward", "input");
    validate::tensor(x, "dropout_forward", "input", device(), -1, true);
    validate::dropout_p(p);
    DropoutForward out{Tensor::empty(x.shape(), x.dtype()), Tensor::empty(x.shape(), DType::kU8)};
    const uint32_t th = dropout_threshold24(p);
    uint8_t* m = out.mask.data<uint8_t>();
    for (int64_t i = 0; i < x.numel(); ++i) m[i] = dropout_keep(seed, static_cast<uint64_t>(i), th) ? 1 : 0;
    apply_mask(x, out.mask, p, out.y);
    return out;
  }

  Tensor dropout_backward(const Tensor& dy, const Tensor& mask, float p) override {
    require_plain(dy, "dropout_backward", "dy");
    validate::tensor(dy, "dropout_backward", "dy", device(), -1, true);
    validate::plain(mask, "dropout_backward", "mask", device(), dy.shape(), DType::kU8);
    validate::dropout_p(p);
    Tensor dx = Tensor::empty(dy.shape(), dy.dtype());
    apply_mask(dy, mask, p, dx);
    return dx;
  }

  // ---------------------------------------------------------------- loss
  LossOutput softmax_cross_entropy(const Tensor& logits, const Tensor& labels, bool want_grad,
                                   int64_t normalizer) override {
    require_plain(logits, "softmax_cross_entropy", "logits");
    const auto [N0, K0] = validate::loss(logits, labels, device());
    const int64_t N = N0, K = K0;  // copies: clang 14 cannot capture bindings in lambdas
    TANDEM_REQUIRE(normalizer >= 0, "softmax_cross_entropy: normalizer {} must be >= 0", normalizer);
    const double norm = normalizer > 0 ? static_cast<double>(normalizer) : static_cast<double>(std::max<int64_t>(N, 1));
    LossOutput out;
    if (want_grad) out.dlogits = Tensor::empty(logits.shape(), logits.dtype());
    dispatch(logits.dtype(), [&](auto tag) {
      using T = decltype(tag);
      double total = 0;
      for (int64_t n = 0; n < N; ++n) {
        const T* row = ptr<T>(logits) + n * K;
        const int64_t l = label_at(labels, n, K);
        int64_t arg = 0;
        for (int64_t k = 1; k < K; ++k)
          if (row[k] > row[arg]) arg = k;
        double se = 0;
        for (int64_t k = 0; k < K; ++k) se += std::exp(static_cast<double>(row[k]) - row[arg]);
        const double lse = row[arg] + std::log(se);
        total += lse - row[l];
        if (arg == l) ++out.correct;
        if (want_grad) {
          T* g = ptr<T>(out.dlogits) + n * K;
          for (int64_t k = 0; k < K; ++k) g[k] = static_cast<T>((std::exp(row[k] - lse) - (k == l ? 1.0 : 0.0)) / norm);
        }
      }
      out.loss = total / norm;
      return 0;
    });
    return out;
  }

  // ---------------------------------------------------------------- elementwise
  Tensor add(const Tensor& a, const Tensor& b) override {
    Tensor c = Tensor::empty(a.shape(), a.dtype());
    binary("add", a, b, c, [](double x, double y) { return x + y; });
    return c;
  }
  void add_inplace(Tensor& a, const Tensor& b) override {
    binary("add_inplace", a, b, a, [](double x, double y) { return x + y; });
  }
  void scale(Tensor& x, float alpha) override {
    binary("scale", x, x, x, [alpha](double v, double) { return v * alpha; });
  }
  void axpy(float alpha, const Tensor& x, Tensor& y) override {
    binary("axpy", y, x, y, [alpha](double yv, double xv) { return yv + static_cast<double>(alpha) * xv; });
  }
  void fill(Tensor& x, float value) override {
    require_plain(x, "fill", "x");
    validate::tensor(x, "fill", "x", device(), -1, true);
    x.fill(value);
  }
  double sum_squares(const Tensor& x) override {
    require_plain(x, "sum_squares", "x");
    validate::tensor(x, "sum_squares", "x", device(), -1, true);
    return dispatch(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      double s = 0;
      for (int64_t i = 0; i < x.numel(); ++i) s += static_cast<double>(ptr<T>(x)[i]) * ptr<T>(x)[i];
      return s;
    });
  }

  // ---------------------------------------------------------------- optimizers
  void sgd_update(Tensor& param, const Tensor& grad, Tensor& buf, const SgdParams& p) override {
    validate::sgd(p);
    validate::optimizer_buffers(param, grad, p.momentum != 0 ? &buf : nullptr, nullptr, "sgd_update", device());
    dispatch(param.dtype(), [&](auto tag) {
      using T = decltype(tag);
      T *w = ptr<T>(param), *b = p.momentum != 0 ? ptr<T>(buf) : nullptr;
      const T* g = ptr<T>(grad);
      for (int64_t i = 0; i < param.numel(); ++i) {
        double d = static_cast<double>(g[i]) + static_cast<double>(p.weight_decay) * w[i];
        if (b) {
          const double nb = p.step == 1 ? d : static_cast<double>(p.momentum) * b[i] + (1.0 - p.dampening) * d;
          b[i] = static_cast<T>(nb);
          d = p.nesterov ? d + static_cast<double>(p.momentum) * nb : nb;
        }
        w[i] = static_cast<T>(w[i] - static_cast<double>(p.lr) * d);
      }
      return 0;
    });
  }

  void adam_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamParams& p) override {
    validate::adam(p);
    validate::optimizer_buffers(param, grad, &m, &v, "adam_update", device());
    const double bc1 = 1.0 - std::pow(static_cast<double>(p.beta1), static_cast<double>(p.step));
    const double bc2 = 1.0 - std::pow(static_cast<double>(p.beta2), static_cast<double>(p.step));
    dispatch(param.dtype(), [&](auto tag) {
      using T = decltype(tag);
      T *w = ptr<T>(param), *mp = ptr<T>(m), *vp = ptr<T>(v);
      const T* g = ptr<T>(grad);
      for (int64_t i = 0; i < param.numel(); ++i) {
        double gi = g[i], wi = w[i];
        if (p.decoupled_weight_decay) wi *= 1.0 - static_cast<double>(p.lr) * p.weight_decay;
        else gi += static_cast<double>(p.weight_decay) * wi;
        const double mi = p.beta1 * static_cast<double>(mp[i]) + (1.0 - p.beta1) * gi;
        const double vi = p.beta2 * static_cast<double>(vp[i]) + (1.0 - p.beta2) * gi * gi;
        mp[i] = static_cast<T>(mi);
        vp[i] = static_cast<T>(vi);
        w[i] = static_cast<T>(wi - p.lr / bc1 * mi / (std::sqrt(vi / bc2) + p.eps));
      }
      return 0;
    });
  }

 private:
  // Visits every (output, input, weight) index triple of a convolution that touches a real
  // (non-padding) input element.
  template <typename T, typename F>
  static void conv_loop(const Shape& xs, const Shape& ws, const Shape& ys, const ConvParams& p, F&& f) {
    const int64_t N = ys[0], O = ys[1], OH = ys[2], OW = ys[3];
    const int64_t C = xs[1], H = xs[2], W = xs[3], KH = ws[2], KW = ws[3];
    const int64_t Cg = C / p.groups, Og = O / p.groups;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t o = 0; o < O; ++o) {
        const int64_t g = o / Og;
        for (int64_t oh = 0; oh < OH; ++oh)
          for (int64_t ow = 0; ow < OW; ++ow) {
            const int64_t yi = ((n * O + o) * OH + oh) * OW + ow;
            for (int64_t c = 0; c < Cg; ++c)
              for (int64_t kh = 0; kh < KH; ++kh) {
                const int64_t ih = oh * p.stride_h - p.pad_h + kh * p.dilation_h;
                if (ih < 0 || ih >= H) continue;
                for (int64_t kw = 0; kw < KW; ++kw) {
                  const int64_t iw = ow * p.stride_w - p.pad_w + kw * p.dilation_w;
                  if (iw < 0 || iw >= W) continue;
                  f(yi, ((n * C + g * Cg + c) * H + ih) * W + iw, ((o * Cg + c) * KH + kh) * KW + kw, false);
                }
              }
          }
      }
  }

  // f(y index, offset of the input plane, in-plane indices of the window's real elements, divisor)
  template <typename F> static void pool_loop(const Shape& xs, const Shape& ys, const PoolParams& p, F&& f) {
    const int64_t NC = xs[0] * xs[1], H = xs[2], W = xs[3], OH = ys[2], OW = ys[3];
    std::vector<int64_t> idx;
    for (int64_t nc = 0; nc < NC; ++nc)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          idx.clear();
          for (int64_t kh = 0; kh < p.kernel_h; ++kh) {
            const int64_t ih = oh * p.stride_h - p.pad_h + kh;
            if (ih < 0 || ih >= H) continue;
            for (int64_t kw = 0; kw < p.kernel_w; ++kw) {
              const int64_t iw = ow * p.stride_w - p.pad_w + kw;
              if (iw >= 0 && iw < W) idx.push_back(ih * W + iw);
            }
          }
          const int64_t div = p.count_include_pad ? p.kernel_h * p.kernel_w : static_cast<int64_t>(idx.size());
          f((nc * OH + oh) * OW + ow, nc * H * W, idx, div);
        }
  }

  static std::pair<int64_t, int64_t> bn_dims(const Tensor& x) {
    const int64_t S = x.rank() == 4 ? x.dim(2) * x.dim(3) : 1;
    return {x.dim(0), S};
  }

  template <typename T>
  static void bn_apply(const Tensor& x, const Tensor& gamma, const Tensor& beta, const T* mean, const T* var, float eps,
                       Tensor& y) {
    const auto dims = bn_dims(x);  // named, not bound: clang 14 cannot capture bindings in lambdas
    const int64_t N = dims.first, S = dims.second;
    const int64_t C = x.dim(1);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < C; ++c) {
        const double istd = 1.0 / std::sqrt(static_cast<double>(var[c]) + eps);
        const double g = ptr<T>(gamma)[c], b = ptr<T>(beta)[c], mu = mean[c];
        for (int64_t s = 0; s < S; ++s) {
          const int64_t i = (n * C + c) * S + s;
          ptr<T>(y)[i] = static_cast<T>((ptr<T>(x)[i] - mu) * istd * g + b);
        }
      }
  }

  void apply_mask(const Tensor& x, const Tensor& mask, float p, Tensor& y) {
    const double s = 1.0 / (1.0 - p);
    const uint8_t* m = static_cast<const uint8_t*>(mask.raw_data());
    dispatch(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      for (int64_t i = 0; i < x.numel(); ++i) ptr<T>(y)[i] = m[i] ? static_cast<T>(ptr<T>(x)[i] * s) : T(0);
      return 0;
    });
  }

  template <typename F> void binary(const char* op, const Tensor& a, const Tensor& b, Tensor& out, F&& f) {
    require_plain(a, op, "a");
    require_plain(b, op, "b");
    validate::tensor(a, op, "a", device(), -1, true);
    validate::tensor(b, op, "b", device(), -1, true);
    validate::same_shape(a, b, op, "a", "b");
    validate::same_dtype(a, b, op, "a", "b");
    dispatch(a.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T *ap = ptr<T>(a), *bp = ptr<T>(b);
      T* op_ = ptr<T>(out);
      for (int64_t i = 0; i < a.numel(); ++i) op_[i] = static_cast<T>(f(ap[i], bp[i]));
      return 0;
    });
  }
};

}  // namespace

std::unique_ptr<Backend> make_reference_backend(const BackendOptions& options) {
  return std::make_unique<ReferenceBackend>(options);
}

}  // namespace tandem::engine::compute
