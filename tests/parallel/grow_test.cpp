// Elastic growth (issue #17): a job of 2 thread ranks trains; 2 ranks started later join it (join_communicator +
// a ParallelTrainer with `joining`), are admitted at a step boundary, receive the whole state and train on at 4.
// Each case lets the boundary that admits run only once the joiners have asked (wait_for on pending_joins), so every
// rank knows in advance at which step the job grows.
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <cmath>

#include "tests/parallel/harness.hpp"

using namespace tandem;
using namespace tandem::testing;

namespace {

constexpr int64_t kBatch = 4;  // per replica

par::ParallelConfig elastic_ddp(bool joining, int join_poll_steps = 1) {
  par::ParallelConfig p;
  p.strategy = par::Strategy::kDdp;
  p.bucket_mb = 0.004;
  p.elastic = true;
  p.max_ranks = 4;
  p.joining = joining;
  p.join_poll_steps = join_poll_steps;
  return p;
}

struct Seen {
  std::vector<float> params;
  double loss_mid = 0, loss_end = 0;  // loss_mid: the old ranks' before any admission
  std::vector<int> members;
  double lr_scale = 0;
  int64_t steps = 0, grew_at = -1, position_after = -1;
  int64_t first_at = -1;  // joiners_asking_steps_apart: the step the first joiner was admitted at
  int world = 0, world_between = 0;
};

// A rank's communicator and its trainer (declared last, so destroyed first).
struct Rank {
  std::unique_ptr<comm::Communicator> c;
  std::unique_ptr<par::ParallelTrainer> t;
};

// Rank `i` of the job (2 ranks at port, secret): trains `steps` steps and records the loss before any admission.
Rank start_job_rank(int i, int port, const char* secret, nn::Model& m, int steps, Seen& s, int join_poll_steps = 1) {
  Rank r;
  r.c = comm::create_communicator(i, 2, "127.0.0.1", port, secret, inproc());
  r.t = std::make_unique<par::ParallelTrainer>(m, synthetic12_train(), nullptr, sgd_config(kBatch),
                                               elastic_ddp(false, join_poll_steps), r.c.get());
  for (int k = 0; k < steps; ++k) r.t->step();
  s.loss_mid = r.t->evaluate(synthetic12_train(), 0).loss;
  return r;
}

// A joiner: asks, is admitted at a step boundary and builds its trainer there.
Rank join_as(int index, int port, const char* secret, nn::Model& m, int join_poll_steps = 1) {
  Rank r;
  r.c = join_job(index, port, secret);
  r.t = std::make_unique<par::ParallelTrainer>(m, synthetic12_train(), nullptr, sgd_config(kBatch),
                                               elastic_ddp(true, join_poll_steps), r.c.get());
  return r;
}

// Runs body(i, model, seen[i]) on 4 threads (0, 1: the job's ranks; 2, 3: the joiners); requires that none failed.
std::vector<Seen> run_ranks(const std::function<void(int, nn::Model&, Seen&)>& body) {
  std::vector<Seen> seen(4);
  std::vector<std::string> errors(4);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i)
    threads.emplace_back([&, i] {
      try {
        auto be = one_thread_backend();
        nn::Model m(lenet12(), *be, 3);
        body(i, m, seen[static_cast<size_t>(i)]);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(i)] = e.what();
      }
    });
  for (auto& th : threads) th.join();
  for (int i = 0; i < 4; ++i) BOOST_TEST_REQUIRE(errors[static_cast<size_t>(i)].empty(), "rank " << i << ": " << errors[i]);
  return seen;
}

// Every rank's first step at 4 ranks is just done: records where the epoch goes on, trains `steps` more steps and
// records the end state.
void finish(par::ParallelTrainer& t, nn::Model& m, int steps, Seen& s) {
  s.position_after = t.sample_position();
  for (int k = 0; k < steps; ++k) {
    const train::StepResult st = t.step();
    if (st.samples != kBatch || !std::isfinite(st.loss))
      throw std::runtime_error(fmt::format("step {}: {} samples, loss {}", k, st.samples, st.loss));
  }
  s.loss_end = t.evaluate(synthetic12_train(), 0).loss;
  s.params = host_params(m);
  s.members = t.members();
  s.lr_scale = t.lr_scale();
  s.steps = t.global_step();
  s.world = t.grid().world;
}

// The job grew to 4 at step `grew_at` with `taken` samples of the epoch's global order taken: every rank agrees and
// ends with the same replica, a falling loss and the learning rate x 2 (dp'/dp, the linear scaling rule of shrink).
void check_grown_together(const std::vector<Seen>& seen, int64_t grew_at, int64_t taken) {
  for (int i = 0; i < 4; ++i) {
    const Seen& s = seen[static_cast<size_t>(i)];
    BOOST_TEST_CONTEXT("rank " << i) {
      BOOST_TEST(s.world == 4);
      BOOST_TEST((s.members == std::vector<int>{0, 1, 2, 3}));
      BOOST_TEST((s.params == seen[0].params));  // every replica identical after admission and training, bit for bit
      BOOST_TEST(s.steps == seen[0].steps);
      BOOST_TEST(s.grew_at == grew_at);
      BOOST_TEST(s.lr_scale == 2.0);
      // The epoch's global order continues: the g samples taken, g / 4 per rank, then a step.
      BOOST_TEST(s.position_after == taken / 4 + kBatch);
      BOOST_TEST(std::isfinite(s.loss_end));
      BOOST_TEST(s.loss_end < seen[0].loss_mid);  // training goes on: lower than before the admission
    }
  }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(grow)

// Both joiners have asked (both tickets are counted) when the boundary after step kBefore checks: one admission takes
// both, 2 -> 4, on every rank.
BOOST_AUTO_TEST_CASE(two_ranks_grow_to_four_mid_training_with_equal_parameters_and_a_falling_loss) {
  constexpr int kBefore = 4, kAfter = 12;
  constexpr const char* kSecret = "grow-trainer";
  const int port = unique_port(1);
  std::atomic<int> ready{0};
  const std::vector<Seen> seen = run_ranks([&](int i, nn::Model& m, Seen& s) {
    Rank r;
    if (i < 2) {
      r = start_job_rank(i, port, kSecret, m, kBefore, s);
      ++ready;
      wait_for([&] { return r.c->pending_joins() >= 2; }, "two joiners");
    } else {
      wait_for([&] { return ready.load() >= 2; }, "the job");
      r = join_as(i - 2, port, kSecret, m);
    }
    s.grew_at = r.t->global_step();
    r.t->step();  // the old ranks admit both joiners at its boundary; then everyone's first step at 4
    finish(*r.t, m, kAfter, s);
  });
  check_grown_together(seen, kBefore, kBefore * 2 * kBatch);
}

// The joiners ask steps apart: the first is admitted at the boundary after it asked (2 -> 3), the job trains on at 3
// while the second has not asked, and the second is admitted at a later boundary (3 -> 4). Every rank agrees on both.
BOOST_AUTO_TEST_CASE(joiners_asking_steps_apart_are_admitted_at_separate_boundaries_that_every_rank_agrees_on) {
  constexpr int kBefore = 4, kBetween = 3, kAfter = 6;
  constexpr const char* kSecret = "grow-apart";
  const int port = unique_port(2);
  std::atomic<int> ready{0};
  std::atomic<bool> second_may_ask{false}, second_asked{false};
  const std::vector<Seen> seen = run_ranks([&](int i, nn::Model& m, Seen& s) {
    Rank r;
    if (i < 2) {
      r = start_job_rank(i, port, kSecret, m, kBefore, s);
      ++ready;
      wait_for([&] { return r.c->pending_joins() >= 1; }, "the first joiner");
    } else if (i == 2) {
      wait_for([&] { return ready.load() >= 2; }, "the job");
      r = join_as(0, port, kSecret, m);
    } else {
      wait_for([&] { return second_may_ask.load(); }, "its turn");
      r = join_as(1, port, kSecret, m);
    }
    if (i < 3) {
      s.first_at = r.t->global_step();
      r.t->step();  // the old ranks admit the first joiner at its boundary; then everyone's first step at 3
      for (int k = 0; k < kBetween; ++k) r.t->step();
      s.world_between = r.t->grid().world;
      if (i == 0) second_may_ask = true;  // every boundary rank 0 checked so far came before the second asked
      if (i < 2) {
        wait_for([&] { return r.c->pending_joins() >= 1; }, "the second joiner");
        if (i == 0) second_asked = true;
      } else {
        wait_for([&] { return second_asked.load(); }, "the second joiner");
      }
    }
    s.grew_at = r.t->global_step();
    r.t->step();  // the three admit the second joiner at its boundary; then everyone's first step at 4
    finish(*r.t, m, kAfter, s);
  });
  for (int i = 0; i < 3; ++i) {
    BOOST_TEST_CONTEXT("rank " << i) {
      BOOST_TEST(seen[static_cast<size_t>(i)].first_at == kBefore);
      BOOST_TEST(seen[static_cast<size_t>(i)].world_between == 3);
    }
  }
  // At 3 the epoch went on from floor(g / 3) of the new shards; the second re-shard starts from position x 3.
  const int64_t position_at_3 = kBefore * 2 * kBatch / 3 + (1 + kBetween) * kBatch;
  check_grown_together(seen, kBefore + 1 + kBetween, position_at_3 * 3);
}

// A job that checks for joiners every third step (join_poll_steps) keeps joiners that asked after step 4 waiting
// through the boundaries at steps 4 and 5, and admits them at step 6, on every rank.
BOOST_AUTO_TEST_CASE(joiners_wait_for_the_next_boundary_that_checks_when_the_job_checks_every_third_step) {
  constexpr int kBefore = 4, kEvery = 3, kChecked = 6, kAfter = 6;
  constexpr const char* kSecret = "grow-every";
  const int port = unique_port(3);
  std::atomic<int> ready{0};
  const std::vector<Seen> seen = run_ranks([&](int i, nn::Model& m, Seen& s) {
    Rank r;
    if (i < 2) {
      r = start_job_rank(i, port, kSecret, m, kBefore, s, kEvery);
      ++ready;
      wait_for([&] { return r.c->pending_joins() >= 2; }, "two joiners");
      while (r.t->global_step() < kChecked) r.t->step();  // boundaries that do not check
      s.world_between = r.t->grid().world;
    } else {
      wait_for([&] { return ready.load() >= 2; }, "the job");
      r = join_as(i - 2, port, kSecret, m, kEvery);
    }
    s.grew_at = r.t->global_step();
    r.t->step();  // the old ranks admit both joiners at its boundary; then everyone's first step at 4
    finish(*r.t, m, kAfter, s);
  });
  for (int i = 0; i < 2; ++i) BOOST_TEST(seen[static_cast<size_t>(i)].world_between == 2, "rank " << i);
  check_grown_together(seen, kChecked, kChecked * 2 * kBatch);
}

BOOST_AUTO_TEST_SUITE_END()
