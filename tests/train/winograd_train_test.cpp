// Training with Tandem's own Winograd convolution (TANDEM_CPU_WINOGRAD=on: forward and backward data of
// every 3x3 stride-1 layer, engine/compute/cpu/cpu_winograd.hpp) against the direct kernels (off):
// a few SGD steps of ResNet-18 give losses within 1% (the rounding differences grow step by step),
// and the loss falls alike.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <memory>
#include <vector>

#include "engine/compute/backend.hpp"
#include "engine/compute/cpu/cpu_backend.hpp"
#include "engine/core/settings.hpp"
#include "engine/data/dataset.hpp"
#include "engine/nn/model.hpp"
#include "engine/nn/zoo.hpp"

using namespace tandem;
using namespace tandem::engine;

namespace {

// Losses of `steps` SGD steps (momentum 0.9) on one fixed batch of synthetic 3x32x32 images.
std::vector<double> losses(const char* mode, int steps) {
  const settings::ScopedProcessValue v("TANDEM_CPU_WINOGRAD", mode);
  compute::BackendOptions o;
  o.num_threads = 1;
  auto be = compute::make_backend("cpu", o);
  constexpr int64_t kBatch = 8;
  const data::Dataset d = data::make_synthetic(3, 32, 32, 10, kBatch, 5);
  std::vector<float> pixels(d.pixels.begin(), d.pixels.end());
  for (float& p : pixels) p = (p / 255.0f - 0.5f) / 0.25f;
  const Tensor x = Tensor::wrap(pixels.data(), Shape{kBatch, 3, 32, 32}, DType::kF32);
  std::vector<int32_t> lab(d.labels.begin(), d.labels.begin() + kBatch);
  const Tensor labels = Tensor::wrap(lab.data(), Shape{kBatch}, DType::kI32);
  const nn::ModelSpec spec = nn::zoo_model("resnet18", {3, 32, 32}, 10);
  nn::Model m(spec, *be, 7);
  auto& cb = dynamic_cast<compute::cpu::CpuBackend&>(*be);
  compute::ConvParams p;
  p.pad_h = p.pad_w = 1;
  const bool on = std::string_view(mode) == "on";
  BOOST_TEST((cb.conv_algo_of(Shape{kBatch, 64, 32, 32}, Shape{64, 64, 3, 3}, false, p) ==
              (on ? compute::cpu::ConvAlgo::kTandemWinograd : compute::cpu::ConvAlgo::kDirect)));
  Tensor momentum = Tensor::zeros(m.params().shape());
  std::vector<double> out;
  for (int s = 1; s <= steps; ++s) {
    compute::LossOutput lo = be->softmax_cross_entropy(m.forward(x, true), labels, true, 0);
    out.push_back(lo.loss);
    m.backward(lo.dlogits);
    compute::SgdParams sp;
    sp.lr = 0.02f;
    sp.momentum = 0.9f;
    sp.step = s;
    be->sgd_update(m.params(), m.grads(), momentum, sp);
  }
  return out;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(winograd_training)

BOOST_AUTO_TEST_CASE(resnet18_losses_with_tandems_winograd_match_the_direct_kernels) {
  constexpr int kSteps = 5;
  const std::vector<double> direct = losses("off", kSteps), wino = losses("on", kSteps);
  for (int s = 0; s < kSteps; ++s) {
    BOOST_TEST_MESSAGE("step " << s + 1 << ": loss direct " << direct[s] << ", winograd " << wino[s]);
    BOOST_TEST(std::isfinite(wino[s]));
    BOOST_TEST(std::abs(wino[s] - direct[s]) <= 1e-2 * std::abs(direct[s]) + 1e-3,
               "step " << s + 1 << ": " << wino[s] << " vs " << direct[s]);
  }
  BOOST_TEST(direct[0] == wino[0], boost::test_tools::tolerance(1e-5));  // the first forward: rounding only
  BOOST_TEST(wino[kSteps - 1] < 0.8 * wino[0]);  // it trains: the loss falls on the repeated batch
}

BOOST_AUTO_TEST_SUITE_END()
