// The ImageNet networks and the BERT-base encoder spec of the zoo against torchvision: parameter counts exactly (torchvision counts batch-norm gamma
// and beta as parameters and the running statistics as buffers), MACs per image within 3% of the published figures
// (convolutions and linear layers only, as fvcore/ptflops count them), and the warning for a CIFAR variant given an
// ImageNet-sized input.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/compute/backend.hpp"
#include "engine/core/log.hpp"
#include "engine/nn/model.hpp"
#include "engine/nn/model_spec.hpp"
#include "engine/nn/zoo.hpp"
#include "tests/nn/expect_error.hpp"

using namespace tandem::engine::nn;
namespace tt = boost::test_tools;

namespace {

ModelSpec imagenet(const std::string& n) { return zoo_model(n, zoo_default_input(n), 1000); }

struct Reference {
  const char* name;
  int64_t params;      // torchvision, 1,000 classes
  double gmacs;        // published MACs per image at the default input
};

// torchvision's figures (sum of p.numel() over model.parameters()); MACs as reported by torchvision's model docs
// ("GFLOPS" there are multiply-adds) and ptflops.
const Reference kReferences[] = {
    {"resnet18_imagenet", 11'689'512, 1.814},  {"resnet50", 25'557'032, 4.089},
    {"resnet101", 44'549'160, 7.801},          {"vgg16_imagenet", 138'357'544, 15.470},
    {"mobilenetv2_imagenet", 3'504'872, 0.301}, {"alexnet_imagenet", 61'100'840, 0.714},
    {"inception_v3", 27'161'264, 5.713},
};

struct Captured {
  std::vector<std::string> lines;
  static void sink(int, const char* message, void* user) { static_cast<Captured*>(user)->lines.emplace_back(message); }
};

}  // namespace

BOOST_AUTO_TEST_SUITE(zoo_imagenet)

BOOST_AUTO_TEST_CASE(parameter_counts_equal_torchvisions) {
  for (const Reference& r : kReferences) {
    BOOST_TEST_CONTEXT(r.name) {
      const ModelSpec m = imagenet(r.name);
      BOOST_TEST(m.totals().params == r.params);
      BOOST_TEST(m.num_classes() == 1000);
      BOOST_TEST(zoo_default_classes(r.name) == 1000);
    }
  }
}

BOOST_AUTO_TEST_CASE(macs_per_image_are_the_standard_figures) {
  for (const Reference& r : kReferences) {
    BOOST_TEST_CONTEXT(r.name) {
      const double gmacs = static_cast<double>(imagenet(r.name).totals().macs) / 1e9;
      BOOST_TEST(std::abs(gmacs - r.gmacs) <= 0.03 * r.gmacs, gmacs << " G MACs against " << r.gmacs);
    }
  }
}

BOOST_AUTO_TEST_CASE(default_inputs_are_imagenet_sized) {
  BOOST_TEST(to_string(zoo_default_input("resnet50")) == "3x224x224");
  BOOST_TEST(to_string(zoo_default_input("inception_v3")) == "3x299x299");
  BOOST_TEST(to_string(zoo_default_input("resnet18")) == "3x32x32");
  BOOST_TEST(zoo_default_classes("resnet18") == 10);
}

BOOST_AUTO_TEST_CASE(batch_norm_running_statistics_are_buffers) {
  // ResNet-50 has 53 batch norms over 26,560 channels: 2 running statistics each (num_batches_tracked aside).
  BOOST_TEST(imagenet("resnet50").totals().buffers == 2 * 26'560);
  BOOST_TEST(imagenet("vgg16_imagenet").totals().buffers == 0);
}

BOOST_AUTO_TEST_CASE(inception_auxiliary_classifier_is_a_side_branch) {
  const ModelSpec m = imagenet("inception_v3");
  const int32_t aux = m.find("AuxLogits.fc");
  BOOST_TEST(m.layers[static_cast<size_t>(aux)].out_shape.c == 1000);
  for (const LayerSpec& l : m.layers) {
    for (int32_t p : l.inputs) BOOST_TEST(p != aux);  // nothing reads the auxiliary logits
  }
  BOOST_TEST(m.layers.back().name == "fc");
  // Without the auxiliary classifier torchvision counts 23,834,568: the branch holds the difference.
  int64_t aux_params = 0;
  for (const LayerSpec& l : m.layers) aux_params += l.name.rfind("AuxLogits.", 0) == 0 ? l.params : 0;
  BOOST_TEST(m.totals().params - aux_params == 23'834'568);
  BOOST_TEST(m.layers[static_cast<size_t>(m.find("Mixed_7c.cat"))].out_shape.c == 2048);
  BOOST_TEST(to_string(m.layers[static_cast<size_t>(m.find("Mixed_6e.cat"))].out_shape) == "768x17x17");
}

BOOST_AUTO_TEST_CASE(imagenet_models_round_trip_through_json) {
  for (const Reference& r : kReferences) {
    const ModelSpec a = imagenet(r.name);
    const ModelSpec b = model_from_json(model_to_json(a));
    BOOST_TEST(b.totals().params == a.totals().params);
    BOOST_TEST(b.totals().macs == a.totals().macs);
    BOOST_TEST(b.totals().activation_bytes == a.totals().activation_bytes);
  }
}

BOOST_AUTO_TEST_CASE(cifar_variants_at_imagenet_size_name_the_imagenet_network) {
  const std::pair<const char*, const char*> variants[] = {{"resnet18", "resnet18_imagenet"},
                                                          {"mobilenetv2", "mobilenetv2_imagenet"},
                                                          {"vgg16", "vgg16_imagenet"},
                                                          {"alexnet", "alexnet_imagenet"}};
  for (const auto& [cifar, standard] : variants) {
    const std::string w = zoo_input_warning(cifar, SampleShape{3, 224, 224});
    BOOST_TEST(w.find(standard) != std::string::npos, w);
    BOOST_TEST(w.find("CIFAR") != std::string::npos, w);
    BOOST_TEST(!zoo_input_warning(cifar, SampleShape{3, 320, 320}).empty());
    BOOST_TEST(zoo_input_warning(cifar, SampleShape{3, 32, 32}).empty());
    BOOST_TEST(zoo_input_warning(cifar, SampleShape{3, 64, 64}).empty());
  }
  for (const Reference& r : kReferences) BOOST_TEST(zoo_input_warning(r.name, zoo_default_input(r.name)).empty());
  BOOST_TEST(zoo_input_warning("lenet5", SampleShape{1, 224, 224}).empty());
}

BOOST_AUTO_TEST_CASE(zoo_model_logs_the_warning_once) {
  Captured log;
  tandem::log::set_sink(&Captured::sink, &log);
  zoo_model("alexnet", SampleShape{3, 32, 32}, 10);
  zoo_model("alexnet_imagenet", SampleShape{3, 224, 224}, 1000);
  const size_t before = log.lines.size();
  zoo_model("alexnet", SampleShape{3, 224, 224}, 1000);
  zoo_model("alexnet", SampleShape{3, 224, 224}, 1000);  // the same model again: no second warning
  tandem::log::set_sink(nullptr, nullptr);
  BOOST_TEST(before == 0u);
  BOOST_REQUIRE(log.lines.size() == 1u);
  BOOST_TEST(log.lines[0].find("alexnet_imagenet") != std::string::npos, log.lines[0]);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(transformer_specs)

// BERT-base from its architecture: embeddings 30522x768 + 512x768 + 2x768 + layer norm 2x768 = 23,837,184; per layer
// attention 4 x (768^2 + 768) = 2,362,368, feed-forward 768x3072 + 3072 + 3072x768 + 768 = 4,722,432 and two layer
// norms 3,072: 7,087,872, x12 = 85,054,464. Total 108,891,648; Hugging Face's 109,482,240 adds the pooler
// (768^2 + 768 = 590,592), which an encoder spec leaves out.
BOOST_AUTO_TEST_CASE(bert_base_parameters_and_macs_follow_the_architecture) {
  const ModelSpec m = zoo_model("bert_base", zoo_default_input("bert_base"), 1);
  BOOST_TEST(m.totals().params == 108'891'648);
  BOOST_TEST(m.totals().params + 768 * 768 + 768 == 109'482'240);
  BOOST_TEST(to_string(m.output()) == "768x128x1");
  // At 128 tokens: 12 x (4 L D^2 + 2 L^2 D + 2 L D F) = 11.17 G MACs per sequence.
  const double expected = 12.0 * (4.0 * 128 * 768 * 768 + 2.0 * 128 * 128 * 768 + 2.0 * 128 * 768 * 3072);
  BOOST_TEST(static_cast<double>(m.totals().macs) == expected, tt::tolerance(0.001));
  const ModelSpec back = model_from_json(model_to_json(m));
  BOOST_TEST(back.totals().params == m.totals().params);
  BOOST_TEST(back.totals().fwd_flops == m.totals().fwd_flops);
  for (const LayerSpec& l : m.layers) {
    int64_t n = 0;
    for (const auto& s : l.param_shapes()) {
      int64_t k = 1;
      for (int64_t d : s) k *= d;
      n += k;
    }
    BOOST_TEST(n == l.params, l.name);
  }
}

BOOST_AUTO_TEST_CASE(attention_costs_and_checks) {
  ModelBuilder b("att", SampleShape{1, 10, 1});
  b.embedding(100, 8, kModelInput, "emb");
  const int32_t a = b.attention(2, ModelBuilder::kPrev, "att");
  const LayerSpec& l = b.spec().layers[static_cast<size_t>(a)];
  BOOST_TEST(l.params == 4 * 8 * 8 + 4 * 8);
  BOOST_TEST(l.macs == 4 * 10 * 8 * 8 + 2 * 10 * 10 * 8);
  BOOST_TEST(to_string(l.out_shape) == "8x10x1");
  BOOST_CHECK_THROW(b.attention(3, a, "bad"), tandem::Error);  // 3 heads do not divide 8
  BOOST_CHECK_THROW(zoo_model("bert_base", SampleShape{1, 513, 1}, 1), tandem::Error);
}

BOOST_AUTO_TEST_CASE(backends_refuse_spec_only_layers_naming_them) {
  auto be = tandem::engine::compute::make_backend("reference");
  tandem::testing::expect_error([&] { Model m(zoo_model("bert_base", SampleShape{1, 8, 1}, 1), *be); },
                                tandem::Status::kUnsupported, {"embeddings.word", "spec-only", "reference"});
}

BOOST_AUTO_TEST_SUITE_END()
