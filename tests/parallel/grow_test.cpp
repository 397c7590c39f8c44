// Elastic growth (issue #17): a job of 2 thread ranks trains; 2 ranks started later join it (join_communicator +
// a ParallelTrainer with `joining`), are admitted at a step boundary, receive the whole state and train on at 4.
#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <atomic>
#include <cmath>

#include "engine/comm/bootstrap.hpp"
#include "tests/parallel/harness.hpp"

using namespace tandem;
using namespace tandem::testing;

namespace {

constexpr int64_t kBatch = 4;  // per replica

par::ParallelConfig elastic_ddp(bool joining) {
  par::ParallelConfig p;
  p.strategy = par::Strategy::kDdp;
  p.bucket_mb = 0.004;
  p.elastic = true;
  p.max_ranks = 4;
  p.joining = joining;
  return p;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(grow)

BOOST_AUTO_TEST_CASE(two_ranks_grow_to_four_mid_training_with_equal_parameters_and_a_falling_loss) {
  constexpr int kBefore = 4, kAfter = 12, kMaxPolls = 500;
  const int port = 20000 + static_cast<int>(::getpid() % 20000);  // inproc: names the job, opens nothing
  struct Seen {
    std::vector<float> params;
    double loss_mid = 0, loss_end = 0;
    std::vector<int> members;
    double lr_scale = 0;
    int64_t steps = 0, grew_at = -1, position_after = -1;
    int world = 0;
  };
  std::vector<Seen> seen(4);
  std::vector<std::string> errors(4);
  std::atomic<int> ready{0};
  const train::TrainerConfig cfg = sgd_config(kBatch);
  comm::CommOptions o;
  o.transport = "inproc";
  o.timeout = std::chrono::milliseconds(10000);
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
          c = comm::create_communicator(i, 2, "127.0.0.1", port, "grow-trainer", o);
          t = std::make_unique<par::ParallelTrainer>(m, synthetic12_train(), nullptr, cfg, elastic_ddp(false), c.get());
          for (int k = 0; k < kBefore; ++k) t->step();
          s.loss_mid = t->evaluate(synthetic12_train(), 0).loss;
          ++ready;
          for (int k = 0; k < kMaxPolls && t->grid().world < 4; ++k) {
            t->step();
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
          }
          if (t->grid().world != 4) throw std::runtime_error("the joiners were never admitted");
          s.grew_at = t->global_step() - 1;  // the step right after the admission ran at 4 ranks
        } else {
          for (int k = 0; k < 2000 && ready < 2; ++k) std::this_thread::sleep_for(std::chrono::milliseconds(5));
          comm::BootstrapConfig bc;
          bc.info.rank = i - 2;
          bc.info.size = 2;
          bc.master_addr = "127.0.0.1";
          bc.master_port = port;
          bc.secret = "grow-trainer";
          c = comm::join_communicator(bc, o, std::chrono::milliseconds(30000));
          t = std::make_unique<par::ParallelTrainer>(m, synthetic12_train(), nullptr, cfg, elastic_ddp(true), c.get());
          s.grew_at = t->global_step();
          t->step();  // the old ranks' step right after the admission
        }
        s.position_after = t->sample_position();
        for (int k = 0; k < kAfter; ++k) {
          const train::StepResult st = t->step();
          if (st.samples != kBatch || !std::isfinite(st.loss))
            throw std::runtime_error(fmt::format("step {}: {} samples, loss {}", k, st.samples, st.loss));
        }
        s.loss_end = t->evaluate(synthetic12_train(), 0).loss;
        s.params = host_params(m);
        s.members = t->members();
        s.lr_scale = t->lr_scale();
        s.steps = t->global_step();
        s.world = t->grid().world;
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(i)] = e.what();
      }
    });
  for (auto& th : threads) th.join();
  for (int i = 0; i < 4; ++i) BOOST_TEST_REQUIRE(errors[static_cast<size_t>(i)].empty(), "rank " << i << ": " << errors[i]);
  for (int i = 0; i < 4; ++i) {
    const Seen& s = seen[static_cast<size_t>(i)];
    BOOST_TEST_CONTEXT("rank " << i) {
      BOOST_TEST(s.world == 4);
      BOOST_TEST((s.members == std::vector<int>{0, 1, 2, 3}));
      BOOST_TEST((s.params == seen[0].params));  // every replica identical after admission and training, bit for bit
      BOOST_TEST(s.steps == seen[0].steps);
      BOOST_TEST(s.grew_at == seen[0].grew_at);
      BOOST_TEST(s.lr_scale == 2.0);  // learning rate x dp'/dp (the linear scaling rule, as for shrink)
      // The epoch's global order continues: g = grew_at steps x 2 replicas x 4 samples, g / 4 per rank, then a step.
      // (When the second joiner asked a moment after the first, the boundary admits them one after the other,
      // 2 -> 3 -> 4, which re-shards exactly as one admission 2 -> 4: from the same g.)
      const int64_t g = s.grew_at * kBatch * 2;
      BOOST_TEST(s.position_after == g / 4 + kBatch);
      BOOST_TEST(s.position_after == seen[0].position_after);
      BOOST_TEST(std::isfinite(s.loss_end));
      BOOST_TEST(s.loss_end < seen[0].loss_mid);  // training goes on: lower than before the admission
    }
  }
  BOOST_TEST(seen[0].grew_at >= kBefore);
}

BOOST_AUTO_TEST_SUITE_END()
