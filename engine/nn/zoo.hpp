#pragma once
// The model zoo as specs: mlp (784-512-512-10 on 28x28), lenet5, resnet18 (CIFAR stem), mobilenetv2 (CIFAR stem,
// width multiplier), vgg16 (batch norm), alexnet (adapted to 32x32). Each builds for any input CxHxW and class count
// (too small an input is refused naming the layer that no longer fits).
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
// The input a zoo model is usually trained on: 1x28x28 (Fashion-MNIST) for mlp and lenet5, 3x32x32 (CIFAR) otherwise.
SampleShape zoo_default_input(std::string_view name);
// Throws kInvalidArgument for an unknown name (listing the valid ones) or a bad input/class count.
ModelSpec zoo_model(std::string_view name, SampleShape input, int64_t num_classes, const ZooOptions& options = {});

}  // namespace tandem::engine::nn
