#include "engine/data/partition.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "engine/core/error.hpp"
#include "engine/core/rng.hpp"

namespace tandem::engine::data {

namespace {

void shuffle(std::vector<int64_t>& v, Rng& rng) {
  for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[rng.below(i)]);
}

}  // namespace

ClientShards partition_iid(int64_t samples, int clients, uint64_t seed) {
  TANDEM_REQUIRE(clients >= 1 && samples >= 0, "cannot split {} samples over {} clients", samples, clients);
  std::vector<int64_t> order(static_cast<size_t>(samples));
  std::iota(order.begin(), order.end(), 0);
  Rng rng(mix64(seed, 0x696964));
  shuffle(order, rng);
  ClientShards out(static_cast<size_t>(clients));
  const int64_t base = samples / clients, extra = samples % clients;
  int64_t at = 0;
  for (int k = 0; k < clients; ++k) {
    const int64_t n = base + (k < extra ? 1 : 0);
    auto& s = out[static_cast<size_t>(k)];
    s.assign(order.begin() + at, order.begin() + at + n);
    std::sort(s.begin(), s.end());
    at += n;
  }
  return out;
}

ClientShards partition_dirichlet(const std::vector<int32_t>& labels, int64_t num_classes, int clients, double alpha,
                                 uint64_t seed) {
  TANDEM_REQUIRE(clients >= 1, "cannot split data over {} clients", clients);
  TANDEM_REQUIRE(std::isfinite(alpha) && alpha > 0, "Dirichlet label skew needs alpha > 0 (got {})", alpha);
  TANDEM_REQUIRE(num_classes >= 1, "Dirichlet label skew needs classes (got {})", num_classes);
  std::vector<std::vector<int64_t>> by_class(static_cast<size_t>(num_classes));
  for (size_t i = 0; i < labels.size(); ++i) {
    const int32_t y = labels[i];
    TANDEM_REQUIRE(y >= 0 && y < num_classes, "label {} of sample {} is outside [0, {})", y, i, num_classes);
    by_class[static_cast<size_t>(y)].push_back(static_cast<int64_t>(i));
  }
  Rng rng(mix64(seed, 0x646972));
  ClientShards out(static_cast<size_t>(clients));
  std::vector<double> p(static_cast<size_t>(clients));
  for (auto& idx : by_class) {
    shuffle(idx, rng);
    double total = 0;
    for (double& v : p) total += v = rng.gamma(alpha);
    if (!(total > 0)) {  // every draw underflowed (tiny alpha): the whole class to one client
      std::fill(p.begin(), p.end(), 0.0);
      p[rng.below(p.size())] = total = 1.0;
    }
    // Cut points at the rounded cumulative proportions: every sample of the class lands in exactly one client.
    const auto n = static_cast<double>(idx.size());
    double cum = 0;
    size_t at = 0;
    for (size_t k = 0; k < p.size(); ++k) {
      cum += p[k] / total;
      const size_t end = k + 1 == p.size() ? idx.size() : std::min(idx.size(), static_cast<size_t>(std::llround(cum * n)));
      auto& s = out[k];
      if (end > at) s.insert(s.end(), idx.begin() + static_cast<std::ptrdiff_t>(at), idx.begin() + static_cast<std::ptrdiff_t>(end));
      at = std::max(at, end);
    }
  }
  for (auto& s : out) std::sort(s.begin(), s.end());
  return out;
}

Dataset subset(const Dataset& d, const std::vector<int64_t>& indices, std::string name) {
  Dataset s;
  s.name = std::move(name);
  s.channels = d.channels;
  s.height = d.height;
  s.width = d.width;
  s.num_classes = d.num_classes;
  const int64_t ss = d.sample_size();
  s.pixels.reserve(indices.size() * static_cast<size_t>(ss));
  s.labels.reserve(indices.size());
  for (const int64_t i : indices) {
    TANDEM_REQUIRE(i >= 0 && i < d.size(), "sample {} is outside dataset '{}' of {} samples", i, d.name, d.size());
    s.pixels.insert(s.pixels.end(), d.sample(i), d.sample(i) + ss);
    s.labels.push_back(d.labels[static_cast<size_t>(i)]);
  }
  return s;
}

}  // namespace tandem::engine::data
