// A lost worker absorbed (issues #13 and #17): under ps-async, ssp, ps (elastic), easgd (both variants), fedavg,
// asgd and localsgd a worker whose transport closes between steps (as a killed process's does) does not stop
// training -- the survivors, servers included, shrink their communicator, re-form and finish the epoch with a finite,
// decreasing loss, each logging the lost rank. A lost parameter server stops the job on every survivor naming
// "server N" within the deadline; synchronous ps without elastic stops naming the lost worker.
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include <chrono>
#include <cmath>
#include <functional>

#include "engine/core/log.hpp"
#include "engine/nn/zoo.hpp"
#include "engine/parallel/param_server.hpp"
#include "tests/parallel/harness.hpp"

namespace bdata = boost::unit_test::data;
BOOST_TEST_DONT_PRINT_LOG_VALUE(tandem::engine::parallel::Strategy)
using namespace tandem;
using namespace tandem::testing;

namespace {

constexpr int64_t kBatch = 4;  // per worker

const data::Dataset& train_set() { return synthetic12_train(); }
const data::Dataset& test_set() { return synthetic12_test(); }
nn::ModelSpec lenet() { return lenet12(); }

struct Case {
  const char* name;
  par::Strategy strategy;
  int servers = 0;       // the last ranks of the world
  bool easgd_async = false;
  bool elastic = false;  // ps: absorbs only with elastic
  int staleness = 2;
  float lr = 0.05f;
};
std::ostream& operator<<(std::ostream& o, const Case& c) { return o << c.name; }

const Case kCases[] = {
    {"ps-async", par::Strategy::kPsAsync, 1, false, false, 2, 0.005f},
    {"ssp", par::Strategy::kSsp, 1, false, false, 1, 0.01f},
    {"ps-elastic", par::Strategy::kPs, 1, false, true, 0},
    {"easgd", par::Strategy::kEasgd},
    {"easgd-async", par::Strategy::kEasgd, 1, true},
    {"fedavg", par::Strategy::kFedAvg},
    {"asgd", par::Strategy::kAsgd},
    {"localsgd", par::Strategy::kLocalSgd},
};

par::ParallelConfig config_of(const Case& c) {
  par::ParallelConfig p;
  p.strategy = c.strategy;
  p.servers = c.servers > 0 ? c.servers : 1;
  p.easgd_async = c.easgd_async;
  p.elastic = c.elastic;
  p.staleness = c.staleness;
  p.tau = 2;
  p.average_every = 2;
  p.bucket_mb = 0.004;  // several buckets (pieces in flight during backward)
  return p;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(absorb)

// 4 ranks (3 workers and a server, or 4 workers); world rank 2, a worker, leaves without a word after kBefore steps
// (fedavg: one round). The others finish the epoch (fedavg: two more rounds) and evaluate.
BOOST_DATA_TEST_CASE(survivors_of_a_lost_worker_finish_the_epoch_and_log_it, bdata::make(kCases), c) {
  constexpr int kWorld = 4, kBefore = 3;
  constexpr int kDead = 2;
  const bool fedavg = c.strategy == par::Strategy::kFedAvg;
  train::TrainerConfig cfg = sgd_config(kBatch, fedavg ? 4 : 0);
  cfg.optimizer.lr = c.lr;
  const par::ParallelConfig p = config_of(c);
  struct Seen {
    double loss_start = 0, loss_end = 0;
    std::vector<int> members, lost;
    int64_t gap = -1;
    int32_t round_clients = -1;
    bool logged = false;
  };
  std::vector<Seen> seen(kWorld);
  std::vector<Captured> logs(kWorld);
  const auto errors = run_world(kWorld, quick_deadline(), [&](int r, comm::Communicator& comm) {
    log::Logger logger(log::Level::kWarn);
    logger.set_sink(&Captured::sink, &logs[static_cast<size_t>(r)]);
    log::Scope scope(&logger);
    auto be = one_thread_backend();
    nn::Model m(lenet(), *be, 3);
    par::ParallelTrainer t(m, train_set(), &test_set(), cfg, p, &comm);
    Seen& s = seen[static_cast<size_t>(r)];
    s.loss_start = t.evaluate(train_set(), 0).loss;
    for (int i = 0; i < (fedavg ? 1 : kBefore); ++i) t.step();
    if (r == kDead) {
      t.abandon();
      return;
    }
    const train::EpochResult e = t.train_epoch();  // to the epoch's end, its sums, time split and evaluation
    if (!std::isfinite(e.test_loss) || !std::isfinite(e.train_loss)) throw std::runtime_error("a figure is not finite");
    if (fedavg) t.train_epoch();
    s.loss_end = t.evaluate(train_set(), 0).loss;
    if (fedavg) s.round_clients = t.last_round().total.clients;
    s.members = t.members();
    s.lost = t.lost_ranks();
    if (t.param_server() != nullptr && t.param_server()->is_server()) s.gap = t.param_server()->max_clock_gap();
    s.logged = logs[static_cast<size_t>(r)].contains("world rank(s) 2 lost");
  });
  BOOST_TEST((errors[kDead].status == Status::kOk), errors[kDead].message);
  for (int r : {0, 1, 3}) {
    const Seen& s = seen[static_cast<size_t>(r)];
    BOOST_TEST_CONTEXT(c.name << ", world rank " << r << ": " << errors[static_cast<size_t>(r)].message) {
      BOOST_TEST((errors[static_cast<size_t>(r)].status == Status::kOk));
      BOOST_TEST((s.members == std::vector<int>{0, 1, 3}));
      BOOST_TEST((s.lost == std::vector<int>{kDead}));
      BOOST_TEST(s.logged, "the survivor's log names the lost rank");
      BOOST_TEST(std::isfinite(s.loss_end));
      BOOST_TEST(s.loss_end < s.loss_start);
      // ssp: the bound holds over the live workers throughout (servers only; -1 elsewhere)
      if (s.gap >= 0 && c.strategy != par::Strategy::kPsAsync) BOOST_TEST(s.gap <= c.staleness);
      // fedavg: the 4 clients (one per starting worker) are dealt over the 3 survivors, none dropped
      if (fedavg) BOOST_TEST(s.round_clients == 4);
    }
  }
}

// Every rank trains `before` steps; then world rank `dead` leaves (abandon) and the others call `go_on`. Returns each
// rank's failure and how long the survivors took from the loss to their failure.
struct LossRun {
  std::vector<RankError> errors;
  std::vector<double> seconds;
};
LossRun lose_a_rank(const par::ParallelConfig& p, int world, int dead, int before,
                    const std::function<void(par::ParallelTrainer&)>& go_on) {
  const train::TrainerConfig cfg = sgd_config(kBatch);
  LossRun run;
  run.seconds.assign(static_cast<size_t>(world), 0.0);
  run.errors = run_world(world, quick_deadline(), [&](int r, comm::Communicator& comm) {
    auto be = one_thread_backend();
    nn::Model m(lenet(), *be, 3);
    par::ParallelTrainer t(m, train_set(), nullptr, cfg, p, &comm);
    for (int i = 0; i < before; ++i) t.step();
    if (r == dead) {
      t.abandon();
      return;
    }
    const auto t0 = std::chrono::steady_clock::now();
    try {
      go_on(t);
    } catch (...) {
      run.seconds[static_cast<size_t>(r)] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      throw;
    }
  });
  return run;
}

void ten_steps(par::ParallelTrainer& t) {
  for (int i = 0; i < 10; ++i) t.step();
}

// A lost server: every survivor fails with kPeerFailure naming "server 0" and its world rank, well within the deadline.
BOOST_DATA_TEST_CASE(a_lost_server_stops_every_survivor_naming_it,
                     bdata::make({par::Strategy::kPsAsync, par::Strategy::kPs}), strategy) {
  constexpr int kServer = 3;  // workers 0..2, server 0 = world rank 3
  const LossRun run = lose_a_rank(config_of({"", strategy, 1}), 4, kServer, 2, ten_steps);
  BOOST_TEST((run.errors[kServer].status == Status::kOk), run.errors[kServer].message);
  for (int r = 0; r < kServer; ++r) {
    const RankError& e = run.errors[static_cast<size_t>(r)];
    BOOST_TEST_CONTEXT(par::strategy_name(strategy) << ", world rank " << r << ": " << e.message) {
      BOOST_TEST((e.status == Status::kPeerFailure));
      BOOST_TEST(contains(e.message, fmt::format("world rank {} (", r)));
      if (strategy == par::Strategy::kPsAsync) {
        BOOST_TEST(contains(e.message, "parameter server 0 (world rank 3) was lost"));
      } else {
        BOOST_TEST(contains(e.message, "world rank 3 (server 0)"));
      }
      BOOST_TEST(run.seconds[static_cast<size_t>(r)] < 4.0);  // the communicator's deadline
    }
  }
}

// Synchronous ps without elastic: a lost worker stops the job on every survivor, naming it (ps equals DDP, and DDP
// stops too unless elastic).
BOOST_AUTO_TEST_CASE(synchronous_ps_without_elastic_stops_naming_the_lost_worker) {
  constexpr int kDead = 1;
  const LossRun run = lose_a_rank(config_of({"", par::Strategy::kPs, 1}), 4, kDead, 2, ten_steps);
  BOOST_TEST((run.errors[kDead].status == Status::kOk), run.errors[kDead].message);
  for (int r : {0, 2, 3}) {
    const RankError& e = run.errors[static_cast<size_t>(r)];
    BOOST_TEST_CONTEXT("world rank " << r << ": " << e.message) {
      BOOST_TEST((e.status == Status::kPeerFailure));
      BOOST_TEST(contains(e.message, "world rank 1 left the job"));
      BOOST_TEST(run.seconds[static_cast<size_t>(r)] < 4.0);
    }
  }
}

// min_ranks counts every rank (servers too): 4 ranks with min_ranks 4 stop on the first loss, naming it.
BOOST_AUTO_TEST_CASE(below_min_ranks_an_absorbing_strategy_stops_naming_the_lost_worker) {
  par::ParallelConfig p = config_of({"", par::Strategy::kPsAsync, 1});
  p.min_ranks = 4;
  const LossRun run = lose_a_rank(p, 4, 2, 2, [](par::ParallelTrainer& t) { t.train_epoch(); });
  for (int r : {0, 1, 3}) {
    const RankError& e = run.errors[static_cast<size_t>(r)];
    BOOST_TEST_CONTEXT("world rank " << r << ": " << e.message) {
      BOOST_TEST((e.status == Status::kPeerFailure));
      BOOST_TEST(contains(e.message, "world rank(s) 2 lost"));
      BOOST_TEST(contains(e.message, "3 of 4 ranks left, below min_ranks 4"));
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
