// What a parallel run reports and keeps: the time split, the merged Chrome trace, collective
// evaluation, checkpoints that resume bit-identically (and under another pipeline depth), the
// measured partition, and a dead peer turning into an error instead of a hang.
#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "engine/nn/zoo.hpp"
#include "tests/parallel/harness.hpp"

using namespace tandem;
using namespace tandem::testing;

namespace {

const data::Dataset& train_set() {
  static const data::Dataset d = data::make_synthetic(1, 12, 12, 4, 256, 1);
  return d;
}
const data::Dataset& test_set() {
  static const data::Dataset d = data::make_synthetic(1, 12, 12, 4, 90, 2);
  return d;
}
nn::ModelSpec lenet() { return nn::zoo_model("lenet5", {1, 12, 12}, 4); }

par::ParallelConfig hybrid(int dp, int pp, int mb) {
  par::ParallelConfig p;
  p.strategy = par::Strategy::kHybrid;
  p.dp = dp;
  p.pp = pp;
  p.micro_batches = mb;
  p.bucket_mb = 0.004;
  return p;
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / fmt::format("tandem_parallel_{}_{}", ::getpid(), name)).string();
}

}  // namespace

BOOST_AUTO_TEST_SUITE(runtime)

BOOST_AUTO_TEST_CASE(time_split_accounts_for_the_step_and_trace_merges_every_rank) {
  const std::string path = temp_path("trace.json");
  std::vector<par::EpochSplit> splits(4);
  std::vector<par::TimeSplit> local(4);
  par::ParallelConfig p = hybrid(2, 2, 4);
  p.trace = true;
  require_no_errors(run_world(4, {}, [&](int r, comm::Communicator& c) {
    auto be = one_thread_backend();
    nn::Model m(lenet(), *be, 3);
    train::TrainerConfig cfg = sgd_config(8, 3);
    par::ParallelTrainer t(m, train_set(), nullptr, cfg, p, &c);
    t.train_epoch();
    splits[static_cast<size_t>(r)] = t.last_split();
    local[static_cast<size_t>(r)] = t.local_split();
    t.write_trace(path);
  }));
  for (int r = 0; r < 4; ++r) {
    const par::TimeSplit& s = local[static_cast<size_t>(r)];
    BOOST_TEST(s.steps == 3);
    BOOST_TEST(s.compute_ns > 0);
    BOOST_TEST(s.compute_ns + s.bubble_ns + s.comm_ns + s.data_ns <= s.step_ns);
    BOOST_TEST(s.bubble_ns > 0, "rank " << r << ": a pipeline stage waits for its neighbour at least once");
    BOOST_TEST(s.allreduce_ns > 0, "rank " << r << ": every stage has a data-parallel group here");
    // The epoch split is collective: the same on every rank.
    BOOST_TEST(splits[static_cast<size_t>(r)].step_s == splits[0].step_s);
  }
  BOOST_TEST(splits[0].steps == 3);
  BOOST_TEST(splits[0].bubble_fraction > 0.0);
  BOOST_TEST(splits[0].bubble_fraction <= splits[0].max_bubble_fraction);

  std::ifstream f(path);
  BOOST_REQUIRE(f.good());
  const nlohmann::json j = nlohmann::json::parse(f);
  std::set<int> pids;
  std::set<std::string> cats;
  int forwards_rank3 = 0;
  for (const auto& e : j.at("traceEvents")) {
    if (e.at("ph") != "X") continue;
    pids.insert(e.at("pid").get<int>());
    cats.insert(e.at("cat").get<std::string>());
    BOOST_TEST(e.at("dur").get<double>() >= 0.0);
    if (e.at("pid") == 3 && e.at("name").get<std::string>().rfind("forward mb", 0) == 0) ++forwards_rank3;
  }
  BOOST_TEST((pids == std::set<int>{0, 1, 2, 3}));
  for (const char* c : {"compute", "bubble", "send", "allreduce", "comm", "optimizer"})
    BOOST_TEST(cats.count(c) == 1u, "trace has " << c << " spans");
  BOOST_TEST(forwards_rank3 == 3 * 4, "3 steps x 4 micro-batches of forward on rank 3");
  std::filesystem::remove(path);
}

BOOST_AUTO_TEST_CASE(collective_evaluation_scores_every_test_sample_once) {
  // 90 test samples over 2 replicas (45 each), pipelined over 2 stages, equal to one process.
  double ref_loss = 0, ref_acc = 0;
  {
    auto be = one_thread_backend();
    nn::Model m(lenet(), *be, 3);
    train::Trainer t(m, train_set(), nullptr, sgd_config(16));
    for (int i = 0; i < 2; ++i) t.step();
    const train::EvalResult e = t.evaluate(test_set(), 0);
    ref_loss = e.loss;
    ref_acc = e.accuracy;
  }
  std::vector<train::EvalResult> got(4);
  require_no_errors(run_world(4, {}, [&](int r, comm::Communicator& c) {
    auto be = one_thread_backend();
    nn::Model m(lenet(), *be, 3);
    par::ParallelTrainer t(m, train_set(), nullptr, sgd_config(8), hybrid(2, 2, 2), &c);
    for (int i = 0; i < 2; ++i) t.step();
    got[static_cast<size_t>(r)] = t.evaluate(test_set(), 0);
  }));
  for (const auto& e : got) {
    BOOST_TEST(e.samples == 90);
    BOOST_TEST(e.accuracy == ref_acc, "same predictions as one process");
    BOOST_TEST(std::fabs(e.loss - ref_loss) <= 1e-5 * std::fabs(ref_loss));
  }
}

BOOST_AUTO_TEST_CASE(checkpoint_resumes_bit_identically_and_under_another_pipeline_depth) {
  const std::string path = temp_path("ckpt");
  comm::CommOptions det;
  det.deterministic = true;
  train::TrainerConfig cfg = sgd_config(8);
  cfg.optimizer.kind = engine::optim::OptimizerKind::kAdam;  // two state tensors per stage
  cfg.optimizer.lr = 1e-3f;
  const auto run = [&](const par::ParallelConfig& p, int world, int steps, const std::string& save_after,
                       const std::string& load_first) {
    std::vector<std::vector<float>> params(static_cast<size_t>(world));
    std::vector<std::vector<int32_t>> bounds(static_cast<size_t>(world));
    require_no_errors(run_world(world, det, [&](int r, comm::Communicator& c) {
      auto be = one_thread_backend();
      nn::Model m(lenet(), *be, 3);
      par::ParallelTrainer t(m, train_set(), nullptr, cfg, p, &c);
      if (!load_first.empty()) t.load_checkpoint(load_first);
      for (int i = 0; i < steps; ++i) {
        t.step();
        if (i == 1 && !save_after.empty()) t.save_checkpoint(save_after);
      }
      params[static_cast<size_t>(r)] = host_params(m);
      bounds[static_cast<size_t>(r)] = t.boundaries();
    }));
    ParallelRun pr;
    pr.params = params;
    pr.bounds = bounds;
    for (int r = 0; r < world; ++r) {
      par::ParallelConfig q = p;
      pr.grids.push_back(par::resolve_grid(q, world, r, static_cast<int64_t>(lenet().layers.size()), 8));
    }
    return pr.assembled(lenet());
  };
  const auto straight = run(hybrid(2, 2, 2), 4, 5, path, "");  // saves after step 2
  const auto resumed = run(hybrid(2, 2, 2), 4, 3, "", path);    // 2 + 3 steps
  BOOST_TEST((resumed == straight), "resuming is bit-identical in deterministic mode");
  par::ParallelConfig ddp;
  ddp.strategy = par::Strategy::kDdp;
  const auto reshaped = run(ddp, 2, 3, "", path);  // same dp, no pipeline
  BOOST_TEST(rel_diff(reshaped, straight) <= 1e-5);
  // A checkpoint of two replicas seeds one (resharding, issue #17: tests/parallel/reshard_test.cpp), at the same
  // global sample position: 2 steps x 8 samples x 2 replicas.
  par::ParallelConfig pipe;
  pipe.strategy = par::Strategy::kPipeline;
  std::vector<int64_t> steps(2);
  require_no_errors(run_world(2, det, [&](int r, comm::Communicator& c) {
    auto be = one_thread_backend();
    nn::Model m(lenet(), *be, 3);
    par::ParallelTrainer t(m, train_set(), nullptr, cfg, pipe, &c);
    t.load_checkpoint(path);
    steps[static_cast<size_t>(r)] = t.global_step();
  }));
  for (const int64_t s : steps) BOOST_TEST(s == 2);
  std::filesystem::remove(path);
}

BOOST_AUTO_TEST_CASE(each_stage_holds_only_its_own_parameters_gradients_and_optimizer_state) {
  train::TrainerConfig cfg = sgd_config(8);
  cfg.optimizer.kind = engine::optim::OptimizerKind::kAdam;  // two state tensors per parameter
  const nn::ModelSpec spec = lenet();
  std::vector<std::string> seen(4);
  require_no_errors(run_world(4, {}, [&](int r, comm::Communicator& c) {
    auto be = one_thread_backend();
    nn::Model m(spec, *be, 3);
    par::ParallelTrainer t(m, train_set(), nullptr, cfg, hybrid(1, 4, 2), &c);
    t.step();
    const auto b = static_cast<size_t>(t.boundaries()[static_cast<size_t>(r)]);
    const auto e = static_cast<size_t>(t.boundaries()[static_cast<size_t>(r) + 1]);
    const int64_t share = spec.totals(b, e).params;
    int64_t state = 0;
    for (const Tensor& st : t.optimizer().state_tensors()) state += st.numel();
    seen[static_cast<size_t>(r)] = fmt::format("held [{}, {}) of stage [{}, {}); params {} grads {} buffers {} state {} "
                                               "(stage {} params, {} buffers; whole model {})",
                                               m.held_begin(), m.held_end(), b, e, m.params().numel(),
                                               m.grads().numel(), m.buffers().numel(), state, share,
                                               spec.totals(b, e).buffers, m.total_params());
    if (m.held_begin() != b || m.held_end() != e || m.params().numel() != share || m.grads().numel() != share ||
        m.buffers().numel() != spec.totals(b, e).buffers || state != 2 * share)
      throw std::runtime_error(seen[static_cast<size_t>(r)]);
  }));
  for (const auto& s : seen) BOOST_TEST_MESSAGE(s);
}

BOOST_AUTO_TEST_CASE(a_pipeline_checkpoint_is_the_single_trainers_format) {
  // One metadata writer for both trainers: 2 steps of a 3-stage pipeline, saved, resume in train::Trainer and
  // continue; the same as 2 + 2 steps of train::Trainer alone (bit-identical: one replica, deterministic sums).
  const std::string path = temp_path("pipe_to_single");
  comm::CommOptions det;
  det.deterministic = true;
  const train::TrainerConfig cfg = sgd_config(8);
  par::ParallelConfig pipe;
  pipe.strategy = par::Strategy::kPipeline;
  require_no_errors(run_world(3, det, [&](int, comm::Communicator& c) {
    auto be = one_thread_backend();
    nn::Model m(lenet(), *be, 3);
    par::ParallelTrainer t(m, train_set(), nullptr, cfg, pipe, &c);
    t.step();
    t.step();
    t.save_checkpoint(path);
  }));
  auto be = one_thread_backend();
  nn::Model resumed(lenet(), *be, 99);  // other initial weights: the checkpoint must replace them
  train::Trainer single(resumed, train_set(), nullptr, cfg);
  single.load_checkpoint(path);
  BOOST_TEST(single.global_step() == 2);
  single.step();
  single.step();
  BOOST_TEST(rel_diff(host_params(resumed), reference_params(lenet(), train_set(), cfg, 4)) <= 1e-6);
  // A stage-only model cannot train alone.
  nn::Model stage(lenet(), *be, 3);
  stage.hold(0, 3);
  try {
    train::Trainer bad(stage, train_set(), nullptr, cfg);
    bad.step();
    BOOST_FAIL("a stage-only model was trained alone");
  } catch (const Error& e) {
    BOOST_TEST(std::string(e.what()).find("holds only layers [0, 3)") != std::string::npos, e.what());
  }
  std::filesystem::remove(path);
}

BOOST_AUTO_TEST_CASE(measured_partition_is_the_same_on_every_rank) {
  par::ParallelConfig p;
  p.strategy = par::Strategy::kPipeline;
  p.partition = par::PartitionCost::kMeasured;
  const nn::ModelSpec spec = lenet();
  const ParallelRun run = run_parallel(spec, train_set(), sgd_config(8), p, 3, 1);
  for (const auto& b : run.bounds) BOOST_TEST((b == run.bounds[0]));
  BOOST_TEST(run.bounds[0].size() == 4u);
  BOOST_TEST(run.bounds[0].back() == static_cast<int32_t>(spec.layers.size()));
}

BOOST_AUTO_TEST_CASE(a_rank_that_stops_turns_into_an_error_naming_it_not_a_hang) {
  // Rank 1 of a 2-stage pipeline leaves after one step; rank 0's next step must fail within the
  // communicator's deadline, naming rank 1.
  comm::CommOptions quick;
  quick.timeout = std::chrono::milliseconds(1500);
  par::ParallelConfig p;
  p.strategy = par::Strategy::kPipeline;
  p.micro_batches = 2;
  std::atomic<bool> left{false};
  const auto t0 = std::chrono::steady_clock::now();
  const auto errors = run_world(2, quick, [&](int r, comm::Communicator& c) {
    auto be = one_thread_backend();
    nn::Model m(lenet(), *be, 3);
    par::ParallelTrainer t(m, train_set(), nullptr, sgd_config(8), p, &c);
    t.step();
    if (r == 1) {
      left = true;
      c.abort("rank 1 stops (test)");
      return;
    }
    for (int i = 0; i < 3; ++i) t.step();
  });
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  BOOST_TEST(left.load());
  BOOST_TEST((errors[0].status == Status::kPeerFailure || errors[0].status == Status::kTimeout), errors[0].message);
  BOOST_TEST(errors[0].message.find("rank 1") != std::string::npos, errors[0].message);
  BOOST_TEST(waited < 30.0);
}

// An epoch cut short by limit_batches stops each rank's loader thread at its end, as the single trainer's does
// (issue #16): otherwise it would go on assembling the rest of the sampler's epoch and hold its queue through the
// evaluation. Ranks are threads of this process: rank 0 counts the process's threads while both wait at a barrier.
BOOST_AUTO_TEST_CASE(an_epoch_cut_short_stops_every_ranks_loader_thread) {
  if (!std::filesystem::exists("/proc/self/task")) {
    BOOST_TEST_MESSAGE("no /proc/self/task here: threads not counted");
    return;
  }
  const auto threads = [] {
    return std::distance(std::filesystem::directory_iterator("/proc/self/task"), std::filesystem::directory_iterator{});
  };
  std::atomic<long> during{0}, after{0}, next{0};
  std::atomic<int> ended{0};
  par::ParallelConfig p;
  p.strategy = par::Strategy::kDdp;
  p.dp = 2;
  require_no_errors(run_world(2, {}, [&](int r, comm::Communicator& c) {
    auto be = one_thread_backend();
    nn::Model m(lenet(), *be, 3);
    train::TrainerConfig cfg = sgd_config(8, 2);  // 2 of the 16 batches of each rank's epoch
    cfg.prefetch = 2;
    par::ParallelTrainer t(m, train_set(), nullptr, cfg, p, &c);
    const auto count_at_barrier = [&](std::atomic<long>& into) {
      c.barrier()->wait();
      if (r == 0) into = threads();
      c.barrier()->wait();
    };
    if (t.step().epoch_end) ++ended;
    count_at_barrier(during);  // both loader threads assemble the next batches
    if (t.step().epoch_end) ++ended;
    count_at_barrier(after);
    t.train_epoch();
    count_at_barrier(next);
  }));
  BOOST_TEST(ended.load() == 2, "the second step ends each rank's epoch");
  BOOST_TEST(after.load() == during.load() - 2);
  BOOST_TEST(next.load() == during.load() - 2);
}

BOOST_AUTO_TEST_SUITE_END()
