// Finite-difference gradient checks of every op's backward on the reference backend, in f64:
// L = sum(op(inputs) * R) for a fixed random R, central differences with eps 1e-6.
#include <boost/test/unit_test.hpp>

#include <functional>

#include "tests/compute/test_util.hpp"

using namespace tandem;
using namespace tandem::engine::compute;
using namespace tandem::engine::compute::testing;

namespace {

constexpr DType kF64 = DType::kF64;

double dot(const Tensor& a, const Tensor& b) {
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) s += a.data<double>()[i] * b.data<double>()[i];
  return s;
}

// Compares analytic[i] with the central difference of loss() in t at up to `samples` indices.
void check_grad(const std::function<double()>& loss, Tensor t, const Tensor& analytic, const std::string& what,
                int samples = 24) {
  BOOST_TEST_REQUIRE(t.numel() == analytic.numel());
  const double eps = 1e-6;
  const int64_t n = t.numel();
  const int64_t step = std::max<int64_t>(1, n / samples);
  for (int64_t i = (n > samples ? 7 % step : 0); i < n; i += step) {
    double* p = t.data<double>() + i;
    const double orig = *p;
    *p = orig + eps;
    const double lp = loss();
    *p = orig - eps;
    const double lm = loss();
    *p = orig;
    const double num = (lp - lm) / (2 * eps);
    const double ana = analytic.data<double>()[i];
    BOOST_TEST(std::abs(num - ana) <= 1e-6 + 1e-5 * std::abs(num),
               what << "[" << i << "]: finite difference " << num << ", backward " << ana);
  }
}

struct ConvCase {
  int64_t n, c, h, w, o, kh, kw, stride, pad, dil, groups;
  bool bias;
};

}  // namespace

BOOST_AUTO_TEST_SUITE(gradcheck_reference)

BOOST_AUTO_TEST_CASE(convolution_data_weights_and_bias) {
  auto be = make_backend("reference");
  const ConvCase cases[] = {{2, 3, 6, 6, 4, 3, 3, 1, 1, 1, 1, true},   {1, 4, 7, 5, 2, 3, 3, 2, 1, 1, 2, true},
                            {2, 4, 6, 6, 4, 3, 3, 1, 1, 1, 4, false},  {1, 2, 7, 7, 3, 3, 3, 1, 2, 2, 1, true},
                            {2, 3, 5, 5, 2, 1, 1, 1, 0, 1, 1, false}};
  uint32_t seed = 1;
  for (const ConvCase& k : cases) {
    ConvParams p{k.stride, k.stride, k.pad, k.pad, k.dil, k.dil, k.groups};
    Tensor x = random_tensor({k.n, k.c, k.h, k.w}, seed++, -1, 1, kF64);
    Tensor w = random_tensor({k.o, k.c / k.groups, k.kh, k.kw}, seed++, -1, 1, kF64);
    Tensor b = k.bias ? random_tensor({k.o}, seed++, -1, 1, kF64) : Tensor();
    const Shape ys = conv_output_shape(x.shape(), w.shape(), p);
    Tensor r = random_tensor(ys, seed++, -1, 1, kF64);
    auto loss = [&] { return dot(be->conv_forward(x, w, b, p), r); };
    Tensor dx = be->conv_backward_data(r, w, x.shape(), p);
    Tensor dw = Tensor::empty(w.shape(), kF64);
    Tensor db = k.bias ? Tensor::empty(b.shape(), kF64) : Tensor();
    be->conv_backward_weights(x, r, dw, db, p, false);
    const std::string name = "conv " + x.shape().str() + " groups " + std::to_string(k.groups);
    check_grad(loss, x, dx, name + " dx");
    check_grad(loss, w, dw, name + " dw");
    if (k.bias) check_grad(loss, b, db, name + " db");
  }
}

BOOST_AUTO_TEST_CASE(batch_norm_training) {
  auto be = make_backend("reference");
  uint32_t seed = 100;
  for (const Shape& s : {Shape{4, 3, 3, 3}, Shape{6, 5}, Shape{1, 2, 4, 3}}) {
    const int64_t C = s[1];
    Tensor x = random_tensor(s, seed++, -2, 2, kF64);
    Tensor g = random_tensor({C}, seed++, 0.5, 1.5, kF64);
    Tensor bt = random_tensor({C}, seed++, -1, 1, kF64);
    Tensor r = random_tensor(s, seed++, -1, 1, kF64);
    Tensor rm = Tensor::zeros({C}, kF64), rv = Tensor::full({C}, 1.0, kF64);
    const BatchNormParams p;
    auto loss = [&] { return dot(be->batch_norm_forward_training(x, g, bt, rm, rv, p).y, r); };
    BatchNormForward f = be->batch_norm_forward_training(x, g, bt, rm, rv, p);
    Tensor dg = Tensor::empty({C}, kF64), db = Tensor::empty({C}, kF64);
    Tensor dx = be->batch_norm_backward(r, x, g, f.mean, f.var, p.eps, dg, db, false);
    check_grad(loss, x, dx, "batch_norm dx " + s.str());
    check_grad(loss, g, dg, "batch_norm dgamma " + s.str());
    check_grad(loss, bt, db, "batch_norm dbeta " + s.str());
  }
}

BOOST_AUTO_TEST_CASE(relu_and_relu6) {
  auto be = make_backend("reference");
  for (Activation a : {Activation::kRelu, Activation::kRelu6}) {
    Tensor x = random_tensor({3, 4, 5}, 7, -8, 8, kF64);
    Tensor r = random_tensor(x.shape(), 8, -1, 1, kF64);
    auto loss = [&] { return dot(be->activation_forward(a, x), r); };
    Tensor dx = be->activation_backward(a, r, be->activation_forward(a, x));
    check_grad(loss, x, dx, a == Activation::kRelu ? "relu" : "relu6", 60);
  }
}

BOOST_AUTO_TEST_CASE(max_avg_and_global_pooling) {
  auto be = make_backend("reference");
  const PoolParams params[] = {{2, 2, 2, 2, 0, 0, true}, {3, 3, 2, 2, 1, 1, true}, {3, 3, 2, 2, 1, 1, false},
                               {3, 2, 1, 2, 1, 0, true}};
  uint32_t seed = 200;
  for (PoolKind kind : {PoolKind::kMax, PoolKind::kAvg}) {
    for (const PoolParams& p : params) {
      Tensor x = random_tensor({2, 3, 7, 6}, seed++, -1, 1, kF64);
      Tensor r = random_tensor(pool_output_shape(x.shape(), p), seed++, -1, 1, kF64);
      auto loss = [&] { return dot(be->pool_forward(kind, x, p).y, r); };
      PoolForward f = be->pool_forward(kind, x, p);
      Tensor dx = be->pool_backward(kind, r, f.workspace, x.shape(), p);
      check_grad(loss, x, dx, std::string(kind == PoolKind::kMax ? "max" : "avg") + " pool k" +
                                  std::to_string(p.kernel_h) + " pad " + std::to_string(p.pad_h));
    }
  }
  Tensor x = random_tensor({2, 3, 4, 5}, seed++, -1, 1, kF64);
  Tensor r = random_tensor({2, 3}, seed++, -1, 1, kF64);
  auto loss = [&] { return dot(be->global_avg_pool_forward(x), r); };
  check_grad(loss, x, be->global_avg_pool_backward(r, x.shape()), "global avg pool");
}

BOOST_AUTO_TEST_CASE(linear_data_weights_and_bias) {
  auto be = make_backend("reference");
  for (const Shape& xs : {Shape{4, 6}, Shape{1, 5}, Shape{2, 2, 2, 3}}) {
    const int64_t in = xs.numel() / xs[0];
    Tensor x = random_tensor(xs, 300, -1, 1, kF64);
    Tensor w = random_tensor({3, in}, 301, -1, 1, kF64);
    Tensor b = random_tensor({3}, 302, -1, 1, kF64);
    Tensor r = random_tensor({xs[0], 3}, 303, -1, 1, kF64);
    auto loss = [&] { return dot(be->linear_forward(x, w, b), r); };
    Tensor dx = be->linear_backward_data(r, w, xs);
    Tensor dw = Tensor::empty(w.shape(), kF64), db = Tensor::empty(b.shape(), kF64);
    be->linear_backward_weights(x, r, dw, db, false);
    check_grad(loss, x, dx, "linear dx " + xs.str());
    check_grad(loss, w, dw, "linear dw " + xs.str());
    check_grad(loss, b, db, "linear db " + xs.str());
  }
}

BOOST_AUTO_TEST_CASE(softmax_cross_entropy_mean_and_normalizer) {
  auto be = make_backend("reference");
  for (int64_t normalizer : {int64_t{0}, int64_t{10}}) {
    Tensor logits = random_tensor({5, 7}, 400, -3, 3, kF64);
    Tensor labels = random_labels(5, 7, 401);
    auto loss = [&] { return be->softmax_cross_entropy(logits, labels, false, normalizer).loss; };
    LossOutput out = be->softmax_cross_entropy(logits, labels, true, normalizer);
    check_grad(loss, logits, out.dlogits, "softmax_cross_entropy normalizer " + std::to_string(normalizer), 35);
  }
}

BOOST_AUTO_TEST_CASE(dropout_and_add) {
  auto be = make_backend("reference");
  Tensor x = random_tensor({4, 9}, 500, -1, 1, kF64);
  Tensor r = random_tensor({4, 9}, 501, -1, 1, kF64);
  auto loss = [&] { return dot(be->dropout_forward(x, 0.3f, 77).y, r); };
  DropoutForward f = be->dropout_forward(x, 0.3f, 77);
  check_grad(loss, x, be->dropout_backward(r, f.mask, 0.3f), "dropout", 36);
  Tensor y = random_tensor({4, 9}, 502, -1, 1, kF64);
  auto loss_add = [&] { return dot(be->add(x, y), r); };
  check_grad(loss_add, x, r, "add a", 36);
  check_grad(loss_add, y, r, "add b", 36);
}

BOOST_AUTO_TEST_SUITE_END()
