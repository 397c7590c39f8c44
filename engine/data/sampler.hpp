#pragma once
// Splits a dataset among `world` ranks for one epoch at a time. Every rank draws the same permutation from
// (seed, epoch) and takes every world-th index starting at its rank; the list is padded by wrapping around (or cut,
// with drop_last) so all ranks see the same number of samples. The state (epoch, position) is small and is what a
// checkpoint stores to resume mid-epoch.
#include <cstdint>
#include <vector>

namespace tandem::engine::data {

struct SamplerState {
  uint64_t seed = 0;
  int64_t epoch = 0;
  int64_t position = 0;  // samples of this rank's shard already handed out in `epoch`
};

class DistributedSampler {
 public:
  DistributedSampler(int64_t dataset_size, int world = 1, int rank = 0, bool shuffle = true, uint64_t seed = 0,
                     bool drop_last = false);

  int64_t dataset_size() const noexcept { return size_; }
  int world() const noexcept { return world_; }
  int rank() const noexcept { return rank_; }
  int64_t shard_size() const noexcept { return shard_; }  // samples per rank per epoch
  int64_t epoch() const noexcept { return epoch_; }
  int64_t position() const noexcept { return position_; }
  int64_t remaining() const noexcept { return shard_ - position_; }

  // This rank's indices for the current epoch, in order.
  const std::vector<int64_t>& indices() const;
  // The next min(n, remaining()) indices; advances the position.
  std::vector<int64_t> take(int64_t n);
  void advance(int64_t n);  // skips n samples (n <= remaining())
  void set_epoch(int64_t epoch);  // position back to 0
  void next_epoch() { set_epoch(epoch_ + 1); }

  SamplerState state() const noexcept { return {seed_, epoch_, position_}; }
  // Throws kInvalidArgument when the state does not fit this sampler (other seed, position past the shard).
  void restore(const SamplerState& s);

 private:
  int64_t size_;
  int world_, rank_;
  bool shuffle_, drop_last_;
  uint64_t seed_;
  int64_t shard_ = 0;
  int64_t epoch_ = 0, position_ = 0;
  mutable int64_t cached_epoch_ = -1;
  mutable std::vector<int64_t> cache_;
};

}  // namespace tandem::engine::data
