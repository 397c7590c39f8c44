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
#include "engine/data/loader.hpp"
#include "engine/nn/cpu_storage.hpp"

namespace tandem::engine::train {

namespace {

constexpr double kMiB = 1048576.0;
// cgroup v1 reports "no limit" as a huge page-rounded number (9223372036854771712); anything above this
// is treated as unlimited.
constexpr double kUnlimited = 1e18;
// What the first step adds besides tensors: oneDNN's JIT kernels and primitive caches, the evaluation batch
// (measured: lenet5 at batch 64 peaks 8-20 MiB above its tensors).
constexpr double kFirstStepRuntimeBytes = 16.0 * 1048576;

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

TrainingFootprint layer_footprint(const nn::ModelSpec& spec, size_t first, size_t end, int64_t samples_in_flight,
                                  int64_t micro_batch) {
  TANDEM_REQUIRE(first < end && end <= spec.layers.size(), "memory estimate: layers [{}, {}) out of range (model has {})",
                 first, end, spec.layers.size());
  TrainingFootprint f;
  f.first_layer = first;
  f.end_layer = end;
  f.samples_in_flight = samples_in_flight;
  f.micro_batch = micro_batch > 0 ? micro_batch : samples_in_flight;
  // the stage's input: the model input on the first stage, else what crosses the cut before it
  double input = 0;
  for (int32_t id : spec.crossing(first))
    input += id == nn::kModelInput ? 4.0 * static_cast<double>(spec.input.numel())
                                   : static_cast<double>(spec.layers[static_cast<size_t>(id)].activation_bytes);
  const std::vector<bool> shared = spec.shared_outputs(first);
  double stored = 0, layout = 0;
  for (size_t i = first; i < end; ++i) {
    if (shared[i]) continue;
    stored += static_cast<double>(spec.layers[i].activation_bytes);
    layout += nn::cpu_stored_output_bytes(spec.layers[i]);
  }
  const auto n = static_cast<double>(samples_in_flight);
  f.activation_bytes = n * (stored + input);
  f.layout_bytes = n * (layout + input) - f.activation_bytes;
  const nn::CpuWorkspace w = nn::cpu_workspace(spec, first, end, f.micro_batch);
  f.scratch_bytes = w.scratch_bytes;
  f.conv_scratch_bytes = w.conv_scratch_bytes;
  f.conv_copy_bytes = w.conv_copy_bytes;
  return f;
}

TrainingFootprint single_footprint(const nn::ModelSpec& spec, int64_t batch_size, int prefetch,
                                   double optimizer_state_bytes_per_param) {
  TrainingFootprint f = layer_footprint(spec, 0, spec.layers.size(), batch_size, batch_size);
  f.loader_bytes = data::loader_bytes(batch_size, prefetch, spec.input.numel());
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
  // the activations as the backend stores them, and what backward and the allocator hold on top
  e.activation_bytes = nn::kCpuActivationOverhead * (f.activation_bytes + f.layout_bytes);
  e.workspace_bytes = f.scratch_bytes + f.loader_bytes + f.bucket_bytes + kFirstStepRuntimeBytes;
  if (model.backend().device().is_cpu()) e.workspace_bytes += f.conv_copy_bytes + f.conv_scratch_bytes + f.short_batch_bytes;
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
