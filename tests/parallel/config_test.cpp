// Configuration errors come back on every rank before any work starts; ranks started with different
// settings fail together naming the odd one out; the grid places ranks as documented.
#include <boost/test/unit_test.hpp>

#include "engine/nn/zoo.hpp"
#include "tests/parallel/harness.hpp"

using namespace tandem;
using namespace tandem::testing;

namespace {

const data::Dataset& small_set() {
  static const data::Dataset d = data::make_synthetic(1, 12, 12, 4, 64, 1);
  return d;
}
nn::ModelSpec lenet() { return nn::zoo_model("lenet5", {1, 12, 12}, 4); }

// Every rank constructs a trainer; returns what each rank got.
std::vector<RankError> construct_on(int world, const std::function<par::ParallelConfig(int)>& config_of,
                                    int64_t batch = 8) {
  return run_world(world, {}, [&](int r, comm::Communicator& c) {
    auto be = one_thread_backend();
    nn::Model m(lenet(), *be, 3);
    par::ParallelTrainer t(m, small_set(), nullptr, sgd_config(batch), config_of(r), &c);
  });
}

void expect_on_every_rank(const std::vector<RankError>& errors, Status status,
                          const std::vector<std::string>& needles) {
  for (size_t r = 0; r < errors.size(); ++r) {
    BOOST_TEST(static_cast<int>(errors[r].status) == static_cast<int>(status),
               "rank " << r << " got " << status_name(errors[r].status) << ": " << errors[r].message);
    for (const auto& n : needles)
      BOOST_TEST(errors[r].message.find(n) != std::string::npos,
                 "rank " << r << ": \"" << errors[r].message << "\" lacks \"" << n << "\"");
  }
}

par::ParallelConfig hybrid(int dp, int pp, int mb = 1) {
  par::ParallelConfig p;
  p.strategy = par::Strategy::kHybrid;
  p.dp = dp;
  p.pp = pp;
  p.micro_batches = mb;
  return p;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(configuration)

BOOST_AUTO_TEST_CASE(world_not_divisible_by_dp_times_pp_fails_on_every_rank) {
  expect_on_every_rank(construct_on(3, [](int) { return hybrid(2, 2); }), Status::kInvalidArgument,
                       {"world size 3 is not divisible by dp x pp = 2 x 2"});
  expect_on_every_rank(construct_on(4, [](int) { return hybrid(3, 0); }), Status::kInvalidArgument,
                       {"world size 4 is not divisible by dp=3"});
  expect_on_every_rank(construct_on(4, [](int) { return hybrid(1, 2); }), Status::kInvalidArgument,
                       {"world size 4 is not dp x pp = 1 x 2", "--dp 2 --pp 2"});
}

BOOST_AUTO_TEST_CASE(more_stages_than_layers_fails_on_every_rank) {
  const int64_t layers = static_cast<int64_t>(lenet().layers.size());
  const int world = static_cast<int>(layers) + 1;
  par::ParallelConfig p;
  p.strategy = par::Strategy::kPipeline;
  expect_on_every_rank(construct_on(world, [&](int) { return p; }), Status::kInvalidArgument,
                       {fmt::format("{} pipeline stages but the model has only {} layers", world, layers)});
}

BOOST_AUTO_TEST_CASE(more_micro_batches_than_samples_fails_on_every_rank) {
  expect_on_every_rank(construct_on(4, [](int) { return hybrid(2, 2, 9); }, 8), Status::kInvalidArgument,
                       {"9 micro-batches are more than the 8 samples of a batch"});
}

BOOST_AUTO_TEST_CASE(strategy_contradicting_the_grid_fails) {
  par::ParallelConfig p;
  p.strategy = par::Strategy::kDdp;
  p.pp = 2;
  expect_on_every_rank(construct_on(2, [&](int) { return p; }), Status::kInvalidArgument,
                       {"strategy ddp has no pipeline stages"});
  p = par::ParallelConfig{};  // single on two ranks
  expect_on_every_rank(construct_on(2, [&](int) { return p; }), Status::kInvalidArgument,
                       {"strategy single trains on one rank but the world has 2 ranks"});
}

BOOST_AUTO_TEST_CASE(a_rank_with_other_settings_fails_every_rank_naming_it) {
  const auto errors = construct_on(4, [](int r) { return hybrid(2, 2, r == 2 ? 4 : 2); });
  expect_on_every_rank(errors, Status::kMismatch, {"rank 2 has micro_batches = 4 but rank 0 has 2"});
}

BOOST_AUTO_TEST_CASE(a_rank_with_other_bucket_sizes_fails_every_rank_naming_it) {
  // the bucket policy decides which all-reduces the ranks post: one rank's other list would pair different buckets
  const auto errors = construct_on(2, [](int r) {
    par::ParallelConfig p;
    p.strategy = par::Strategy::kDdp;
    p.bucket_sizes_mb = r == 1 ? std::vector<double>{0.002, 0.004} : std::vector<double>{0.002, 0.003};
    return p;
  });
  expect_on_every_rank(errors, Status::kMismatch, {"rank 1 has first bucket / bucket sizes = "});
}

BOOST_AUTO_TEST_CASE(staleness_lr_is_ps_async_only_and_every_rank_must_give_the_same) {
  for (const par::Strategy s : {par::Strategy::kPs, par::Strategy::kSsp, par::Strategy::kDdp}) {
    par::ParallelConfig p;
    p.strategy = s;
    p.staleness_lr = par::StalenessLr::kInverse;
    expect_on_every_rank(construct_on(3, [&](int) { return p; }), Status::kInvalidArgument,
                         {fmt::format("--staleness-lr inverse: strategy {} applies no stale pushes",
                                      par::strategy_name(s))});
  }
  const auto errors = construct_on(3, [](int r) {
    par::ParallelConfig p;
    p.strategy = par::Strategy::kPsAsync;
    p.staleness_lr = r == 1 ? par::StalenessLr::kNone : par::StalenessLr::kInverse;
    return p;
  });
  expect_on_every_rank(errors, Status::kMismatch, {"rank 1 has staleness_lr = 0 but rank 0 has 1"});
}

BOOST_AUTO_TEST_CASE(grid_places_stages_within_a_replica_on_consecutive_ranks) {
  par::ParallelConfig p = hybrid(2, 3);
  for (int r = 0; r < 6; ++r) {
    par::ParallelConfig q = p;
    const par::Grid g = par::resolve_grid(q, 6, r, 12, 8);
    BOOST_TEST(g.stage == r % 3);
    BOOST_TEST(g.dp_rank == r / 3);
    BOOST_TEST(g.rank_of(g.dp_rank, g.stage) == r);
  }
  par::ParallelConfig d;
  d.strategy = par::Strategy::kDdp;
  const par::Grid g = par::resolve_grid(d, 4, 1, 12, 8);
  BOOST_TEST((d.dp == 4 && d.pp == 1 && g.stage == 0 && g.dp_rank == 1));
}

BOOST_AUTO_TEST_CASE(names_parse_and_print) {
  BOOST_TEST(par::strategy_name(par::parse_strategy("hybrid")) == std::string("hybrid"));
  BOOST_TEST(par::compression_name(par::parse_compression("bf16")) == std::string("bf16"));
  BOOST_CHECK_THROW(par::parse_strategy("tensor"), Error);
  BOOST_CHECK_THROW(par::parse_compression("int8"), Error);
  BOOST_CHECK_THROW(par::parse_partition_cost("random"), Error);
  BOOST_TEST(par::staleness_lr_name(par::parse_staleness_lr("inverse")) == std::string("inverse"));
  BOOST_CHECK_THROW(par::parse_staleness_lr("inverted"), Error);
}

BOOST_AUTO_TEST_SUITE_END()
