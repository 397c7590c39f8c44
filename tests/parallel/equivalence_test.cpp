// Equivalence with single-process training: with the same global batch and seed (and no dropout or
// batch norm, whose per-replica / per-micro-batch statistics legitimately differ), DDP, the pipeline
// and hybrid DP x PP give the parameters train::Trainer gives after K steps -- within 1e-5 relative
// (float sums regrouped by rank or micro-batch round differently), and bit-identically where nothing
// is regrouped (one micro-batch, one replica).
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include "engine/nn/zoo.hpp"
#include "tests/parallel/harness.hpp"

namespace bdata = boost::unit_test::data;
BOOST_TEST_DONT_PRINT_LOG_VALUE(tandem::engine::parallel::ScheduleKind)
BOOST_TEST_DONT_PRINT_LOG_VALUE(tandem::engine::parallel::GradCompression)
using namespace tandem;
using namespace tandem::testing;

namespace {

constexpr int kSteps = 3;

const data::Dataset& train_set() {
  static const data::Dataset d = data::make_synthetic(1, 12, 12, 4, 256, 1);
  return d;
}
nn::ModelSpec lenet() { return nn::zoo_model("lenet5", {1, 12, 12}, 4); }

// conv -> relu -> conv -> add(relu, conv) -> relu -> gap -> flatten -> linear: a cut before the add
// sends two tensors (the skip and the branch) and receives two gradients.
nn::ModelSpec residual() {
  nn::ModelBuilder b("residual", {1, 12, 12});
  b.conv(4, 3, 1, 1);
  const int32_t r = b.relu();
  const int32_t c = b.conv(4, 3, 1, 1);
  b.add(r, c);
  b.relu();
  b.global_avgpool();
  b.flatten();
  b.linear(4);
  return std::move(b).build();
}

par::ParallelConfig pconfig(par::Strategy s, int dp, int pp, int micro_batches = 1,
                            par::ScheduleKind k = par::ScheduleKind::kOneFOneB) {
  par::ParallelConfig p;
  p.strategy = s;
  p.dp = dp;
  p.pp = pp;
  p.micro_batches = micro_batches;
  p.schedule = k;
  p.bucket_mb = 0.004;  // several buckets even for this small net (4 KiB)
  return p;
}

void check_replicas_identical(const ParallelRun& run) {
  // Every replica of a stage holds bit-identical parameters for that stage.
  const par::Grid& g = run.grids[0];
  for (int s = 0; s < g.pp; ++s) {
    for (int d = 1; d < g.dp; ++d) {
      BOOST_TEST((run.params[static_cast<size_t>(g.rank_of(d, s))] == run.params[static_cast<size_t>(g.rank_of(0, s))]),
                 "replica " << d << " of stage " << s << " differs from replica 0");
    }
  }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(equivalence)

BOOST_DATA_TEST_CASE(ddp_matches_single_process, bdata::make({2, 4}), dp) {
  const int64_t per_rank = 8;
  const auto ref = reference_params(lenet(), train_set(), sgd_config(per_rank * dp), kSteps);
  const ParallelRun run =
      run_parallel(lenet(), train_set(), sgd_config(per_rank), pconfig(par::Strategy::kDdp, 0, 0), dp, kSteps);
  check_replicas_identical(run);
  const double d = rel_diff(run.params[0], ref);
  BOOST_TEST_MESSAGE("ddp dp=" << dp << ": max relative difference " << d);
  BOOST_TEST(d <= 1e-5);
  BOOST_TEST((run.params[0] != reference_params(lenet(), train_set(), sgd_config(per_rank * dp), kSteps - 1)),
             "training moved the parameters");
}

BOOST_DATA_TEST_CASE(pipeline_matches_single_process,
                     bdata::make({2, 4}) * bdata::make({par::ScheduleKind::kGPipe, par::ScheduleKind::kOneFOneB}) *
                         bdata::make({1, 3, 4}),
                     stages, schedule, micro_batches) {
  const int64_t batch = 16;
  const auto ref = reference_params(lenet(), train_set(), sgd_config(batch), kSteps);
  const ParallelRun run = run_parallel(lenet(), train_set(), sgd_config(batch),
                                       pconfig(par::Strategy::kPipeline, 0, 0, micro_batches, schedule), stages, kSteps);
  const std::vector<float> got = run.assembled(lenet());
  const double d = rel_diff(got, ref);
  BOOST_TEST_MESSAGE("pipeline S=" << stages << " " << par::schedule_name(schedule) << " M=" << micro_batches
                                   << ": max relative difference " << d);
  BOOST_TEST(d <= 1e-5);
  if (micro_batches == 1) BOOST_TEST((got == ref), "one micro-batch: nothing is regrouped, so bit-identical");
}

BOOST_AUTO_TEST_CASE(hybrid_2x2_matches_single_process) {
  const int64_t per_rank = 8;
  const auto ref = reference_params(lenet(), train_set(), sgd_config(2 * per_rank), kSteps);
  for (auto k : {par::ScheduleKind::kGPipe, par::ScheduleKind::kOneFOneB}) {
    const ParallelRun run = run_parallel(lenet(), train_set(), sgd_config(per_rank),
                                         pconfig(par::Strategy::kHybrid, 2, 2, 2, k), 4, kSteps);
    check_replicas_identical(run);
    const double d = rel_diff(run.assembled(lenet()), ref);
    BOOST_TEST_MESSAGE("hybrid 2x2 " << par::schedule_name(k) << ": max relative difference " << d);
    BOOST_TEST(d <= 1e-5);
  }
}

BOOST_AUTO_TEST_CASE(cut_through_a_residual_block_sends_every_crossing_tensor) {
  const nn::ModelSpec spec = residual();
  BOOST_REQUIRE_EQUAL(spec.crossing(3).size(), 2u);  // the skip (relu) and the branch (conv)
  const auto ref = reference_params(spec, train_set(), sgd_config(12), kSteps);
  par::ParallelConfig p = pconfig(par::Strategy::kPipeline, 0, 0, 3, par::ScheduleKind::kOneFOneB);
  p.boundaries = {0, 3, static_cast<int32_t>(spec.layers.size())};
  const ParallelRun run = run_parallel(spec, train_set(), sgd_config(12), p, 2, kSteps);
  BOOST_TEST((run.bounds[0] == p.boundaries));
  BOOST_TEST(rel_diff(run.assembled(spec), ref) <= 1e-5);
}

BOOST_AUTO_TEST_CASE(gradient_accumulation_equals_the_larger_batch) {
  // dp=2, 4 samples per batch, 2 batches accumulated: 16 samples per step.
  const auto ref = reference_params(lenet(), train_set(), sgd_config(16), kSteps);
  par::ParallelConfig p = pconfig(par::Strategy::kDdp, 0, 0);
  p.accumulation = 2;
  const ParallelRun run = run_parallel(lenet(), train_set(), sgd_config(4), p, 2, kSteps);
  check_replicas_identical(run);
  BOOST_TEST(rel_diff(run.params[0], ref) <= 1e-5);
}

BOOST_AUTO_TEST_CASE(deterministic_mode_is_bit_identical_run_to_run) {
  comm::CommOptions det;
  det.deterministic = true;
  for (auto [s, dp, pp] : {std::tuple{par::Strategy::kDdp, 0, 0}, std::tuple{par::Strategy::kHybrid, 2, 2}}) {
    const auto p = pconfig(s, dp, pp, 2);
    const ParallelRun a = run_parallel(lenet(), train_set(), sgd_config(8), p, 4, kSteps, det);
    const ParallelRun b = run_parallel(lenet(), train_set(), sgd_config(8), p, 4, kSteps, det);
    for (size_t r = 0; r < a.params.size(); ++r)
      BOOST_TEST((a.params[r] == b.params[r]), par::strategy_name(s) << " rank " << r << " differs between runs");
  }
}

BOOST_DATA_TEST_CASE(compressed_gradients_stay_close, bdata::make({par::GradCompression::kF16, par::GradCompression::kBF16}),
                     compression) {
  const auto exact =
      run_parallel(lenet(), train_set(), sgd_config(8), pconfig(par::Strategy::kDdp, 0, 0), 2, kSteps).params[0];
  par::ParallelConfig p = pconfig(par::Strategy::kDdp, 0, 0);
  p.compression = compression;
  const ParallelRun run = run_parallel(lenet(), train_set(), sgd_config(8), p, 2, kSteps);
  check_replicas_identical(run);
  const double d = rel_diff(run.params[0], exact);
  BOOST_TEST_MESSAGE(par::compression_name(compression) << ": max relative difference to f32 gradients " << d);
  BOOST_TEST(d > 0.0, "the narrow type rounds, so the result must differ from f32");
  BOOST_TEST(d < (compression == par::GradCompression::kF16 ? 1e-3 : 1e-2));
}

BOOST_AUTO_TEST_CASE(a_whole_epoch_with_a_short_last_batch_matches) {
  // 50 samples: DDP dp=2 with 8 per rank ends on a batch of 1 per rank, the pipeline (16, M=4) on a
  // batch of 2 split into 2 micro-batches; single-process training ends on the same 2 samples.
  const data::Dataset d50 = train_set().head(50);
  const auto reference = [&](int64_t batch) {
    auto be = one_thread_backend();
    nn::Model m(lenet(), *be, 3);
    train::Trainer t(m, d50, nullptr, sgd_config(batch));
    t.train_epoch();
    return host_params(m);
  };
  const auto epoch = [&](const par::ParallelConfig& p, int world, int64_t batch) {
    ParallelRun run;
    run.params.resize(static_cast<size_t>(world));
    run.bounds.resize(static_cast<size_t>(world));
    run.grids.resize(static_cast<size_t>(world));
    std::vector<int64_t> samples(static_cast<size_t>(world));
    require_no_errors(run_world(world, {}, [&](int r, comm::Communicator& c) {
      auto be = one_thread_backend();
      nn::Model m(lenet(), *be, 3);
      par::ParallelTrainer t(m, d50, nullptr, sgd_config(batch), p, &c);
      const train::EpochResult e = t.train_epoch();
      samples[static_cast<size_t>(r)] = e.train_samples;
      run.params[static_cast<size_t>(r)] = host_params(m);
      run.bounds[static_cast<size_t>(r)] = t.boundaries();
      run.grids[static_cast<size_t>(r)] = t.grid();
    }));
    for (int64_t s : samples) BOOST_TEST(s == 50);
    return run;
  };
  const auto ref16 = reference(16);
  BOOST_TEST(rel_diff(epoch(pconfig(par::Strategy::kDdp, 0, 0, 2), 2, 8).params[0], ref16) <= 1e-5);
  BOOST_TEST(rel_diff(epoch(pconfig(par::Strategy::kPipeline, 0, 0, 4), 2, 16).assembled(lenet()), ref16) <= 1e-5);
}

BOOST_AUTO_TEST_SUITE_END()
