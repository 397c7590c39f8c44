#pragma once
// Datasets held in memory as 8-bit pixels (NCHW, one byte per value) and int32 labels: Fashion-MNIST takes 47 MB
// instead of 188 MB as floats. Batches are converted to normalised f32 by the loader.
#include <cstdint>
#include <string>
#include <vector>

namespace tandem::engine::data {

// The bytes a loaded data set of `samples` samples of `sample_size` values each holds resident: its 8-bit pixels and
// int32 labels (the Dataset below). The simulator charges a rank's data sets with it (simulator/simulate.cpp).
constexpr double resident_bytes(int64_t samples, int64_t sample_size) noexcept {
  return static_cast<double>(samples) * static_cast<double>(sample_size * int64_t{sizeof(uint8_t)} + int64_t{sizeof(int32_t)});
}

// The samples a loader keeps of a set of `available` under `limit` (<= 0: all): the first min(limit, available).
// The readers (readers.hpp) and Dataset::head keep that many; the simulator charges that many (simulate.cpp).
constexpr int64_t limited_samples(int64_t available, int64_t limit) noexcept {
  return limit > 0 && limit < available ? limit : available;
}

struct Dataset {
  std::string name;
  int64_t channels = 0, height = 0, width = 0;
  int64_t num_classes = 0;
  std::vector<uint8_t> pixels;  // size() * sample_size() (the element type resident_bytes counts)
  std::vector<int32_t> labels;  // in [0, num_classes)

  int64_t size() const noexcept { return static_cast<int64_t>(labels.size()); }
  int64_t sample_size() const noexcept { return channels * height * width; }
  const uint8_t* sample(int64_t i) const noexcept { return pixels.data() + i * sample_size(); }
  double resident_bytes() const noexcept { return data::resident_bytes(size(), sample_size()); }
  // The first `count` samples (all when count <= 0 or beyond the size).
  Dataset head(int64_t count) const;
  // Checks sizes and label range; throws kInvalidArgument naming the dataset.
  void validate() const;
};

// Deterministic synthetic data of any shape: each class has a fixed random template and every sample is its class
// template plus noise, so models can learn it (accuracy well above chance after a few steps).
Dataset make_synthetic(int64_t channels, int64_t height, int64_t width, int64_t num_classes, int64_t count,
                       uint64_t seed);

}  // namespace tandem::engine::data
