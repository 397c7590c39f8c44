// Resuming at another world size (issue #17): a checkpoint written at dp x pp resumes at dp' x pp' -- parameters,
// buffers and optimizer state resharded to the new stage cut, the sampler at the same global sample position -- and
// reaches the parameters of the uninterrupted run; the strategies with per-worker state refuse another dp, naming why.
//
// Tolerance: with the global batch kept (batch x dp constant) the resumed run computes the same sums as the
// uninterrupted one in another order (other all-reduce groups, other micro-batch splits), so parameters agree within
// float rounding: max |a - b| / max |b| <= 1e-5 after 3 steps here (measured differences are ~1e-7).
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <filesystem>

#include "engine/core/log.hpp"
#include "engine/nn/zoo.hpp"
#include "engine/train/checkpoint.hpp"
#include "tests/parallel/harness.hpp"

namespace bdata = boost::unit_test::data;
using namespace tandem;
using namespace tandem::testing;

namespace {

constexpr int64_t kGlobalBatch = 16;  // per step, over all replicas
constexpr int kBefore = 3, kAfter = 3;
constexpr double kTolerance = 1e-5;

const data::Dataset& train_set() {
  static const data::Dataset d = data::make_synthetic(1, 12, 12, 4, 256, 1);
  return d;
}
nn::ModelSpec lenet() { return nn::zoo_model("lenet5", {1, 12, 12}, 4); }

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / fmt::format("tandem_reshard_{}_{}", ::getpid(), name)).string();
}

struct GridShape {
  int dp = 1, pp = 1;
};
std::ostream& operator<<(std::ostream& o, const GridShape& g) { return o << g.dp << "x" << g.pp; }

train::TrainerConfig config(bool adam, int dp) {
  train::TrainerConfig cfg = sgd_config(kGlobalBatch / dp);  // SGD with momentum 0.9
  if (adam) {
    cfg.optimizer.kind = engine::optim::OptimizerKind::kAdam;  // two moments per parameter
    cfg.optimizer.lr = 1e-3f;
  }
  return cfg;
}

par::ParallelConfig hybrid(GridShape g) {
  par::ParallelConfig p;
  p.strategy = par::Strategy::kHybrid;
  p.dp = g.dp;
  p.pp = g.pp;
  p.micro_batches = g.pp > 1 ? 2 : 1;
  p.bucket_mb = 0.004;
  return p;
}

// Trains `steps` steps at grid g (loading `load` first, saving to `save` after `save_after` steps when given) and
// returns the whole model's parameters, assembled from replica 0's stages.
std::vector<float> train_at(GridShape g, bool adam, int steps, const std::string& load = "",
                            const std::string& save = "", int save_after = 0) {
  const int world = g.dp * g.pp;
  const train::TrainerConfig cfg = config(adam, g.dp);
  const par::ParallelConfig p = hybrid(g);
  ParallelRun run;
  run.params.resize(static_cast<size_t>(world));
  run.bounds.resize(static_cast<size_t>(world));
  run.grids.resize(static_cast<size_t>(world));
  const auto errors = run_world(world, {}, [&](int r, comm::Communicator& c) {
    auto be = one_thread_backend();
    nn::Model m(lenet(), *be, load.empty() ? 3 : 99);  // a resumed run must take everything from the file
    par::ParallelTrainer t(m, train_set(), nullptr, cfg, p, &c);
    if (!load.empty()) t.load_checkpoint(load);
    for (int i = 0; i < steps; ++i) {
      if (!save.empty() && i == save_after) t.save_checkpoint(save);
      if (t.step().samples == 0) throw std::runtime_error("ran out of batches");
    }
    if (!save.empty() && steps == save_after) t.save_checkpoint(save);
    run.params[static_cast<size_t>(r)] = host_params(m);
    run.bounds[static_cast<size_t>(r)] = t.boundaries();
    run.grids[static_cast<size_t>(r)] = t.grid();
  });
  for (size_t r = 0; r < errors.size(); ++r)  // every rank's own reason, not only "rank k could not load it"
    BOOST_TEST(errors[r].message.empty(), g << " rank " << r << ": " << errors[r].message);
  require_no_errors(errors);
  return run.assembled(lenet());
}

// The process logger's warnings while alive (the rank threads here log through it).
struct WarningCapture {
  Captured got;
  WarningCapture() { tandem::log::set_sink(&Captured::sink, &got); }
  ~WarningCapture() { tandem::log::set_sink(nullptr, nullptr); }
  bool contains(const std::string& needle) { return got.contains(needle); }
  std::string text() {
    std::lock_guard lock(got.mu);
    std::string all;
    for (const auto& l : got.lines) all += l + "\n";
    return all;
  }
};

struct Case {
  GridShape from;
  bool adam;
};
std::ostream& operator<<(std::ostream& o, const Case& c) { return o << c.from << (c.adam ? " adam" : " sgd"); }

}  // namespace

BOOST_TEST_DONT_PRINT_LOG_VALUE(GridShape)

BOOST_AUTO_TEST_SUITE(reshard)

// Both directions in dp and in pp: 2x1 grows pp (1x2, 2x2), grows dp (4x1), shrinks dp (1x1); 2x2 shrinks both
// (1x1), grows dp and shrinks pp (4x1), deepens the pipeline (1x4).
BOOST_DATA_TEST_CASE(resumes_at_another_grid_to_the_uninterrupted_parameters,
                     bdata::make({Case{{2, 1}, false}, Case{{2, 2}, true}}), c) {
  const std::string path = temp_path(fmt::format("{}x{}.ckpt", c.from.dp, c.from.pp));
  const std::vector<float> straight = train_at(c.from, c.adam, kBefore + kAfter, "", path, kBefore);
  const std::vector<float> at_checkpoint = train::load_checkpoint(path).tensor("model.params");
  const std::vector<GridShape> targets = c.from.pp == 1 ? std::vector<GridShape>{{1, 2}, {4, 1}, {1, 1}, {2, 2}}
                                                        : std::vector<GridShape>{{1, 1}, {4, 1}, {1, 4}, {2, 1}};
  for (const GridShape& to : targets) {
    const std::vector<float> resumed = train_at(to, c.adam, kAfter, path);
    const double d = rel_diff(resumed, straight);
    BOOST_TEST_MESSAGE(c << " -> " << to << ": max relative difference " << d);
    BOOST_TEST(d <= kTolerance, c << " resumed at " << to << " differs by " << d);
    // Not vacuous: the M steps after the checkpoint moved the parameters far more than the tolerance.
    BOOST_TEST(rel_diff(at_checkpoint, straight) > 100 * kTolerance);
  }
  std::filesystem::remove(path);
}

BOOST_AUTO_TEST_CASE(resharding_keeps_the_optimizer_state_and_the_global_sample_position) {
  // 2x2 writes, 1x4 and then 4x1 load and write again without stepping: every tensor (Adam's two moments included)
  // comes back bit-identical, and the global sample position (position x replicas) is the same.
  const std::string a = temp_path("a.ckpt"), b = temp_path("b.ckpt"), c = temp_path("c.ckpt");
  train_at({2, 2}, true, kBefore, "", a, kBefore);
  train_at({1, 4}, true, 0, a, b, 0);
  train_at({4, 1}, true, 0, b, c, 0);
  const train::Checkpoint ca = train::load_checkpoint(a), cc = train::load_checkpoint(c);
  BOOST_REQUIRE(ca.has("optimizer.state.1"));
  BOOST_REQUIRE_EQUAL(ca.tensors.size(), cc.tensors.size());
  for (size_t k = 0; k < ca.tensors.size(); ++k) {
    BOOST_TEST(ca.tensors[k].first == cc.tensors[k].first);
    BOOST_TEST((ca.tensors[k].second == cc.tensors[k].second), ca.tensors[k].first << " changed through 1x4 and 4x1");
  }
  const auto& sa = ca.meta.at("sampler");
  const auto& sc = cc.meta.at("sampler");
  BOOST_TEST(sa.at("world").get<int>() == 2);
  BOOST_TEST(sc.at("world").get<int>() == 4);
  BOOST_TEST(sa.at("position").get<int64_t>() == kBefore * kGlobalBatch / 2);
  BOOST_TEST(sc.at("position").get<int64_t>() * 4 == sa.at("position").get<int64_t>() * 2);
  BOOST_TEST(cc.meta.at("optimizer").at("steps").get<int64_t>() == kBefore);
  for (const auto& f : {a, b, c}) std::filesystem::remove(f);
}

BOOST_AUTO_TEST_CASE(sampler_rule_keeps_the_global_position_and_floors_an_uneven_split) {
  train::TrainingProgress p;
  p.sampler = {7, 2, 24};  // seed 7, epoch 2, 24 samples into each of 2 shards: 48 of the epoch's permutation
  p.sampler_world = 2;
  data::SamplerState s = train::reshard_sampler(p, 256, 4);
  BOOST_TEST(s.position == 12);
  BOOST_TEST(s.epoch == 2);
  BOOST_TEST(s.seed == 7u);
  BOOST_TEST(train::reshard_sampler(p, 256, 1).position == 48);
  BOOST_TEST(train::reshard_sampler(p, 256, 2).position == 24);
  // The samples handed out are the same set: the first 48 entries of the permutation at either width.
  std::vector<int64_t> seen2, seen4;
  for (int r = 0; r < 2; ++r) {
    data::DistributedSampler d(256, 2, r, true, 7);
    d.set_epoch(2);
    const auto v = d.take(24);
    seen2.insert(seen2.end(), v.begin(), v.end());
  }
  for (int r = 0; r < 4; ++r) {
    data::DistributedSampler d(256, 4, r, true, 7);
    d.set_epoch(2);
    const auto v = d.take(12);
    seen4.insert(seen4.end(), v.begin(), v.end());
  }
  std::sort(seen2.begin(), seen2.end());
  std::sort(seen4.begin(), seen4.end());
  BOOST_TEST((seen2 == seen4));
  // An exhausted epoch stays exhausted: 250 samples, shards of 125 at dp 2 and of 84 at dp 3.
  p.sampler.position = 125;
  BOOST_TEST(train::reshard_sampler(p, 250, 3).position == 84);
  // 48 samples do not split over 5 replicas: each starts at 9 (45 of the permutation), entries 45..47 are trained
  // again, and a warning says so; nothing of the epoch is skipped.
  p.sampler.position = 24;
  {
    WarningCapture warnings;
    const data::SamplerState five = train::reshard_sampler(p, 256, 5);
    BOOST_TEST(five.position == 9);
    BOOST_TEST(five.epoch == 2);
    BOOST_TEST(warnings.contains("48 samples into epoch 2"), warnings.text());
    BOOST_TEST(warnings.contains("samples 45..47 of its order are trained a second time"), warnings.text());
  }
  {
    WarningCapture warnings;  // an even split says nothing
    BOOST_TEST(train::reshard_sampler(p, 256, 4).position == 12);
    BOOST_TEST(warnings.text().empty(), warnings.text());
  }
  // A position past the new shards is refused naming the numbers: 125 of 250 at dp 2 would be 250 at dp 1 (whole),
  // but a forged 126 is past even a single shard.
  p.sampler.position = 126;
  p.sampler_world = 2;
  try {
    train::reshard_sampler(p, 250, 1);
    BOOST_FAIL("a position past the shards must be refused");
  } catch (const Error& e) {
    BOOST_TEST(static_cast<int>(e.status()) == static_cast<int>(Status::kInvalidArgument));
  }
}

BOOST_AUTO_TEST_CASE(an_uneven_sample_position_resumes_on_every_rank_and_says_what_is_seen_again) {
  const std::string path = temp_path("uneven.ckpt");
  train_at({2, 1}, false, 1, "", path, 1);  // 16 samples into the epoch (8 per replica x 2)
  const par::ParallelConfig p = hybrid({3, 1});
  WarningCapture warnings;
  std::vector<int64_t> positions(3, -1);
  const auto errors = run_world(3, {}, [&](int rank, comm::Communicator& c) {
    auto be = one_thread_backend();
    nn::Model m(lenet(), *be, 3);
    par::ParallelTrainer t(m, train_set(), nullptr, config(false, 2), p, &c);
    t.load_checkpoint(path);
    positions[static_cast<size_t>(rank)] = t.sample_position();
  });
  for (const auto& e : errors) BOOST_TEST(e.message.empty(), e.message);
  for (const int64_t pos : positions) BOOST_TEST(pos == 5);  // floor(16 / 3): entry 15 is trained again
  BOOST_TEST(warnings.contains("samples 15..15 of its order are trained a second time"), warnings.text());
  std::filesystem::remove(path);
}

// Strategy s on `world` ranks: loads `load` first when given, steps, saves to `save` when given; returns rank 0's
// parameters after a collective evaluation (the parameter servers' sync point) and every rank's failure.
std::vector<float> run_strategy(par::ParallelConfig p, int world, int64_t batch, int steps, const std::string& load,
                                const std::string& save, std::vector<RankError>* errors = nullptr) {
  std::vector<float> params;
  const auto e = run_world(world, {}, [&](int r, comm::Communicator& c) {
    auto be = one_thread_backend();
    nn::Model m(lenet(), *be, 3);
    train::TrainerConfig cfg = config(true, 1);
    cfg.batch_size = batch;
    par::ParallelTrainer t(m, train_set(), nullptr, cfg, p, &c);
    if (!load.empty()) t.load_checkpoint(load);
    for (int i = 0; i < steps; ++i) t.step();
    if (!save.empty()) t.save_checkpoint(save);
    t.evaluate(train_set(), 1);
    if (r == 0) params = host_params(m);
  });
  if (errors != nullptr) {
    *errors = e;
  } else {
    require_no_errors(e);
  }
  return params;
}

par::ParallelConfig strategy(par::Strategy s, int servers = 0) {
  par::ParallelConfig p;
  p.strategy = s;
  p.servers = servers;
  p.average_every = 2;
  p.bucket_mb = 0.004;
  return p;
}

void expect_refused(const std::vector<RankError>& errors, const std::string& path, const std::string& why) {
  for (size_t r = 0; r < errors.size(); ++r) {
    BOOST_TEST(static_cast<int>(errors[r].status) == static_cast<int>(Status::kInvalidArgument),
               "rank " << r << ": " << errors[r].message);
    BOOST_TEST(errors[r].message.find(path) != std::string::npos, errors[r].message);
    BOOST_TEST(errors[r].message.find(why) != std::string::npos, errors[r].message);
  }
}

BOOST_AUTO_TEST_CASE(parameter_servers_resume_with_other_worker_and_server_counts) {
  // ps, 2 workers + 1 server at batch 8 -> 1 worker + 2 servers at batch 16: the servers take their new shards of the
  // whole-model parameters and Adam moments, and the run continues as if uninterrupted.
  const std::string path = temp_path("ps.ckpt");
  run_strategy(strategy(par::Strategy::kPs, 1), 3, 8, kBefore, "", path);
  const std::vector<float> straight = run_strategy(strategy(par::Strategy::kPs, 1), 3, 8, kAfter, path, "");
  const std::vector<float> resumed = run_strategy(strategy(par::Strategy::kPs, 2), 3, 16, kAfter, path, "");
  const double d = rel_diff(resumed, straight);
  BOOST_TEST_MESSAGE("ps 2 workers + 1 server -> 1 worker + 2 servers: max relative difference " << d);
  BOOST_TEST(d <= kTolerance);
  BOOST_TEST(rel_diff(train::load_checkpoint(path).tensor("model.params"), straight) > 100 * kTolerance);
  std::filesystem::remove(path);
}

BOOST_AUTO_TEST_CASE(strategies_with_per_worker_state_refuse_another_width_naming_why) {
  const std::string path = temp_path("strategies.ckpt");
  std::vector<RankError> errors;
  // Local SGD between averagings: each worker's own parameters and moments are in the file.
  run_strategy(strategy(par::Strategy::kLocalSgd), 3, 8, 1, "", path);
  run_strategy(strategy(par::Strategy::kLocalSgd), 2, 12, 1, path, "", &errors);
  expect_refused(errors, path, "localsgd keeps each worker's own parameters and optimizer state (they drift apart "
                               "between averagings)");
  // Even into DDP: nobody could say which worker's state the model should take.
  run_strategy(strategy(par::Strategy::kDdp), 1, 24, 1, path, "", &errors);
  expect_refused(errors, path, "with 3 data-parallel worker(s), this run has 1");
  // ps-async counts one update per push.
  run_strategy(strategy(par::Strategy::kPsAsync, 1), 3, 8, 1, "", path);
  run_strategy(strategy(par::Strategy::kPsAsync, 1), 2, 16, 1, path, "", &errors);
  expect_refused(errors, path, "ps-async applies one server update per worker push");
  // FedAvg whose clients default to the workers: 2 clients then, 3 now.
  run_strategy(strategy(par::Strategy::kFedAvg), 2, 8, 1, "", path);
  run_strategy(strategy(par::Strategy::kFedAvg), 3, 8, 1, path, "", &errors);
  expect_refused(errors, path, "FedAvg splits the training set among its clients by count, 2 then and 3 now");
  // With the clients fixed, the workers may change.
  par::ParallelConfig five = strategy(par::Strategy::kFedAvg);
  five.clients = 5;
  run_strategy(five, 2, 8, 1, "", path);
  run_strategy(five, 3, 8, 1, path, "");
  // At the same width too: other clients, or another label skew, would go on under the same round numbers.
  par::ParallelConfig six = five;
  six.clients = 6;
  run_strategy(six, 2, 8, 1, path, "", &errors);
  expect_refused(errors, path, "FedAvg splits the training set among its clients by count, 5 then and 6 now");
  par::ParallelConfig skewed = five;
  skewed.dirichlet_alpha = 0.5;
  run_strategy(skewed, 2, 8, 1, path, "", &errors);
  expect_refused(errors, path, "by Dirichlet alpha, 0 (IID) then and 0.5 now; resume with --dirichlet-alpha 0 (IID)");
  std::filesystem::remove(path);
}

BOOST_AUTO_TEST_SUITE_END()
