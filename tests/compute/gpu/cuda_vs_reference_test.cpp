#include <boost/test/unit_test.hpp>

#include "tests/compute/conformance.hpp"
#include "tests/compute/gpu/gpu_available.hpp"

using namespace tandem;
using namespace tandem::engine::compute;
using namespace tandem::engine::compute::testing;
using conformance::Pair;

#define GPU_CASE(name)                                                                      \
  BOOST_AUTO_TEST_CASE(name, *boost::unit_test::precondition(CudaAvailable())) {            \
    Pair b("cuda");                                                                         \
    conformance::name(b);                                                                   \
  }

BOOST_AUTO_TEST_SUITE(cuda_vs_reference)

GPU_CASE(convolution_forward_and_backward)
GPU_CASE(batch_norm_training_inference_and_backward)
GPU_CASE(activations_on_plain_and_blocked_inputs)
GPU_CASE(pooling_forward_and_backward)
GPU_CASE(linear_forward_and_backward)
GPU_CASE(softmax_cross_entropy_loss_grad_and_accuracy)
GPU_CASE(dropout_masks_match_and_rate_is_p)
GPU_CASE(elementwise_ops_mix_layouts)
GPU_CASE(small_network_keeps_blocked_layouts_and_matches)
GPU_CASE(optimizers_match_reference)

BOOST_AUTO_TEST_CASE(tensors_round_trip_and_errors_name_the_device,
                     *boost::unit_test::precondition(CudaAvailable())) {
  auto be = make_backend("cuda");
  Tensor h = random_tensor({3, 5}, 1);
  Tensor d = be->to_plain(h);
  BOOST_TEST(d.device().is_cuda());
  BOOST_TEST((status_of([&] { (void)d.data<float>(); }) == Status::kInvalidArgument));
  expect_close(values(be->to_host(d)), values(h), 0, 0, "round trip");
  auto cpu = make_backend("cpu");
  BOOST_TEST((status_of([&] { cpu->add(d, d); }) == Status::kInvalidArgument));  // wrong device
  Tensor logits = be->to_plain(random_tensor({2, 3}, 2));
  Tensor bad = be->to_plain(Tensor::from_vector({2}, std::vector<int64_t>{0, 5}));
  try {
    be->softmax_cross_entropy(logits, bad, true, 0);
    BOOST_FAIL("no throw");
  } catch (const Error& e) {
    BOOST_TEST(std::string(e.what()).find("label 5 of row 1") != std::string::npos, e.what());
  }
}

BOOST_AUTO_TEST_CASE(device_allocator_reuses_blocks, *boost::unit_test::precondition(CudaAvailable())) {
  auto be = make_backend("cuda");
  void* first = nullptr;
  {
    Tensor t = be->empty({1 << 20}, DType::kF32);
    first = t.raw_data();
  }
  Tensor u = be->empty({1 << 20}, DType::kF32);
  BOOST_TEST(u.raw_data() == first);
  BOOST_TEST(reinterpret_cast<uintptr_t>(u.raw_data()) % 64 == 0);
}

BOOST_AUTO_TEST_SUITE_END()

// Runs everywhere: without a GPU, creating the backend must fail with kUnsupported and a reason.
BOOST_AUTO_TEST_CASE(cuda_backend_reports_why_it_is_unavailable) {
  const auto& probe = cuda_probe();
  if (probe.available) {
    BOOST_TEST_MESSAGE("CUDA device present: backend created");
    return;
  }
  BOOST_TEST_MESSAGE("no CUDA device: " << probe.reason);
  BOOST_TEST((status_of([] { make_backend("cuda"); }) == Status::kUnsupported));
  BOOST_TEST(!probe.reason.empty());
}
