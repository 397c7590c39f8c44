#pragma once
// The model zoo as specs: mlp (784-512-512-10 on 28x28), lenet5, resnet18 (CIFAR stem), mobilenetv2 (CIFAR stem,
// width multiplier), vgg16 (batch norm), alexnet (adapted to 32x32); and torchvision's ImageNet networks, whose
// parameter counts equal torchvision's with 1,000 classes: resnet18_imagenet, resnet50, resnet101, vgg16_imagenet,
// mobilenetv2_imagenet, alexnet_imagenet, inception_v3 (with its auxiliary classifier as a side branch); bert_base, a
// spec-only transformer encoder (token ids 1 x L x 1, default L = 128; no backend runs it). Each builds
// for any input CxHxW and class count (too small an input is refused naming the layer that no longer fits).
#include <string>
#include <string_view>
#include <vector>

#include "engine/nn/model_spec.hpp"

namespace tandem::engine::nn {

struct ZooOptions {
  double width_mult = 1.0;  // mobilenetv2 only: channels scaled and rounded to multiples of 8
};

const std::vector<std::string>& zoo_names();
bool is_zoo_model(std::string_view name) noexcept;
// The input a zoo model is usually trained on: 1x28x28 (Fashion-MNIST) for mlp and lenet5, 3x224x224 for the
// ImageNet networks (3x299x299 for inception_v3), 3x32x32 (CIFAR) otherwise.
SampleShape zoo_default_input(std::string_view name);
// 1000 for the ImageNet networks, 10 otherwise.
int64_t zoo_default_classes(std::string_view name);
// Non-empty when `name` is a CIFAR variant (resnet18, mobilenetv2, vgg16, alexnet) given an input of 224x224 or
// more pixels: names the ImageNet variant to use instead. zoo_model() logs it (log::warn, once per model name).
std::string zoo_input_warning(std::string_view name, SampleShape input);
// Throws kInvalidArgument for an unknown name (listing the valid ones) or a bad input/class count.
ModelSpec zoo_model(std::string_view name, SampleShape input, int64_t num_classes, const ZooOptions& options = {});

}  // namespace tandem::engine::nn
