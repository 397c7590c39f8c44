// Client shards for FedAvg: every sample in exactly one client, IID sizes balanced, and the Dirichlet label skew's
// statistics -- alpha large gives each client about the global class mix, alpha small concentrates each client on
// few classes -- the same split for the same seed.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/core/rng.hpp"
#include "engine/data/partition.hpp"

using namespace tandem::engine::data;

namespace {

// 10 classes, 500 samples each, labels interleaved.
std::vector<int32_t> labels_10x500() {
  std::vector<int32_t> y(5000);
  for (size_t i = 0; i < y.size(); ++i) y[i] = static_cast<int32_t>((i * 7) % 10);
  return y;
}

void check_every_sample_once(const ClientShards& s, size_t n) {
  std::vector<int> seen(n, 0);
  for (const auto& c : s)
    for (int64_t i : c) {
      BOOST_REQUIRE(i >= 0 && static_cast<size_t>(i) < n);
      ++seen[static_cast<size_t>(i)];
    }
  BOOST_TEST(std::count(seen.begin(), seen.end(), 1) == static_cast<std::ptrdiff_t>(n));
}

// Per client: the fraction of its samples in its most common class (clients with no samples are skipped).
std::vector<double> top_class_share(const ClientShards& s, const std::vector<int32_t>& y) {
  std::vector<double> out;
  for (const auto& c : s) {
    if (c.empty()) continue;
    std::vector<int> count(10, 0);
    for (int64_t i : c) ++count[static_cast<size_t>(y[static_cast<size_t>(i)])];
    out.push_back(static_cast<double>(*std::max_element(count.begin(), count.end())) / static_cast<double>(c.size()));
  }
  return out;
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}

}  // namespace

BOOST_AUTO_TEST_SUITE(client_partition)

BOOST_AUTO_TEST_CASE(iid_assigns_every_sample_once_in_balanced_shards) {
  const ClientShards s = partition_iid(1003, 7, 11);
  BOOST_REQUIRE_EQUAL(s.size(), 7u);
  check_every_sample_once(s, 1003);
  for (const auto& c : s) BOOST_TEST((c.size() == 143u || c.size() == 144u));  // 1003 = 7 x 143 + 2
  BOOST_TEST((partition_iid(1003, 7, 11) == s));
  BOOST_TEST((partition_iid(1003, 7, 12) != s));
}

BOOST_AUTO_TEST_CASE(dirichlet_assigns_every_sample_once_for_any_alpha) {
  const std::vector<int32_t> y = labels_10x500();
  for (double alpha : {0.01, 0.1, 0.5, 1.0, 100.0}) {
    const ClientShards s = partition_dirichlet(y, 10, 20, alpha, 3);
    BOOST_REQUIRE_EQUAL(s.size(), 20u);
    check_every_sample_once(s, y.size());
  }
  BOOST_TEST((partition_dirichlet(y, 10, 20, 0.5, 3) == partition_dirichlet(y, 10, 20, 0.5, 3)));
  BOOST_TEST((partition_dirichlet(y, 10, 20, 0.5, 3) != partition_dirichlet(y, 10, 20, 0.5, 4)));
}

BOOST_AUTO_TEST_CASE(large_alpha_is_close_to_iid) {
  // Dir(1000) proportions are 1/K within a few percent: every client holds about 500 / 10 samples of each class,
  // so its most common class is barely above the global 10%.
  const std::vector<int32_t> y = labels_10x500();
  const ClientShards s = partition_dirichlet(y, 10, 10, 1000.0, 5);
  for (const auto& c : s) BOOST_TEST(std::fabs(static_cast<double>(c.size()) - 500.0) < 60.0);
  for (double share : top_class_share(s, y)) BOOST_TEST(share < 0.16);
}

BOOST_AUTO_TEST_CASE(small_alpha_concentrates_each_client_on_few_classes) {
  // Dir(0.05) puts almost all of a class on one or two clients: a client's most common class is most of its data.
  const std::vector<int32_t> y = labels_10x500();
  const std::vector<double> skewed = top_class_share(partition_dirichlet(y, 10, 10, 0.05, 5), y);
  const std::vector<double> mild = top_class_share(partition_dirichlet(y, 10, 10, 1.0, 5), y);
  BOOST_TEST(mean(skewed) > 0.7);
  BOOST_TEST(mean(mild) < mean(skewed));
  BOOST_TEST(mean(mild) > 0.16);  // alpha 1 is visibly skewed too
}

BOOST_AUTO_TEST_CASE(subset_copies_the_chosen_samples) {
  Dataset d;
  d.name = "d";
  d.channels = 1;
  d.height = 1;
  d.width = 2;
  d.num_classes = 3;
  d.pixels = {0, 1, 10, 11, 20, 21};
  d.labels = {0, 1, 2};
  const Dataset s = subset(d, {2, 0}, "d client 0");
  BOOST_TEST(s.name == "d client 0");
  BOOST_TEST((s.pixels == std::vector<uint8_t>{20, 21, 0, 1}));
  BOOST_TEST((s.labels == std::vector<int32_t>{2, 0}));
}

// Issue #16: a FedAvg rank builds every client's subset on top of the training set; the simulator charges them by
// client_subsets_resident_bytes, which must be what the subsets hold -- for both partitions.
BOOST_AUTO_TEST_CASE(the_clients_subsets_hold_one_more_copy_of_the_set) {
  const Dataset d = make_synthetic(1, 5, 4, 6, 301, 2);
  for (const ClientShards& shards : {partition_iid(d.size(), 7, 1), partition_dirichlet(d.labels, 6, 7, 0.3, 1)}) {
    double held = 0;
    for (size_t k = 0; k < shards.size(); ++k) held += subset(d, shards[k], "client").resident_bytes();
    BOOST_TEST(held == client_subsets_resident_bytes(d.size(), d.sample_size()));
    BOOST_TEST(held == d.resident_bytes());
  }
}

BOOST_AUTO_TEST_SUITE_END()
