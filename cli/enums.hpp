#pragma once
// The names the command line gives the C ABI's enums, in one place: every option taking one of them checks
// its value against these maps (CLI11's CheckedTransformer names the valid ones on a bad value).
#include <map>
#include <string>

#include "tandem/tandem.h"

namespace tandem::cli {

// The zoo as the command line describes it (help texts of train, simulate, calibrate and model summary).
inline constexpr const char* kZooHelp =
    "mlp, lenet5, resnet18, mobilenetv2, vgg16, alexnet: CIFAR-sized; resnet18_imagenet, resnet50, resnet101, "
    "vgg16_imagenet, mobilenetv2_imagenet, alexnet_imagenet, inception_v3: torchvision's ImageNet networks";

inline const std::map<std::string, int>& strategy_names() {
  static const std::map<std::string, int> m{{"single", TANDEM_STRATEGY_SINGLE},
                                            {"ddp", TANDEM_STRATEGY_DDP},
                                            {"pipeline", TANDEM_STRATEGY_PIPELINE},
                                            {"hybrid", TANDEM_STRATEGY_HYBRID},
                                            {"ps", TANDEM_STRATEGY_PS},
                                            {"ps-async", TANDEM_STRATEGY_PS_ASYNC},
                                            {"ssp", TANDEM_STRATEGY_SSP},
                                            {"asgd", TANDEM_STRATEGY_ASGD},
                                            {"easgd", TANDEM_STRATEGY_EASGD},
                                            {"fedavg", TANDEM_STRATEGY_FEDAVG},
                                            {"localsgd", TANDEM_STRATEGY_LOCALSGD}};
  return m;
}
inline const std::map<std::string, int>& schedule_names() {
  static const std::map<std::string, int> m{{"1f1b", TANDEM_SCHEDULE_1F1B}, {"gpipe", TANDEM_SCHEDULE_GPIPE}};
  return m;
}
inline const std::map<std::string, int>& compression_names() {
  static const std::map<std::string, int> m{
      {"none", TANDEM_COMPRESSION_NONE}, {"fp16", TANDEM_COMPRESSION_FP16}, {"bf16", TANDEM_COMPRESSION_BF16}};
  return m;
}
inline const std::map<std::string, int>& precision_names() {
  static const std::map<std::string, int> m{
      {"f32", TANDEM_PRECISION_F32}, {"bf16", TANDEM_PRECISION_BF16}, {"fp16", TANDEM_PRECISION_FP16}};
  return m;
}
inline const std::map<std::string, int>& framework_names() {
  static const std::map<std::string, int> m{{"tandem", TANDEM_FRAMEWORK_TANDEM},
                                            {"pytorch-ddp", TANDEM_FRAMEWORK_PYTORCH_DDP}};
  return m;
}
inline const std::map<std::string, int>& partition_names() {
  static const std::map<std::string, int> m{{"flops", TANDEM_PARTITION_FLOPS},
                                            {"measured", TANDEM_PARTITION_MEASURED}};
  return m;
}
inline const std::map<std::string, int>& algo_names() {
  static const std::map<std::string, int> m{{"auto", TANDEM_ALGO_AUTO},           {"ring", TANDEM_ALGO_RING},
                                            {"hd", TANDEM_ALGO_HALVING_DOUBLING}, {"tree", TANDEM_ALGO_TREE},
                                            {"hier", TANDEM_ALGO_HIERARCHICAL},   {"det", TANDEM_ALGO_DETERMINISTIC}};
  return m;
}
inline const std::map<std::string, int>& credit_mode_names() {
  static const std::map<std::string, int> m{{"preset", TANDEM_CREDIT_MODE_PRESET},
                                            {"standard", TANDEM_CREDIT_MODE_STANDARD},
                                            {"unlimited", TANDEM_CREDIT_MODE_UNLIMITED}};
  return m;
}
// The simulator's optimizer names: SGD, SGD with momentum 0.9, Adam.
inline const std::map<std::string, int>& sim_optimizer_names() {
  static const std::map<std::string, int> m{{"sgd", 0}, {"momentum", 1}, {"adam", 2}};
  return m;
}

// The name of `value` in `names` ("?" if none).
inline const char* name_of(const std::map<std::string, int>& names, int value) {
  for (const auto& [k, v] : names)
    if (v == value) return k.c_str();
  return "?";
}

}  // namespace tandem::cli
