// The oneDNN backend against the reference backend (tests/compute/conformance.hpp).
#include <boost/test/unit_test.hpp>

#include <cstring>

#include "tests/compute/conformance.hpp"

using namespace tandem;
using namespace tandem::engine::compute;
using namespace tandem::engine::compute::testing;
using conformance::Pair;

BOOST_AUTO_TEST_SUITE(cpu_vs_reference)

BOOST_AUTO_TEST_CASE(convolution_forward_and_backward) {
  Pair b("cpu");
  conformance::convolution_forward_and_backward(b);
}

BOOST_AUTO_TEST_CASE(batch_norm_training_inference_and_backward) {
  Pair b("cpu");
  conformance::batch_norm_training_inference_and_backward(b);
}

BOOST_AUTO_TEST_CASE(activations_on_plain_and_blocked_inputs) {
  Pair b("cpu");
  conformance::activations_on_plain_and_blocked_inputs(b);
}

BOOST_AUTO_TEST_CASE(pooling_forward_and_backward) {
  Pair b("cpu");
  conformance::pooling_forward_and_backward(b);
}

BOOST_AUTO_TEST_CASE(linear_forward_and_backward) {
  Pair b("cpu");
  conformance::linear_forward_and_backward(b);
}

BOOST_AUTO_TEST_CASE(softmax_cross_entropy_loss_grad_and_accuracy) {
  Pair b("cpu");
  conformance::softmax_cross_entropy_loss_grad_and_accuracy(b);
}

BOOST_AUTO_TEST_CASE(dropout_masks_match_and_rate_is_p) {
  Pair b("cpu");
  conformance::dropout_masks_match_and_rate_is_p(b);
}

BOOST_AUTO_TEST_CASE(elementwise_ops_mix_layouts) {
  Pair b("cpu");
  conformance::elementwise_ops_mix_layouts(b);
}

BOOST_AUTO_TEST_CASE(small_network_keeps_blocked_layouts_and_matches) {
  Pair b("cpu");
  conformance::small_network_keeps_blocked_layouts_and_matches(b);
}

// The cpu backend's own max pooling kernel works on plain and on oneDNN's channel-blocked
// layouts; a convolution with 6 output channels leaves a block padded 6 -> 8 (or 16).
BOOST_AUTO_TEST_CASE(max_pooling_on_blocked_and_padded_channel_layouts) {
  Pair b("cpu");
  const PoolParams params[] = {{2, 2, 2, 2, 0, 0, true}, {3, 3, 2, 2, 1, 1, true}, {3, 2, 1, 2, 1, 0, true}};
  uint32_t seed = 300;
  for (int64_t channels : {6, 16, 19}) {
    Tensor x = random_tensor({3, 2, 11, 10}, seed++), w = random_tensor({channels, 2, 3, 3}, seed++);
    const ConvParams cp{1, 1, 1, 1, 1, 1, 1};
    Tensor hc = b.cpu->conv_forward(x, w, Tensor(), cp), hr = b.ref->conv_forward(x, w, Tensor(), cp);
    for (const PoolParams& p : params) {
      const std::string name = "max pool after conv to " + std::to_string(channels) + " channels, k" +
                               std::to_string(p.kernel_h) + "x" + std::to_string(p.kernel_w) + " p" + std::to_string(p.pad_h);
      PoolForward fc = b.cpu->pool_forward(PoolKind::kMax, hc, p), fr = b.ref->pool_forward(PoolKind::kMax, hr, p);
      BOOST_TEST(fc.y.is_plain() == hc.is_plain(), name << ": the output keeps the input's layout");
      b.close(fc.y, fr.y, name + " forward");
      Tensor dy = random_tensor(fr.y.shape(), seed++);
      b.close(b.cpu->pool_backward(PoolKind::kMax, dy, fc.workspace, hc.shape(), p),
              b.ref->pool_backward(PoolKind::kMax, dy, fr.workspace, hr.shape(), p), name + " backward");
    }
  }
}

BOOST_AUTO_TEST_CASE(max_pooling_ties_go_to_the_first_tap_and_bad_workspaces_fail) {
  Pair b("cpu");
  Tensor x = Tensor::full({1, 2, 4, 4}, 0.5);  // every window is a tie
  const PoolParams p{2, 2, 2, 2, 0, 0, true};
  PoolForward fc = b.cpu->pool_forward(PoolKind::kMax, x, p), fr = b.ref->pool_forward(PoolKind::kMax, x, p);
  Tensor dy = random_tensor({1, 2, 2, 2}, 7);
  b.close(b.cpu->pool_backward(PoolKind::kMax, dy, fc.workspace, x.shape(), p),
          b.ref->pool_backward(PoolKind::kMax, dy, fr.workspace, x.shape(), p), "ties");
  Tensor other = b.cpu->pool_forward(PoolKind::kMax, Tensor::full({1, 2, 6, 6}, 1.0), p).workspace;
  BOOST_TEST((status_of([&] { b.cpu->pool_backward(PoolKind::kMax, dy, other, x.shape(), p); }) ==
              Status::kInvalidArgument));
  Tensor foreign = Tensor::zeros({1, 2, 2, 2}, DType::kU8);  // right shape, no layout: not from a forward
  BOOST_TEST((status_of([&] { b.cpu->pool_backward(PoolKind::kMax, dy, foreign, x.shape(), p); }) ==
              Status::kInvalidArgument));
}

// Weight gradients of small convolutions whose channel counts are not whole vectors take the
// cpu backend's direct kernel when dy arrives channel-blocked (as it does inside a network).
BOOST_AUTO_TEST_CASE(direct_weight_gradients_of_small_convolutions_match_reference) {
  Pair b("cpu");
  struct Case {
    int64_t n, c, h, w, o, k, stride, pad, dil;
    bool blocked_x;
  };
  const Case cases[] = {{4, 1, 12, 12, 6, 5, 1, 2, 1, false},  // LeNet-5's first layer, smaller
                        {4, 6, 9, 9, 16, 5, 1, 0, 1, true},    // its second, input blocked and padded
                        {2, 3, 11, 10, 7, 3, 2, 1, 1, false},  // stride 2, odd sizes
                        {2, 5, 10, 10, 12, 3, 1, 2, 2, true}};  // dilation 2
  uint32_t seed = 400;
  for (const Case& k : cases) {
    const std::string name = "conv dW " + std::to_string(k.c) + "->" + std::to_string(k.o) + " k" + std::to_string(k.k) +
                             " s" + std::to_string(k.stride) + " d" + std::to_string(k.dil);
    const ConvParams p{k.stride, k.stride, k.pad, k.pad, k.dil, k.dil, 1};
    // Blocked tensors with known values: 1x1 convolutions of random inputs, read back plain.
    auto blocked = [&](const Shape& s) {
      const ConvParams one{1, 1, 0, 0, 1, 1, 1};
      Tensor t = b.cpu->conv_forward(random_tensor({s[0], 2, s[2], s[3]}, seed++), random_tensor({s[1], 2, 1, 1}, seed++),
                                     Tensor(), one);
      BOOST_TEST_REQUIRE(!t.is_plain(), name << ": expected a channel-blocked tensor");
      return t;
    };
    const Shape xs{k.n, k.c, k.h, k.w};
    Tensor x = k.blocked_x ? blocked(xs) : random_tensor(xs, seed++);
    const Shape ys = conv_output_shape(xs, Shape{k.o, k.c, k.k, k.k}, p);
    Tensor dy = blocked(ys);
    Tensor xr = b.cpu->to_plain(x), dyr = b.cpu->to_plain(dy);
    Tensor dw = Tensor::empty({k.o, k.c, k.k, k.k}), db = Tensor::empty({k.o});
    Tensor dwr = Tensor::empty(dw.shape()), dbr = Tensor::empty({k.o});
    for (bool acc : {false, true}) {
      b.cpu->conv_backward_weights(x, dy, dw, db, p, acc);
      b.ref->conv_backward_weights(xr, dyr, dwr, dbr, p, acc);
      b.close(dw, dwr, name + (acc ? " accumulate" : ""), 1e-4);
      b.close(db, dbr, name + " bias" + (acc ? " accumulate" : ""), 1e-4);
    }
    // Plain inputs (as a pipeline stage receives them) give the same bits.
    Tensor dw_plain = Tensor::empty(dw.shape()), db_plain = Tensor::empty({k.o});
    b.cpu->conv_backward_weights(x, dy, dw, db, p, false);
    b.cpu->conv_backward_weights(xr, dyr, dw_plain, db_plain, p, false);
    BOOST_TEST(std::memcmp(dw.raw_data(), dw_plain.raw_data(), dw.nbytes()) == 0, name << ": layout changed dW");
    BOOST_TEST(std::memcmp(db.raw_data(), db_plain.raw_data(), db.nbytes()) == 0, name << ": layout changed db");
  }
}

// The vectorized SGD kernel against the scalar float formula it replaced (bit for bit: the AVX2
// clone does the same operations without FMA) and against the reference backend (double).
BOOST_AUTO_TEST_CASE(sgd_kernel_matches_the_scalar_formula_bit_for_bit) {
  constexpr int64_t n = 70001;  // odd, above the parallel threshold
  for (int threads : {1, 2}) {
    for (bool nesterov : {false, true}) {
      for (float momentum : {0.0f, 0.9f}) {
        if (nesterov && momentum == 0.0f) continue;
        auto cpu = make_backend("cpu"), ref = make_backend("reference");
        cpu->set_num_threads(threads);
        Tensor w = random_tensor({n}, 11), buf = Tensor::zeros({n});
        Tensor wr = w.clone(), br = buf.clone(), ws = w.clone(), bs = buf.clone();
        for (int step = 1; step <= 3; ++step) {
          const SgdParams p{0.05f, momentum, nesterov ? 0.0f : 0.1f, 1e-3f, nesterov, step};
          Tensor g = random_tensor({n}, 20 + step);
          cpu->sgd_update(w, g, buf, p);
          ref->sgd_update(wr, g, br, p);
          float* sw = ws.data<float>();
          float* sb = bs.data<float>();
          const float* sg = g.data<float>();
          const float damp = 1.0f - p.dampening;
          for (int64_t i = 0; i < n; ++i) {
            const float d = sg[i] + p.weight_decay * sw[i];
            if (momentum == 0.0f) {
              sw[i] -= p.lr * d;
              continue;
            }
            const float nb = step == 1 ? d : p.momentum * sb[i] + damp * d;
            sb[i] = nb;
            sw[i] -= p.lr * (nesterov ? d + p.momentum * nb : nb);
          }
        }
        BOOST_TEST_CONTEXT("threads " << threads << " momentum " << momentum << (nesterov ? " nesterov" : "")) {
          BOOST_TEST(std::memcmp(w.raw_data(), ws.raw_data(), w.nbytes()) == 0);
          if (momentum != 0.0f) BOOST_TEST(std::memcmp(buf.raw_data(), bs.raw_data(), buf.nbytes()) == 0);
          expect_close(values(w), values(wr), 1e-5, 1e-6, "sgd vs reference");
        }
      }
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
