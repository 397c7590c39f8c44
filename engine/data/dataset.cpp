#include "engine/data/dataset.hpp"

#include <algorithm>

#include "engine/core/error.hpp"
#include "engine/core/rng.hpp"

namespace tandem::engine::data {

Dataset Dataset::head(int64_t limit) const {
  const int64_t count = limited_samples(size(), limit);
  if (count == size()) return *this;
  Dataset d;
  d.name = name;
  d.channels = channels;
  d.height = height;
  d.width = width;
  d.num_classes = num_classes;
  d.pixels.assign(pixels.begin(), pixels.begin() + count * sample_size());
  d.labels.assign(labels.begin(), labels.begin() + count);
  return d;
}

void Dataset::validate() const {
  TANDEM_REQUIRE(channels > 0 && height > 0 && width > 0, "dataset '{}': sample shape {}x{}x{} must be positive",
                 name, channels, height, width);
  TANDEM_REQUIRE(num_classes > 0, "dataset '{}': class count must be positive (got {})", name, num_classes);
  TANDEM_REQUIRE(static_cast<int64_t>(pixels.size()) == size() * sample_size(),
                 "dataset '{}': {} pixel bytes for {} samples of {} (expected {})", name, pixels.size(), size(),
                 sample_size(), size() * sample_size());
  for (int64_t i = 0; i < size(); ++i) {
    TANDEM_REQUIRE(labels[i] >= 0 && labels[i] < num_classes, "dataset '{}': label {} of sample {} outside [0, {})",
                   name, labels[i], i, num_classes);
  }
}

Dataset make_synthetic(int64_t channels, int64_t height, int64_t width, int64_t num_classes, int64_t count,
                       uint64_t seed) {
  TANDEM_REQUIRE(channels > 0 && height > 0 && width > 0 && num_classes > 0 && count > 0,
                 "synthetic dataset: shape {}x{}x{}, {} classes and {} samples must all be positive", channels, height,
                 width, num_classes, count);
  Dataset d;
  d.name = "synthetic";
  d.channels = channels;
  d.height = height;
  d.width = width;
  d.num_classes = num_classes;
  const int64_t n = d.sample_size();
  Rng rng(seed);
  std::vector<uint8_t> templates(static_cast<size_t>(num_classes * n));
  for (auto& t : templates) t = static_cast<uint8_t>(rng.below(256));
  d.pixels.resize(static_cast<size_t>(count * n));
  d.labels.resize(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    const auto label = static_cast<int32_t>(rng.below(static_cast<uint64_t>(num_classes)));
    d.labels[i] = label;
    const uint8_t* t = templates.data() + label * n;
    uint8_t* p = d.pixels.data() + i * n;
    for (int64_t k = 0; k < n; ++k) {
      const int64_t v = t[k] + static_cast<int64_t>(rng.below(97)) - 48;  // noise in [-48, 48]
      p[k] = static_cast<uint8_t>(std::clamp<int64_t>(v, 0, 255));
    }
  }
  return d;
}

}  // namespace tandem::engine::data
