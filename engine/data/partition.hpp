#pragma once
// Client shards for federated learning (FedAvg, issue #13): the sample indices of a dataset split over K clients,
// every index in exactly one client, seeded (every rank computes the same split from the same seed).
//
//   IID: a seeded shuffle cut into K contiguous runs whose sizes differ by at most one.
//   Dirichlet(alpha) label skew (Hsu, Qi and Brown 2019): for each class, proportions p ~ Dir(alpha, ..., alpha)
//   over the K clients; the class's samples (shuffled) are cut at the cumulative proportions. A large alpha gives
//   every client about the global class mix (IID); a small alpha gives each client a few classes. A client may
//   end up with no samples at all when alpha is small.
#include <cstdint>
#include <string>
#include <vector>

#include "engine/data/dataset.hpp"

namespace tandem::engine::data {

using ClientShards = std::vector<std::vector<int64_t>>;  // [client] -> ascending sample indices

ClientShards partition_iid(int64_t samples, int clients, uint64_t seed);
// labels[i] in [0, num_classes). alpha > 0.
ClientShards partition_dirichlet(const std::vector<int32_t>& labels, int64_t num_classes, int clients, double alpha,
                                 uint64_t seed);

// The samples `indices` of `d` (in that order) as a dataset of their own, named `name`.
Dataset subset(const Dataset& d, const std::vector<int64_t>& indices, std::string name);

// The bytes the clients' subsets of a `samples`-sample set hold (their pixels and labels, as resident_bytes counts
// them): both partitions put every sample in exactly one client, so one more copy of the set.
constexpr double client_subsets_resident_bytes(int64_t samples, int64_t sample_size) noexcept {
  return resident_bytes(samples, sample_size);
}


}  // namespace tandem::engine::data
