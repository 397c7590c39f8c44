// Elastic pipeline and hybrid DP x PP (issue #17): a 2 x 2 grid loses ranks; the survivors re-form a grid, each
// stage's state taken from a surviving replica of it (or from the checkpoint when none survived), and train on.
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <ostream>

#include "engine/core/settings.hpp"
#include "tests/parallel/harness.hpp"

using namespace tandem;
using namespace tandem::testing;

namespace {

constexpr int64_t kBatch = 4;  // per replica

par::ParallelConfig grid(par::Strategy s, int dp, const std::string& checkpoint) {
  par::ParallelConfig p;
  p.strategy = s;
  p.dp = dp;
  p.pp = 2;
  p.micro_batches = 2;
  p.elastic = s == par::Strategy::kHybrid;
  p.elastic_checkpoint = checkpoint;
  return p;
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / fmt::format("tandem_reform_{}_{}", ::getpid(), name)).string();
}

struct Seen {
  std::vector<float> params;
  double loss_mid = 0, loss_end = 0;
  std::vector<int> members;
  par::Grid grid;
  double lr_scale = 0;
  int64_t steps = 0;
  bool released = false;  // a spare whose step() ended because the job did
};

// 2 x 2 hybrid: kBefore steps, a checkpoint, `extra` more steps, then the ranks in `dead` leave; the others call
// step() kAfter times.
std::vector<RankError> run_loss(const std::vector<int>& dead, const std::string& checkpoint, int kBefore, int extra,
                                int kAfter, std::vector<Seen>& seen) {
  seen.assign(4, Seen{});
  const train::TrainerConfig cfg = sgd_config(kBatch);
  return run_world(4, quick_deadline(), [&](int r, comm::Communicator& c) {
    auto be = one_thread_backend();
    nn::Model m(lenet12(), *be, 3);
    par::ParallelTrainer t(m, synthetic12_train(), nullptr, cfg, grid(par::Strategy::kHybrid, 2, checkpoint), &c);
    Seen& s = seen[static_cast<size_t>(r)];
    for (int i = 0; i < kBefore; ++i) t.step();
    if (!checkpoint.empty()) t.save_checkpoint(checkpoint);
    for (int i = 0; i < extra; ++i) t.step();
    s.loss_mid = t.evaluate(synthetic12_train(), 0).loss;
    if (std::find(dead.begin(), dead.end(), r) != dead.end()) {
      t.abandon();
      return;
    }
    for (int i = 0; i < kAfter; ++i) {
      const train::StepResult st = t.step();
      if (st.samples == 0 && st.epoch_end && t.spare()) {  // the job ended while this rank waited as a spare
        s.released = true;
        s.steps = t.global_step();
        return;
      }
      if (st.samples != kBatch) throw std::runtime_error(fmt::format("step {}: {} samples", i, st.samples));
    }
    s.loss_end = t.evaluate(synthetic12_train(), 0).loss;
    s.params = host_params(m);
    s.members = t.members();
    s.grid = t.grid();
    s.lr_scale = t.lr_scale();
    s.steps = t.global_step();
  });
}

// A loss at an epoch's end that finds the survivors in different phases (TANDEM_TEST_REFORM_LEAVE, parallel_trainer.cpp):
// 2 x 2 hybrid, epochs of 6 steps, evaluated on the test set, two epochs. The survivors re-form at 1 x 2 and finish
// both epochs, every rank of the grid reporting the same figures.
struct EpochEndLoss {
  const char* hook;          // TANDEM_TEST_REFORM_LEAVE: "rank:point"
  int victim;
  std::vector<int> members;  // the re-formed grid's world ranks (stage 0, stage 1)
  int spare;
  int64_t scored;            // the first epoch's samples
  int64_t steps;             // optimizer steps after both epochs
};
std::ostream& operator<<(std::ostream& os, const EpochEndLoss& c) { return os << c.hook; }

const EpochEndLoss kEpochEndLosses[] = {
    // World rank 2 (stage 0, replica 1) leaves in the epoch's last step: world ranks 1 and 3 (stage 1) complete it and
    // are in the epoch's sums, world rank 0 is cut off in its gradient all-reduce. All go back to step 5, the newest
    // every survivor has: the ones in the sums do not sum a step the others redo. The single replica's position (40
    // samples taken) is past the epoch's 6 batches, so the epoch ends there with the 5 steps' samples of both replicas.
    {"2:last-step", 2, {0, 1}, 3, 5 * 2 * kBatch, 5 + 6},
    // World rank 1 completes the epoch's sums and leaves: world rank 0 went on to the time split, 2 and 3 were cut off
    // in the sums. The sums completed, so they stand (the lost rank's samples counted once): 2 and 3 take them from
    // world rank 0 and all go on to the time split.
    {"1:summed", 1, {0, 3}, 2, 6 * 2 * kBatch, 6 + 6},
    // The same with world rank 3 alone cut off; it takes the sums and becomes the spare.
    {"2:summed", 2, {0, 1}, 3, 6 * 2 * kBatch, 6 + 6},
    // Cut off in the time split: world rank 0 went on to the evaluation.
    {"1:timed", 1, {0, 3}, 2, 6 * 2 * kBatch, 6 + 6},
    // Cut off in the evaluation: world rank 0 went on to the next epoch's first step; 2 and 3 take the evaluation.
    {"1:evaluated", 1, {0, 3}, 2, 6 * 2 * kBatch, 6 + 6},
};

struct EpochEndRun {
  std::vector<RankError> errors;
  std::vector<std::vector<train::EpochResult>> epochs = std::vector<std::vector<train::EpochResult>>(4);
  std::vector<Seen> seen = std::vector<Seen>(4);
};

// Two epochs of 6 steps of a 2 x 2 hybrid grid, each evaluated on the test set and followed by a checkpoint save (as
// `tandem train` runs them), with TANDEM_TEST_REFORM_LEAVE=hook.
EpochEndRun two_epochs_with(const char* hook) {
  const settings::ScopedProcessValue leave("TANDEM_TEST_REFORM_LEAVE", hook);
  const std::string path = temp_path("epoch_end.ckpt");
  EpochEndRun out;
  out.errors = run_world(4, quick_deadline(), [&](int r, comm::Communicator& comm) {
    auto be = one_thread_backend();
    nn::Model m(lenet12(), *be, 3);
    par::ParallelTrainer t(m, synthetic12_train(), &synthetic12_test(), sgd_config(kBatch, 6),
                           grid(par::Strategy::kHybrid, 2, ""), &comm);
    for (int e = 0; e < 2; ++e) {
      out.epochs[static_cast<size_t>(r)].push_back(t.train_epoch());
      t.save_checkpoint(path);
    }
    Seen& s = out.seen[static_cast<size_t>(r)];
    s.released = t.spare();
    s.members = t.members();
    s.grid = t.grid();
    s.steps = t.global_step();
  });
  std::filesystem::remove(path);
  return out;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(reform)

// World rank 3 (replica 1, stage 1) dies: 3 survivors, pp 2 kept -> 1 x 2 on world ranks 0 and 1 (stage 0 from
// rank 0, stage 1 from rank 1, the surviving replica); world rank 2 waits as a spare, and its step() ends cleanly
// when the job does. The result equals a 1 x 2 pipeline resumed from the checkpoint of the same step with the
// learning rate x 1/2 (the stated rule).
BOOST_AUTO_TEST_CASE(a_2x2_grid_losing_one_rank_continues_at_1x2_equal_to_the_resumed_reference) {
  constexpr int kBefore = 4, kAfter = 8;
  const std::string ck = temp_path("one.ckpt");
  std::vector<Seen> seen;
  const auto errors = run_loss({3}, ck, kBefore, 0, kAfter, seen);
  BOOST_TEST(errors[0].message.empty(), errors[0].message);
  BOOST_TEST(errors[1].message.empty(), errors[1].message);
  BOOST_TEST(errors[2].message.empty(), errors[2].message);
  BOOST_TEST(seen[2].released);  // a spare until the end, not an error
  // The reference: a 1 x 2 pipeline from the checkpoint, learning rate x 1/2.
  train::TrainerConfig half = sgd_config(kBatch);
  half.optimizer.lr *= 0.5f;
  std::vector<std::vector<float>> ref(2);
  const auto ref_errors = run_world(2, quick_deadline(), [&](int r, comm::Communicator& c) {
    auto be = one_thread_backend();
    nn::Model m(lenet12(), *be, 3);
    par::ParallelTrainer t(m, synthetic12_train(), nullptr, half, grid(par::Strategy::kPipeline, 1, ""), &c);
    t.load_checkpoint(ck);
    for (int i = 0; i < kAfter; ++i) t.step();
    ref[static_cast<size_t>(r)] = host_params(m);
  });
  require_no_errors(ref_errors);
  for (int r = 0; r < 2; ++r) {
    const Seen& s = seen[static_cast<size_t>(r)];
    BOOST_TEST_CONTEXT("world rank " << r) {
      BOOST_TEST(s.grid.dp == 1);
      BOOST_TEST(s.grid.pp == 2);
      BOOST_TEST((s.members == std::vector<int>{0, 1}));
      BOOST_TEST(s.lr_scale == 0.5);
      BOOST_TEST(s.steps == kBefore + kAfter);
      BOOST_TEST(std::isfinite(s.loss_end));
      BOOST_TEST(s.loss_end < s.loss_mid);
      BOOST_TEST(rel_diff(s.params, ref[static_cast<size_t>(r)]) < 1e-5, rel_diff(s.params, ref[static_cast<size_t>(r)]));
    }
  }
  std::filesystem::remove(ck);
}

// World ranks 1 and 3 hold stage 1 in both replicas. Without a checkpoint the survivors stop naming the stage.
BOOST_AUTO_TEST_CASE(losing_every_replica_of_a_stage_without_a_checkpoint_stops_naming_the_stage) {
  std::vector<Seen> seen;
  const auto errors = run_loss({1, 3}, "", 3, 0, 2, seen);
  for (int r : {0, 2}) {
    BOOST_TEST_CONTEXT("world rank " << r) {
      BOOST_TEST((errors[static_cast<size_t>(r)].status == Status::kPeerFailure));
      BOOST_TEST(contains(errors[static_cast<size_t>(r)].message, "pipeline stage(s) 1 lost on every replica"),
                 errors[static_cast<size_t>(r)].message);
    }
  }
}

// World rank 3 leaves mid-epoch: the grid re-forms at 1 x 2 on world ranks 0 and 1, and world rank 2 waits as a spare.
// Then world rank 1 (stage 1's only replica now) completes the epoch's sums and leaves (TANDEM_TEST_REFORM_LEAVE), with
// no checkpoint: world rank 0, alone and past the sums (so it drafts nobody), stops naming the stage, and refuses the
// spare at once, which stops with that reason rather than wait for a grid that no longer exists (spare_wait_ms is 30 s
// here: without the refusal its step() fails with kTimeout then). Neither rank that left refuses it: after the first
// loss the spare waits on.
BOOST_AUTO_TEST_CASE(a_grid_that_stops_refuses_its_waiting_spare_which_stops_with_the_survivors_reason) {
  const settings::ScopedProcessValue leave("TANDEM_TEST_REFORM_LEAVE", "1:summed");
  par::ParallelConfig p = grid(par::Strategy::kHybrid, 2, "");
  p.spare_wait_ms = 30000;
  std::vector<bool> spare(4, false);
  const auto errors = run_world(4, quick_deadline(), [&](int r, comm::Communicator& c) {
    auto be = one_thread_backend();
    nn::Model m(lenet12(), *be, 3);
    par::ParallelTrainer t(m, synthetic12_train(), nullptr, sgd_config(kBatch, 6), p, &c);
    for (int i = 0; i < 2; ++i) t.step();
    if (r == 3) {
      t.abandon();
      return;
    }
    try {
      t.train_epoch();
    } catch (...) {
      spare[static_cast<size_t>(r)] = t.spare();
      throw;
    }
  });
  BOOST_TEST(errors[3].message.empty(), errors[3].message);
  BOOST_TEST(contains(errors[1].message, "TANDEM_TEST_REFORM_LEAVE"), errors[1].message);
  BOOST_TEST(spare[2]);
  for (int r : {0, 2}) {
    const RankError& e = errors[static_cast<size_t>(r)];
    BOOST_TEST_CONTEXT("world rank " << r << ": " << e.message) {
      BOOST_TEST((e.status == Status::kPeerFailure));
      BOOST_TEST(contains(e.message, "pipeline stage(s) 1 lost on every replica"));
    }
  }
  BOOST_TEST(contains(errors[2].message, "spare world rank 2 stops with the grid it waited for"), errors[2].message);
}

// With a checkpoint (written at step 3, two steps before the loss) the survivors 0 and 2 re-form at 1 x 2 from it.
BOOST_AUTO_TEST_CASE(losing_every_replica_of_a_stage_with_a_checkpoint_restores_it_from_there) {
  constexpr int kBefore = 3, kExtra = 2, kAfter = 6;
  const std::string ck = temp_path("both.ckpt");
  std::vector<Seen> seen;
  const auto errors = run_loss({1, 3}, ck, kBefore, kExtra, kAfter, seen);
  for (int r : {0, 2}) {
    const Seen& s = seen[static_cast<size_t>(r)];
    BOOST_TEST_CONTEXT("world rank " << r) {
      BOOST_TEST(errors[static_cast<size_t>(r)].message.empty(), errors[static_cast<size_t>(r)].message);
      BOOST_TEST(s.grid.dp == 1);
      BOOST_TEST(s.grid.pp == 2);
      BOOST_TEST((s.members == std::vector<int>{0, 2}));
      BOOST_TEST(s.steps == kBefore + kAfter);  // back to the checkpoint's step, then kAfter steps
      BOOST_TEST(std::isfinite(s.loss_end));
      BOOST_TEST(s.loss_end < s.loss_mid);
    }
  }
  std::filesystem::remove(ck);
}

// 2 x 2 hybrid, epochs of 6 steps (limit_batches, per replica): `victim` leaves after kBefore steps, the others
// are in train_epoch. The 3 survivors re-form at 1 x 2; the epoch's kBefore x 2 x kBatch samples continue at
// position 32 of the single replica's shard, past the 6 batches, so the epoch ends at once: its figures are those the
// survivors scored before the loss, carried over the re-form.
constexpr int kLateBefore = 4;

struct LateLoss {
  std::vector<RankError> errors;
  std::vector<Seen> seen = std::vector<Seen>(4);
  std::vector<train::EpochResult> epoch = std::vector<train::EpochResult>(4);
};

LateLoss lose_late_in_an_epoch(int victim) {
  LateLoss out;
  out.errors = run_world(4, quick_deadline(), [&](int r, comm::Communicator& c) {
    auto be = one_thread_backend();
    nn::Model m(lenet12(), *be, 3);
    par::ParallelTrainer t(m, synthetic12_train(), nullptr, sgd_config(kBatch, 6), grid(par::Strategy::kHybrid, 2, ""),
                           &c);
    if (r == victim) {
      for (int i = 0; i < kLateBefore; ++i) t.step();
      t.abandon();
      return;
    }
    Seen& s = out.seen[static_cast<size_t>(r)];
    out.epoch[static_cast<size_t>(r)] = t.train_epoch();
    s.released = t.spare();
    s.members = t.members();
    s.grid = t.grid();
    s.steps = t.global_step();
  });
  return out;
}

// Every grid rank of the re-formed 1 x 2 grid: `members` (by grid rank), each on the stage it held before (world rank
// w held stage w % 2), and the epoch's figures over `scored` samples.
void check_late_loss(const LateLoss& run, int victim, const std::vector<int>& members, int spare, int64_t scored) {
  for (int r = 0; r < 4; ++r)
    if (r != victim)
      BOOST_TEST(run.errors[static_cast<size_t>(r)].message.empty(), run.errors[static_cast<size_t>(r)].message);
  BOOST_TEST(run.seen[static_cast<size_t>(spare)].released);  // its stage is held by a lower rank: no place for it
  for (int r : members) {
    const Seen& s = run.seen[static_cast<size_t>(r)];
    const train::EpochResult& e = run.epoch[static_cast<size_t>(r)];
    BOOST_TEST_CONTEXT("world rank " << r) {
      BOOST_TEST(!s.released);
      BOOST_TEST(s.members == members);
      BOOST_TEST(s.grid.dp == 1);
      BOOST_TEST(s.grid.pp == 2);
      BOOST_TEST(s.grid.stage == r % 2);  // the stage it held before the loss
      BOOST_TEST(s.steps == kLateBefore);
      BOOST_TEST(e.epoch == 1);
      BOOST_TEST(e.train_samples == scored);
      BOOST_TEST(std::isfinite(e.train_loss));
      BOOST_TEST(e.train_loss > 0);
      BOOST_TEST((e.train_accuracy >= 0 && e.train_accuracy <= 1));
    }
  }
}

// World rank 1 (stage 1 of replica 0) dies: world ranks 0 (stage 0) and 3 (stage 1, which scored replica 1's samples)
// go on, world rank 2 waits -- rather than world rank 2 moving to stage 1 and world rank 3 waiting. The epoch reports
// replica 1's kBefore x kBatch samples (replica 0's left with world rank 1), not 0 samples with a loss of 0.
BOOST_AUTO_TEST_CASE(a_loss_late_in_an_epoch_keeps_each_survivors_stage_and_reports_the_samples_scored) {
  check_late_loss(lose_late_in_an_epoch(1), 1, {0, 3}, 2, kLateBefore * kBatch);
}

// World rank 0 (stage 0 of replica 0) dies: world rank 2 takes stage 0 (grid rank 0), world rank 1 keeps stage 1,
// and world rank 3 waits as a spare. Both last stages scored before the loss: the spare's share is carried over the
// re-form, so the epoch reports both replicas' kBefore x kBatch samples.
BOOST_AUTO_TEST_CASE(a_survivor_that_becomes_a_spare_leaves_its_epoch_figures_to_the_grid) {
  check_late_loss(lose_late_in_an_epoch(0), 0, {2, 1}, 3, 2 * kLateBefore * kBatch);
}

BOOST_DATA_TEST_CASE(a_loss_at_an_epochs_end_with_the_survivors_in_different_phases_reforms_and_finishes_the_epoch,
                     boost::unit_test::data::make(kEpochEndLosses), c) {
  const EpochEndRun run = two_epochs_with(c.hook);
  const auto& errors = run.errors;
  const auto& epochs = run.epochs;
  const auto& seen = run.seen;
  BOOST_TEST(contains(errors[static_cast<size_t>(c.victim)].message, "TANDEM_TEST_REFORM_LEAVE"),
             errors[static_cast<size_t>(c.victim)].message);
  for (int r = 0; r < 4; ++r)
    if (r != c.victim)
      BOOST_TEST(errors[static_cast<size_t>(r)].message.empty(), "world rank " << r << ": "
                                                                              << errors[static_cast<size_t>(r)].message);
  BOOST_TEST(seen[static_cast<size_t>(c.spare)].released);
  const std::vector<train::EpochResult>& first = epochs[static_cast<size_t>(c.members[0])];
  BOOST_REQUIRE_EQUAL(first.size(), 2u);
  BOOST_TEST(first[0].train_samples == c.scored);
  BOOST_TEST(first[1].train_samples == 6 * kBatch);  // the 1 x 2 grid's 6 steps
  for (const train::EpochResult& e : first) {
    BOOST_TEST(std::isfinite(e.train_loss));
    BOOST_TEST(std::isfinite(e.test_loss));
  }
  for (int r : c.members) {
    const Seen& s = seen[static_cast<size_t>(r)];
    const std::vector<train::EpochResult>& mine = epochs[static_cast<size_t>(r)];
    BOOST_TEST_CONTEXT("world rank " << r) {
      BOOST_TEST(!s.released);
      BOOST_TEST(s.members == c.members);
      BOOST_TEST(s.grid.dp == 1);
      BOOST_TEST(s.grid.pp == 2);
      BOOST_TEST(s.steps == c.steps);
      BOOST_REQUIRE_EQUAL(mine.size(), 2u);
      for (size_t e = 0; e < 2; ++e) {  // the same figures on every rank of the grid
        BOOST_TEST(mine[e].epoch == static_cast<int64_t>(e) + 1);
        BOOST_TEST(mine[e].train_samples == first[e].train_samples);
        BOOST_TEST(mine[e].train_loss == first[e].train_loss);
        BOOST_TEST(mine[e].test_loss == first[e].test_loss);
      }
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
