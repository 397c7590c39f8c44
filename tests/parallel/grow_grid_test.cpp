// Elastic growth of pipeline and hybrid grids, and their spares (issue #17): ranks started later join a running grid
// (join_communicator + a ParallelTrainer with `joining`) and are admitted a whole row at a time; a survivor with no
// place in a re-formed grid waits as a spare and is drafted back when the grid can widen.
#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <atomic>
#include <cmath>
#include <filesystem>

#include "engine/comm/bootstrap.hpp"
#include "tests/parallel/harness.hpp"

using namespace tandem;
using namespace tandem::testing;

namespace {

constexpr int64_t kBatch = 4;  // per replica
constexpr const char* kSecret = "grow-grid";

par::ParallelConfig grid_config(par::Strategy s, int dp, bool joining, int max_ranks = 4) {
  par::ParallelConfig p;
  p.strategy = s;
  p.dp = joining ? 0 : dp;
  p.pp = 2;
  p.micro_batches = 2;
  p.elastic = true;
  p.max_ranks = max_ranks;
  p.joining = joining;
  return p;
}

struct Seen {
  std::vector<float> params;
  double loss_mid = 0, loss_end = 0;
  std::vector<int> members;
  par::Grid grid;
  par::Strategy strategy = par::Strategy::kSingle;
  std::vector<int32_t> boundaries;
  double lr_scale = 0;
  int64_t steps = 0, first_step_after = -1;
};

// Trains `steps` more steps (each a full batch) and records the end state.
void finish(par::ParallelTrainer& t, nn::Model& m, int steps, Seen& s) {
  for (int k = 0; k < steps; ++k) {
    const train::StepResult st = t.step();
    if (st.samples != kBatch || (t.grid().stage == t.grid().pp - 1 && !std::isfinite(st.loss)))
      throw std::runtime_error(fmt::format("step {}: {} samples, loss {}", k, st.samples, st.loss));
  }
  s.loss_end = t.evaluate(synthetic12_train(), 0).loss;
  s.params = host_params(m);
  s.members = t.members();
  s.grid = t.grid();
  s.strategy = t.parallel_config().strategy;
  s.boundaries = t.boundaries();
  s.lr_scale = t.lr_scale();
  s.steps = t.global_step();
}

void check_replicas_equal(const std::vector<Seen>& seen) {
  for (size_t i = 0; i < seen.size(); ++i)
    for (size_t j = 0; j < seen.size(); ++j)
      if (seen[i].grid.stage == seen[j].grid.stage) {
        BOOST_TEST_CONTEXT("ranks " << i << " and " << j << " (stage " << seen[i].grid.stage << ")") {
          BOOST_TEST((seen[i].params == seen[j].params));  // bit for bit
        }
      }
}

void require_empty(const std::vector<std::string>& errors) {
  for (size_t i = 0; i < errors.size(); ++i) BOOST_TEST_REQUIRE(errors[i].empty(), "thread " << i << ": " << errors[i]);
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / fmt::format("tandem_grow_grid_{}_{}", ::getpid(), name)).string();
}

}  // namespace

BOOST_AUTO_TEST_SUITE(grow_grid)

// A hybrid 1 x 2 (dp x pp) job: two joiners ask, the grid widens to 2 x 2 at the next step boundary (the joiners get
// stage 0's and stage 1's slices from the existing replica), and training goes on. The result equals a 2 x 2 grid
// resumed from a checkpoint written at the join step, learning rate x 2 (dp'/dp, the rule of DDP's grow).
BOOST_AUTO_TEST_CASE(hybrid_1x2_grows_to_2x2_equal_to_the_2x2_resumed_at_the_join_step) {
  constexpr int kBefore = 4, kAfter = 6;
  const int port = unique_port(1);
  const std::string ck = temp_path("join.ckpt");
  std::vector<Seen> seen(4);
  std::vector<std::string> errors(4);
  std::atomic<int> ready{0};
  const train::TrainerConfig cfg = sgd_config(kBatch);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i)
    threads.emplace_back([&, i] {
      try {
        Seen& s = seen[static_cast<size_t>(i)];
        auto be = one_thread_backend();
        nn::Model m(lenet12(), *be, 3);
        std::unique_ptr<comm::Communicator> c;
        std::unique_ptr<par::ParallelTrainer> t;
        if (i < 2) {
          c = comm::create_communicator(i, 2, "127.0.0.1", port, kSecret, inproc());
          t = std::make_unique<par::ParallelTrainer>(m, synthetic12_train(), nullptr, cfg,
                                                     grid_config(par::Strategy::kHybrid, 1, false), c.get());
          for (int k = 0; k < kBefore; ++k) t->step();
          s.loss_mid = t->evaluate(synthetic12_train(), 0).loss;
          ++ready;
          wait_for([&] { return c->pending_joins() >= 2; }, "two joiners");
          t->save_checkpoint(ck);  // the state the admission hands on
          t->step();               // admits both at its boundary, then one step at 2 x 2
          s.first_step_after = t->global_step();
        } else {
          wait_for([&] { return ready.load() >= 2; }, "the job");
          c = join_job(i - 2, port, kSecret);
          t = std::make_unique<par::ParallelTrainer>(m, synthetic12_train(), nullptr, cfg,
                                                     grid_config(par::Strategy::kHybrid, 1, true), c.get());
          t->step();
          s.first_step_after = t->global_step();
        }
        finish(*t, m, kAfter, s);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(i)] = e.what();
      }
    });
  for (auto& th : threads) th.join();
  require_empty(errors);
  // The reference: a 2 x 2 grid (the job's stage cut) from the checkpoint, learning rate x 2.
  train::TrainerConfig twice = sgd_config(kBatch);
  twice.optimizer.lr *= 2.0f;
  std::vector<std::vector<float>> ref(4);
  par::ParallelConfig rp = grid_config(par::Strategy::kHybrid, 2, false);
  rp.elastic = false;
  rp.boundaries = seen[0].boundaries;
  require_no_errors(run_world(4, inproc(), [&](int r, comm::Communicator& c) {
    auto be = one_thread_backend();
    nn::Model m(lenet12(), *be, 3);
    par::ParallelTrainer t(m, synthetic12_train(), nullptr, twice, rp, &c);
    t.load_checkpoint(ck);
    for (int k = 0; k < kAfter + 1; ++k) t.step();
    ref[static_cast<size_t>(r)] = host_params(m);
  }));
  check_replicas_equal(seen);
  for (int i = 0; i < 4; ++i) {
    const Seen& s = seen[static_cast<size_t>(i)];
    BOOST_TEST_CONTEXT("thread " << i << " (grid rank " << s.grid.rank << ")") {
      BOOST_TEST(s.grid.world == 4);
      BOOST_TEST(s.grid.dp == 2);
      BOOST_TEST(s.grid.pp == 2);
      BOOST_TEST((s.members == std::vector<int>{0, 1, 2, 3}));
      BOOST_TEST(s.lr_scale == 2.0);
      BOOST_TEST(s.first_step_after == kBefore + 1);
      BOOST_TEST(s.steps == kBefore + 1 + kAfter);
      BOOST_TEST(std::isfinite(s.loss_end));
      BOOST_TEST(s.loss_end < seen[0].loss_mid);
      const double d = rel_diff(s.params, ref[static_cast<size_t>(s.grid.rank)]);
      BOOST_TEST(d < 1e-5, "relative difference " << d);
    }
  }
  std::filesystem::remove(ck);
}

// A pipeline of 2 stages: one joiner makes 3 ranks, which make no wider grid, so it waits (a spare in the admission
// queue) while the job trains on at 1 x 2; a second joiner completes a row and both come in: 2 x 2, now hybrid.
BOOST_AUTO_TEST_CASE(a_pipeline_keeps_one_joiner_waiting_and_widens_to_2x2_with_the_second) {
  constexpr int kBefore = 3, kWaiting = 4, kAfter = 6;
  const int port = unique_port(2);
  std::vector<Seen> seen(4);
  std::vector<std::string> errors(4);
  std::atomic<int> stage_of_test{0};  // 1: the first joiner may ask; 2: the second may
  std::atomic<bool> first_admitted{false};
  std::vector<int> world_while_waiting(2, 0);
  std::vector<int64_t> steps_while_waiting(2, 0);
  std::vector<char> admitted_while_waiting(2, 1);  // not vector<bool>: its bits share words, the ranks write at once
  const train::TrainerConfig cfg = sgd_config(kBatch);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i)
    threads.emplace_back([&, i] {
      try {
        Seen& s = seen[static_cast<size_t>(i)];
        auto be = one_thread_backend();
        nn::Model m(lenet12(), *be, 3);
        std::unique_ptr<comm::Communicator> c;
        std::unique_ptr<par::ParallelTrainer> t;
        if (i < 2) {
          c = comm::create_communicator(i, 2, "127.0.0.1", port, kSecret, inproc());
          t = std::make_unique<par::ParallelTrainer>(m, synthetic12_train(), nullptr, cfg,
                                                     grid_config(par::Strategy::kPipeline, 1, false), c.get());
          for (int k = 0; k < kBefore; ++k) t->step();
          s.loss_mid = t->evaluate(synthetic12_train(), 0).loss;
          if (i == 0) stage_of_test = 1;
          wait_for([&] { return c->pending_joins() >= 1; }, "the first joiner");
          for (int k = 0; k < kWaiting; ++k) t->step();  // every boundary sees 1 waiting: no wider grid
          world_while_waiting[static_cast<size_t>(i)] = t->grid().world;
          steps_while_waiting[static_cast<size_t>(i)] = t->global_step();
          admitted_while_waiting[static_cast<size_t>(i)] = first_admitted.load();
          c->pending_joins();  // both old ranks have looked before the second joiner may ask
          if (i == 0) stage_of_test = 2;
          for (int k = 0; k < 1000 && t->grid().world < 4; ++k) {
            t->step();
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
          }
          if (t->grid().world != 4) throw std::runtime_error("the grid never widened");
          s.first_step_after = t->global_step();
        } else {
          wait_for([&] { return stage_of_test.load() >= i - 1; }, "its turn");
          c = join_job(i - 2, port, kSecret);
          if (i == 2) first_admitted = true;
          t = std::make_unique<par::ParallelTrainer>(m, synthetic12_train(), nullptr, cfg,
                                                     grid_config(par::Strategy::kPipeline, 1, true), c.get());
          t->step();
          s.first_step_after = t->global_step();
        }
        finish(*t, m, kAfter, s);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(i)] = e.what();
      }
    });
  for (auto& th : threads) th.join();
  require_empty(errors);
  for (int i = 0; i < 2; ++i) {
    BOOST_TEST_CONTEXT("old rank " << i) {
      BOOST_TEST(world_while_waiting[static_cast<size_t>(i)] == 2);  // 3 ranks: still 1 x 2
      BOOST_TEST(steps_while_waiting[static_cast<size_t>(i)] == kBefore + kWaiting);
      BOOST_TEST(!admitted_while_waiting[static_cast<size_t>(i)]);  // the first joiner was still waiting
    }
  }
  check_replicas_equal(seen);
  for (int i = 0; i < 4; ++i) {
    const Seen& s = seen[static_cast<size_t>(i)];
    BOOST_TEST_CONTEXT("thread " << i) {
      BOOST_TEST(s.grid.world == 4);
      BOOST_TEST(s.grid.dp == 2);
      BOOST_TEST(s.grid.pp == 2);
      BOOST_TEST((s.strategy == par::Strategy::kHybrid));  // a pipeline that widened runs as hybrid
      BOOST_TEST((s.members == std::vector<int>{0, 1, 2, 3}));
      BOOST_TEST(s.lr_scale == 2.0);
      BOOST_TEST(s.first_step_after == seen[0].first_step_after);
      BOOST_TEST(s.steps == seen[0].steps);
      BOOST_TEST(std::isfinite(s.loss_end));
      BOOST_TEST(s.loss_end < seen[0].loss_mid);
    }
  }
}

// A hybrid 2 x 2 loses world rank 3: the 3 survivors re-form at 1 x 2 and world rank 2, with no place, waits as a
// spare (its step() blocks). A joiner then makes 4 waiting-or-running ranks: the spare (keeping its label 2) and the
// joiner (label 4) are admitted together and the grid is 2 x 2 again.
BOOST_AUTO_TEST_CASE(a_survivor_beyond_the_reformed_grid_waits_as_a_spare_and_is_drafted_with_the_next_joiner) {
  constexpr int kBefore = 3, kAfter = 5;
  const int port = unique_port(3);
  std::vector<Seen> seen(5);
  std::vector<std::string> errors(5);
  std::atomic<int> reformed{0};
  std::vector<int> world_after_loss(2, 0);
  int64_t spare_first_step = -1;
  const train::TrainerConfig cfg = sgd_config(kBatch);
  std::vector<std::thread> threads;
  for (int i = 0; i < 5; ++i)
    threads.emplace_back([&, i] {
      try {
        Seen& s = seen[static_cast<size_t>(i)];
        auto be = one_thread_backend();
        nn::Model m(lenet12(), *be, 3);
        std::unique_ptr<comm::Communicator> c;
        std::unique_ptr<par::ParallelTrainer> t;
        if (i < 4) {
          comm::CommOptions o = inproc();
          o.timeout = std::chrono::milliseconds(4000);
          c = comm::create_communicator(i, 4, "127.0.0.1", port, kSecret, o);
          t = std::make_unique<par::ParallelTrainer>(m, synthetic12_train(), nullptr, cfg,
                                                     grid_config(par::Strategy::kHybrid, 2, false), c.get());
          for (int k = 0; k < kBefore; ++k) t->step();
          s.loss_mid = t->evaluate(synthetic12_train(), 0).loss;
          if (i == 3) {
            t->abandon();
            return;
          }
          if (i == 2) {
            t->step();  // the loss, the re-form without it, the wait as a spare, the draft, a step at 2 x 2
            spare_first_step = t->global_step();
          } else {
            t->step();  // the loss and the re-form at 1 x 2
            world_after_loss[static_cast<size_t>(i)] = t->grid().world;
            ++reformed;
            for (int k = 0; k < 1000 && t->grid().world < 4; ++k) {
              t->step();
              std::this_thread::sleep_for(std::chrono::milliseconds(2));
            }
            if (t->grid().world != 4) throw std::runtime_error("the grid never widened again");
          }
        } else {
          wait_for([&] { return reformed.load() >= 2; }, "the re-form");
          c = join_job(0, port, kSecret, 4);
          t = std::make_unique<par::ParallelTrainer>(m, synthetic12_train(), nullptr, cfg,
                                                     grid_config(par::Strategy::kHybrid, 2, true), c.get());
          t->step();
        }
        s.first_step_after = t->global_step();
        finish(*t, m, kAfter, s);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(i)] = e.what();
      }
    });
  for (auto& th : threads) th.join();
  for (int i : {0, 1, 2, 4}) BOOST_TEST_REQUIRE(errors[static_cast<size_t>(i)].empty(), "thread " << i << ": " << errors[i]);
  BOOST_TEST(world_after_loss[0] == 2);  // 1 x 2 while world rank 2 waited
  BOOST_TEST(world_after_loss[1] == 2);
  // The spare's one step() call lasted while the others trained at 1 x 2: it came back at their step count.
  BOOST_TEST(spare_first_step == seen[0].first_step_after);
  BOOST_TEST(spare_first_step > kBefore + 1);
  std::vector<Seen> grid4;
  for (int i : {0, 1, 2, 4}) grid4.push_back(seen[static_cast<size_t>(i)]);
  check_replicas_equal(grid4);
  for (int i : {0, 1, 2, 4}) {
    const Seen& s = seen[static_cast<size_t>(i)];
    BOOST_TEST_CONTEXT("thread " << i) {
      BOOST_TEST(s.grid.world == 4);
      BOOST_TEST(s.grid.dp == 2);
      BOOST_TEST((s.members == std::vector<int>{0, 1, 2, 4}));  // the spare kept its label; the joiner got a new one
      BOOST_TEST(s.lr_scale == 1.0);                             // dp' / dp = 2 / 2
      BOOST_TEST(s.steps == seen[0].steps);
      BOOST_TEST(std::isfinite(s.loss_end));
      BOOST_TEST(s.loss_end < seen[0].loss_mid);
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
