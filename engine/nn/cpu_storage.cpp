#include "engine/nn/cpu_storage.hpp"

#include <algorithm>

#include "engine/core/error.hpp"

namespace tandem::engine::nn {

double cpu_stored_output_bytes(const LayerSpec& l) {
  const SampleShape& s = l.out_shape;
  double bytes = static_cast<double>(l.activation_bytes);
  if (s.h * s.w > 1 && s.c > 0) {
    const int64_t padded = (s.c + kCpuChannelBlock - 1) / kCpuChannelBlock * kCpuChannelBlock;
    bytes *= static_cast<double>(padded) / static_cast<double>(s.c);
  }
  if (l.kind == LayerKind::kMaxPool2d) bytes *= 2;
  return bytes;
}

CpuWorkspace cpu_workspace(const ModelSpec& spec, size_t begin, size_t end, int64_t micro_batch, double scale) {
  TANDEM_REQUIRE(begin < end && end <= spec.layers.size(), "model '{}': layers [{}, {}) out of range ({} layers)",
                 spec.name, begin, end, spec.layers.size());
  double largest = 0, conv = 0, largest_conv = 0;
  for (size_t i = begin; i < end; ++i) {
    const LayerSpec& l = spec.layers[i];
    largest = std::max(largest, cpu_stored_output_bytes(l));
    if (l.kind != LayerKind::kConv2d) continue;
    const double w = 4.0 * static_cast<double>(l.params);
    conv += w;
    largest_conv = std::max(largest_conv, w);
  }
  CpuWorkspace w;
  w.scratch_bytes = scale * 2 * largest * static_cast<double>(micro_batch);
  w.conv_copy_bytes = scale * kConvWeightCopies * conv;
  w.conv_scratch_bytes = scale * kLargestConvWeightCopies * largest_conv;
  return w;
}

double cpu_primitive_bytes(const ModelSpec& spec, size_t begin, size_t end, int64_t micro_batch) {
  TANDEM_REQUIRE(begin < end && end <= spec.layers.size(), "model '{}': layers [{}, {}) out of range ({} layers)",
                 spec.name, begin, end, spec.layers.size());
  TANDEM_REQUIRE(micro_batch >= 1, "model '{}': a batch shape of {} samples", spec.name, micro_batch);
  double bytes = kCpuShapeBytes;
  for (size_t i = begin; i < end; ++i)
    if (spec.layers[i].kind != LayerKind::kFlatten) bytes += kCpuShapeBytesPerLayer;
  return bytes;
}

}  // namespace tandem::engine::nn
