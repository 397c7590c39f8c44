// Fused optimizer updates against closed forms (constant gradients make SGD-momentum and Adam
// trajectories geometric sums), on both host backends, plus argument checks.
#include <boost/test/unit_test.hpp>

#include <cmath>

#include "tests/compute/conformance.hpp"

using namespace tandem;
using namespace tandem::engine::compute;
using namespace tandem::engine::compute::testing;

namespace {
const char* const kHostBackends[] = {"reference", "cpu"};
constexpr int64_t kN = 100003;  // odd, above the parallel threshold
}  // namespace

BOOST_AUTO_TEST_SUITE(optimizers)

BOOST_AUTO_TEST_CASE(sgd_plain_step_with_weight_decay) {
  for (const char* name : kHostBackends) {
    auto be = make_backend(name);
    Tensor w = random_tensor({kN}, 1), g = random_tensor({kN}, 2), none;
    Tensor w0 = w.clone();
    be->sgd_update(w, g, none, SgdParams{0.1f, 0.0f, 0.0f, 0.01f, false, 1});
    std::vector<double> want(kN);
    for (int64_t i = 0; i < kN; ++i) {
      const double wi = w0.data<float>()[i];
      want[i] = wi - 0.1 * (g.data<float>()[i] + 0.01 * wi);  // w - lr (g + wd w)
    }
    expect_close(values(w), want, 1e-6, 1e-7, std::string(name) + " sgd");
  }
}

BOOST_AUTO_TEST_CASE(sgd_momentum_and_nesterov_follow_geometric_sums) {
  // Constant gradient g, no weight decay, dampening 0: buf_t = g (1 - m^t) / (1 - m).
  // Heavy ball: w_T = w0 - lr g sum_{t=1..T} (1 - m^t) / (1 - m).
  // Nesterov:   w_T = w0 - lr g sum_{t=1..T} (1 + m (1 - m^t) / (1 - m)).
  const double lr = 0.05, m = 0.9;
  const int T = 5;
  for (const char* name : kHostBackends) {
    for (bool nesterov : {false, true}) {
      auto be = make_backend(name);
      Tensor w = Tensor::full({kN}, 1.0), g = Tensor::full({kN}, 0.5), buf = Tensor::full({kN}, 123.0);
      for (int t = 1; t <= T; ++t)
        be->sgd_update(w, g, buf, SgdParams{float(lr), float(m), 0.0f, 0.0f, nesterov, t});
      double sum = 0;
      for (int t = 1; t <= T; ++t) {
        const double b = (1 - std::pow(m, t)) / (1 - m);
        sum += nesterov ? 1 + m * b : b;
      }
      const double want_w = 1.0 - lr * 0.5 * sum;
      const double want_buf = 0.5 * (1 - std::pow(m, T)) / (1 - m);
      BOOST_TEST_CONTEXT(name << (nesterov ? " nesterov" : " momentum")) {
        BOOST_TEST(w.data<float>()[0] == want_w, boost::test_tools::tolerance(1e-5));
        BOOST_TEST(w.data<float>()[kN - 1] == want_w, boost::test_tools::tolerance(1e-5));
        BOOST_TEST(buf.data<float>()[kN / 2] == want_buf, boost::test_tools::tolerance(1e-5));
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(sgd_dampening_applies_after_the_first_step) {
  for (const char* name : kHostBackends) {
    auto be = make_backend(name);
    Tensor w = Tensor::full({8}, 0.0), g = Tensor::full({8}, 1.0), buf = Tensor::zeros({8});
    be->sgd_update(w, g, buf, SgdParams{1.0f, 0.5f, 0.5f, 0.0f, false, 1});  // buf = g = 1
    be->sgd_update(w, g, buf, SgdParams{1.0f, 0.5f, 0.5f, 0.0f, false, 2});  // buf = 0.5 + 0.5 = 1
    BOOST_TEST(buf.data<float>()[3] == 1.0f);
    BOOST_TEST(w.data<float>()[3] == -2.0f);
  }
}

BOOST_AUTO_TEST_CASE(adam_with_constant_gradient_moves_lr_per_step) {
  // With constant g, bias-corrected m_hat = g and v_hat = g^2, so every step is lr g / (|g| + eps).
  const double lr = 0.01, eps = 1e-8;
  for (const char* name : kHostBackends) {
    auto be = make_backend(name);
    Tensor w = Tensor::full({kN}, 2.0), g = Tensor::full({kN}, -0.25), m = Tensor::zeros({kN}), v = Tensor::zeros({kN});
    for (int t = 1; t <= 4; ++t) be->adam_update(w, g, m, v, AdamParams{float(lr), 0.9f, 0.999f, float(eps), 0.0f, false, t});
    const double want = 2.0 + 4 * lr * 0.25 / (0.25 + eps);
    BOOST_TEST(w.data<float>()[7] == want, boost::test_tools::tolerance(1e-5));
    BOOST_TEST(m.data<float>()[7] == -0.25 * (1 - std::pow(0.9, 4)), boost::test_tools::tolerance(1e-5));
    BOOST_TEST(v.data<float>()[7] == 0.0625 * (1 - std::pow(0.999, 4)), boost::test_tools::tolerance(1e-4));
  }
}

BOOST_AUTO_TEST_CASE(adamw_decouples_weight_decay_and_adam_adds_l2) {
  const float lr = 0.1f, wd = 0.5f;
  for (const char* name : kHostBackends) {
    auto be = make_backend(name);
    // AdamW, one step with g = 1: w = w (1 - lr wd) - lr * 1 / (1 + eps).
    Tensor w = Tensor::full({16}, 3.0), g = Tensor::full({16}, 1.0), m = Tensor::zeros({16}), v = Tensor::zeros({16});
    be->adam_update(w, g, m, v, AdamParams{lr, 0.9f, 0.999f, 0.0f, wd, true, 1});
    BOOST_TEST(w.data<float>()[0] == 3.0 * (1 - 0.05) - 0.1, boost::test_tools::tolerance(1e-6));
    // Adam with L2: g' = g + wd w = 1 + 1.5 = 2.5 > 0, one step moves by lr exactly.
    Tensor w2 = Tensor::full({16}, 3.0), m2 = Tensor::zeros({16}), v2 = Tensor::zeros({16});
    be->adam_update(w2, g, m2, v2, AdamParams{lr, 0.9f, 0.999f, 0.0f, wd, false, 1});
    BOOST_TEST(w2.data<float>()[0] == 2.9, boost::test_tools::tolerance(1e-6));
    BOOST_TEST(m2.data<float>()[0] == 0.25, boost::test_tools::tolerance(1e-6));  // (1 - 0.9) * 2.5
  }
}

BOOST_AUTO_TEST_CASE(cpu_matches_reference_on_random_state) {
  conformance::Pair b("cpu");
  conformance::optimizers_match_reference(b);
}

BOOST_AUTO_TEST_CASE(bad_arguments_are_rejected_with_names) {
  for (const char* name : kHostBackends) {
    auto be = make_backend(name);
    Tensor w = Tensor::zeros({10}), g = Tensor::zeros({9}), buf = Tensor::zeros({10}), none;
    try {
      be->sgd_update(w, g, buf, SgdParams{0.1f, 0.9f});
      BOOST_FAIL("no throw");
    } catch (const Error& e) {
      BOOST_TEST(std::string(e.what()).find("grad has 9 elements, param 10") != std::string::npos, e.what());
    }
    Tensor g10 = Tensor::zeros({10});
    BOOST_TEST((status_of([&] { be->sgd_update(w, g10, none, SgdParams{0.1f, 0.9f}); }) == Status::kInvalidArgument));
    BOOST_TEST((status_of([&] { be->sgd_update(w, g10, buf, SgdParams{0.1f, 0.0f, 0, 0, true}); }) ==
                Status::kInvalidArgument));  // nesterov without momentum
    BOOST_TEST((status_of([&] { be->adam_update(w, g10, buf, buf, AdamParams{0.1f, 1.0f}); }) ==
                Status::kInvalidArgument));  // beta1 = 1
    Tensor wi = Tensor::zeros({10}, DType::kI32);
    BOOST_TEST((status_of([&] { be->sgd_update(wi, g10, none, SgdParams{}); }) == Status::kInvalidArgument));
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(backend_registry)

BOOST_AUTO_TEST_CASE(lists_builtins_and_rejects_unknown_names) {
  const auto names = backend_names();
  BOOST_TEST((std::find(names.begin(), names.end(), "cpu") != names.end()));
  BOOST_TEST((std::find(names.begin(), names.end(), "reference") != names.end()));
  try {
    make_backend("tpu");
    BOOST_FAIL("no throw");
  } catch (const Error& e) {
    BOOST_TEST((e.status() == Status::kInvalidArgument));
    BOOST_TEST(std::string(e.what()).find("known: ") != std::string::npos, e.what());
  }
  auto cpu = make_backend("cpu", BackendOptions{1, 0});
  BOOST_TEST(cpu->num_threads() == 1);
  cpu->set_num_threads(2);
  BOOST_TEST(cpu->num_threads() == 2);
  BOOST_TEST((status_of([&] { cpu->set_num_threads(0); }) == Status::kInvalidArgument));
  BOOST_TEST((status_of([] { make_backend("cpu", BackendOptions{-1, 0}); }) == Status::kInvalidArgument));
}

BOOST_AUTO_TEST_CASE(a_device_index_is_cuda_only_and_checked) {
  auto message_of = [](const char* spec) -> std::pair<Status, std::string> {
    try {
      make_backend(spec);
    } catch (const Error& e) {
      return {e.status(), e.what()};
    }
    return {Status::kOk, ""};
  };
  for (const char* bad : {"cpu:0", "reference:1"}) {
    const auto [s, m] = message_of(bad);
    BOOST_TEST((s == Status::kInvalidArgument));
    BOOST_TEST(m.find("only cuda takes a device index") != std::string::npos, m);
  }
  for (const char* bad : {"cuda:", "cuda:x", "cuda:-1", "cuda:1x"}) {
    const auto [s, m] = message_of(bad);
    BOOST_TEST((s == Status::kInvalidArgument));
    BOOST_TEST(m.find("is not a number >= 0") != std::string::npos, m);
  }
  // A well-formed index reaches the CUDA backend itself: built without it, the registry says so; built with it
  // on a host without that device, its factory names why (never a crash).
  const auto [s, m] = message_of("cuda:3");
  if (!backend_compiled("cuda")) {
    BOOST_TEST(m.find("this build has no CUDA backend") != std::string::npos, m);
  } else if (s != Status::kOk) {
    BOOST_TEST((s == Status::kUnsupported || s == Status::kInvalidArgument), m);
    BOOST_TEST((m.find("cuda backend") != std::string::npos), m);
  }
}

BOOST_AUTO_TEST_CASE(registered_factories_replace_and_extend) {
  register_backend("reference-alias", [](const BackendOptions& o) { return make_backend("reference", o); });
  BOOST_TEST(backend_compiled("reference-alias"));
  BOOST_TEST(make_backend("reference-alias")->name() == "reference");
}

BOOST_AUTO_TEST_CASE(ops_name_the_bad_argument) {
  for (const char* name : kHostBackends) {
    auto be = make_backend(name);
    Tensor x = Tensor::zeros({2, 3, 5, 5}), w = Tensor::zeros({4, 2, 3, 3});
    try {
      be->conv_forward(x, w, Tensor(), ConvParams{});
      BOOST_FAIL("no throw");
    } catch (const Error& e) {
      BOOST_TEST(std::string(e.what()).find("expect 2 input channels") != std::string::npos, e.what());
    }
    Tensor logits = Tensor::zeros({2, 3});
    Tensor labels = Tensor::from_vector({2}, std::vector<int64_t>{1, 3});
    try {
      be->softmax_cross_entropy(logits, labels, true, 0);
      BOOST_FAIL("no throw");
    } catch (const Error& e) {
      BOOST_TEST(std::string(e.what()).find("label 3 of row 1 is outside [0, 3)") != std::string::npos, e.what());
    }
    Tensor lf = Tensor::zeros({2}, DType::kF32);
    BOOST_TEST((status_of([&] { be->softmax_cross_entropy(logits, lf, true, 0); }) == Status::kInvalidArgument));
    Tensor a = Tensor::zeros({2, 3}), b = Tensor::zeros({3, 2});
    BOOST_TEST((status_of([&] { be->add(a, b); }) == Status::kInvalidArgument));
    Tensor big = Tensor::zeros({1, 1, 2, 2});
    BOOST_TEST((status_of([&] { be->pool_forward(PoolKind::kMax, big, PoolParams{3, 3, 1, 1, 0, 0}); }) ==
                Status::kInvalidArgument));
    Tensor x2 = Tensor::zeros({4, 6});
    Tensor wl = Tensor::zeros({3, 5});
    BOOST_TEST((status_of([&] { be->linear_forward(x2, wl, Tensor()); }) == Status::kInvalidArgument));
  }
  auto cpu = make_backend("cpu");
  Tensor xd = Tensor::zeros({1, 1, 3, 3}, DType::kF64), wd = Tensor::zeros({1, 1, 1, 1}, DType::kF64);
  BOOST_TEST((status_of([&] { cpu->conv_forward(xd, wd, Tensor(), ConvParams{}); }) == Status::kInvalidArgument));
}

BOOST_AUTO_TEST_SUITE_END()
