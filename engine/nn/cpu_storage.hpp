#pragma once
// How Tandem's cpu backend (oneDNN) stores a training step's tensors beyond the f32 layer outputs that
// ModelSpec::stored_activation_bytes counts -- facts of the layer shapes, measured once (issue #16). The job
// compiler turns them into a rank's workspace figures (engine/parallel/job.hpp StageMemory); the runtime's memory
// guard (engine/train/memory_guard.hpp) and the simulator (simulator/simulate.hpp) both read them there.
#include <cstdint>

#include "engine/nn/model_spec.hpp"

namespace tandem::engine::nn {

// 4-D activations are kept in oneDNN's blocked formats, channels padded to a multiple of this.
inline constexpr int64_t kCpuChannelBlock = 16;

// Peak over the stored activations (padded, with their workspaces): the gradient buffers alive during backward,
// backend workspaces and the caching allocator's free blocks. Measured with tandem train on the cpu backend
// (mobilenetv2 at batch 16 and 64: peak RSS 263 and 880 MiB against 259 and 911 MiB estimated with this factor;
// the per-sample slope of the measured peak, resnet18 7.0 and mobilenetv2 16.5 MiB, against 7.05 and 16.2).
inline constexpr double kCpuActivationOverhead = 1.25;

// The convolutions' weights reordered into blocked formats (forward and backward), per byte of their f32 weights:
// tandem calibrate's runtime_rss_bytes over an mlp's (17.8 MiB, no convolutions) was 1.2 for vgg16 and alexnet
// (CIFAR), 1.26 for mobilenetv2 and 1.8 for resnet18 (bench/simulator/memory_check.py). The lowest is taken: the
// memory guard must not refuse a job that fits. Without it resnet18 at batch 8 peaked 318 MiB against 237 estimated.
inline constexpr double kConvWeightCopies = 1.2;
// The largest convolution's weight gradient and its reordered copy, once a step whatever the batch: the intercept of
// the measured activation peak against the batch (activation_peak_curve) was 18 MiB for resnet18 and vgg16 (largest
// convolution 512x512x3x3, 9.0 MiB), ~3 MiB for mobilenetv2 (1.6 MiB), 8.7 MiB for alexnet (3.4 MiB).
inline constexpr double kLargestConvWeightCopies = 2.0;

// Per sample, a layer's output as the cpu backend keeps it: channels padded to kCpuChannelBlock when it has a
// spatial extent, and max pooling's workspace of argmax positions (one per output element) beside it.
double cpu_stored_output_bytes(const LayerSpec& l);

// What the cpu backend adds for training layers [begin, end), in bytes (f32; `scale` multiplies them all: 0.5 for
// 16-bit activations and weights):
struct CpuWorkspace {
  double scratch_bytes = 0;       // backward: the gradients of a layer's output and of its input, 2 x the largest
                                  // stored output (cpu_stored_output_bytes) of the range, per micro-batch sample
  double conv_copy_bytes = 0;     // the convolutions' reordered weights: kConvWeightCopies x their weights
  double conv_scratch_bytes = 0;  // the largest convolution's weight-gradient scratch: kLargestConvWeightCopies x
                                  // its weights
};
CpuWorkspace cpu_workspace(const ModelSpec& spec, size_t begin, size_t end, int64_t micro_batch, double scale = 1.0);

// What the cpu backend keeps resident for the primitives of one more batch shape (oneDNN's kernels, primitive
// descriptors, scratchpads and reordered weights for that batch size, built on its first step and cached): a part per
// shape and a part per layer that computes (not a flatten view). Measured as the resident growth over the first step
// at a new batch size (tandem calibrate's primitive_bytes_curve), one thread, sgd, at 8-24 samples: mlp (5 such
// layers) 0.98 MiB, lenet5 (11) 0.95-1.05, resnet18 (66) 2.75-3.0, mobilenetv2 (150) 6.4-6.9; the least-squares line is
// 0.52 MiB + 41 KiB a layer (mlp -26%, lenet5 +1%, resnet18 +15%, mobilenetv2 -3%). The growth with the batch is
// small and model-specific (mlp +2.6 KB a sample, resnet18 up to +41 KB, mobilenetv2 none to 32), so the derived
// figure leaves it out; a profile's curve carries it.
inline constexpr double kCpuShapeBytes = 0.52 * 1048576;
inline constexpr double kCpuShapeBytesPerLayer = 41.0 * 1024;
// That figure for layers [begin, end) at `micro_batch` samples (>= 1; it does not enter the figure, see above). A run
// that also trains an epoch's short last batch holds two sets (engine/parallel/job.hpp StageMemory::short_batch_bytes).
double cpu_primitive_bytes(const ModelSpec& spec, size_t begin, size_t end, int64_t micro_batch);

}  // namespace tandem::engine::nn
