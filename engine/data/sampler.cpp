#include "engine/data/sampler.hpp"

#include <numeric>

#include "engine/core/error.hpp"
#include "engine/core/rng.hpp"

namespace tandem::engine::data {

DistributedSampler::DistributedSampler(int64_t dataset_size, int world, int rank, bool shuffle, uint64_t seed,
                                       bool drop_last)
    : size_(dataset_size), world_(world), rank_(rank), shuffle_(shuffle), drop_last_(drop_last), seed_(seed) {
  TANDEM_REQUIRE(dataset_size > 0, "sampler: dataset is empty");
  TANDEM_REQUIRE(world >= 1 && rank >= 0 && rank < world, "sampler: rank {} outside world of {}", rank, world);
  shard_ = drop_last ? size_ / world : (size_ + world - 1) / world;
  TANDEM_REQUIRE(shard_ > 0, "sampler: {} samples cannot give each of {} ranks one sample with drop_last", size_,
                 world);
}

const std::vector<int64_t>& DistributedSampler::indices() const {
  if (cached_epoch_ == epoch_) return cache_;
  std::vector<int64_t> perm(static_cast<size_t>(size_));
  std::iota(perm.begin(), perm.end(), int64_t{0});
  if (shuffle_) {
    Rng rng(mix64(seed_, static_cast<uint64_t>(epoch_)));
    for (size_t i = perm.size() - 1; i > 0; --i) std::swap(perm[i], perm[rng.below(i + 1)]);
  }
  cache_.resize(static_cast<size_t>(shard_));
  for (int64_t k = 0; k < shard_; ++k) cache_[k] = perm[static_cast<size_t>((k * world_ + rank_) % size_)];
  cached_epoch_ = epoch_;
  return cache_;
}

std::vector<int64_t> DistributedSampler::take(int64_t n) {
  TANDEM_REQUIRE(n >= 0, "sampler: take({}) needs n >= 0", n);
  const auto& all = indices();
  const int64_t k = std::min(n, remaining());
  std::vector<int64_t> out(all.begin() + position_, all.begin() + position_ + k);
  position_ += k;
  return out;
}

void DistributedSampler::advance(int64_t n) {
  TANDEM_REQUIRE(n >= 0 && n <= remaining(), "sampler: cannot advance {} samples with {} left in epoch {}", n,
                 remaining(), epoch_);
  position_ += n;
}

void DistributedSampler::set_epoch(int64_t epoch) {
  TANDEM_REQUIRE(epoch >= 0, "sampler: epoch {} must be >= 0", epoch);
  epoch_ = epoch;
  position_ = 0;
}

void DistributedSampler::restore(const SamplerState& s) {
  TANDEM_REQUIRE(s.seed == seed_, "sampler: state was saved with seed {} but this sampler uses seed {}", s.seed, seed_);
  TANDEM_REQUIRE(s.epoch >= 0 && s.position >= 0 && s.position <= shard_,
                 "sampler: state (epoch {}, position {}) does not fit a shard of {} samples", s.epoch, s.position,
                 shard_);
  epoch_ = s.epoch;
  position_ = s.position;
}

}  // namespace tandem::engine::data
