// C shims: models and datasets.
#include <cstring>

#include "api/src/guard.hpp"
#include "api/src/train_handles.hpp"
#include "engine/data/readers.hpp"
#include "engine/nn/zoo.hpp"

using tandem::Status;
using tandem::api::check_field_mask;
using tandem::api::checked;
using tandem::api::ContextScope;
using tandem::api::guarded;
using tandem::api::mask_through;
namespace nn = tandem::engine::nn;
namespace data = tandem::engine::data;

static_assert(offsetof(tandem_model_params_t, field_mask) == 0);
static_assert(offsetof(tandem_model_attr_t, field_mask) == 0);
static_assert(offsetof(tandem_layer_attr_t, field_mask) == 0);
static_assert(offsetof(tandem_dataset_params_t, field_mask) == 0);
static_assert(sizeof(tandem_layer_attr_t) == 104);

namespace {


std::string string_field(const char* s, const char* what) {
  TANDEM_REQUIRE(s != nullptr, "{} is NULL", what);
  return std::string(s);
}

const nn::Model& live_model(const tandem_model* m, const char* fn) {
  const auto& h = checked(m, fn, "model");
  TANDEM_REQUIRE(h.model != nullptr, "{}: model '{}' was created with backend 'none' (spec only)", fn, h.spec.name);
  return *h.model;
}

}  // namespace

extern "C" {

TANDEM_API tandem_status_t tandem_model_create(tandem_context_t* ctx, const tandem_model_params_t* params,
                                               tandem_model_t** out) TANDEM_NOEXCEPT {
  return guarded([&] {
    const auto& context = checked(ctx, "tandem_model_create", "context");
    const ContextScope scope(context.env);
    TANDEM_REQUIRE(params != nullptr && out != nullptr, "tandem_model_create: params and out must be non-null");
    const uint64_t m = params->field_mask;
    check_field_mask(m, mask_through(TANDEM_MODEL_PARAM_INIT), "tandem_model_params_t");
    const int sources = !!(m & TANDEM_MODEL_PARAM_NAME) + !!(m & TANDEM_MODEL_PARAM_SPEC_PATH) +
                        !!(m & TANDEM_MODEL_PARAM_SPEC_JSON);
    TANDEM_REQUIRE(sources == 1, "tandem_model_create: set exactly one of name, spec_path, spec_json (got {})", sources);
    auto h = std::make_unique<tandem_model>();
    h->env = context.env;
    if (m & TANDEM_MODEL_PARAM_NAME) {
      const std::string name = string_field(params->name, "tandem_model_create: name");
      nn::SampleShape in = nn::zoo_default_input(name);
      if (m & TANDEM_MODEL_PARAM_INPUT_SHAPE) in = {params->input_channels, params->input_height, params->input_width};
      const int64_t classes =
          (m & TANDEM_MODEL_PARAM_NUM_CLASSES) ? params->num_classes : nn::zoo_default_classes(name);
      nn::ZooOptions zo;
      if (m & TANDEM_MODEL_PARAM_WIDTH_MULT) zo.width_mult = params->width_mult;
      h->spec = nn::zoo_model(name, in, classes, zo);
    } else {
      TANDEM_REQUIRE(!(m & (TANDEM_MODEL_PARAM_INPUT_SHAPE | TANDEM_MODEL_PARAM_NUM_CLASSES |
                            TANDEM_MODEL_PARAM_WIDTH_MULT)),
                     "tandem_model_create: input shape, class count and width multiplier apply to zoo models only "
                     "(a spec states them itself)");
      h->spec = (m & TANDEM_MODEL_PARAM_SPEC_PATH)
                    ? nn::load_model_file(string_field(params->spec_path, "tandem_model_create: spec_path"))
                    : nn::model_from_json_text(string_field(params->spec_json, "tandem_model_create: spec_json"));
    }
    h->backend_name = (m & TANDEM_MODEL_PARAM_BACKEND) ? string_field(params->backend, "tandem_model_create: backend")
                                                        : std::string("cpu");
    const uint64_t seed = (m & TANDEM_MODEL_PARAM_SEED) ? params->seed : 0;
    const nn::InitScheme init = (m & TANDEM_MODEL_PARAM_INIT)
                                    ? nn::parse_init(string_field(params->init, "tandem_model_create: init"))
                                    : nn::InitScheme::kKaiming;
    if (h->backend_name != "none") {
      tandem::engine::compute::BackendOptions bo;
      bo.num_threads = context.num_threads;
      h->backend = tandem::engine::compute::make_backend(h->backend_name, bo);
      h->model = std::make_unique<nn::Model>(h->spec, *h->backend, seed, init);
    }
    *out = h.release();
  });
}

TANDEM_API void tandem_model_destroy(tandem_model_t* model) TANDEM_NOEXCEPT {
  tandem::api::destroy_handle(model);
}

TANDEM_API tandem_status_t tandem_model_query(const tandem_model_t* model, tandem_model_attr_t* attr) TANDEM_NOEXCEPT {
  return guarded([&] {
    const auto& h = checked(model, "tandem_model_query", "model");
    const ContextScope scope(h.env);
    TANDEM_REQUIRE(attr != nullptr, "tandem_model_query: attr must be non-null");
    check_field_mask(attr->field_mask, mask_through(TANDEM_MODEL_ATTR_HELD), "tandem_model_attr_t");
    const nn::ModelSpec& s = h.spec;
    if (attr->field_mask & TANDEM_MODEL_ATTR_NAME) {
      attr->name = s.name.c_str();
      attr->backend = h.backend ? h.backend->name().data() : "none";
    }
    if (attr->field_mask & TANDEM_MODEL_ATTR_SHAPE) {
      attr->input_channels = s.input.c;
      attr->input_height = s.input.h;
      attr->input_width = s.input.w;
      attr->num_classes = s.num_classes();
      attr->num_layers = s.layers.size();
    }
    if (attr->field_mask & TANDEM_MODEL_ATTR_COST) {
      const nn::ModelTotals t = s.totals();
      attr->params = t.params;
      attr->buffers = t.buffers;
      attr->macs = t.macs;
      attr->fwd_flops = t.fwd_flops;
      attr->bwd_flops = t.bwd_flops;
      attr->activation_bytes = t.activation_bytes;
    }
    if (attr->field_mask & TANDEM_MODEL_ATTR_HELD) {
      const size_t begin = h.model ? h.model->held_begin() : 0;
      const size_t end = h.model ? h.model->held_end() : s.layers.size();
      attr->held_first_layer = begin;
      attr->held_end_layer = end;
      attr->held_params = s.totals(begin, end).params;
    }
  });
}

TANDEM_API tandem_status_t tandem_model_layer_query(const tandem_model_t* model, size_t index,
                                                    tandem_layer_attr_t* attr) TANDEM_NOEXCEPT {
  return guarded([&] {
    const auto& h = checked(model, "tandem_model_layer_query", "model");
    const ContextScope scope(h.env);
    TANDEM_REQUIRE(attr != nullptr, "tandem_model_layer_query: attr must be non-null");
    TANDEM_REQUIRE(index < h.spec.layers.size(), "tandem_model_layer_query: index {} out of range (model '{}' has {} layers)",
                   index, h.spec.name, h.spec.layers.size());
    check_field_mask(attr->field_mask, mask_through(TANDEM_LAYER_ATTR_COST), "tandem_layer_attr_t");
    const nn::LayerSpec& l = h.spec.layers[index];
    if (attr->field_mask & TANDEM_LAYER_ATTR_NAME) {
      attr->name = l.name.c_str();
      attr->kind = nn::layer_kind_name(l.kind).data();
      attr->num_inputs = static_cast<int32_t>(l.inputs.size());
      attr->inputs[0] = l.inputs[0];
      attr->inputs[1] = l.inputs.size() > 1 ? l.inputs[1] : nn::kModelInput;
    }
    if (attr->field_mask & TANDEM_LAYER_ATTR_SHAPE) {
      attr->out_channels = l.out_shape.c;
      attr->out_height = l.out_shape.h;
      attr->out_width = l.out_shape.w;
    }
    if (attr->field_mask & TANDEM_LAYER_ATTR_COST) {
      attr->params = l.params;
      attr->macs = l.macs;
      attr->fwd_flops = l.fwd_flops;
      attr->bwd_flops = l.bwd_flops();
      attr->activation_bytes = l.activation_bytes;
    }
  });
}

TANDEM_API tandem_status_t tandem_model_get_params(const tandem_model_t* model, float* dst,
                                                   size_t count) TANDEM_NOEXCEPT {
  return guarded([&] {
    const nn::Model& m = live_model(model, "tandem_model_get_params");
    TANDEM_REQUIRE(dst != nullptr, "tandem_model_get_params: dst must be non-null");
    auto& mm = const_cast<nn::Model&>(m);
    TANDEM_REQUIRE(static_cast<int64_t>(count) == mm.params().numel(),
                   "tandem_model_get_params: count {} but model '{}' has {} parameters", count, m.spec().name,
                   mm.params().numel());
    const tandem::Tensor host = m.backend().to_host(mm.params());
    if (count > 0) std::memcpy(dst, host.data<float>(), count * sizeof(float));
  });
}

TANDEM_API tandem_status_t tandem_model_set_params(tandem_model_t* model, const float* src,
                                                   size_t count) TANDEM_NOEXCEPT {
  return guarded([&] {
    auto& m = const_cast<nn::Model&>(live_model(model, "tandem_model_set_params"));
    TANDEM_REQUIRE(src != nullptr, "tandem_model_set_params: src must be non-null");
    TANDEM_REQUIRE(static_cast<int64_t>(count) == m.params().numel(),
                   "tandem_model_set_params: count {} but model '{}' has {} parameters", count, m.spec().name,
                   m.params().numel());
    if (count == 0) return;
    m.backend().copy(tandem::Tensor::wrap(const_cast<float*>(src), tandem::Shape{m.params().numel()}, tandem::DType::kF32),
                     m.params());
  });
}

TANDEM_API tandem_status_t tandem_model_forward(tandem_model_t* model, const float* input, int64_t batch,
                                                float* logits, size_t logits_count) TANDEM_NOEXCEPT {
  return guarded([&] {
    auto& m = const_cast<nn::Model&>(live_model(model, "tandem_model_forward"));
    TANDEM_REQUIRE(input != nullptr && logits != nullptr && batch > 0,
                   "tandem_model_forward: input and logits must be non-null and batch positive (got {})", batch);
    const nn::SampleShape in = m.spec().input;
    const int64_t k = m.spec().num_classes();
    TANDEM_REQUIRE(static_cast<int64_t>(logits_count) >= batch * k,
                   "tandem_model_forward: logits holds {} values, {} samples x {} classes need {}", logits_count,
                   batch, k, batch * k);
    const tandem::Shape xs = in.h * in.w == 1 ? tandem::Shape{batch, in.c} : tandem::Shape{batch, in.c, in.h, in.w};
    tandem::engine::compute::Backend& be = m.backend();
    tandem::Tensor x = tandem::Tensor::wrap(const_cast<float*>(input), xs, tandem::DType::kF32);
    if (!be.device().is_cpu()) {
      tandem::Tensor dx = be.empty(xs);
      be.copy(x, dx);
      x = dx;
    }
    const tandem::Tensor y = be.to_host(m.forward(x, false));
    std::memcpy(logits, y.data<float>(), static_cast<size_t>(batch * k) * sizeof(float));
  });
}

TANDEM_API tandem_status_t tandem_dataset_create(tandem_context_t* ctx, const tandem_dataset_params_t* params,
                                                 tandem_dataset_t** out) TANDEM_NOEXCEPT {
  return guarded([&] {
    const ContextScope scope(checked(ctx, "tandem_dataset_create", "context").env);
    TANDEM_REQUIRE(params != nullptr && out != nullptr, "tandem_dataset_create: params and out must be non-null");
    const uint64_t m = params->field_mask;
    check_field_mask(m, mask_through(TANDEM_DATASET_PARAM_SEED), "tandem_dataset_params_t");
    const std::string kind = (m & TANDEM_DATASET_PARAM_KIND) ? string_field(params->kind, "tandem_dataset_create: kind")
                                                             : std::string("fashion-mnist");
    const bool train = !(m & TANDEM_DATASET_PARAM_TRAIN) || params->train != 0;
    const std::string path = (m & TANDEM_DATASET_PARAM_PATH) ? string_field(params->path, "tandem_dataset_create: path")
                                                             : std::string();
    auto h = std::make_unique<tandem_dataset>();
    // The readers keep only the first `limit` samples (never holding the whole set); head() applies it to the rest.
    int64_t limit = 0;
    if (m & TANDEM_DATASET_PARAM_LIMIT) {
      TANDEM_REQUIRE(params->limit >= 0, "tandem_dataset_create: limit {} must be >= 0", params->limit);
      limit = params->limit;
    }
    if (kind == "fashion-mnist") {
      h->data = data::load_fashion_mnist(train, path, limit);
    } else if (kind == "cifar10") {
      TANDEM_REQUIRE(!path.empty(), "tandem_dataset_create: cifar10 needs path (the directory of its binary batches)");
      h->data = data::load_cifar10(train, path, limit);
    } else if (kind == "idx") {
      TANDEM_REQUIRE(!path.empty() && (m & TANDEM_DATASET_PARAM_LABELS_PATH),
                     "tandem_dataset_create: idx needs path (images) and labels_path");
      h->data = data::load_idx(path, string_field(params->labels_path, "tandem_dataset_create: labels_path"), "idx",
                              limit);
    } else if (kind == "synthetic") {
      const bool shape = m & TANDEM_DATASET_PARAM_SHAPE;
      h->data = data::make_synthetic(shape ? params->channels : 1, shape ? params->height : 28,
                                     shape ? params->width : 28,
                                     (m & TANDEM_DATASET_PARAM_NUM_CLASSES) ? params->num_classes : 10,
                                     (m & TANDEM_DATASET_PARAM_COUNT) ? params->count : 1024,
                                     (m & TANDEM_DATASET_PARAM_SEED) ? params->seed : 0);
    } else {
      TANDEM_THROW(Status::kInvalidArgument,
                   "tandem_dataset_create: unknown kind '{}' (expected fashion-mnist, cifar10, idx or synthetic)", kind);
    }
    if (limit > 0) h->data = h->data.head(limit);
    h->data.validate();
    *out = h.release();
  });
}

TANDEM_API void tandem_dataset_destroy(tandem_dataset_t* dataset) TANDEM_NOEXCEPT {
  tandem::api::destroy_handle(dataset);
}

TANDEM_API tandem_status_t tandem_dataset_info(const tandem_dataset_t* dataset, int64_t* size, int64_t* channels,
                                               int64_t* height, int64_t* width,
                                               int64_t* num_classes) TANDEM_NOEXCEPT {
  return guarded([&] {
    const data::Dataset& d = checked(dataset, "tandem_dataset_info", "dataset").data;
    if (size != nullptr) *size = d.size();
    if (channels != nullptr) *channels = d.channels;
    if (height != nullptr) *height = d.height;
    if (width != nullptr) *width = d.width;
    if (num_classes != nullptr) *num_classes = d.num_classes;
  });
}

}  // extern "C"
