#include "engine/nn/zoo.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "engine/core/error.hpp"
#include "engine/core/suggest.hpp"

namespace tandem::engine::nn {
namespace {

using B = ModelBuilder;

ModelSpec mlp(SampleShape in, int64_t classes) {
  B b("mlp", in);
  b.flatten();
  b.linear(512, true, B::kPrev, "fc1");
  b.relu();
  b.linear(512, true, B::kPrev, "fc2");
  b.relu();
  b.linear(classes, true, B::kPrev, "fc3");
  return std::move(b).build();
}

ModelSpec lenet5(SampleShape in, int64_t classes) {
  B b("lenet5", in);
  b.conv(6, 5, 1, 2, 1, true, B::kPrev, "conv1");
  b.relu();
  b.maxpool(2, 2);
  b.conv(16, 5, 1, 0, 1, true, B::kPrev, "conv2");
  b.relu();
  b.maxpool(2, 2);
  b.flatten();
  b.linear(120, true, B::kPrev, "fc1");
  b.relu();
  b.linear(84, true, B::kPrev, "fc2");
  b.relu();
  b.linear(classes, true, B::kPrev, "fc3");
  return std::move(b).build();
}

// conv + batch norm (+ relu) with names prefix.conv / prefix.bn / prefix.relu.
int32_t conv_bn(B& b, const std::string& prefix, int64_t out, int64_t k, int64_t stride, int64_t pad, int64_t groups,
                int32_t from, int act /*0 none, 1 relu, 6 relu6*/) {
  b.conv(out, k, stride, pad, groups, false, from, prefix + ".conv");
  int32_t y = b.batchnorm(B::kPrev, prefix + ".bn");
  if (act == 1) y = b.relu(B::kPrev, prefix + ".relu");
  if (act == 6) y = b.relu6(B::kPrev, prefix + ".relu6");
  return y;
}

ModelSpec resnet18(SampleShape in, int64_t classes) {
  B b("resnet18", in);
  int32_t x = conv_bn(b, "stem", 64, 3, 1, 1, 1, B::kPrev, 1);
  int64_t channels = 64;
  const int64_t planes[4] = {64, 128, 256, 512};
  for (int stage = 0; stage < 4; ++stage) {
    for (int block = 0; block < 2; ++block) {
      const int64_t stride = (stage > 0 && block == 0) ? 2 : 1;
      const std::string p = fmt::format("layer{}.{}", stage + 1, block);
      conv_bn(b, p + ".a", planes[stage], 3, stride, 1, 1, x, 1);
      const int32_t main = conv_bn(b, p + ".b", planes[stage], 3, 1, 1, 1, B::kPrev, 0);
      int32_t shortcut = x;
      if (stride != 1 || channels != planes[stage]) {
        shortcut = conv_bn(b, p + ".down", planes[stage], 1, stride, 0, 1, x, 0);
      }
      b.add(main, shortcut, p + ".add");
      x = b.relu(B::kPrev, p + ".relu");
      channels = planes[stage];
    }
  }
  b.global_avgpool(B::kPrev, "pool");
  b.linear(classes, true, B::kPrev, "fc");
  return std::move(b).build();
}

int64_t make_divisible(double v, int64_t divisor = 8) {
  int64_t r = std::max<int64_t>(divisor, static_cast<int64_t>(v + divisor / 2.0) / divisor * divisor);
  if (static_cast<double>(r) < 0.9 * v) r += divisor;  // never round down by more than 10%
  return r;
}

ModelSpec mobilenetv2(SampleShape in, int64_t classes, double wm) {
  TANDEM_REQUIRE(wm > 0 && wm <= 4, "mobilenetv2: width multiplier {} out of range (0, 4]", wm);
  B b(wm == 1.0 ? std::string("mobilenetv2") : fmt::format("mobilenetv2_x{}", wm), in);
  // CIFAR stem: the first convolution and the 24-channel stage keep stride 1 (ImageNet uses 2 for both).
  struct Stage { int64_t t, c, n, s; };
  const Stage stages[] = {{1, 16, 1, 1}, {6, 24, 2, 1}, {6, 32, 3, 2}, {6, 64, 4, 2},
                          {6, 96, 3, 1}, {6, 160, 3, 2}, {6, 320, 1, 1}};
  int64_t channels = make_divisible(32 * wm);
  int32_t x = conv_bn(b, "stem", channels, 3, 1, 1, 1, B::kPrev, 6);
  int block = 0;
  for (const Stage& st : stages) {
    const int64_t out = make_divisible(static_cast<double>(st.c) * wm);
    for (int64_t i = 0; i < st.n; ++i, ++block) {
      const int64_t stride = i == 0 ? st.s : 1;
      const std::string p = fmt::format("block{}", block);
      const int64_t hidden = channels * st.t;
      int32_t y = x;
      if (st.t != 1) y = conv_bn(b, p + ".expand", hidden, 1, 1, 0, 1, y, 6);
      y = conv_bn(b, p + ".dw", hidden, 3, stride, 1, hidden, y, 6);
      y = conv_bn(b, p + ".project", out, 1, 1, 0, 1, y, 0);
      if (stride == 1 && channels == out) y = b.add(y, x, p + ".add");
      x = y;
      channels = out;
    }
  }
  conv_bn(b, "head", make_divisible(1280 * std::max(1.0, wm)), 1, 1, 0, 1, x, 6);
  b.global_avgpool(B::kPrev, "pool");
  b.linear(classes, true, B::kPrev, "fc");
  return std::move(b).build();
}

ModelSpec vgg16(SampleShape in, int64_t classes) {
  B b("vgg16", in);
  const int64_t cfg[] = {64, 64, 0, 128, 128, 0, 256, 256, 256, 0, 512, 512, 512, 0, 512, 512, 512, 0};
  int conv_i = 0, pool_i = 0;
  for (int64_t c : cfg) {
    if (c == 0) {
      b.maxpool(2, 2, 0, B::kPrev, fmt::format("pool{}", ++pool_i));
      continue;
    }
    const std::string p = fmt::format("conv{}", ++conv_i);
    b.conv(c, 3, 1, 1, 1, true, B::kPrev, p);
    b.batchnorm(B::kPrev, p + ".bn");
    b.relu(B::kPrev, p + ".relu");
  }
  b.flatten();
  b.linear(classes, true, B::kPrev, "fc");
  return std::move(b).build();
}

ModelSpec alexnet(SampleShape in, int64_t classes) {
  // The 11x11/4 ImageNet stem becomes 3x3/2 so that 32x32 inputs keep 2x2 maps before the classifier.
  B b("alexnet", in);
  b.conv(64, 3, 2, 1, 1, true, B::kPrev, "conv1");
  b.relu();
  b.maxpool(2, 2);
  b.conv(192, 3, 1, 1, 1, true, B::kPrev, "conv2");
  b.relu();
  b.maxpool(2, 2);
  b.conv(384, 3, 1, 1, 1, true, B::kPrev, "conv3");
  b.relu();
  b.conv(256, 3, 1, 1, 1, true, B::kPrev, "conv4");
  b.relu();
  b.conv(256, 3, 1, 1, 1, true, B::kPrev, "conv5");
  b.relu();
  b.maxpool(2, 2);
  b.flatten();
  b.linear(4096, true, B::kPrev, "fc1");
  b.relu();
  b.linear(4096, true, B::kPrev, "fc2");
  b.relu();
  b.linear(classes, true, B::kPrev, "fc3");
  return std::move(b).build();
}

}  // namespace

const std::vector<std::string>& zoo_names() {
  static const std::vector<std::string> names = {"mlp", "lenet5", "resnet18", "mobilenetv2", "vgg16", "alexnet"};
  return names;
}

bool is_zoo_model(std::string_view name) noexcept {
  const auto& n = zoo_names();
  return std::find(n.begin(), n.end(), name) != n.end();
}

SampleShape zoo_default_input(std::string_view name) {
  if (name == "mlp" || name == "lenet5") return SampleShape{1, 28, 28};
  TANDEM_REQUIRE(is_zoo_model(name), "unknown model '{}'{} (zoo: {})", name, did_you_mean(name, zoo_names()),
                 fmt::join(zoo_names(), ", "));
  return SampleShape{3, 32, 32};
}

ModelSpec zoo_model(std::string_view name, SampleShape input, int64_t num_classes, const ZooOptions& options) {
  TANDEM_REQUIRE(num_classes > 0, "model '{}': class count must be positive (got {})", name, num_classes);
  TANDEM_REQUIRE(input.c > 0 && input.h > 0 && input.w > 0, "model '{}': input shape {} must be positive", name,
                 to_string(input));
  if (name == "mlp") return mlp(input, num_classes);
  if (name == "lenet5") return lenet5(input, num_classes);
  if (name == "resnet18") return resnet18(input, num_classes);
  if (name == "mobilenetv2") return mobilenetv2(input, num_classes, options.width_mult);
  if (name == "vgg16") return vgg16(input, num_classes);
  if (name == "alexnet") return alexnet(input, num_classes);
  TANDEM_THROW(Status::kInvalidArgument, "unknown model '{}'{} (zoo: {})", name, did_you_mean(name, zoo_names()),
               fmt::join(zoo_names(), ", "));
}

}  // namespace tandem::engine::nn
