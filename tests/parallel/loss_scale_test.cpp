// fp16 loss scaling over ranks (issue #14 (c)): the skip-or-step decision is one for the whole job. Ranks as threads
// on the fp16 emulation (TANDEM_CPU_MATH=fp16). A NaN injected into ONE rank's gradients after the all-reduce
// (TANDEM_TEST_NONFINITE) makes every rank skip -- DDP replicas and pipeline stages -- with weights unchanged and
// the scale halved on each; two finite steps later every rank grows it. And an overflow from the scale itself
// (2^100) skips everywhere too; a loss-scaled DDP run matches the single-process loss-scaled run.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include <unistd.h>

#include "engine/core/settings.hpp"
#include "tests/parallel/harness.hpp"

using namespace tandem;
using namespace tandem::testing;
using Mode = train::LossScaleConfig::Mode;

namespace {

train::TrainerConfig scaled_config(double init, double backoff) {
  train::TrainerConfig c = sgd_config(8);
  c.loss_scale.mode = Mode::kDynamic;
  c.loss_scale.init = init;
  c.loss_scale.growth = 2;
  c.loss_scale.backoff = backoff;
  c.loss_scale.growth_interval = 2;
  return c;
}

struct RankLog {
  std::vector<bool> skipped;
  std::vector<double> scale;
  std::vector<bool> changed;  // the rank's parameters differ from before the step
};

// Runs `steps` steps on 2 ranks with `pc`; per rank, what each step did.
std::vector<RankLog> run2(const train::TrainerConfig& cfg, par::ParallelConfig pc, int steps) {
  std::vector<RankLog> logs(2);
  const auto errors = run_world(2, {}, [&](int r, comm::Communicator& c) {
    auto be = one_thread_backend();
    nn::Model m(lenet12(), *be, 3);
    par::ParallelTrainer t(m, synthetic12_train(), nullptr, cfg, pc, &c);
    RankLog& log = logs[static_cast<size_t>(r)];
    for (int i = 0; i < steps; ++i) {
      const std::vector<float> before = host_params(m);
      const train::StepResult s = t.step();
      if (s.samples == 0) throw std::runtime_error("ran out of batches");
      log.skipped.push_back(s.skipped);
      log.scale.push_back(t.loss_scaler().state().scale);
      log.changed.push_back(host_params(m) != before);
    }
  });
  require_no_errors(errors);
  return logs;
}

void expect_skip_then_growth(const std::vector<RankLog>& logs, double first_scale) {
  for (size_t r = 0; r < logs.size(); ++r) {
    BOOST_TEST_CONTEXT("rank " << r) {
      const RankLog& l = logs[r];
      BOOST_TEST(l.skipped == std::vector<bool>({true, false, false, false}), "skips per step");
      BOOST_TEST(!l.changed[0], "a skipped step changed the weights");
      BOOST_TEST(l.changed[1]);
      BOOST_TEST(l.scale[0] == first_scale / 2);          // backed off
      BOOST_TEST(l.scale[1] == first_scale / 2);
      BOOST_TEST(l.scale[2] == first_scale);              // grown after 2 finite steps
      BOOST_TEST(l.scale[3] == first_scale);
    }
  }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(loss_scaling)

BOOST_AUTO_TEST_CASE(one_ranks_nan_skips_the_step_on_every_ddp_replica) {
  const settings::ScopedProcessValue math("TANDEM_CPU_MATH", "fp16");
  const settings::ScopedProcessValue hook("TANDEM_TEST_NONFINITE", "1:1");  // world rank 1, its first step
  par::ParallelConfig pc;
  pc.strategy = par::Strategy::kDdp;
  expect_skip_then_growth(run2(scaled_config(1024, 0.5), pc, 4), 1024);
}

BOOST_AUTO_TEST_CASE(one_stages_nan_skips_the_step_on_every_pipeline_stage) {
  const settings::ScopedProcessValue math("TANDEM_CPU_MATH", "fp16");
  for (const char* rank : {"0:1", "1:1"}) {  // the first stage's NaN, then the last's
    BOOST_TEST_CONTEXT("TANDEM_TEST_NONFINITE=" << rank) {
      const settings::ScopedProcessValue hook("TANDEM_TEST_NONFINITE", rank);
      par::ParallelConfig pc;
      pc.strategy = par::Strategy::kPipeline;
      pc.micro_batches = 2;
      expect_skip_then_growth(run2(scaled_config(1024, 0.5), pc, 4), 1024);
    }
  }
}

BOOST_AUTO_TEST_CASE(a_scale_that_overflows_half_skips_everywhere) {
  const settings::ScopedProcessValue math("TANDEM_CPU_MATH", "fp16");
  par::ParallelConfig pc;
  pc.strategy = par::Strategy::kPipeline;
  const std::vector<RankLog> logs = run2(scaled_config(std::ldexp(1.0, 100), std::ldexp(1.0, -90)), pc, 4);
  for (const RankLog& l : logs) {
    BOOST_TEST(l.skipped == std::vector<bool>({true, false, false, false}));
    BOOST_TEST(!l.changed[0]);
    BOOST_TEST(l.scale[0] == 1024.0);
    BOOST_TEST(l.scale[2] == 2048.0);
  }
}

// Loss-scaled DDP on 2 ranks reaches the parameters of the loss-scaled single-process run on the global batch.
BOOST_AUTO_TEST_CASE(loss_scaled_ddp_matches_one_process) {
  const settings::ScopedProcessValue math("TANDEM_CPU_MATH", "fp16");
  par::ParallelConfig pc;
  pc.strategy = par::Strategy::kDdp;
  const train::TrainerConfig cfg = scaled_config(65536, 0.5);
  const ParallelRun run = run_parallel(lenet12(), synthetic12_train(), cfg, pc, 2, 3);
  train::TrainerConfig one = cfg;
  one.batch_size = 16;
  const std::vector<float> want = reference_params(lenet12(), synthetic12_train(), one, 3);
  BOOST_TEST(rel_diff(run.params[0], want) < 1e-3);
  BOOST_TEST(run.params[0] == run.params[1]);
}

// Issue #14 (d) over ranks: a 2-stage pipeline's checkpoint keeps the scaler (scale, growth count, skips);
// trainers that load it go on growing where the saving run would.
BOOST_AUTO_TEST_CASE(a_parallel_checkpoint_keeps_the_scaler) {
  const settings::ScopedProcessValue math("TANDEM_CPU_MATH", "fp16");
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("tandem_parallel_loss_scale_" + std::to_string(::getpid()) + ".ckpt")).string();
  struct Rm {
    std::string p;
    ~Rm() { std::remove(p.c_str()); }
  } rm{path};
  par::ParallelConfig pc;
  pc.strategy = par::Strategy::kPipeline;
  const train::TrainerConfig cfg = scaled_config(std::ldexp(1.0, 100), std::ldexp(1.0, -90));
  std::mutex mu;
  std::vector<std::string> problems;
  const auto note = [&](const std::string& s) {
    std::lock_guard lock(mu);
    problems.push_back(s);
  };
  require_no_errors(run_world(2, {}, [&](int, comm::Communicator& c) {
    auto be = one_thread_backend();
    nn::Model m(lenet12(), *be, 3);
    par::ParallelTrainer t(m, synthetic12_train(), nullptr, cfg, pc, &c);
    t.step();  // skipped: 2^100 -> 1024
    t.step();  // finite: growth count 1
    t.save_checkpoint(path);
  }));
  require_no_errors(run_world(2, {}, [&](int r, comm::Communicator& c) {
    auto be = one_thread_backend();
    nn::Model m(lenet12(), *be, 5);
    par::ParallelTrainer t(m, synthetic12_train(), nullptr, cfg, pc, &c);
    t.load_checkpoint(path);
    const train::LossScaleState& s = t.loss_scaler().state();
    if (s.scale != 1024.0 || s.growth_tracker != 1 || s.skipped != 1)
      note("rank " + std::to_string(r) + " loaded scale " + std::to_string(s.scale) + ", count " +
           std::to_string(s.growth_tracker) + ", skipped " + std::to_string(s.skipped));
    if (t.step().skipped) note("rank " + std::to_string(r) + " skipped after resuming");
    if (t.loss_scaler().state().scale != 2048.0) note("rank " + std::to_string(r) + " did not grow after resuming");
  }));
  for (const std::string& p : problems) BOOST_ERROR(p);
}

BOOST_AUTO_TEST_CASE(strategies_without_a_common_step_are_refused) {
  par::ParallelConfig pc;
  pc.strategy = par::Strategy::kLocalSgd;
  const auto errors = run_world(2, {}, [&](int, comm::Communicator& c) {
    auto be = one_thread_backend();
    nn::Model m(lenet12(), *be, 3);
    par::ParallelTrainer t(m, synthetic12_train(), nullptr, scaled_config(1024, 0.5), pc, &c);
  });
  for (const RankError& e : errors) {
    BOOST_TEST((e.status == Status::kUnsupported));
    BOOST_TEST(e.message.find("loss scaling") != std::string::npos, e.message);
  }
}

BOOST_AUTO_TEST_SUITE_END()
