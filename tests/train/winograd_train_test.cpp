// Training with Tandem's own Winograd convolution (TANDEM_CPU_WINOGRAD=on: forward and backward data of
// every 3x3 stride-1 layer, engine/compute/cpu/cpu_winograd.hpp) against the direct kernels (off):
// a few SGD steps of ResNet-18 give losses within 1% (the rounding differences grow step by step),
// and the loss falls alike. The kept weight transforms (CpuBackend::winograd_weights) never outlive the
// weights they were made from: after each route that changes a model's weights the Winograd logits equal
// the direct kernels' on the same weights.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

#include "engine/compute/backend.hpp"
#include "engine/compute/cpu/cpu_backend.hpp"
#include "engine/core/settings.hpp"
#include "engine/data/dataset.hpp"
#include "engine/nn/model.hpp"
#include "engine/nn/zoo.hpp"
#include "engine/train/trainer.hpp"

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

// Every route that changes a model's weights, each after evaluation passes that kept the transforms
// (forward, no backward: kept from the third pass on): an optimizer step, a checkpoint load, bytes written
// straight into the parameter buffer (what a collective, a parameter-server pull or an elastic state
// transfer does: a transport receives into it), and a resharding (hold() drops and re-makes layers'
// storage, so other values may land at an address the cache knows). After each, the logits equal those
// of the direct kernels on a copy of the same weights, and differ from the previous ones by far more
// than the tolerance, so a stale transform would fail.
BOOST_AUTO_TEST_CASE(kept_transforms_follow_every_route_that_changes_the_weights) {
  constexpr int64_t kBatch = 4;
  const auto backend = [](const char* mode) {
    const settings::ScopedProcessValue v("TANDEM_CPU_WINOGRAD", mode);
    compute::BackendOptions o;
    o.num_threads = 1;
    return compute::make_backend("cpu", o);
  };
  auto wbe = backend("on"), dbe = backend("off");
  auto& cb = dynamic_cast<compute::cpu::CpuBackend&>(*wbe);
  const nn::ModelSpec spec = nn::zoo_model("resnet18", {3, 32, 32}, 10);
  nn::Model wm(spec, *wbe, 11), dm(spec, *dbe, 11);
  const data::Dataset d = data::make_synthetic(3, 32, 32, 10, 4 * kBatch, 9);
  train::TrainerConfig tc;
  tc.batch_size = kBatch;
  tc.optimizer.lr = 0.05f;
  tc.optimizer.momentum = 0.9f;
  train::Trainer trainer(wm, d, nullptr, tc);
  std::vector<float> pixels(kBatch * 3 * 32 * 32);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<float>((i * 37) % 101) / 50.0f - 1.0f;
  const Tensor x = Tensor::wrap(pixels.data(), Shape{kBatch, 3, 32, 32}, DType::kF32);
  const auto logits = [](nn::Model& m, const Tensor& in) {
    const Tensor y = m.backend().to_plain(m.forward(in, false));
    return std::vector<float>(y.data<float>(), y.data<float>() + y.numel());
  };
  std::vector<float> before;
  // Evaluates four times (the third keeps the transforms, the fourth runs from them) and checks against the
  // direct kernels; the kept transforms are in place when the next route changes the weights.
  const auto check = [&](const char* route) {
    const auto s0 = cb.winograd_cache_stats();
    const std::vector<float> first = logits(wm, x), second = logits(wm, x), third = logits(wm, x);
    const auto s1 = cb.winograd_cache_stats();
    const std::vector<float> wino = logits(wm, x);
    const auto s2 = cb.winograd_cache_stats();
    BOOST_TEST(s1.transforms > s0.transforms, route << ": the new weights were not transformed");
    BOOST_TEST((s2.hits > s1.hits && s2.transforms == s1.transforms), route << ": nothing was kept");
    BOOST_TEST(s2.bytes > 0);
    BOOST_TEST((first == second && second == third && third == wino),
               route << ": kept transforms gave other logits than fresh ones");
    dm.params().copy_from(wm.params());
    dm.buffers().copy_from(wm.buffers());
    const std::vector<float> direct = logits(dm, x);
    float worst = 0, scale = 0, moved = 0;
    for (size_t i = 0; i < direct.size(); ++i) {
      worst = std::max(worst, std::abs(wino[i] - direct[i]));
      scale = std::max(scale, std::abs(direct[i]));
      if (!before.empty()) moved = std::max(moved, std::abs(before[i] - direct[i]));
    }
    BOOST_TEST_MESSAGE(route << ": max difference " << worst << " of " << scale << ", logits moved by " << moved);
    BOOST_TEST(worst <= 1e-4f * scale, route << ": winograd differs from direct by " << worst << " of " << scale);
    if (!before.empty()) BOOST_TEST(moved > 1e-2f * scale, route << ": the logits did not move (" << moved << ")");
    before = wino;
  };
  check("initial weights");

  BOOST_TEST_REQUIRE(!trainer.step().skipped);
  check("an optimizer step");
  const std::string ckpt = (std::filesystem::temp_directory_path() /
                            ("tandem_wino_cache_" + std::to_string(::getpid()) + ".ckpt")).string();
  trainer.save_checkpoint(ckpt);
  const std::vector<float> saved = before;
  for (int i = 0; i < 2; ++i) BOOST_TEST_REQUIRE(!trainer.step().skipped);
  check("two more optimizer steps");
  trainer.load_checkpoint(ckpt);
  std::filesystem::remove(ckpt);
  check("checkpoint load");
  BOOST_TEST(before == saved, "the checkpoint's weights gave other logits than when it was saved");

  // One weight of the last 512-channel 3x3 layer, written in place.
  size_t last = 0;
  for (size_t i = 0; i < spec.layers.size(); ++i)
    if (wm.layer_params(i).numel() == 512 * 512 * 9) last = i;
  BOOST_TEST_REQUIRE(last > 0);
  float* w = static_cast<float*>(wm.params().raw_data()) + wm.param_offset(last);
  w[512 * 9 * 7 + 4] += 20.0f;  // output channel 7, centre tap of input channel 0
  check("one weight written into the parameter buffer");

  // Resharding: hold the first half, then everything again (the second half re-made from the seed, its
  // trained values gone).
  wm.hold(0, spec.layers.size() / 2);
  wm.hold(0, spec.layers.size());
  check("resharding (hold)");
}

BOOST_AUTO_TEST_SUITE_END()
