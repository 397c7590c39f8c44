#include "engine/nn/model_spec.hpp"

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "engine/core/error.hpp"

namespace tandem::engine::nn {

using nlohmann::json;

const SampleShape& ModelSpec::output() const {
  return layers.empty() ? input : layers.back().out_shape;
}

int64_t ModelSpec::num_classes() const { return output().numel(); }

ModelTotals ModelSpec::totals(size_t begin, size_t end) const {
  TANDEM_REQUIRE(begin <= end && end <= layers.size(), "model '{}': layer range [{}, {}) out of bounds (0..{})", name,
                 begin, end, layers.size());
  ModelTotals t;
  for (size_t i = begin; i < end; ++i) {
    const LayerSpec& l = layers[i];
    t.params += l.params;
    t.buffers += l.buffers;
    t.macs += l.macs;
    t.fwd_flops += l.fwd_flops;
    t.bwd_flops += l.bwd_flops();
    t.activation_bytes += l.activation_bytes;
  }
  return t;
}

std::vector<int32_t> ModelSpec::crossing(size_t cut) const {
  TANDEM_REQUIRE(cut <= layers.size(), "model '{}': cut {} beyond {} layers", name, cut, layers.size());
  std::set<int32_t> out;
  for (size_t i = cut; i < layers.size(); ++i) {
    for (int32_t p : layers[i].inputs) {
      if (p < static_cast<int32_t>(cut)) out.insert(p);
    }
  }
  return {out.begin(), out.end()};
}

std::vector<bool> ModelSpec::shared_outputs(size_t begin) const {
  const auto is_relu = [](LayerKind k) { return k == LayerKind::kReLU || k == LayerKind::kReLU6; };
  std::vector<int> consumers(layers.size(), 0);
  for (const LayerSpec& l : layers)
    for (int32_t p : l.inputs)
      if (p >= 0) ++consumers[static_cast<size_t>(p)];
  std::vector<bool> shared(layers.size(), false);
  for (size_t i = begin; i < layers.size(); ++i) {
    const LayerSpec& l = layers[i];
    if (l.kind == LayerKind::kFlatten) {
      shared[i] = true;
    } else if (is_relu(l.kind) && !l.inputs.empty() && l.inputs[0] >= static_cast<int32_t>(begin)) {
      const auto p = static_cast<size_t>(l.inputs[0]);
      shared[i] = consumers[p] == 1 && !is_relu(layers[p].kind) && layers[p].kind != LayerKind::kFlatten;
    }
  }
  return shared;
}

int64_t ModelSpec::stored_activation_bytes(size_t begin, size_t end) const {
  TANDEM_REQUIRE(begin <= end && end <= layers.size(), "model '{}': layers [{}, {}) out of range ({} layers)", name,
                 begin, end, layers.size());
  const std::vector<bool> shared = shared_outputs(begin);
  int64_t bytes = 0;
  for (size_t i = begin; i < end; ++i)
    if (!shared[i]) bytes += layers[i].activation_bytes;
  return bytes;
}

int32_t ModelSpec::find(const std::string& layer_name) const {
  for (size_t i = 0; i < layers.size(); ++i) {
    if (layers[i].name == layer_name) return static_cast<int32_t>(i);
  }
  TANDEM_THROW(Status::kInvalidArgument, "model '{}' has no layer named '{}'", name, layer_name);
}

void ModelSpec::infer_all() {
  TANDEM_REQUIRE(input.c > 0 && input.h > 0 && input.w > 0, "model '{}': input shape {} is empty", name,
                 to_string(input));
  int64_t elements = input.c;
  TANDEM_REQUIRE(!__builtin_mul_overflow(elements, input.h, &elements) &&
                     !__builtin_mul_overflow(elements, input.w, &elements) && elements <= (int64_t{1} << 48),
                 "model '{}': input shape {} has more than 2^48 elements", name, to_string(input));
  for (size_t i = 0; i < layers.size(); ++i) {
    std::vector<SampleShape> in;
    for (int32_t p : layers[i].inputs) {
      TANDEM_REQUIRE(p == kModelInput || (p >= 0 && static_cast<size_t>(p) < i),
                     "layer '{}' (#{}) reads layer #{}, which does not come before it", layers[i].name, i, p);
      in.push_back(p == kModelInput ? input : layers[static_cast<size_t>(p)].out_shape);
    }
    infer(layers[i], in);
  }
}

// ---- builder ------------------------------------------------------------------------------------

ModelBuilder::ModelBuilder(std::string name, SampleShape input) {
  spec_.name = std::move(name);
  spec_.input = input;
  TANDEM_REQUIRE(input.c > 0 && input.h > 0 && input.w > 0, "model '{}': input shape {} must be positive",
                 spec_.name, to_string(input));
}

int32_t ModelBuilder::resolve(int32_t from) const {
  if (from == kPrev) return last();  // -1 == kModelInput for the first layer
  TANDEM_REQUIRE(from == kModelInput || (from >= 0 && from <= last()), "model '{}': input index {} is not a layer yet",
                 spec_.name, from);
  return from;
}

const SampleShape& ModelBuilder::shape_of(int32_t index) const {
  return index == kModelInput ? spec_.input : spec_.layers.at(static_cast<size_t>(index)).out_shape;
}

int32_t ModelBuilder::push(LayerSpec layer) {
  const auto index = static_cast<int32_t>(spec_.layers.size());
  if (layer.name.empty()) layer.name = fmt::format("{}{}", layer_kind_name(layer.kind), index);
  for (const LayerSpec& l : spec_.layers) {
    TANDEM_REQUIRE(l.name != layer.name, "model '{}': layer name '{}' is used twice", spec_.name, layer.name);
  }
  std::vector<SampleShape> in;
  for (int32_t p : layer.inputs) {
    TANDEM_REQUIRE(p == kModelInput || (p >= 0 && p < index), "layer '{}': input #{} does not come before it",
                   layer.name, p);
    in.push_back(shape_of(p));
  }
  infer(layer, in);
  spec_.layers.push_back(std::move(layer));
  return index;
}

namespace {
LayerSpec make(LayerKind kind, std::string name, std::vector<int32_t> inputs) {
  LayerSpec l;
  l.kind = kind;
  l.name = std::move(name);
  l.inputs = std::move(inputs);
  return l;
}
LayerSpec windowed(LayerKind kind, std::string name, int32_t from, int64_t kernel, int64_t stride, int64_t padding) {
  LayerSpec l = make(kind, std::move(name), {from});
  l.kernel_h = l.kernel_w = kernel;
  l.stride = stride;
  l.padding = padding;
  return l;
}
}  // namespace

int32_t ModelBuilder::conv(int64_t out_channels, int64_t kernel, int64_t stride, int64_t padding, int64_t groups,
                           bool bias, int32_t from, std::string name) {
  LayerSpec l = windowed(LayerKind::kConv2d, std::move(name), resolve(from), kernel, stride, padding);
  l.out_channels = out_channels;
  l.groups = groups;
  l.bias = bias;
  return push(std::move(l));
}
int32_t ModelBuilder::conv2(int64_t out_channels, int64_t kernel_h, int64_t kernel_w, int64_t stride,
                            int64_t padding_h, int64_t padding_w, bool bias, int32_t from, std::string name) {
  LayerSpec l = windowed(LayerKind::kConv2d, std::move(name), resolve(from), kernel_h, stride, padding_h);
  l.kernel_w = kernel_w;
  l.padding_w = padding_w;
  l.out_channels = out_channels;
  l.bias = bias;
  return push(std::move(l));
}
int32_t ModelBuilder::batchnorm(int32_t from, std::string name, float eps) {
  LayerSpec l = make(LayerKind::kBatchNorm2d, std::move(name), {resolve(from)});
  l.eps = eps;
  return push(std::move(l));
}
int32_t ModelBuilder::relu(int32_t from, std::string name) {
  return push(make(LayerKind::kReLU, std::move(name), {resolve(from)}));
}
int32_t ModelBuilder::relu6(int32_t from, std::string name) {
  return push(make(LayerKind::kReLU6, std::move(name), {resolve(from)}));
}
int32_t ModelBuilder::maxpool(int64_t kernel, int64_t stride, int64_t padding, int32_t from, std::string name) {
  return push(windowed(LayerKind::kMaxPool2d, std::move(name), resolve(from), kernel, stride, padding));
}
int32_t ModelBuilder::avgpool(int64_t kernel, int64_t stride, int64_t padding, int32_t from, std::string name) {
  return push(windowed(LayerKind::kAvgPool2d, std::move(name), resolve(from), kernel, stride, padding));
}
int32_t ModelBuilder::global_avgpool(int32_t from, std::string name) {
  return push(make(LayerKind::kGlobalAvgPool, std::move(name), {resolve(from)}));
}
int32_t ModelBuilder::flatten(int32_t from, std::string name) {
  return push(make(LayerKind::kFlatten, std::move(name), {resolve(from)}));
}
int32_t ModelBuilder::linear(int64_t out_features, bool bias, int32_t from, std::string name) {
  LayerSpec l = make(LayerKind::kLinear, std::move(name), {resolve(from)});
  l.out_features = out_features;
  l.bias = bias;
  return push(std::move(l));
}
int32_t ModelBuilder::add(int32_t a, int32_t b, std::string name) {
  return push(make(LayerKind::kAdd, std::move(name), {resolve(a), resolve(b)}));
}
int32_t ModelBuilder::embedding(int64_t num_embeddings, int64_t dim, int32_t from, std::string name) {
  LayerSpec l = make(LayerKind::kEmbedding, std::move(name), {resolve(from)});
  l.num_embeddings = num_embeddings;
  l.out_channels = dim;
  return push(std::move(l));
}
int32_t ModelBuilder::layernorm(float eps, int32_t from, std::string name) {
  LayerSpec l = make(LayerKind::kLayerNorm, std::move(name), {resolve(from)});
  l.eps = eps;
  return push(std::move(l));
}
int32_t ModelBuilder::gelu(int32_t from, std::string name) {
  return push(make(LayerKind::kGELU, std::move(name), {resolve(from)}));
}
int32_t ModelBuilder::attention(int64_t heads, int32_t from, std::string name) {
  LayerSpec l = make(LayerKind::kAttention, std::move(name), {resolve(from)});
  l.heads = heads;
  return push(std::move(l));
}
int32_t ModelBuilder::concat(const std::vector<int32_t>& from, std::string name) {
  std::vector<int32_t> in;
  for (int32_t f : from) in.push_back(resolve(f));
  return push(make(LayerKind::kConcat, std::move(name), std::move(in)));
}

ModelSpec ModelBuilder::build() && {
  TANDEM_REQUIRE(!spec_.layers.empty(), "model '{}' has no layers", spec_.name);
  return std::move(spec_);
}

// ---- JSON ---------------------------------------------------------------------------------------

namespace {

std::string type_name(const json& v) { return v.type_name(); }

int64_t get_int(const json& obj, const char* key, const std::string& where, int64_t def, int64_t min_value) {
  if (!obj.contains(key)) return def;
  const json& v = obj.at(key);
  TANDEM_REQUIRE(v.is_number_integer(), "{}.{}: must be an integer (got {} {})", where, key, type_name(v), v.dump());
  const auto x = v.get<int64_t>();
  TANDEM_REQUIRE(x >= min_value, "{}.{}: must be >= {} (got {})", where, key, min_value, x);
  return x;
}

int64_t require_int(const json& obj, const char* key, const std::string& where, int64_t min_value) {
  TANDEM_REQUIRE(obj.contains(key), "{}.{}: missing (required for this layer type)", where, key);
  return get_int(obj, key, where, 0, min_value);
}

void read_kernel(const json& obj, const std::string& where, LayerSpec& l, bool required) {
  if (!obj.contains("kernel")) {
    TANDEM_REQUIRE(!required, "{}.kernel: missing (required for this layer type)", where);
    return;
  }
  const json& k = obj.at("kernel");
  if (k.is_array()) {
    TANDEM_REQUIRE(k.size() == 2 && k[0].is_number_integer() && k[1].is_number_integer(),
                   "{}.kernel: must be an integer or [kh, kw] (got {})", where, k.dump());
    l.kernel_h = k[0].get<int64_t>();
    l.kernel_w = k[1].get<int64_t>();
  } else {
    TANDEM_REQUIRE(k.is_number_integer(), "{}.kernel: must be an integer or [kh, kw] (got {})", where, k.dump());
    l.kernel_h = l.kernel_w = k.get<int64_t>();
  }
  TANDEM_REQUIRE(l.kernel_h > 0 && l.kernel_w > 0, "{}.kernel: must be positive (got {})", where, k.dump());
}

void read_padding(const json& obj, const std::string& where, LayerSpec& l) {
  if (!obj.contains("padding")) return;
  const json& p = obj.at("padding");
  if (p.is_array()) {
    TANDEM_REQUIRE(p.size() == 2 && p[0].is_number_integer() && p[1].is_number_integer() && p[0].get<int64_t>() >= 0 &&
                       p[1].get<int64_t>() >= 0,
                   "{}.padding: must be an integer >= 0 or [ph, pw] (got {})", where, p.dump());
    l.padding = p[0].get<int64_t>();
    l.padding_w = p[1].get<int64_t>();
  } else {
    l.padding = get_int(obj, "padding", where, 0, 0);
  }
}

void check_keys(const json& obj, const std::string& where, std::initializer_list<const char*> allowed) {
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    const bool ok = std::any_of(allowed.begin(), allowed.end(), [&](const char* a) { return it.key() == a; });
    TANDEM_REQUIRE(ok, "{}.{}: unknown field for this layer type", where, it.key());
  }
}

}  // namespace

ModelSpec model_from_json(const json& j) {
  TANDEM_REQUIRE(j.is_object(), "model spec: must be a JSON object (got {})", type_name(j));
  for (auto it = j.begin(); it != j.end(); ++it) {
    TANDEM_REQUIRE(it.key() == "name" || it.key() == "input" || it.key() == "layers",
                   "model spec: unknown field '{}' (expected name, input, layers)", it.key());
  }
  std::string name = "custom";
  if (j.contains("name")) {
    TANDEM_REQUIRE(j["name"].is_string(), "name: must be a string (got {})", type_name(j["name"]));
    name = j["name"].get<std::string>();
  }
  TANDEM_REQUIRE(j.contains("input"), "input: missing (expected [C, H, W])");
  const json& in = j["input"];
  TANDEM_REQUIRE(in.is_array() && (in.size() == 3 || in.size() == 1),
                 "input: must be [C, H, W] or [features] (got {})", in.dump());
  for (const json& d : in) {
    TANDEM_REQUIRE(d.is_number_integer() && d.get<int64_t>() > 0, "input: dimensions must be positive integers (got {})",
                   in.dump());
  }
  SampleShape input = in.size() == 3 ? SampleShape{in[0].get<int64_t>(), in[1].get<int64_t>(), in[2].get<int64_t>()}
                               : SampleShape{in[0].get<int64_t>(), 1, 1};
  TANDEM_REQUIRE(j.contains("layers"), "layers: missing");
  const json& layers = j["layers"];
  TANDEM_REQUIRE(layers.is_array() && !layers.empty(), "layers: must be a non-empty array (got {})",
                 layers.is_array() ? "[]" : type_name(layers));

  ModelBuilder b(name, input);
  std::vector<std::string> names;
  for (size_t i = 0; i < layers.size(); ++i) {
    const std::string where = fmt::format("layers[{}]", i);
    const json& o = layers[i];
    TANDEM_REQUIRE(o.is_object(), "{}: must be an object (got {})", where, type_name(o));
    TANDEM_REQUIRE(o.contains("type") && o["type"].is_string(), "{}.type: missing or not a string", where);
    LayerSpec l;
    try {
      l.kind = parse_layer_kind(o["type"].get<std::string>());
    } catch (const Error& e) {
      TANDEM_THROW(Status::kInvalidArgument, "{}.type: {}", where, e.what());
    }
    if (o.contains("name")) {
      TANDEM_REQUIRE(o["name"].is_string() && !o["name"].get<std::string>().empty(),
                     "{}.name: must be a non-empty string", where);
      l.name = o["name"].get<std::string>();
      TANDEM_REQUIRE(l.name != "input", "{}.name: 'input' is reserved for the model input", where);
    }
    switch (l.kind) {
      case LayerKind::kConv2d:
        check_keys(o, where, {"type", "name", "inputs", "out_channels", "kernel", "stride", "padding", "groups", "bias"});
        l.out_channels = require_int(o, "out_channels", where, 1);
        read_kernel(o, where, l, true);
        l.stride = get_int(o, "stride", where, 1, 1);
        read_padding(o, where, l);
        l.groups = get_int(o, "groups", where, 1, 1);
        break;
      case LayerKind::kLinear:
        check_keys(o, where, {"type", "name", "inputs", "out_features", "bias"});
        l.out_features = require_int(o, "out_features", where, 1);
        break;
      case LayerKind::kMaxPool2d:
      case LayerKind::kAvgPool2d:
        check_keys(o, where, {"type", "name", "inputs", "kernel", "stride", "padding"});
        read_kernel(o, where, l, true);
        l.stride = get_int(o, "stride", where, l.kernel_h, 1);
        read_padding(o, where, l);
        break;
      case LayerKind::kEmbedding:
        check_keys(o, where, {"type", "name", "inputs", "num_embeddings", "out_channels"});
        l.num_embeddings = require_int(o, "num_embeddings", where, 1);
        l.out_channels = require_int(o, "out_channels", where, 1);
        break;
      case LayerKind::kAttention:
        check_keys(o, where, {"type", "name", "inputs", "heads"});
        l.heads = require_int(o, "heads", where, 1);
        break;
      case LayerKind::kLayerNorm:
      case LayerKind::kBatchNorm2d:
        check_keys(o, where, {"type", "name", "inputs", "eps", "momentum"});
        if (o.contains("eps")) {
          TANDEM_REQUIRE(o["eps"].is_number() && o["eps"].get<double>() > 0, "{}.eps: must be a positive number",
                         where);
          l.eps = o["eps"].get<float>();
        }
        if (o.contains("momentum")) {
          TANDEM_REQUIRE(o["momentum"].is_number() && o["momentum"].get<double>() >= 0 &&
                             o["momentum"].get<double>() <= 1,
                         "{}.momentum: must be a number in [0, 1]", where);
          l.momentum = o["momentum"].get<float>();
        }
        break;
      default:
        check_keys(o, where, {"type", "name", "inputs"});
        break;
    }
    if (o.contains("bias")) {
      TANDEM_REQUIRE(o["bias"].is_boolean(), "{}.bias: must be true or false (got {})", where, o["bias"].dump());
      l.bias = o["bias"].get<bool>();
    }
    const size_t want = l.kind == LayerKind::kAdd || l.kind == LayerKind::kConcat ? 2 : 1;
    if (o.contains("inputs")) {
      const json& ins = o["inputs"];
      if (l.kind == LayerKind::kConcat) {
        TANDEM_REQUIRE(ins.is_array() && ins.size() >= want,
                       "{}.inputs: must be an array of 2 or more layer names (got {})", where, ins.dump());
      } else {
        TANDEM_REQUIRE(ins.is_array() && ins.size() == want,
                       "{}.inputs: must be an array of {} layer name(s) (got {})", where, want, ins.dump());
      }
      for (const json& n : ins) {
        TANDEM_REQUIRE(n.is_string(), "{}.inputs: entries must be layer names (got {})", where, n.dump());
        const auto s = n.get<std::string>();
        if (s == "input") {
          l.inputs.push_back(kModelInput);
          continue;
        }
        const auto it = std::find(names.begin(), names.end(), s);
        TANDEM_REQUIRE(it != names.end(), "{}.inputs: '{}' is not an earlier layer (or 'input')", where, s);
        l.inputs.push_back(static_cast<int32_t>(it - names.begin()));
      }
    } else {
      TANDEM_REQUIRE(want == 1, "{}.inputs: missing ({} needs two or more layer names)", where,
                     layer_kind_name(l.kind));
      l.inputs.push_back(static_cast<int32_t>(i) - 1);
    }
    try {
      b.push(std::move(l));
    } catch (const Error& e) {
      TANDEM_THROW(e.status(), "{}: {}", where, e.what());
    }
    names.push_back(b.spec().layers.back().name);
  }
  return std::move(b).build();
}

ModelSpec model_from_json_text(const std::string& text) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number that overflows
    TANDEM_THROW(Status::kInvalidArgument, "model spec: not valid JSON: {}", e.what());
  }
  return model_from_json(j);
}

ModelSpec load_model_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  TANDEM_CHECK(f.good(), Status::kIo, "model spec '{}': cannot open file", path);
  std::stringstream ss;
  ss << f.rdbuf();
  TANDEM_CHECK(!f.bad(), Status::kIo, "model spec '{}': read failed", path);
  try {
    return model_from_json_text(ss.str());
  } catch (const Error& e) {
    TANDEM_THROW(e.status(), "model spec '{}': {}", path, e.what());
  }
}

json model_to_json(const ModelSpec& spec) {
  json layers = json::array();
  for (size_t i = 0; i < spec.layers.size(); ++i) {
    const LayerSpec& l = spec.layers[i];
    json o;
    o["type"] = std::string(layer_kind_name(l.kind));
    o["name"] = l.name;
    json ins = json::array();
    for (int32_t p : l.inputs) ins.push_back(p == kModelInput ? std::string("input") : spec.layers[size_t(p)].name);
    o["inputs"] = ins;
    switch (l.kind) {
      case LayerKind::kConv2d:
        o["out_channels"] = l.out_channels;
        o["groups"] = l.groups;
        o["bias"] = l.bias;
        [[fallthrough]];
      case LayerKind::kMaxPool2d:
      case LayerKind::kAvgPool2d:
        o["kernel"] = l.kernel_h == l.kernel_w ? json(l.kernel_h) : json::array({l.kernel_h, l.kernel_w});
        o["stride"] = l.stride;
        o["padding"] = l.pad_h() == l.pad_w() ? json(l.pad_h()) : json::array({l.pad_h(), l.pad_w()});
        break;
      case LayerKind::kLinear:
        o["out_features"] = l.out_features;
        o["bias"] = l.bias;
        break;
      case LayerKind::kBatchNorm2d:
        o["eps"] = l.eps;
        o["momentum"] = l.momentum;
        break;
      case LayerKind::kLayerNorm:
        o["eps"] = l.eps;
        break;
      case LayerKind::kEmbedding:
        o["num_embeddings"] = l.num_embeddings;
        o["out_channels"] = l.out_channels;
        break;
      case LayerKind::kAttention:
        o["heads"] = l.heads;
        break;
      default:
        break;
    }
    layers.push_back(std::move(o));
  }
  return json{{"name", spec.name}, {"input", {spec.input.c, spec.input.h, spec.input.w}}, {"layers", layers}};
}

}  // namespace tandem::engine::nn
