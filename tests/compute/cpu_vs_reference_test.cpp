// The oneDNN backend against the reference backend (tests/compute/conformance.hpp).
#include <boost/test/unit_test.hpp>

#include "tests/compute/conformance.hpp"

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

BOOST_AUTO_TEST_SUITE_END()
