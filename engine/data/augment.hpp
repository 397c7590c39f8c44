#pragma once
// Converting 8-bit samples to normalised f32, with optional training augmentation: random crop with zero padding
// (PyTorch's RandomCrop(size, padding)) and random horizontal flip. Normalisation: x = (pixel / 255 - mean) / std.
#include <cstdint>
#include <vector>

#include "engine/core/rng.hpp"

namespace tandem::engine::data {

struct Augment {
  int64_t crop_padding = 0;  // > 0: pad by this many zero pixels, then crop back at a random offset
  bool hflip = false;        // mirror left-right with probability 1/2
  std::vector<float> mean;   // per channel (one value applies to all); empty: 0
  std::vector<float> std;    // per channel (one value applies to all); empty: 1

  bool random() const noexcept { return crop_padding > 0 || hflip; }
};

// Mean and standard deviation commonly used for the data sets (in [0, 1] pixel units).
Augment fashion_mnist_normalization();  // mean 0.2860, std 0.3530
Augment cifar10_normalization();        // per-channel CIFAR-10 statistics

// Precomputed per-channel lookup tables: 256 floats per channel.
class SampleConverter {
 public:
  SampleConverter(const Augment& a, int64_t channels, int64_t height, int64_t width);
  // dst (c*h*w floats) from src (c*h*w bytes). rng == nullptr disables the random parts (evaluation).
  void convert(const uint8_t* src, float* dst, Rng* rng) const;

 private:
  Augment aug_;
  int64_t c_, h_, w_;
  std::vector<float> lut_;
};

}  // namespace tandem::engine::data
