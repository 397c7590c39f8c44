// `tandem model summary NAME|FILE [--input CxHxW] [--classes N] [--width-mult W] [--json]`: the layer table of a zoo
// model or a JSON spec (output shape, parameters, FLOPs, activation bytes) and totals, through the C ABI. Warnings the
// library logs while building the model (a CIFAR variant given an ImageNet-sized input) are shown with the table.
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/command.hpp"
#include "cli/enums.hpp"
#include "tandem/tandem.h"

namespace {

struct SummaryOptions {
  std::string model;
  std::string input;  // "CxHxW"
  int64_t classes = 0;
  double width_mult = 0;
  bool json = false;
};

bool is_file(const std::string& p) {
  struct stat st{};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string human(double v) {
  if (v >= 1e9) return fmt::format("{:.2f}G", v / 1e9);
  if (v >= 1e6) return fmt::format("{:.2f}M", v / 1e6);
  if (v >= 1e3) return fmt::format("{:.1f}K", v / 1e3);
  return fmt::format("{:.0f}", v);
}

// Collects the context's warnings (and errors) for the summary; lower levels are dropped.
void collect_warning(tandem_log_level_t level, const char* message, void* user) {
  if (level >= TANDEM_LOG_WARN) static_cast<std::vector<std::string>*>(user)->emplace_back(message);
}

int summary(const SummaryOptions& o) {
  tandem_context_t* ctx = nullptr;
  std::vector<std::string> warnings;
  tandem_context_params_t cp = TANDEM_CONTEXT_PARAMS_INIT;
  cp.field_mask = TANDEM_CONTEXT_PARAM_LOG_SINK;
  cp.log_sink = &collect_warning;
  cp.log_user_data = &warnings;
  if (tandem_context_create(&cp, &ctx) != TANDEM_OK) return tandem::cli::fail("cannot create a context");
  tandem_model_params_t p = TANDEM_MODEL_PARAMS_INIT;
  p.field_mask = TANDEM_MODEL_PARAM_BACKEND;
  p.backend = "none";
  const bool from_file = is_file(o.model) || o.model.find(".json") != std::string::npos;
  if (from_file) {
    p.field_mask |= TANDEM_MODEL_PARAM_SPEC_PATH;
    p.spec_path = o.model.c_str();
  } else {
    p.field_mask |= TANDEM_MODEL_PARAM_NAME;
    p.name = o.model.c_str();
    if (!o.input.empty()) {
      long long c = 0, h = 0, w = 0;
      char tail = 0;
      if (std::sscanf(o.input.c_str(), "%lldx%lldx%lld%c", &c, &h, &w, &tail) != 3) {
        tandem_context_destroy(ctx);
        std::fprintf(stderr, "tandem: --input '%s' must look like 3x32x32\n", o.input.c_str());
        return 2;
      }
      p.field_mask |= TANDEM_MODEL_PARAM_INPUT_SHAPE;
      p.input_channels = c;
      p.input_height = h;
      p.input_width = w;
    }
    if (o.classes > 0) {
      p.field_mask |= TANDEM_MODEL_PARAM_NUM_CLASSES;
      p.num_classes = o.classes;
    }
    if (o.width_mult > 0) {
      if (const std::string why = tandem::cli::width_mult_error(o.model); !why.empty()) {
        std::fprintf(stderr, "tandem model summary: %s\n", why.c_str());
        tandem_context_destroy(ctx);
        return 2;
      }
      p.field_mask |= TANDEM_MODEL_PARAM_WIDTH_MULT;
      p.width_mult = o.width_mult;
    }
  }
  tandem_model_t* model = nullptr;
  if (tandem_model_create(ctx, &p, &model) != TANDEM_OK) {
    for (const std::string& w : warnings) std::fprintf(stderr, "warning: %s\n", w.c_str());
    const int rc = tandem::cli::fail(fmt::format("cannot load model '{}'", o.model));
    tandem_context_destroy(ctx);
    return rc;
  }
  tandem_model_attr_t ma = TANDEM_MODEL_ATTR_INIT;
  ma.field_mask = TANDEM_MODEL_ATTR_NAME | TANDEM_MODEL_ATTR_SHAPE | TANDEM_MODEL_ATTR_COST;
  tandem_model_query(model, &ma);
  nlohmann::json layers = nlohmann::json::array();
  if (!o.json) {
    std::printf("%s: input %lldx%lldx%lld, %lld classes\n", ma.name, static_cast<long long>(ma.input_channels),
                static_cast<long long>(ma.input_height), static_cast<long long>(ma.input_width),
                static_cast<long long>(ma.num_classes));
    for (const std::string& w : warnings) std::printf("warning: %s\n", w.c_str());
    std::printf("%4s  %-22s %-15s %-14s %10s %10s %10s %10s\n", "#", "layer", "type", "output", "params", "fwd FLOPs",
                "bwd FLOPs", "act bytes");
  }
  for (size_t i = 0; i < ma.num_layers; ++i) {
    tandem_layer_attr_t la = TANDEM_LAYER_ATTR_INIT;
    la.field_mask = TANDEM_LAYER_ATTR_NAME | TANDEM_LAYER_ATTR_SHAPE | TANDEM_LAYER_ATTR_COST;
    tandem_model_layer_query(model, i, &la);
    const std::string shape = fmt::format("{}x{}x{}", la.out_channels, la.out_height, la.out_width);
    if (o.json) {
      nlohmann::json inputs = nlohmann::json::array();
      // tandem_layer_attr_t holds the first two producers; a concat may have more (num_inputs counts them all).
      const int known = std::min<int>(la.num_inputs, static_cast<int>(std::size(la.inputs)));
      for (int k = 0; k < known; ++k) inputs.push_back(la.inputs[k]);
      layers.push_back({{"name", la.name}, {"type", la.kind}, {"inputs", inputs},
                        {"num_inputs", la.num_inputs}, {"output", {la.out_channels, la.out_height, la.out_width}},
                        {"params", la.params},
                        {"macs", la.macs}, {"fwd_flops", la.fwd_flops}, {"bwd_flops", la.bwd_flops},
                        {"activation_bytes", la.activation_bytes}});
    } else {
      std::printf("%4zu  %-22s %-15s %-14s %10s %10s %10s %10s\n", i, la.name, la.kind, shape.c_str(),
                  human(static_cast<double>(la.params)).c_str(), human(la.fwd_flops).c_str(),
                  human(la.bwd_flops).c_str(), human(static_cast<double>(la.activation_bytes)).c_str());
    }
  }
  if (o.json) {
    const nlohmann::json out = {
        {"model", ma.name},
        {"input", {ma.input_channels, ma.input_height, ma.input_width}},
        {"num_classes", ma.num_classes},
        {"warnings", warnings},
        {"layers", layers},
        {"totals",
         {{"params", ma.params}, {"buffers", ma.buffers}, {"macs", ma.macs}, {"fwd_flops", ma.fwd_flops},
          {"bwd_flops", ma.bwd_flops}, {"activation_bytes", ma.activation_bytes}}}};
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    std::printf("total: %zu layers, %lld parameters (%s, %.1f MB f32), %s MACs, forward %s FLOPs, backward %s FLOPs, "
                "activations %s bytes per sample\n",
                ma.num_layers, static_cast<long long>(ma.params), human(static_cast<double>(ma.params)).c_str(),
                static_cast<double>(ma.params) * 4 / 1e6, human(static_cast<double>(ma.macs)).c_str(),
                human(ma.fwd_flops).c_str(), human(ma.bwd_flops).c_str(),
                human(static_cast<double>(ma.activation_bytes)).c_str());
  }
  tandem_model_destroy(model);
  tandem_context_destroy(ctx);
  return 0;
}

tandem::cli::Registration reg{"model", "inspect models (zoo names or JSON specs)", [](CLI::App& app) -> tandem::cli::Runner {
  auto o = std::make_shared<SummaryOptions>();
  app.require_subcommand(1);
  CLI::App* s = app.add_subcommand("summary", "per-layer table (output shape, parameters, FLOPs, activation bytes)");
  s->add_option("model", o->model,
                std::string("zoo name (") + tandem::cli::kZooHelp + ") or a JSON spec file")
      ->required();
  s->add_option("--input", o->input, "input shape CxHxW for a zoo model (default: its usual input)");
  s->add_option("--classes", o->classes, "class count for a zoo model (default 10; 1000 for the ImageNet networks)")
      ->check(tandem::cli::kPositive);
  s->add_option("--width-mult", o->width_mult, "mobilenetv2 width multiplier")->check(tandem::cli::kPositive);
  s->add_flag("--json", o->json, "machine-readable output");
  return [o, s] { return s->parsed() ? summary(*o) : 1; };
}};

}  // namespace
