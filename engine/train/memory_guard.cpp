#include "engine/train/memory_guard.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>
#include <vector>

#include "engine/core/error.hpp"
#include "engine/core/host_info.hpp"
#include "engine/core/log.hpp"
#include "engine/core/settings.hpp"

namespace tandem::engine::train {

namespace {

constexpr double kMiB = 1048576.0;
// cgroup v1 reports "no limit" as a huge page-rounded number (9223372036854771712); anything above this
// is treated as unlimited.
constexpr double kUnlimited = 1e18;
// Peak over the activations kept for backward: gradient buffers alive during backward, backend workspaces and the
// caching allocator's free blocks. Measured with tandem train on the cpu backend (mobilenetv2 at batch 16 and 64:
// peak RSS 263 and 880 MiB against 259 and 911 MiB estimated with this factor).
constexpr double kActivationOverhead = 1.25;
// What the first step adds besides tensors: oneDNN's JIT kernels and primitive caches, the evaluation batch
// (measured: lenet5 at batch 64 peaks 8-20 MiB above its tensors).
constexpr double kFirstStepRuntimeBytes = 16.0 * 1048576;
// On the cpu backend the convolutions also keep their weights reordered into oneDNN's blocked formats (forward and
// backward), which grows with the convolution weights, not the batch: tandem calibrate's runtime_rss_bytes over an
// mlp's (17.8 MiB, no convolutions), per byte of f32 convolution weights, was 1.2 for vgg16 and alexnet (CIFAR),
// 1.26 for mobilenetv2 and 1.8 for resnet18 (issue #16, bench/simulator/memory_check.py). The lowest is taken: the
// guard must not refuse a job that fits. Without it resnet18 at batch 8 peaked 318 MiB against 237 estimated.
constexpr double kConvWeightCopies = 1.2;
// ... and a step's peak has a part that does not grow with the batch: the weight gradient of the largest
// convolution and its reordered copy. Measured as the intercept of the activation peak against the batch
// (activation_peak_curve): 18 MiB for resnet18 and vgg16 (largest convolution 512x512x3x3, 9.0 MiB), ~3 MiB for
// mobilenetv2 (1.6 MiB), 8.7 MiB for alexnet (3.4 MiB).
constexpr double kLargestConvWeightCopies = 2.0;
// The cpu backend keeps 4-D activations in oneDNN's blocked formats, channels padded to a multiple of 16.
constexpr int64_t kChannelBlock = 16;

// This process's resident size (bytes; 0 when /proc is unavailable).
double resident_bytes() { return std::max(0.0, proc_kib_field_bytes("/proc/self/status", "VmRSS")); }

std::string read_first_line(const std::string& path) {
  std::ifstream in(path);
  std::string s;
  if (!in.good() || !std::getline(in, s)) return {};
  return s;
}

// The smallest limit on the way from the process's cgroup up to the mounted root.
std::optional<MemoryLimit> cgroup_limit() {
  const auto cg = find_cgroup("memory");
  if (!cg) return std::nullopt;
  std::string rel = cg->path;
  if (cg->mount_root != "/" && rel.rfind(cg->mount_root, 0) == 0) rel = rel.substr(cg->mount_root.size());
  const char* file = cg->version == 1 ? "memory.limit_in_bytes" : "memory.max";
  std::optional<MemoryLimit> best;
  for (;;) {
    const std::string dir = cg->mount + (rel == "/" ? std::string() : rel);
    const std::string path = dir + "/" + file;
    const std::string v = read_first_line(path);
    if (!v.empty() && v != "max") {
      char* end = nullptr;
      const double bytes = std::strtod(v.c_str(), &end);
      if (end != v.c_str() && bytes > 0 && bytes < kUnlimited && (!best || bytes < best->bytes))
        best = MemoryLimit{bytes, fmt::format("cgroup v{} {}", cg->version, path)};
    }
    if (rel.empty() || rel == "/") break;
    const size_t slash = rel.find_last_of('/');
    rel = slash == 0 || slash == std::string::npos ? "/" : rel.substr(0, slash);
  }
  return best;
}

// Per-sample bytes a layer's output takes as the backend keeps it (channels padded to the block size).
double stored_output_bytes(const nn::LayerSpec& l) {
  const auto& s = l.out_shape;
  double bytes = static_cast<double>(l.activation_bytes);
  if (s.h * s.w > 1 && s.c > 0) {
    const int64_t padded = (s.c + kChannelBlock - 1) / kChannelBlock * kChannelBlock;
    bytes *= static_cast<double>(padded) / static_cast<double>(s.c);
  }
  // Max pooling also keeps a workspace of the argmax positions (one per output element).
  if (l.kind == nn::LayerKind::kMaxPool2d) bytes *= 2;
  return bytes;
}

}  // namespace

std::string format_bytes(double b) {
  if (b >= 1024 * kMiB) return fmt::format("{:.2f} GiB", b / (1024 * kMiB));
  if (b >= kMiB) return fmt::format("{:.1f} MiB", b / kMiB);
  return fmt::format("{:.0f} KiB", b / 1024);
}

std::string MemoryEstimate::describe() const {
  const std::string model = param_bytes + grad_bytes > 0
                                ? fmt::format("parameters {}, gradients {}", format_bytes(param_bytes), format_bytes(grad_bytes))
                                : std::string("parameters and gradients resident");
  return fmt::format("{} (resident now {}, {}, optimizer state {}, activations of {} samples in flight {}, workspace {})",
                     format_bytes(total()), format_bytes(resident_bytes), model, format_bytes(optimizer_bytes),
                     samples_in_flight, format_bytes(activation_bytes), format_bytes(workspace_bytes));
}

TrainingFootprint single_footprint(int64_t batch_size, int prefetch, double optimizer_state_bytes_per_param) {
  TrainingFootprint f;
  f.samples_in_flight = f.micro_batch = f.loader_batch = batch_size;
  f.prefetch = prefetch;
  f.optimizer_state_bytes_per_param = optimizer_state_bytes_per_param;
  return f;
}

MemoryEstimate estimate_training_memory(const nn::Model& model, const TrainingFootprint& f) {
  const nn::ModelSpec& spec = model.spec();
  const size_t a = f.first_layer, b = f.end_layer == 0 ? spec.layers.size() : f.end_layer;
  TANDEM_REQUIRE(a < b && b <= spec.layers.size(), "memory estimate: layers [{}, {}) out of range (model has {})", a,
                 b, spec.layers.size());
  MemoryEstimate e;
  e.samples_in_flight = f.samples_in_flight;
  e.resident_bytes = resident_bytes();
  const nn::ModelTotals t = spec.totals(a, b);
  if (!model.storage_allocated()) {  // the Model allocates on first use: f32 parameters, gradients, statistics
    e.param_bytes = 4.0 * static_cast<double>(t.params + t.buffers);
    e.grad_bytes = 4.0 * static_cast<double>(t.params);
  }
  e.optimizer_bytes = static_cast<double>(t.params) * f.optimizer_state_bytes_per_param;
  // Outputs that take no storage of their own, as nn::Model runs them (in-place ReLUs, flatten views).
  const std::vector<bool> shared = spec.shared_outputs(a);
  double per_sample = 0, largest = 0;
  for (size_t i = a; i < b; ++i) {
    const double o = stored_output_bytes(spec.layers[i]);
    if (!shared[i]) per_sample += o;
    largest = std::max(largest, o);
  }
  // The stage's input: the model input on the first stage, else the activations received from the previous one.
  double input = 0;
  if (a == 0) {
    input = static_cast<double>(spec.input.numel()) * 4;
  } else {
    for (int32_t id : spec.crossing(a))
      if (id >= 0) input += static_cast<double>(spec.layers[static_cast<size_t>(id)].activation_bytes);
  }
  e.activation_bytes = kActivationOverhead * static_cast<double>(f.samples_in_flight) * (per_sample + input);
  const int64_t mb = f.micro_batch > 0 ? f.micro_batch : f.samples_in_flight;
  const double scratch = 2 * largest * static_cast<double>(mb);  // gradient of a layer's output and of its input
  const double loader = static_cast<double>(std::max(f.prefetch, 0) + 1) * static_cast<double>(f.loader_batch) *
                        static_cast<double>(spec.input.numel()) * 4;
  e.workspace_bytes = scratch + loader + f.bucket_bytes + kFirstStepRuntimeBytes;
  if (model.backend().device().is_cpu()) {
    double conv = 0, largest_conv = 0;
    for (size_t i = a; i < b; ++i) {
      if (spec.layers[i].kind != nn::LayerKind::kConv2d) continue;
      const double w = 4.0 * static_cast<double>(spec.layers[i].params);
      conv += w;
      largest_conv = std::max(largest_conv, w);
    }
    e.workspace_bytes += kConvWeightCopies * conv + kLargestConvWeightCopies * largest_conv;
  }
  return e;
}

std::optional<MemoryLimit> memory_limit() {
  std::optional<MemoryLimit> best;
  auto consider = [&](std::optional<MemoryLimit> l) {
    if (l && (!best || l->bytes < best->bytes)) best = std::move(l);
  };
  if (const auto v = settings::current()->integer("TANDEM_MEMORY_LIMIT_BYTES"))  // positive
    consider(MemoryLimit{static_cast<double>(*v), "TANDEM_MEMORY_LIMIT_BYTES"});
  consider(cgroup_limit());
  const double avail = proc_kib_field_bytes("/proc/meminfo", "MemAvailable");
  if (avail >= 0) {
    const double rss = resident_bytes();
    consider(MemoryLimit{avail + rss, fmt::format("MemAvailable {} plus this process's resident {} (/proc/meminfo)",
                                                  format_bytes(avail), format_bytes(rss))});
  }
  return best;
}

MemoryEstimate check_training_memory(const nn::Model& model, const TrainingFootprint& f, std::string_view who) {
  MemoryEstimate e = estimate_training_memory(model, f);
  const bool enabled = settings::current()->flag("TANDEM_MEMORY_GUARD").value_or(true);
  const auto limit = memory_limit();
  log::debug("{}: estimated memory {}; limit {}", who, e.describe(),
             limit ? fmt::format("{} ({})", format_bytes(limit->bytes), limit->source) : std::string("none found"));
  if (!enabled || !limit || e.total() <= limit->bytes) return e;
  TANDEM_THROW(Status::kOutOfMemory,
               "{}: out of memory: the job needs an estimated {} but the limit is {} ({}); use a smaller batch, more "
               "micro-batches or pipeline stages, or a host with more memory (TANDEM_MEMORY_GUARD=0 skips this check)",
               who, e.describe(), format_bytes(limit->bytes), limit->source);
}

}  // namespace tandem::engine::train
