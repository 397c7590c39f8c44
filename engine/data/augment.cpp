#include "engine/data/augment.hpp"

#include "engine/core/error.hpp"

namespace tandem::engine::data {

Augment fashion_mnist_normalization() {
  Augment a;
  a.mean = {0.2860f};
  a.std = {0.3530f};
  return a;
}

Augment cifar10_normalization() {
  Augment a;
  a.mean = {0.4914f, 0.4822f, 0.4465f};
  a.std = {0.2470f, 0.2435f, 0.2616f};
  return a;
}

SampleConverter::SampleConverter(const Augment& a, int64_t channels, int64_t height, int64_t width)
    : aug_(a), c_(channels), h_(height), w_(width), lut_(static_cast<size_t>(256 * channels)) {
  auto per_channel = [&](const std::vector<float>& v, const char* what, float def, int64_t ch) {
    if (v.empty()) return def;
    TANDEM_REQUIRE(v.size() == 1 || static_cast<int64_t>(v.size()) == channels,
                   "augmentation: {} has {} values for {} channels", what, v.size(), channels);
    return v.size() == 1 ? v[0] : v[static_cast<size_t>(ch)];
  };
  TANDEM_REQUIRE(a.crop_padding >= 0, "augmentation: crop padding {} must be >= 0", a.crop_padding);
  for (int64_t ch = 0; ch < channels; ++ch) {
    const float mean = per_channel(a.mean, "mean", 0.0f, ch), sd = per_channel(a.std, "std", 1.0f, ch);
    TANDEM_REQUIRE(sd > 0, "augmentation: std of channel {} must be positive (got {})", ch, sd);
    for (int p = 0; p < 256; ++p) lut_[static_cast<size_t>(ch * 256 + p)] = (static_cast<float>(p) / 255.0f - mean) / sd;
  }
}

void SampleConverter::convert(const uint8_t* src, float* dst, Rng* rng) const {
  int64_t dy = 0, dx = 0;
  bool flip = false;
  if (rng != nullptr && aug_.crop_padding > 0) {
    const auto span = static_cast<uint64_t>(2 * aug_.crop_padding + 1);
    dy = static_cast<int64_t>(rng->below(span)) - aug_.crop_padding;
    dx = static_cast<int64_t>(rng->below(span)) - aug_.crop_padding;
  }
  if (rng != nullptr && aug_.hflip) flip = (rng->next_u64() >> 63) != 0;
  const int64_t plane = h_ * w_;
  for (int64_t ch = 0; ch < c_; ++ch) {
    const float* lut = lut_.data() + ch * 256;
    const uint8_t* s = src + ch * plane;
    float* d = dst + ch * plane;
    if (dy == 0 && dx == 0 && !flip) {
      for (int64_t i = 0; i < plane; ++i) d[i] = lut[s[i]];
      continue;
    }
    for (int64_t y = 0; y < h_; ++y) {
      const int64_t sy = y + dy;
      for (int64_t x = 0; x < w_; ++x) {
        const int64_t sx = (flip ? w_ - 1 - x : x) + dx;
        const bool inside = sy >= 0 && sy < h_ && sx >= 0 && sx < w_;
        d[y * w_ + x] = lut[inside ? s[sy * w_ + sx] : 0];
      }
    }
  }
}

}  // namespace tandem::engine::data
