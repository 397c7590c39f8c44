#pragma once
// Conformance of a backend against the reference backend, op by op, forward and backward, on
// several shapes (stride 2, padding, dilation, groups = channels, odd sizes, batch 1), and
// through a small network (on the cpu backend, blocked layouts flow from layer to layer).
// Inputs are made on the host and moved with the backend's to_plain; results are compared on
// the host. Used by test_compute (cpu) and test_compute_gpu (cuda).
#include <boost/test/unit_test.hpp>

#include "tests/compute/test_util.hpp"

namespace tandem::engine::compute::testing::conformance {

constexpr double kRtol = 2e-5, kAtol = 2e-5;

struct Pair {
  std::unique_ptr<Backend> cpu;  // the backend under test (named for the common case)
  std::unique_ptr<Backend> ref = make_backend("reference");
  explicit Pair(const char* name) : cpu(make_backend(name)) {}
  // A host tensor on the tested backend's device.
  Tensor in(const Tensor& t) { return !t.defined() || t.device() == cpu->device() ? t : cpu->to_plain(t); }
  Tensor dev_empty(const Shape& s) { return cpu->empty(s, DType::kF32); }
  void close(const Tensor& got_cpu, const Tensor& want_ref, const std::string& what, double rtol = kRtol) {
    BOOST_TEST_REQUIRE((got_cpu.shape() == want_ref.shape()), what << ": shape " << got_cpu.shape().str() << " vs "
                                                                   << want_ref.shape().str());
    expect_close(values(*cpu, got_cpu), values(*ref, want_ref), rtol, kAtol, what);
  }
};

struct ConvCase {
  int64_t n, c, h, w, o, k, stride, pad, dil, groups;
  bool bias;
};


inline void convolution_forward_and_backward(Pair& b) {
  const ConvCase cases[] = {
      {2, 3, 8, 8, 4, 3, 1, 1, 1, 1, true},      // plain 3x3
      {1, 5, 9, 7, 6, 3, 2, 1, 1, 1, false},     // batch 1, odd sizes, stride 2
      {2, 8, 10, 10, 8, 3, 1, 1, 1, 8, true},    // depthwise
      {2, 32, 9, 9, 32, 3, 2, 1, 1, 32, false},  // depthwise stride 2, blocked
      {2, 8, 7, 7, 16, 1, 1, 0, 1, 1, false},    // pointwise
      {3, 4, 11, 11, 6, 5, 2, 2, 1, 2, true},    // groups 2, 5x5
      {2, 3, 9, 9, 4, 3, 1, 2, 2, 1, false},     // dilation 2
      {4, 16, 8, 8, 32, 3, 2, 1, 1, 1, true},    // blocked channels, stride 2
      // 3x3 stride 1 with whole 16-channel blocks (the cpu backend's Winograd path on AVX-512)
      {2, 16, 8, 8, 32, 3, 1, 1, 1, 1, true},    // with bias
      {3, 32, 10, 6, 16, 3, 1, 1, 1, 1, false},  // planes not a whole number of 4x4 tiles
      {1, 16, 9, 7, 48, 3, 1, 0, 1, 1, false},   // no padding, batch 1
      // tiny output planes (the cpu backend's im2col + matmul path)
      {2, 16, 1, 1, 24, 3, 1, 1, 1, 1, true},    // 1x1 plane, 3x3 kernel, padding 1
      {3, 8, 2, 2, 12, 3, 1, 1, 1, 1, false},    // 2x2 plane
      {2, 8, 4, 4, 16, 3, 2, 1, 1, 1, true},     // 4x4 -> 2x2, stride 2
      {1, 5, 3, 3, 7, 3, 1, 0, 1, 1, true},      // 3x3 -> 1x1 without padding, batch 1
      {2, 4, 5, 5, 6, 3, 1, 0, 2, 1, false},     // dilated 3x3 on 5x5 -> 1x1
      {2, 6, 3, 3, 4, 1, 2, 0, 1, 1, false},     // 1x1 kernel, stride 2 -> 2x2
  };
  uint32_t seed = 1;
  for (const ConvCase& k : cases) {
    const ConvParams p{k.stride, k.stride, k.pad, k.pad, k.dil, k.dil, k.groups};
    Tensor x = random_tensor({k.n, k.c, k.h, k.w}, seed++);
    Tensor w = random_tensor({k.o, k.c / k.groups, k.k, k.k}, seed++);
    Tensor bias = k.bias ? random_tensor({k.o}, seed++) : Tensor();
    const std::string name = "conv x" + x.shape().str() + " w" + w.shape().str() + " stride " +
                             std::to_string(k.stride) + " groups " + std::to_string(k.groups);
    b.close(b.cpu->conv_forward(b.in(x), b.in(w), b.in(bias), p), b.ref->conv_forward(x, w, bias, p), name + " forward");
    Tensor dy = random_tensor(conv_output_shape(x.shape(), w.shape(), p), seed++);
    b.close(b.cpu->conv_backward_data(b.in(dy), b.in(w), x.shape(), p), b.ref->conv_backward_data(dy, w, x.shape(), p),
            name + " backward data");
    Tensor dw_c = b.dev_empty(w.shape()), dw_r = Tensor::empty(w.shape());
    Tensor db_c = k.bias ? b.dev_empty(bias.shape()) : Tensor(), db_r = k.bias ? Tensor::empty(bias.shape()) : Tensor();
    b.cpu->conv_backward_weights(b.in(x), b.in(dy), dw_c, db_c, p, false);
    b.ref->conv_backward_weights(x, dy, dw_r, db_r, p, false);
    b.close(dw_c, dw_r, name + " backward weights");
    if (k.bias) b.close(db_c, db_r, name + " backward bias");
    // accumulate = true adds to what is there
    b.cpu->conv_backward_weights(b.in(x), b.in(dy), dw_c, db_c, p, true);
    b.ref->conv_backward_weights(x, dy, dw_r, db_r, p, true);
    b.close(dw_c, dw_r, name + " accumulated weights");
    if (k.bias) b.close(db_c, db_r, name + " accumulated bias");
  }
}

inline void batch_norm_training_inference_and_backward(Pair& b) {
  uint32_t seed = 50;
  for (const Shape& s : {Shape{4, 3, 5, 5}, Shape{2, 16, 4, 4}, Shape{8, 10}, Shape{1, 32, 3, 3}}) {
    const int64_t C = s[1];
    Tensor x = random_tensor(s, seed++, -2, 3);
    Tensor g = random_tensor({C}, seed++, 0.5, 1.5), bt = random_tensor({C}, seed++);
    Tensor rm_c = random_tensor({C}, seed), rv_c = random_tensor({C}, seed + 1, 0.5, 2);
    Tensor rm_r = rm_c.clone(), rv_r = rv_c.clone();
    rm_c = b.in(rm_c);
    rv_c = b.in(rv_c);
    const BatchNormParams p{1e-5f, 0.1f};
    BatchNormForward fc = b.cpu->batch_norm_forward_training(b.in(x), b.in(g), b.in(bt), rm_c, rv_c, p);
    BatchNormForward fr = b.ref->batch_norm_forward_training(x, g, bt, rm_r, rv_r, p);
    const std::string name = "batch_norm " + s.str();
    b.close(fc.y, fr.y, name + " y", 1e-4);
    b.close(fc.mean, fr.mean, name + " mean");
    b.close(fc.var, fr.var, name + " var", 1e-4);
    b.close(rm_c, rm_r, name + " running mean");
    b.close(rv_c, rv_r, name + " running var", 1e-4);
    Tensor dy = random_tensor(s, seed++);
    Tensor dg_c = b.dev_empty({C}), db_c = b.dev_empty({C}), dg_r = Tensor::empty({C}), db_r = Tensor::empty({C});
    b.close(b.cpu->batch_norm_backward(b.in(dy), b.in(x), b.in(g), fc.mean, fc.var, p.eps, dg_c, db_c, false),
            b.ref->batch_norm_backward(dy, x, g, fr.mean, fr.var, p.eps, dg_r, db_r, false), name + " dx", 1e-4);
    b.close(dg_c, dg_r, name + " dgamma", 1e-4);
    b.close(db_c, db_r, name + " dbeta", 1e-4);
    b.close(b.cpu->batch_norm_forward_inference(b.in(x), b.in(g), b.in(bt), rm_c, rv_c, p.eps),
            b.ref->batch_norm_forward_inference(x, g, bt, rm_r, rv_r, p.eps), name + " inference", 1e-4);
  }
}

inline void activations_on_plain_and_blocked_inputs(Pair& b) {
  // A conv output on the cpu backend is blocked: ReLU must work on it directly.
  Tensor x0 = random_tensor({2, 16, 6, 6}, 70);
  Tensor w = random_tensor({16, 16, 3, 3}, 71, -0.5, 0.5);
  const ConvParams p{1, 1, 1, 1, 1, 1, 1};
  Tensor xc = b.cpu->conv_forward(b.in(x0), b.in(w), Tensor(), p);
  Tensor xr = b.ref->conv_forward(x0, w, Tensor(), p);
  for (Activation a : {Activation::kRelu, Activation::kRelu6}) {
    const std::string name = a == Activation::kRelu ? "relu" : "relu6";
    Tensor yc = b.cpu->activation_forward(a, xc), yr = b.ref->activation_forward(a, xr);
    b.close(yc, yr, name + " forward (blocked)");
    Tensor dy = random_tensor(xr.shape(), 72);
    b.close(b.cpu->activation_backward(a, b.in(dy), yc), b.ref->activation_backward(a, dy, yr), name + " backward");
    Tensor plain = random_tensor({5, 7}, 73, -8, 8);
    Tensor pc = b.in(plain.clone());
    Tensor inplace = b.cpu->activation_forward(a, pc, true);
    BOOST_TEST(inplace.shares_storage_with(pc));
    b.close(inplace, b.ref->activation_forward(a, plain), name + " in place (plain)");
  }
}

inline void pooling_forward_and_backward(Pair& b) {
  const PoolParams params[] = {{2, 2, 2, 2, 0, 0, true}, {3, 3, 2, 2, 1, 1, true}, {3, 3, 2, 2, 1, 1, false},
                               {3, 3, 1, 1, 1, 1, true}};
  uint32_t seed = 80;
  for (const Shape& s : {Shape{2, 3, 8, 8}, Shape{1, 16, 7, 9}}) {
    for (PoolKind kind : {PoolKind::kMax, PoolKind::kAvg}) {
      for (const PoolParams& p : params) {
        Tensor x = random_tensor(s, seed++);
        const std::string name = std::string(kind == PoolKind::kMax ? "max" : "avg") + " pool " + s.str() + " k" +
                                 std::to_string(p.kernel_h) + " s" + std::to_string(p.stride_h) + " p" +
                                 std::to_string(p.pad_h) + (p.count_include_pad ? " incl" : " excl");
        PoolForward fc = b.cpu->pool_forward(kind, b.in(x), p), fr = b.ref->pool_forward(kind, x, p);
        b.close(fc.y, fr.y, name + " forward");
        Tensor dy = random_tensor(fr.y.shape(), seed++);
        b.close(b.cpu->pool_backward(kind, b.in(dy), fc.workspace, s, p), b.ref->pool_backward(kind, dy, fr.workspace, s, p),
                name + " backward");
      }
    }
    Tensor x = random_tensor(s, seed++);
    Tensor gc = b.cpu->global_avg_pool_forward(b.in(x));
    BOOST_TEST(gc.is_plain());
    b.close(gc, b.ref->global_avg_pool_forward(x), "global avg pool " + s.str());
    Tensor dy = random_tensor({s[0], s[1]}, seed++);
    b.close(b.cpu->global_avg_pool_backward(b.in(dy), s), b.ref->global_avg_pool_backward(dy, s),
            "global avg pool backward " + s.str());
  }
}

inline void linear_forward_and_backward(Pair& b) {
  uint32_t seed = 90;
  for (const auto& [xs, out] : {std::pair{Shape{5, 7}, int64_t{3}}, std::pair{Shape{64, 784}, int64_t{512}},
                                std::pair{Shape{1, 10}, int64_t{4}}, std::pair{Shape{2, 3, 4, 4}, int64_t{6}}}) {
    const int64_t in = xs.numel() / xs[0];
    Tensor x = random_tensor(xs, seed++), w = random_tensor({out, in}, seed++), bias = random_tensor({out}, seed++);
    const std::string name = "linear " + xs.str() + " -> " + std::to_string(out);
    Tensor yc = b.cpu->linear_forward(b.in(x), b.in(w), b.in(bias));
    BOOST_TEST(yc.is_plain());
    b.close(yc, b.ref->linear_forward(x, w, bias), name + " forward", 1e-4);
    b.close(b.cpu->linear_forward(b.in(x), b.in(w), Tensor()), b.ref->linear_forward(x, w, Tensor()), name + " no bias", 1e-4);
    Tensor dy = random_tensor({xs[0], out}, seed++);
    b.close(b.cpu->linear_backward_data(b.in(dy), b.in(w), xs), b.ref->linear_backward_data(dy, w, xs), name + " dx", 1e-4);
    Tensor dw_c = b.dev_empty(w.shape()), dw_r = Tensor::empty(w.shape());
    Tensor db_c = b.dev_empty({out}), db_r = Tensor::empty({out});
    for (bool acc : {false, true}) {
      b.cpu->linear_backward_weights(b.in(x), b.in(dy), dw_c, db_c, acc);
      b.ref->linear_backward_weights(x, dy, dw_r, db_r, acc);
      b.close(dw_c, dw_r, name + (acc ? " dw accumulated" : " dw"), 1e-4);
      b.close(db_c, db_r, name + (acc ? " db accumulated" : " db"), 1e-4);
    }
  }
}

inline void softmax_cross_entropy_loss_grad_and_accuracy(Pair& b) {
  uint32_t seed = 100;
  for (const auto& [n, k] : {std::pair{int64_t{5}, int64_t{10}}, std::pair{int64_t{64}, int64_t{10}},
                             std::pair{int64_t{1}, int64_t{3}}}) {
    for (DType lt : {DType::kI32, DType::kI64}) {
      Tensor logits = random_tensor({n, k}, seed++, -4, 4);
      Tensor labels = random_labels(n, k, seed++, lt);
      LossOutput c = b.cpu->softmax_cross_entropy(b.in(logits), b.in(labels), true, 0);
      LossOutput r = b.ref->softmax_cross_entropy(logits, labels, true, 0);
      BOOST_TEST(c.loss == r.loss, boost::test_tools::tolerance(1e-5));
      BOOST_TEST(c.correct == r.correct);
      b.close(c.dlogits, r.dlogits, "dlogits");
      LossOutput c2 = b.cpu->softmax_cross_entropy(b.in(logits), b.in(labels), false, 4 * n);
      BOOST_TEST(c2.loss == r.loss / 4, boost::test_tools::tolerance(1e-5));
      BOOST_TEST(!c2.dlogits.defined());
    }
  }
}

inline void dropout_masks_match_and_rate_is_p(Pair& b) {
  Tensor x = random_tensor({100, 100}, 110);
  DropoutForward c = b.cpu->dropout_forward(b.in(x), 0.25f, 9), r = b.ref->dropout_forward(x, 0.25f, 9);
  b.close(c.y, r.y, "dropout forward");
  const Tensor cmask = b.cpu->to_host(c.mask);
  int64_t kept = 0;
  for (int64_t i = 0; i < c.mask.numel(); ++i) {
    BOOST_TEST_REQUIRE(cmask.data<uint8_t>()[i] == r.mask.data<uint8_t>()[i]);
    kept += cmask.data<uint8_t>()[i];
  }
  BOOST_TEST(std::abs(kept / 10000.0 - 0.75) < 0.02);  // 10,000 Bernoulli(0.75): sd 0.0043
  Tensor dy = random_tensor(x.shape(), 111);
  b.close(b.cpu->dropout_backward(b.in(dy), c.mask, 0.25f), b.ref->dropout_backward(dy, r.mask, 0.25f), "dropout backward");
  const Tensor omask = b.cpu->to_host(b.cpu->dropout_forward(b.in(x), 0.25f, 10).mask);
  int64_t differ = 0;
  for (int64_t i = 0; i < c.mask.numel(); ++i) differ += cmask.data<uint8_t>()[i] != omask.data<uint8_t>()[i];
  BOOST_TEST(differ > 1000);  // another seed, another mask
}

inline void elementwise_ops_mix_layouts(Pair& b) {
  Tensor x0 = random_tensor({2, 16, 5, 5}, 120);
  Tensor w = random_tensor({16, 16, 1, 1}, 121);
  const ConvParams p;
  Tensor blocked = b.cpu->conv_forward(b.in(x0), b.in(w), Tensor(), p);
  Tensor plain_ref = b.ref->conv_forward(x0, w, Tensor(), p);
  Tensor other = random_tensor(x0.shape(), 122);
  b.close(b.cpu->add(blocked, b.in(other)), b.ref->add(plain_ref, other), "add blocked + plain");
  b.close(b.cpu->add(b.in(other), blocked), b.ref->add(other, plain_ref), "add plain + blocked");
  Tensor acc_c = b.cpu->add(blocked, b.in(other)), acc_r = b.ref->add(plain_ref, other);
  b.cpu->add_inplace(acc_c, blocked);
  b.ref->add_inplace(acc_r, plain_ref);
  b.close(acc_c, acc_r, "add_inplace");
  b.cpu->scale(acc_c, 0.5f);
  b.ref->scale(acc_r, 0.5f);
  b.close(acc_c, acc_r, "scale");
  b.cpu->axpy(-2.0f, b.in(other), acc_c);
  b.ref->axpy(-2.0f, other, acc_r);
  b.close(acc_c, acc_r, "axpy");
  BOOST_TEST(b.cpu->sum_squares(acc_c) == b.ref->sum_squares(acc_r), boost::test_tools::tolerance(1e-5));
  Tensor f = b.dev_empty({1000});
  b.cpu->fill(f, 3.5f);
  BOOST_TEST(b.cpu->sum_squares(f) == 1000 * 3.5 * 3.5, boost::test_tools::tolerance(1e-9));
}

// conv -> bn -> relu -> maxpool -> conv(dw) -> bn -> relu6 -> (+ skip) -> GAP -> linear -> loss, and
// back: every parameter gradient and the input gradient match the reference backend.
inline void small_network_keeps_blocked_layouts_and_matches(Pair& b) {
  const int64_t N = 4, C = 16;
  Tensor x = random_tensor({N, 3, 12, 12}, 130);
  Tensor labels = random_labels(N, 10, 131);
  Tensor w1 = random_tensor({C, 3, 3, 3}, 132, -0.3, 0.3), w2 = random_tensor({C, 1, 3, 3}, 133, -0.3, 0.3);
  Tensor g1 = Tensor::full({C}, 1.0), b1 = Tensor::zeros({C}), g2 = random_tensor({C}, 134, 0.5, 1.5),
         b2 = random_tensor({C}, 135, -0.1, 0.1);
  Tensor wl = random_tensor({10, C}, 136, -0.3, 0.3), bl = random_tensor({10}, 137, -0.1, 0.1);
  const ConvParams c1{1, 1, 1, 1, 1, 1, 1}, c2{1, 1, 1, 1, 1, 1, C};
  const PoolParams mp{2, 2, 2, 2, 0, 0, true};
  struct Grads {
    Tensor dx, dw1, dw2, dg1, db1, dg2, db2, dwl, dbl;
    double loss;
    bool blocked_inside = false;
  };
  auto run = [&](Backend& be) {
    auto in = [&](const Tensor& t) { return t.device() == be.device() ? t : be.to_plain(t); };
    Tensor rm1 = in(Tensor::zeros({C})), rv1 = in(Tensor::full({C}, 1.0)), rm2 = in(Tensor::zeros({C})),
           rv2 = in(Tensor::full({C}, 1.0));
    Tensor h1 = be.conv_forward(in(x), in(w1), Tensor(), c1);
    BatchNormForward n1 = be.batch_norm_forward_training(h1, in(g1), in(b1), rm1, rv1, {});
    Tensor a1 = be.activation_forward(Activation::kRelu, n1.y, true);
    PoolForward p1 = be.pool_forward(PoolKind::kMax, a1, mp);
    Tensor h2 = be.conv_forward(p1.y, in(w2), Tensor(), c2);
    BatchNormForward n2 = be.batch_norm_forward_training(h2, in(g2), in(b2), rm2, rv2, {});
    Tensor a2 = be.activation_forward(Activation::kRelu6, n2.y, false);
    Tensor s = be.add(a2, p1.y);
    Tensor gp = be.global_avg_pool_forward(s);
    Tensor logits = be.linear_forward(gp, in(wl), in(bl));
    LossOutput lo = be.softmax_cross_entropy(logits, in(labels), true, 0);
    Grads g;
    g.loss = lo.loss;
    g.blocked_inside = !h1.is_plain() && !a1.is_plain() && !p1.y.is_plain() && !s.is_plain();
    g.dwl = be.empty(wl.shape());
    g.dbl = be.empty(bl.shape());
    be.linear_backward_weights(gp, lo.dlogits, g.dwl, g.dbl, false);
    Tensor dgp = be.linear_backward_data(lo.dlogits, in(wl), gp.shape());
    Tensor ds = be.global_avg_pool_backward(dgp, s.shape());
    Tensor da2 = be.activation_backward(Activation::kRelu6, ds, a2);
    g.dg2 = be.empty({C});
    g.db2 = be.empty({C});
    Tensor dh2 = be.batch_norm_backward(da2, h2, in(g2), n2.mean, n2.var, 1e-5f, g.dg2, g.db2, false);
    g.dw2 = be.empty(w2.shape());
    Tensor none;
    be.conv_backward_weights(p1.y, dh2, g.dw2, none, c2, false);
    Tensor dp1 = be.conv_backward_data(dh2, in(w2), p1.y.shape(), c2);
    be.add_inplace(dp1, ds);  // the skip connection
    Tensor da1 = be.pool_backward(PoolKind::kMax, dp1, p1.workspace, a1.shape(), mp);
    Tensor dn1 = be.activation_backward(Activation::kRelu, da1, a1);
    g.dg1 = be.empty({C});
    g.db1 = be.empty({C});
    Tensor dh1 = be.batch_norm_backward(dn1, h1, in(g1), n1.mean, n1.var, 1e-5f, g.dg1, g.db1, false);
    g.dw1 = be.empty(w1.shape());
    be.conv_backward_weights(in(x), dh1, g.dw1, none, c1, false);
    g.dx = be.conv_backward_data(dh1, in(w1), x.shape(), c1);
    return g;
  };
  Grads gc = run(*b.cpu), gr = run(*b.ref);
  if (b.cpu->name() == "cpu") BOOST_TEST(gc.blocked_inside);  // oneDNN chose blocked layouts and kept them
  BOOST_TEST(gc.loss == gr.loss, boost::test_tools::tolerance(1e-5));
  b.close(gc.dwl, gr.dwl, "net dwl", 1e-3);
  b.close(gc.dbl, gr.dbl, "net dbl", 1e-3);
  b.close(gc.dg2, gr.dg2, "net dgamma2", 1e-3);
  b.close(gc.db2, gr.db2, "net dbeta2", 1e-3);
  b.close(gc.dw2, gr.dw2, "net dw2", 1e-3);
  b.close(gc.dg1, gr.dg1, "net dgamma1", 1e-3);
  b.close(gc.db1, gr.db1, "net dbeta1", 1e-3);
  b.close(gc.dw1, gr.dw1, "net dw1", 1e-3);
  b.close(gc.dx, gr.dx, "net dx", 1e-3);
}
inline void optimizers_match_reference(Pair& b) {
  const int64_t n = 100003;  // odd, above the cpu backend's parallel threshold
  Tensor w = random_tensor({n}, 10), g = random_tensor({n}, 11), buf = random_tensor({n}, 12);
  Tensor wr = w.clone(), br = buf.clone();
  Tensor wc = b.in(w.clone()), bc = b.in(buf.clone()), gc = b.in(g);
  const SgdParams sp{0.03f, 0.9f, 0.1f, 5e-4f, false, 3};
  b.cpu->sgd_update(wc, gc, bc, sp);
  b.ref->sgd_update(wr, g, br, sp);
  b.close(wc, wr, "sgd w", 1e-6);
  b.close(bc, br, "sgd buf", 1e-6);
  Tensor m = random_tensor({n}, 13), v = random_tensor({n}, 14, 0, 1);
  Tensor mr = m.clone(), vr = v.clone(), mc = b.in(m.clone()), vc = b.in(v.clone());
  const AdamParams ap{1e-3f, 0.9f, 0.99f, 1e-8f, 0.01f, true, 7};
  b.cpu->adam_update(wc, gc, mc, vc, ap);
  b.ref->adam_update(wr, g, mr, vr, ap);
  b.close(wc, wr, "adam w", 1e-5);
  b.close(mc, mr, "adam m", 1e-6);
  b.close(vc, vr, "adam v", 1e-6);
}

}  // namespace tandem::engine::compute::testing::conformance
