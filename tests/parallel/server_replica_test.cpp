// A lost parameter server's shard restored (issue #17): with server_replicas its backup takes it over from its
// replica (values, optimizer state, clock) and training goes on with no restart -- synchronous ps to the very
// parameters of an uninterrupted run; ps-async and ssp survive. Without a replica the shard comes back from
// elastic_checkpoint (every rank back to its step, so again the uninterrupted run's parameters); without either every
// survivor stops naming the server and why. The job compiler's fail-over rule and the bad settings are checked too.
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <utility>
#include <unistd.h>

#include "engine/core/log.hpp"
#include "engine/core/settings.hpp"
#include "engine/nn/zoo.hpp"
#include "engine/parallel/job.hpp"
#include "engine/parallel/param_server.hpp"
#include "engine/train/checkpoint.hpp"
#include "tests/parallel/harness.hpp"

namespace bdata = boost::unit_test::data;
BOOST_TEST_DONT_PRINT_LOG_VALUE(tandem::engine::parallel::Strategy)
using namespace tandem;
using namespace tandem::testing;

namespace {

constexpr int64_t kBatch = 4;  // per worker
constexpr int kServer1 = 3;  // ps_config: workers 0, 1; servers 0 and 1 = world ranks 2 and 3

par::ParallelConfig ps_config(par::Strategy s, int replicas) {
  par::ParallelConfig p;
  p.strategy = s;
  p.servers = 2;
  p.server_replicas = replicas;
  p.elastic = s == par::Strategy::kPs;
  p.staleness = 1;
  p.bucket_mb = 0.004;  // several buckets, so several pieces per shard
  return p;
}

// Elastic ps over 3 servers, each shard backed up on the next (replica_servers), with momentum to replicate.
par::Job three_servers_one_replica() {
  par::Job job;
  job.model = lenet12();
  job.batch = 4;
  job.parallel.strategy = par::Strategy::kPs;
  job.parallel.servers = 3;
  job.parallel.server_replicas = 1;
  job.parallel.elastic = true;
  job.parallel.bucket_mb = 0.004;
  job.optimizer.momentum = 0.9f;
  return job;
}

std::vector<float> host_params(nn::Model& m) {
  const Tensor h = m.backend().to_host(m.params());
  return std::vector<float>(h.data<float>(), h.data<float>() + h.numel());
}

struct Outcome {
  std::vector<RankError> errors;
  std::vector<std::vector<float>> params;  // per rank: the model's parameters at the end (workers)
  std::vector<std::vector<int>> members;
  std::vector<std::vector<int32_t>> owned;  // servers: the shards each holds at the end
  std::vector<std::vector<std::pair<int64_t, std::vector<float>>>> held;  // servers: (first key, values) of each
  std::vector<int64_t> servers;  // the servers in the job's program at the end
  std::vector<int64_t> steps;    // optimizer steps at the end
  std::vector<char> logged;  // not vector<bool>: its bits share words, the ranks write at once
  std::vector<double> seconds;  // from the loss to the end (or the failure)
  std::vector<double> loss_start, loss_end;  // with `eval`: the training set's loss before the first step and at the end
  std::vector<std::vector<int64_t>> trail;  // per rank: its optimizer step after each step() call
  std::vector<std::vector<std::string>> lines;  // per rank: what it logged (warnings and errors)
};

bool logged(const Outcome& o, int rank, const std::string& part) {
  const std::vector<std::string>& lines = o.lines[static_cast<size_t>(rank)];
  return std::any_of(lines.begin(), lines.end(), [&](const std::string& l) { return contains(l, part); });
}

// The calling thread's warnings and errors go to `into` while this lives.
struct CaptureLog {
  explicit CaptureLog(Captured& into) { logger.set_sink(&Captured::sink, &into); }
  log::Logger logger{log::Level::kWarn};
  log::Scope scope{&logger};
};

// `workers` workers and p.servers servers train until their optimizer step is `until`. Each (world rank, step) of
// `deaths` leaves without a word when it reaches that step; with a `checkpoint`, every rank saves it at step
// `checkpoint_at`. `lr`: the learning rate (sgd_config's by default).
Outcome run_losses(const par::ParallelConfig& p, const std::vector<std::pair<int, int>>& deaths, int until,
                   const std::string& checkpoint = "", int checkpoint_at = -1, const std::string& expect_log = "",
                   bool eval = false, int workers = 2, float lr = 0) {
  const int world = workers + p.servers;
  const auto n = static_cast<size_t>(world);
  train::TrainerConfig cfg = sgd_config(kBatch);
  if (lr > 0) cfg.optimizer.lr = lr;
  Outcome o;
  o.params.resize(n);
  o.members.resize(n);
  o.owned.resize(n);
  o.held.resize(n);
  o.servers.assign(n, 0);
  o.steps.assign(n, 0);
  o.logged.assign(n, 0);
  o.seconds.assign(n, 0.0);
  o.loss_start.assign(n, NAN);
  o.loss_end.assign(n, NAN);
  o.trail.resize(n);
  int first_loss = until;
  for (const auto& d : deaths) first_loss = std::min(first_loss, d.second);
  std::vector<Captured> logs(n);
  o.errors = run_world(world, quick_deadline(), [&](int r, comm::Communicator& comm) {
    const auto me = static_cast<size_t>(r);
    const CaptureLog capture(logs[me]);
    auto be = one_thread_backend();
    nn::Model m(lenet12(), *be, 3);
    par::ParallelTrainer t(m, synthetic12_train(), nullptr, cfg, p, &comm);
    int dies_at = -1;
    for (const auto& d : deaths)
      if (d.first == r) dies_at = d.second;
    auto t0 = std::chrono::steady_clock::now();
    bool saved = false;
    if (eval) o.loss_start[me] = t.evaluate(synthetic12_train(), 0).loss;
    const auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
    try {
      // A lost server may take the step it was serving with it: that step is completed or redone by the survivors.
      for (int i = 0; i < 3 * until && t.global_step() < until; ++i) {
        if (t.global_step() < first_loss) t0 = std::chrono::steady_clock::now();  // timed from the first loss
        if (!checkpoint.empty() && !saved && t.global_step() == checkpoint_at) {
          t.save_checkpoint(checkpoint);
          saved = true;
        }
        if (t.global_step() == dies_at) {
          t.abandon();
          return;
        }
        t.step();
        o.trail[me].push_back(t.global_step());
      }
    } catch (...) {
      o.seconds[me] = elapsed();
      throw;
    }
    o.seconds[me] = elapsed();
    if (eval) o.loss_end[me] = t.evaluate(synthetic12_train(), 0).loss;
    o.params[me] = host_params(m);
    o.members[me] = t.members();
    o.servers[me] = t.job().sync.servers;
    o.steps[me] = t.global_step();
    if (t.param_server() != nullptr && t.param_server()->is_server()) {
      o.owned[me] = t.param_server()->owned_shards();
      for (int32_t k : o.owned[me])
        o.held[me].emplace_back(t.job().sync.shards[static_cast<size_t>(k)].begin, t.param_server()->shard_values(k));
    }
    o.logged[me] = expect_log.empty() || logs[me].contains(expect_log);
  });
  for (size_t r = 0; r < n; ++r) o.lines.push_back(logs[r].lines);
  if (std::getenv("TANDEM_TEST_SHOW_LOGS") != nullptr)
    for (size_t r = 0; r < n; ++r)
      for (const std::string& line : logs[r].lines) std::fprintf(stderr, "rank %zu: %s\n", r, line.c_str());
  return o;
}

// Every rank trains `before` steps (checkpoint: then saves `checkpoint` and trains `after_checkpoint` more); then
// world rank `dead` (if >= 0) leaves without a word and the others train until their optimizer step is `until`.
Outcome run(const par::ParallelConfig& p, int before, int dead, int until, const std::string& checkpoint = "",
            int after_checkpoint = 0, const std::string& expect_log = "") {
  std::vector<std::pair<int, int>> deaths;
  if (dead >= 0) deaths.emplace_back(dead, before + after_checkpoint);
  return run_losses(p, deaths, until, checkpoint, checkpoint.empty() ? -1 : before, expect_log);
}

std::string temp_path(const char* name) {
  return (std::filesystem::temp_directory_path() / fmt::format("tandem_{}_{}.ckpt", name, getpid())).string();
}

par::ParallelConfig servers_config(int servers, int replicas) {
  par::ParallelConfig p = ps_config(par::Strategy::kPs, replicas);
  p.servers = servers;
  return p;
}

std::vector<int32_t> sorted(std::vector<int32_t> v) {
  std::sort(v.begin(), v.end());
  return v;
}

// Every survivor in `ranks` finished without an error at the uninterrupted run's step, and the workers (world ranks
// 0 and 1; a server's own model is not trained) end with its parameters.
void require_exact(const Outcome& lost, const Outcome& whole, const std::vector<int>& ranks) {
  for (int r : ranks) {
    const auto i = static_cast<size_t>(r);
    BOOST_TEST_CONTEXT("world rank " << r << ": " << lost.errors[i].message) {
      BOOST_TEST_REQUIRE((lost.errors[i].status == Status::kOk));
      BOOST_TEST(lost.steps[i] == whole.steps[0]);
      if (r < 2) BOOST_TEST(rel_diff(lost.params[i], whole.params[i]) <= 1e-6);
    }
  }
}

// 3 servers, one replica each, lost server 1 and its only backup, server 2: every survivor (world ranks 0, 1, 2)
// stopped with kPeerFailure naming shard 1 (and not shard 2, whose backup on server 0 survived), in bounded time.
void require_stopped_naming_shard_1(const Outcome& lost) {
  for (int r : {0, 1, 2}) {
    const RankError& e = lost.errors[static_cast<size_t>(r)];
    BOOST_TEST_CONTEXT("world rank " << r << ": " << e.message) {
      BOOST_TEST((e.status == Status::kPeerFailure));
      BOOST_TEST(contains(e.message, "lost 1 of the model's 3 shards"));
      BOOST_TEST(contains(e.message, "parameter server 1 was lost with shard 1 ["));
      BOOST_TEST(!contains(e.message, "shard 2 ["));
      BOOST_TEST(contains(e.message, "restart it from the last checkpoint"));
      BOOST_TEST(lost.seconds[static_cast<size_t>(r)] < 15.0);
    }
  }
}

// With elastic_checkpoint `name` (a temporary file) written at step 2: the uninterrupted run to `until` (no errors
// required), then the run with `deaths` and TANDEM_TEST_REFORM_LEAVE=`hook`, whose survivors must log `expect_log`
// (Outcome::logged; by default, going back to the checkpoint).
std::pair<Outcome, Outcome> uninterrupted_and_restored(par::ParallelConfig p, const char* name,
                                                       const std::vector<std::pair<int, int>>& deaths, int until,
                                                       const char* hook,
                                                       const char* expect_log = "every rank goes back to checkpoint") {
  const std::string path = temp_path(name);
  p.elastic_checkpoint = path;
  Outcome whole = run_losses(p, {}, until);
  require_no_errors(whole.errors);
  const settings::ScopedProcessValue leave("TANDEM_TEST_REFORM_LEAVE", hook);
  Outcome lost = run_losses(p, deaths, until, path, 2, expect_log);
  std::filesystem::remove(path);
  return {std::move(whole), std::move(lost)};
}


// A fault inside an epoch's checkpoint save (TANDEM_TEST_SAVE_FAULT, parallel_trainer.cpp), as `tandem train` meets
// it: ps-async with 2 workers and 2 servers, a replica each (the chaos benchmark's ps-async-backup), two epochs of 6
// steps, each evaluated on the test set and followed by a save to one file.
struct SaveFaultRun {
  std::vector<RankError> errors;
  std::vector<std::vector<train::EpochResult>> epochs = std::vector<std::vector<train::EpochResult>>(4);
  std::vector<std::vector<int>> members = std::vector<std::vector<int>>(4);
  std::vector<int64_t> steps = std::vector<int64_t>(4, 0);
  std::vector<char> file_after_first = std::vector<char>(4, 0);  // the file existed right after the first save
  std::vector<std::vector<int32_t>> owned = std::vector<std::vector<int32_t>>(4);
  std::vector<std::vector<std::string>> lines;
  nlohmann::json meta;  // the file's metadata at the end (null: none)
};

SaveFaultRun two_epochs_saving_with(const char* hook) {
  const settings::ScopedProcessValue fault("TANDEM_TEST_SAVE_FAULT", hook);
  const std::string path = temp_path("ps_save_fault");
  std::filesystem::remove(path);
  SaveFaultRun out;
  std::vector<Captured> logs(4);
  out.errors = run_world(4, quick_deadline(), [&](int r, comm::Communicator& comm) {
    const auto me = static_cast<size_t>(r);
    const CaptureLog capture(logs[me]);
    auto be = one_thread_backend();
    nn::Model m(lenet12(), *be, 3);
    par::ParallelTrainer t(m, synthetic12_train(), &synthetic12_test(), sgd_config(kBatch, 6),
                           ps_config(par::Strategy::kPsAsync, 1), &comm);
    for (int e = 0; e < 2; ++e) {
      out.epochs[me].push_back(t.train_epoch());
      t.save_checkpoint(path);
      if (e == 0) out.file_after_first[me] = std::filesystem::exists(path) ? 1 : 0;
    }
    out.members[me] = t.members();
    out.steps[me] = t.global_step();
    if (t.param_server()->is_server()) out.owned[me] = t.param_server()->owned_shards();
  });
  for (Captured& c : logs) out.lines.push_back(c.lines);
  if (std::filesystem::exists(path)) out.meta = train::load_checkpoint(path).meta;
  std::filesystem::remove(path);
  return out;
}

// Workers 0 and 1 and server 0 (world rank 2) were not hit: each finished both epochs with finite figures, the job's
// second save wrote the file at the end of both epochs, and each worker logged that it gave the first save up.
void require_survivors_finished(const SaveFaultRun& run) {
  for (int r : {0, 1, 2}) {
    const auto i = static_cast<size_t>(r);
    BOOST_TEST_CONTEXT("world rank " << r << ": " << run.errors[i].message) {
      BOOST_TEST_REQUIRE((run.errors[i].status == Status::kOk));
      BOOST_TEST_REQUIRE(run.epochs[i].size() == 2u);
      BOOST_TEST(run.epochs[i][1].epoch == 2);
      BOOST_TEST(std::isfinite(run.epochs[i][1].train_loss));
      BOOST_TEST(std::isfinite(run.epochs[i][1].test_loss));
      BOOST_TEST(run.steps[i] == 12);
      BOOST_TEST(!run.file_after_first[i], "the save that could not complete left a file");
      if (r < 2) {
        const auto& lines = run.lines[i];
        BOOST_TEST(std::any_of(lines.begin(), lines.end(), [](const std::string& l) {
          return contains(l, "was lost while the ranks wrote checkpoint");
        }));
      }
    }
  }
  BOOST_TEST_REQUIRE(!run.meta.is_null(), "the second save wrote no file");
  BOOST_TEST(run.meta.at("completed_epochs").get<int64_t>() == 2);
  BOOST_TEST(run.meta.at("optimizer").at("steps").get<int64_t>() == 12);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(server_replica)

// Synchronous ps, 2 workers and 2 servers, one replica each: server 1 (world rank 3) is lost after 3 steps; server 0
// takes its shard over from its replica and the workers train to step 8. The workers end with the parameters of an uninterrupted
// run of 8 steps (momentum SGD: the optimizer state came over too) -- to float rounding, and in fact bit for bit.
BOOST_AUTO_TEST_CASE(sync_ps_loses_a_server_and_ends_where_the_uninterrupted_run_does) {
  const par::ParallelConfig p = ps_config(par::Strategy::kPs, 1);
  const Outcome whole = run(p, 8, -1, 8);
  require_no_errors(whole.errors);
  const Outcome lost = run(p, 3, kServer1, 8, "", 0, "each lost shard taken over from its replica");
  BOOST_TEST((lost.errors[kServer1].status == Status::kOk), lost.errors[kServer1].message);
  for (int r : {0, 1, 2}) {
    BOOST_TEST_CONTEXT("world rank " << r << ": " << lost.errors[static_cast<size_t>(r)].message) {
      BOOST_TEST((lost.errors[static_cast<size_t>(r)].status == Status::kOk));
      BOOST_TEST((lost.members[static_cast<size_t>(r)] == std::vector<int>{0, 1, 2}));
      BOOST_TEST(lost.servers[static_cast<size_t>(r)] == 1);  // the job's program now has one server
      BOOST_TEST(lost.logged[static_cast<size_t>(r)], "the survivor logs the take-over");
    }
  }
  BOOST_TEST((lost.owned[2] == std::vector<int32_t>{0, 1}));  // server 0 holds both shards
  for (int r : {0, 1}) {
    const std::vector<float>& a = lost.params[static_cast<size_t>(r)];
    const std::vector<float>& b = whole.params[static_cast<size_t>(r)];
    BOOST_TEST_REQUIRE(a.size() == b.size());
    BOOST_TEST(rel_diff(a, b) <= 1e-6, "worker " << r << ": max relative difference " << rel_diff(a, b));
  }
  // and the run did move: the parameters after 8 steps differ from those after 3
  const Outcome three = run(p, 3, -1, 3);
  BOOST_TEST(rel_diff(three.params[0], whole.params[0]) > 1e-4);
}

// ps-async and ssp with a replica: server 1 lost after 3 steps, the survivors train to step 15 and finish.
BOOST_DATA_TEST_CASE(async_and_ssp_survive_a_lost_server_with_a_replica,
                     bdata::make({par::Strategy::kPsAsync, par::Strategy::kSsp}), strategy) {
  const Outcome lost = run(ps_config(strategy, 1), 3, kServer1, 15, "", 0, "world rank(s) 3 lost");
  for (int r : {0, 1, 2}) {
    BOOST_TEST_CONTEXT(par::strategy_name(strategy) << ", world rank " << r << ": "
                                                    << lost.errors[static_cast<size_t>(r)].message) {
      BOOST_TEST((lost.errors[static_cast<size_t>(r)].status == Status::kOk));
      BOOST_TEST((lost.members[static_cast<size_t>(r)] == std::vector<int>{0, 1, 2}));
      BOOST_TEST(lost.logged[static_cast<size_t>(r)]);
    }
  }
  BOOST_TEST((lost.owned[2] == std::vector<int32_t>{0, 1}));
  for (int r : {0, 1})
    for (float v : lost.params[static_cast<size_t>(r)]) BOOST_TEST_REQUIRE(std::isfinite(v));
}

// No replica, but a checkpoint (written after step 3): server 1 is lost after step 5; every rank goes back to the
// checkpoint, server 0 restores both shards from it, and the workers train to step 7, ending with the parameters of
// an uninterrupted 7-step run.
BOOST_AUTO_TEST_CASE(without_a_replica_the_shard_comes_back_from_the_checkpoint) {
  const std::string path = temp_path("ps_restore");
  par::ParallelConfig p = ps_config(par::Strategy::kPs, 0);
  p.elastic_checkpoint = path;
  const Outcome whole = run(p, 7, -1, 7);
  require_no_errors(whole.errors);
  const Outcome lost = run(p, 3, kServer1, 7, path, 2, "every rank goes back to checkpoint");
  std::filesystem::remove(path);
  for (int r : {0, 1, 2}) {
    BOOST_TEST_CONTEXT("world rank " << r << ": " << lost.errors[static_cast<size_t>(r)].message) {
      BOOST_TEST((lost.errors[static_cast<size_t>(r)].status == Status::kOk));
      BOOST_TEST(lost.logged[static_cast<size_t>(r)]);
      BOOST_TEST(lost.steps[static_cast<size_t>(r)] == 7);
    }
  }
  BOOST_TEST((lost.owned[2] == std::vector<int32_t>{0, 1}));
  for (int r : {0, 1})
    BOOST_TEST(rel_diff(lost.params[static_cast<size_t>(r)], whole.params[static_cast<size_t>(r)]) <= 1e-6);
}

// The servers' values at the end, whole: every shard any server held, at its keys (asynchronous EASGD: the centre).
std::vector<float> servers_whole(const Outcome& o) {
  std::vector<float> all;
  for (const auto& shards : o.held)
    for (const auto& [begin, values] : shards) {
      all.resize(std::max(all.size(), static_cast<size_t>(begin) + values.size()), NAN);
      std::copy(values.begin(), values.end(), all.begin() + begin);
    }
  return all;
}

// Asynchronous EASGD (issue #13): the centre has no replica, so a lost server's shard comes back from
// elastic_checkpoint -- the centre cut again over the surviving server, every rank back to the checkpoint's step --
// and with one worker (no race at the servers) the job ends where the uninterrupted one does: the worker's own
// parameters and the centre, bit for bit. Without a checkpoint every survivor stops naming the server and the shard.
BOOST_AUTO_TEST_CASE(async_easgd_takes_a_lost_centre_shard_back_from_the_checkpoint) {
  const std::string path = temp_path("easgd_restore");
  par::ParallelConfig p;
  p.strategy = par::Strategy::kEasgd;
  p.easgd_async = true;
  p.servers = 2;  // world: worker 0; servers 0 and 1 = world ranks 1 and 2
  p.tau = 2;
  p.elastic_checkpoint = path;
  const Outcome whole = run_losses(p, {}, 7, "", -1, "", false, 1);
  require_no_errors(whole.errors);
  const Outcome lost = run_losses(p, {{2, 5}}, 7, path, 3, "every rank goes back to checkpoint", false, 1);
  std::filesystem::remove(path);
  for (int r : {0, 1}) {
    BOOST_TEST_CONTEXT("world rank " << r << ": " << lost.errors[static_cast<size_t>(r)].message) {
      BOOST_TEST((lost.errors[static_cast<size_t>(r)].status == Status::kOk));
      BOOST_TEST(lost.logged[static_cast<size_t>(r)]);
      BOOST_TEST(lost.steps[static_cast<size_t>(r)] == 7);
      BOOST_TEST(lost.servers[static_cast<size_t>(r)] == 1);
    }
  }
  BOOST_TEST((lost.owned[1] == std::vector<int32_t>{0}));  // the whole centre, one shard
  const std::vector<float> centre = servers_whole(lost), expected = servers_whole(whole);
  BOOST_TEST_REQUIRE(expected.size() == whole.params[0].size());
  BOOST_TEST((centre == expected), "the centre equals the uninterrupted run's");
  BOOST_TEST((lost.params[0] == whole.params[0]), "and so do the worker's parameters");

  p.elastic_checkpoint.clear();
  const Outcome stopped = run_losses(p, {{2, 5}}, 7, "", -1, "", false, 1);
  for (int r : {0, 1}) {
    const RankError& e = stopped.errors[static_cast<size_t>(r)];
    BOOST_TEST_CONTEXT("world rank " << r << ": " << e.message) {
      BOOST_TEST((e.status == Status::kPeerFailure));
      BOOST_TEST(contains(e.message, "parameter server 1 was lost with shard 1"));
      BOOST_TEST(contains(e.message, "no checkpoint to restore it from"));
    }
  }
}

// No replica, no checkpoint: every survivor stops with kPeerFailure naming the lost server and why, within the
// communicator's deadline.
BOOST_DATA_TEST_CASE(without_a_replica_or_checkpoint_every_survivor_stops_naming_the_server,
                     bdata::make({par::Strategy::kPs, par::Strategy::kPsAsync}), strategy) {
  const Outcome lost = run(ps_config(strategy, 0), 3, kServer1, 13);
  for (int r : {0, 1, 2}) {
    const RankError& e = lost.errors[static_cast<size_t>(r)];
    BOOST_TEST_CONTEXT(par::strategy_name(strategy) << ", world rank " << r << ": " << e.message) {
      BOOST_TEST((e.status == Status::kPeerFailure));
      BOOST_TEST(contains(e.message, "parameter server 1 was lost"));
      BOOST_TEST(contains(e.message, "no replica on a surviving server (0 replica(s) per shard)"));
      BOOST_TEST(contains(e.message, "no checkpoint to restore them from"));
      BOOST_TEST(lost.seconds[static_cast<size_t>(r)] < 4.0);
    }
  }
}

// ---- a second server loss (issue #17) ----

// 4 servers, one replica each: server 1 (world rank 3) is lost after step 3 and server 2 takes its shard over; after step 6
// -- the replicas long re-seeded over the 3 survivors -- server 2 (world rank 4), now holding shards 1 and 2, is lost
// too, and its new backup, server 3, takes both over. Synchronous ps ends where the uninterrupted run does.
BOOST_AUTO_TEST_CASE(a_second_server_lost_after_the_replicas_were_reseeded_is_survived_exactly) {
  const par::ParallelConfig p = servers_config(4, 1);
  const Outcome whole = run_losses(p, {}, 10);
  require_no_errors(whole.errors);
  const Outcome lost = run_losses(p, {{3, 3}, {4, 6}}, 10);
  require_exact(lost, whole, {0, 1, 2, 5});
  for (int r : {0, 1, 2, 5}) {
    BOOST_TEST((lost.members[static_cast<size_t>(r)] == std::vector<int>{0, 1, 2, 5}));
    BOOST_TEST(lost.servers[static_cast<size_t>(r)] == 2);
  }
  BOOST_TEST((lost.owned[2] == std::vector<int32_t>{0}));
  BOOST_TEST((sorted(lost.owned[5]) == std::vector<int32_t>{1, 2, 3}));
}

// A server lost between a replica's header and its payload (TANDEM_TEST_REFORM_LEAVE "3:replicating": server 1
// sends the header of its first update's replica, waits until its backup has taken it, and leaves). The backup had
// taken the header as the replica's and cleared its copy before the payload came, so it took the shard over with
// zeros as if they were clock 0's values (the flake of this suite's second-loss case under load: a second loss
// right between the two messages). It keeps its last complete copy now (the first re-seed): the workers redo step 1
// and synchronous ps ends where the uninterrupted run does.
BOOST_AUTO_TEST_CASE(a_server_lost_between_a_replica_s_header_and_payload_leaves_the_backup_its_last_copy) {
  const par::ParallelConfig p = ps_config(par::Strategy::kPs, 1);
  const Outcome whole = run_losses(p, {}, 6);
  require_no_errors(whole.errors);
  const settings::ScopedProcessValue hook("TANDEM_TEST_REFORM_LEAVE", "3:replicating");
  const Outcome lost = run_losses(p, {}, 6);
  BOOST_TEST(contains(lost.errors[kServer1].message, "left the job at point 'replicating'"), lost.errors[kServer1].message);
  require_exact(lost, whole, {0, 1, 2});
  for (int r : {0, 1, 2}) BOOST_TEST((lost.members[static_cast<size_t>(r)] == std::vector<int>{0, 1, 2}));
  BOOST_TEST((lost.owned[2] == std::vector<int32_t>{0, 1}));
}

// 4 servers, one replica each: server 1 (world rank 3) is lost after step 3 and server 2 (world rank 4) takes its shard
// over; right after the re-form commits on every survivor (TANDEM_TEST_REFORM_LEAVE "4:committed"), server 2 leaves
// too. Its backup, server 3 (world rank 5), had not taken the new view's replicas yet -- they were sent on entering
// the region and taken while serving -- so shards 1 and 2 had no complete copy and every survivor stopped naming
// them. The re-seed is part of the re-form's transaction now (acknowledged before the vote): server 3 takes both
// over and synchronous ps ends where the uninterrupted run does.
BOOST_AUTO_TEST_CASE(a_server_lost_right_after_a_re_form_commits_is_survived_exactly_from_the_re_seeded_replicas) {
  const par::ParallelConfig p = servers_config(4, 1);
  const Outcome whole = run_losses(p, {}, 10);
  require_no_errors(whole.errors);
  const settings::ScopedProcessValue hook("TANDEM_TEST_REFORM_LEAVE", "4:committed");
  const Outcome lost = run_losses(p, {{3, 3}}, 10, "", -1, "world rank(s) 4 lost");
  BOOST_TEST(contains(lost.errors[4].message, "left the job at point 'committed'"), lost.errors[4].message);
  require_exact(lost, whole, {0, 1, 2, 5});
  for (int r : {0, 1, 2, 5}) {
    BOOST_TEST((lost.members[static_cast<size_t>(r)] == std::vector<int>{0, 1, 2, 5}));
    BOOST_TEST(lost.logged[static_cast<size_t>(r)], "world rank " << r << " logs the second loss");
  }
  BOOST_TEST((lost.owned[2] == std::vector<int32_t>{0}));
  BOOST_TEST((sorted(lost.owned[5]) == std::vector<int32_t>{1, 2, 3}));
}

// 3 servers, two replicas each: servers 1 and 2 (world ranks 3 and 4) are lost at once; server 0 backs both up and
// takes both shards over. Synchronous ps ends where the uninterrupted run does.
BOOST_AUTO_TEST_CASE(two_servers_lost_at_once_are_survived_when_a_third_backs_both_up) {
  const par::ParallelConfig p = servers_config(3, 2);
  const Outcome whole = run_losses(p, {}, 8);
  require_no_errors(whole.errors);
  const Outcome lost = run_losses(p, {{3, 3}, {4, 3}}, 8);
  require_exact(lost, whole, {0, 1, 2});
  BOOST_TEST((sorted(lost.owned[2]) == std::vector<int32_t>{0, 1, 2}));
}

// 3 servers, one replica each: server 1 and its only backup, server 2, are lost at once. Shard 1 exists nowhere now:
// every survivor stops with kPeerFailure naming it (and not shard 2, whose backup on server 0 survived), in bounded
// time -- neither a hang nor a silent restart from wrong values.
BOOST_AUTO_TEST_CASE(a_shard_lost_with_its_only_replica_stops_every_survivor_naming_the_shard) {
  require_stopped_naming_shard_1(run_losses(servers_config(3, 1), {{3, 3}, {4, 3}}, 10));
}

// The same double loss with a checkpoint (written at step 2): every rank goes back to it, the surviving server takes
// every shard from it, and synchronous ps ends where the uninterrupted run does.
BOOST_AUTO_TEST_CASE(a_shard_lost_with_its_only_replica_comes_back_from_the_checkpoint) {
  const std::string path = temp_path("ps_double_loss");
  par::ParallelConfig p = servers_config(3, 1);
  p.elastic_checkpoint = path;
  const Outcome whole = run_losses(p, {}, 8);
  require_no_errors(whole.errors);
  const Outcome lost = run_losses(p, {{3, 4}, {4, 4}}, 8, path, 2, "every rank goes back to checkpoint");
  std::filesystem::remove(path);
  require_exact(lost, whole, {0, 1, 2});
  for (int r : {0, 1, 2}) BOOST_TEST(lost.logged[static_cast<size_t>(r)], "world rank " << r << " logs the restore");
  BOOST_TEST((sorted(lost.owned[2]) == std::vector<int32_t>{0, 1, 2}));
}

// ---- a second loss during a server re-form (issue #17: the re-form is a transaction) ----
// TANDEM_TEST_REFORM_LEAVE="rank:point" (parallel_trainer.cpp) makes a world rank leave the job at a point of the
// re-form the first loss started: "agreed" (the survivors have agreed on where everyone is; before, the shards moved
// at this point on every rank) or "voting" (the new view built and the shards sent to the workers, before the vote).
// The survivors' old view stays untouched until every one of them votes, so they abandon the attempt and re-form
// again from it over the smaller membership.

const auto kPoints = bdata::make({std::string("agreed"), std::string("voting")});

// ps over 4 servers, one replica each: server 1 (world rank 3) is lost after step 3; in the re-form that follows,
// server 3 (world rank 5), which backs up shard 2 and owns shard 3 (backed up on server 0), leaves too. The survivors
// re-form from the old view with both servers lost: server 2 takes shard 1 and server 0 shard 3, each from its
// replica, and synchronous ps ends where the uninterrupted run does; every survivor's log names both lost ranks.
BOOST_DATA_TEST_CASE(a_server_lost_during_a_server_re_form_is_survived_exactly, kPoints, point) {
  const par::ParallelConfig p = servers_config(4, 1);
  const Outcome whole = run_losses(p, {}, 10);
  require_no_errors(whole.errors);
  const settings::ScopedProcessValue hook("TANDEM_TEST_REFORM_LEAVE", ("5:" + point).c_str());
  const Outcome lost = run_losses(p, {{3, 3}}, 10, "", -1, "world rank(s) 3, 5 lost");
  BOOST_TEST_CONTEXT("point " << point) {
    require_exact(lost, whole, {0, 1, 2, 4});
    for (int r : {0, 1, 2, 4}) {
      BOOST_TEST((lost.members[static_cast<size_t>(r)] == std::vector<int>{0, 1, 2, 4}));
      BOOST_TEST(lost.servers[static_cast<size_t>(r)] == 2);
      BOOST_TEST(lost.logged[static_cast<size_t>(r)], "world rank " << r << " logs both losses");
    }
    BOOST_TEST((sorted(lost.owned[2]) == std::vector<int32_t>{0, 3}));
    BOOST_TEST((sorted(lost.owned[4]) == std::vector<int32_t>{1, 2}));
  }
}

struct SecondLoss {
  par::Strategy strategy;
  const char* point;
};
std::ostream& operator<<(std::ostream& os, const SecondLoss& c) {
  return os << par::strategy_name(c.strategy) << " at " << c.point;
}
const SecondLoss kWorkerLeaves[] = {{par::Strategy::kPs, "agreed"},      {par::Strategy::kPs, "voting"},
                                    {par::Strategy::kSsp, "agreed"},     {par::Strategy::kSsp, "voting"},
                                    {par::Strategy::kPsAsync, "agreed"}, {par::Strategy::kPsAsync, "voting"}};

// 2 workers and 2 servers, one replica each: server 1 (world rank 3) is lost after step 3, and worker 1 (world rank
// 1) leaves in the re-form that follows. Worker 0 and server 0 (which takes shard 1 from its replica) train on to
// step 14: the loss keeps falling, and both survivors' logs name both lost ranks.
BOOST_DATA_TEST_CASE(a_worker_lost_during_a_server_re_form_is_absorbed, bdata::make(kWorkerLeaves), c) {
  const settings::ScopedProcessValue hook("TANDEM_TEST_REFORM_LEAVE", (std::string("1:") + c.point).c_str());
  // ps-async at sgd_config's rate: its loss rose over the 14 steps in 2 of 10 runs beside another suite's run (its
  // gradients arrive staler under load), so it trains at absorb_test's rate for it
  const float lr = c.strategy == par::Strategy::kPsAsync ? 0.005f : 0.0f;
  const Outcome lost = run_losses(ps_config(c.strategy, 1), {{kServer1, 3}}, 14, "", -1, "world rank(s) 3, 1 lost",
                                  true, 2, lr);
  for (int r : {0, 2}) {
    const auto i = static_cast<size_t>(r);
    BOOST_TEST_CONTEXT(c << ", world rank " << r << ": " << lost.errors[i].message) {
      BOOST_TEST_REQUIRE((lost.errors[i].status == Status::kOk));
      BOOST_TEST((lost.members[i] == std::vector<int>{0, 2}));
      BOOST_TEST(lost.steps[i] == 14);
      BOOST_TEST(lost.logged[i], "the log names both lost ranks");
      BOOST_TEST(std::isfinite(lost.loss_end[i]));
      BOOST_TEST(lost.loss_end[i] < lost.loss_start[i]);
    }
  }
  BOOST_TEST((lost.owned[2] == std::vector<int32_t>{0, 1}));
}

// 3 servers, one replica each: server 1 (world rank 3) is lost after step 3, and in the re-form that follows server 2
// (world rank 4) -- the only other copy of shard 1 -- leaves too. Shard 1 exists nowhere now: every survivor stops
// with kPeerFailure naming it (and not shard 2, whose backup on server 0 survived), well within the deadline.
BOOST_DATA_TEST_CASE(a_second_loss_in_a_re_form_that_takes_a_shard_s_last_copy_stops_every_survivor_naming_it,
                     bdata::make({par::Strategy::kPs, par::Strategy::kSsp}) * kPoints, strategy, point) {
  const settings::ScopedProcessValue hook("TANDEM_TEST_REFORM_LEAVE", ("4:" + point).c_str());
  par::ParallelConfig p = servers_config(3, 1);
  p.strategy = strategy;
  BOOST_TEST_CONTEXT(par::strategy_name(strategy) << " at " << point) {
    require_stopped_naming_shard_1(run_losses(p, {{3, 3}}, 10));
  }
}

// The same with a checkpoint (written at step 2): the shard comes back from it -- every rank goes back to it -- and
// synchronous ps ends where the uninterrupted run does.
BOOST_AUTO_TEST_CASE(a_shard_s_last_copy_lost_in_a_re_form_comes_back_from_the_checkpoint) {
  const auto [whole, lost] = uninterrupted_and_restored(servers_config(3, 1), "ps_reform_loss", {{3, 4}}, 8, "4:agreed");
  require_exact(lost, whole, {0, 1, 2});
  for (int r : {0, 1, 2}) BOOST_TEST(lost.logged[static_cast<size_t>(r)], "world rank " << r << " logs the restore");
  BOOST_TEST((sorted(lost.owned[2]) == std::vector<int32_t>{0, 1, 2}));
}

// ---- a rank lost inside the vote itself: the vote completes on some survivors and not on others ----
// TANDEM_TEST_REFORM_LEAVE="R:voted": world rank R leaves right after its vote completed; the survivors above R see
// their vote cut off by that loss, those below commit. Every survivor must end with one view: when a survivor
// committed, the others adopt the view they had built (rolled forward), else all go on from the old one.

struct VoteCut {
  par::Strategy strategy;
  int leaves;        // world rank that leaves after its vote
  bool rolled;       // a survivor (below it) committed: the others roll forward
};
std::ostream& operator<<(std::ostream& os, const VoteCut& c) {
  return os << par::strategy_name(c.strategy) << ", world rank " << c.leaves << " leaves after its vote";
}
const VoteCut kVoteCuts[] = {{par::Strategy::kPs, 1, true},
                             {par::Strategy::kPs, 0, false},
                             {par::Strategy::kSsp, 1, true},
                             {par::Strategy::kPsAsync, 1, true}};

// 3 workers and 2 servers, one replica each: server 1 (world rank 4) is lost after step 3; in the re-form that
// follows, worker `leaves` leaves right after its vote. Leaving worker 1: worker 0 commits, worker 2 and server 0
// (world rank 3) do not -- they roll forward; leaving worker 0: nobody left committed -- all roll back. Either way the
// three survivors re-form once more, train on to step 10 and end with one state: the two workers hold the same
// parameters (ps; ssp and ps-async train on), the loss fell, every survivor logs both losses, server 0 owns both
// shards. Before the roll-forward every survivor stopped here ("hold another view").
BOOST_DATA_TEST_CASE(a_rank_lost_inside_the_vote_leaves_every_survivor_with_one_view, bdata::make(kVoteCuts), c) {
  const settings::ScopedProcessValue hook("TANDEM_TEST_REFORM_LEAVE", fmt::format("{}:voted", c.leaves).c_str());
  par::ParallelConfig p = ps_config(c.strategy, 1);
  p.elastic = true;
  std::vector<int> survivors;
  for (int r = 0; r < 4; ++r)
    if (r != c.leaves) survivors.push_back(r);
  // a rank that committed recovers from each loss apart; the others from both at once
  // ps-async applies each of the 3 workers' gradients whole: at sgd_config's rate it diverges now and then, lost
  // in the vote or not (1 run in 6 with only the server lost), so it trains at absorb_test's rate
  const float lr = c.strategy == par::Strategy::kPsAsync ? 0.005f : 0.0f;
  const Outcome lost = run_losses(p, {{4, 3}}, 10, "", -1,
                                  fmt::format("ranks go on (world ranks {})", fmt::join(survivors, ", ")), true, 3, lr);
  const std::string outcome = c.rolled ? "rolled forward" : "no survivor committed it";
  for (int r : survivors) {
    const auto i = static_cast<size_t>(r);
    BOOST_TEST_CONTEXT(c << ", world rank " << r << ": " << lost.errors[i].message) {
      BOOST_TEST_REQUIRE((lost.errors[i].status == Status::kOk));
      BOOST_TEST((lost.members[i] == survivors));
      BOOST_TEST(lost.steps[i] == 10);
      BOOST_TEST(lost.logged[i], "the log names the survivors");
      BOOST_TEST(logged(lost, r, fmt::format("{} lost", c.leaves)), "the log names the rank lost in the vote");
      BOOST_TEST(std::isfinite(lost.loss_end[i]));
      BOOST_TEST(lost.loss_end[i] < lost.loss_start[i]);
    }
  }
  // the survivors whose vote was cut off (above the leaving rank) say how it was settled; the others had nothing to
  // settle
  for (int r : survivors)
    BOOST_TEST(logged(lost, r, outcome) == (r > c.leaves), c << ", world rank " << r << " logs '" << outcome << "'");
  BOOST_TEST((lost.owned[3] == std::vector<int32_t>{0, 1}));
  const auto w0 = static_cast<size_t>(survivors[0]), w1 = static_cast<size_t>(survivors[1]);
  if (c.strategy == par::Strategy::kPs)
    BOOST_TEST(rel_diff(lost.params[w0], lost.params[w1]) == 0.0, "the workers' parameters differ");
}

// A server lost inside the vote: 2 workers and 4 servers, one replica each, a checkpoint at step 2. Server 1 (world rank
// 3) is lost after step 3; in the re-form, server 2 (world rank 4), which takes shard 1 over, leaves right after its
// vote: world ranks 0, 1 and 2 commit, server 3 (world rank 5) rolls forward. The re-seed is part of the re-form (every
// backup held its full replicas before it voted), so server 3 takes server 2's shards over from its replicas and
// nobody goes back to the checkpoint (they did before the re-seed was in the transaction); synchronous ps ends exactly
// where the uninterrupted run does. Before the roll-forward they stopped ("hold another view").
BOOST_AUTO_TEST_CASE(a_server_lost_inside_the_vote_is_survived_from_its_re_seeded_replicas) {
  // (world rank 5 logs "3, 4 lost": its first pass was cut off in the vote)
  const auto [whole, lost] =
      uninterrupted_and_restored(servers_config(4, 1), "ps_vote_server", {{3, 3}}, 10, "4:voted", "4 lost");
  require_exact(lost, whole, {0, 1, 2, 5});
  for (int r : {0, 1, 2, 5}) {
    BOOST_TEST((lost.members[static_cast<size_t>(r)] == std::vector<int>{0, 1, 2, 5}));
    BOOST_TEST(lost.logged[static_cast<size_t>(r)], "world rank " << r << " logs the loss in the vote");
    BOOST_TEST(!logged(lost, r, "goes back to checkpoint"), "world rank " << r << " restored the checkpoint");
    BOOST_TEST(logged(lost, r, "rolled forward") == (r == 5), "world rank " << r);
  }
  BOOST_TEST((sorted(lost.owned[5]) == std::vector<int32_t>{1, 2, 3}));
}

// ---- a further loss while the checkpoint is restored ----

// 2 workers and 3 servers, one replica each, a checkpoint at step 2: servers 1 and 2 (world ranks 3 and 4) are lost at
// once after step 4, so shard 1 has no copy left and server 0 takes every shard from the checkpoint -- empty until it
// is loaded; worker 1 leaves before that load completes. The next re-form must not take the empty shards as real:
// every survivor goes back to the checkpoint again (it logs so), and ends exactly where a run does that lost worker 1
// at step 2 and the servers at step 4 (the same restore at the same width, completed). Before the "restore due"
// state the survivors trained on from the empty shards, at step 4.
BOOST_AUTO_TEST_CASE(a_loss_before_the_checkpoint_is_restored_restores_it_again) {
  const std::string path = temp_path("ps_restore_due");
  par::ParallelConfig p = servers_config(3, 1);
  p.elastic_checkpoint = path;
  const Outcome whole = run_losses(p, {{1, 2}, {3, 4}, {4, 4}}, 8, path, 2, "every rank goes back to checkpoint");
  require_no_errors(whole.errors);
  const settings::ScopedProcessValue hook("TANDEM_TEST_REFORM_LEAVE", "1:restoring");
  const Outcome lost = run_losses(p, {{3, 4}, {4, 4}}, 8, path, 2, "did not complete: every rank goes back to it again");
  std::filesystem::remove(path);
  for (int r : {0, 2}) {
    const auto i = static_cast<size_t>(r);
    BOOST_TEST_CONTEXT("world rank " << r << ": " << lost.errors[i].message) {
      BOOST_TEST_REQUIRE((lost.errors[i].status == Status::kOk));
      BOOST_TEST((lost.members[i] == std::vector<int>{0, 2}));
      BOOST_TEST(lost.steps[i] == 8);
      BOOST_TEST(lost.logged[i], "the survivor logs the second restore");
      BOOST_TEST(whole.logged[i]);
    }
  }
  // worker 0 went back to the checkpoint's step 2 after the loss (the step() in flight ended at step 3 again, not one
  // past the step before it); one step() call more than steps
  const std::vector<int64_t>& trail = lost.trail[0];
  const bool back = std::adjacent_find(trail.begin(), trail.end(), [](int64_t a, int64_t b) { return b != a + 1; }) !=
                    trail.end();
  BOOST_TEST(back, "worker 0's steps never went back: " << fmt::format("{}", fmt::join(trail, ", ")));
  BOOST_TEST(trail.size() == 9u, fmt::format("{}", fmt::join(trail, ", ")));
  BOOST_TEST((sorted(lost.owned[2]) == std::vector<int32_t>{0, 1, 2}));
  BOOST_TEST(rel_diff(lost.params[0], whole.params[0]) <= 1e-6, "max relative difference "
                                                                    << rel_diff(lost.params[0], whole.params[0]));
}

// Below min_ranks after the second loss: 2 workers and 2 servers with min_ranks 3 lose server 1 (world rank 3), and
// worker 1 (world rank 1) in the re-form. The 2 survivors re-form, write the checkpoint and stop with kPeerFailure
// naming both lost ranks, the minimum and the checkpoint; the checkpoint is on disk.
BOOST_AUTO_TEST_CASE(below_min_ranks_after_a_loss_in_a_re_form_every_survivor_stops_with_a_checkpoint) {
  const std::string path = temp_path("ps_reform_min");
  par::ParallelConfig p = ps_config(par::Strategy::kPs, 1);
  p.min_ranks = 3;
  p.elastic_checkpoint = path;
  const settings::ScopedProcessValue hook("TANDEM_TEST_REFORM_LEAVE", "1:agreed");
  const Outcome lost = run_losses(p, {{kServer1, 3}}, 10);
  const bool written = std::filesystem::exists(path);
  std::filesystem::remove(path);
  for (int r : {0, 2}) {
    const RankError& e = lost.errors[static_cast<size_t>(r)];
    BOOST_TEST_CONTEXT("world rank " << r << ": " << e.message) {
      BOOST_TEST((e.status == Status::kPeerFailure));
      BOOST_TEST(contains(e.message, "world rank(s) 3, 1 lost"));
      BOOST_TEST(contains(e.message, "below min_ranks 3"));
      BOOST_TEST(contains(e.message, "checkpoint '" + path + "' holds step"));
      BOOST_TEST(lost.seconds[static_cast<size_t>(r)] < 15.0);
    }
  }
  BOOST_TEST(written);
}

// The job compiler's fail-over: 3 servers with one replica each; server 1 lost: its shard goes to server 2 (its
// backup), renumbered 1; the pieces follow; the memory grows by the taken shard; with no replica it is refused, and
// with any_survivor the next surviving server takes it.
// Asynchronous EASGD restored from a checkpoint after a server loss: the centre cut again over the survivors, server
// k owning shard k (its exchange's pairing), each bucket's pieces re-cut along the new ranges, the memory re-sized.
BOOST_AUTO_TEST_CASE(the_job_compiler_cuts_the_easgd_centre_again_over_the_surviving_servers) {
  par::Job job = three_servers_one_replica();
  job.parallel.strategy = par::Strategy::kEasgd;
  job.parallel.easgd_async = true;
  job.parallel.server_replicas = 0;
  job.parallel.elastic = false;
  par::CompiledJob cj = par::compile_job(job, 5);
  BOOST_TEST_REQUIRE(cj.sync.servers == 3);
  const int64_t total = cj.sync.shards.back().end;
  std::vector<int32_t> buckets;
  for (const par::BucketPiece& piece : cj.sync.pieces)
    if (buckets.empty() || buckets.back() != piece.bucket) buckets.push_back(piece.bucket);
  par::reshard_servers(cj.sync, 2, job.optimizer);
  BOOST_TEST(cj.sync.servers == 2);
  BOOST_TEST_REQUIRE(cj.sync.shards.size() == 2u);
  const std::vector<par::KeyRange> expected = par::shard_key_ranges(total, 2);
  for (size_t k = 0; k < 2; ++k) {
    BOOST_TEST(cj.sync.shards[k].server == static_cast<int32_t>(k));
    BOOST_TEST(cj.sync.shards[k].begin == expected[k].begin);
    BOOST_TEST(cj.sync.shards[k].end == expected[k].end);
  }
  BOOST_TEST(cj.sync.server_memory.size() == 2u);
  // the pieces cover every key once, bucket by bucket in the same order as before, each inside its server's shard
  std::vector<std::pair<int64_t, int64_t>> spans;
  std::vector<int32_t> after;
  for (const par::BucketPiece& piece : cj.sync.pieces) {
    if (after.empty() || after.back() != piece.bucket) after.push_back(piece.bucket);
    const par::KeyRange& r = cj.sync.shards[static_cast<size_t>(piece.server)];
    BOOST_TEST((piece.begin >= r.begin && piece.end <= r.end && piece.begin < piece.end));
    spans.emplace_back(piece.begin, piece.end);
  }
  std::sort(spans.begin(), spans.end());
  int64_t at = 0;
  for (const auto& [b, e] : spans) {
    BOOST_TEST(b == at);
    at = e;
  }
  BOOST_TEST(at == total);
  BOOST_TEST((after == buckets));
  BOOST_CHECK_THROW(par::reshard_servers(cj.sync, 0, job.optimizer), Error);
}

BOOST_AUTO_TEST_CASE(the_job_compiler_moves_a_lost_shard_to_its_backup) {
  const par::Job job = three_servers_one_replica();
  par::CompiledJob cj = par::compile_job(job, 5);
  BOOST_TEST(cj.sync.replicas == 1);
  BOOST_TEST((par::replica_servers(2, 3, 1) == std::vector<int32_t>{0}));
  BOOST_TEST((par::replica_servers(0, 3, 5) == std::vector<int32_t>{1, 2}));  // at most servers - 1
  BOOST_TEST(cj.sync.replica_bytes_per_update[0] == 8.0 * static_cast<double>(cj.sync.shards[0].size()));
  // server 1 keeps server 0's backup: its param bytes are two shards' worth
  BOOST_TEST(cj.sync.server_memory[1].param_bytes ==
             4.0 * static_cast<double>(cj.sync.shards[1].size() + cj.sync.shards[0].size()));
  const double before = cj.sync.server_memory[2].param_bytes;
  par::CompiledJob none = cj;
  par::fail_over_servers(cj, {1}, false);
  BOOST_TEST(cj.sync.servers == 2);
  BOOST_TEST(cj.world == 4);
  BOOST_TEST(cj.sync.shards[0].server == 0);
  BOOST_TEST(cj.sync.shards[1].server == 1);
  BOOST_TEST(cj.sync.shards[2].server == 1);
  for (const par::BucketPiece& piece : cj.sync.pieces)
    BOOST_TEST(piece.server == (piece.begin >= cj.sync.shards[1].begin ? 1 : 0));
  BOOST_TEST(cj.sync.server_memory[1].param_bytes > before);
  none.sync.replicas = 0;
  BOOST_CHECK_EXCEPTION(par::fail_over_servers(none, {1}, false), Error, [](const Error& e) {
    return e.status() == Status::kPeerFailure && contains(e.what(), "parameter server 1 was lost") &&
           contains(e.what(), "no surviving replica");
  });
  par::fail_over_servers(none, {0}, true);  // from a checkpoint: the next surviving server, 1 (renumbered 0)
  BOOST_TEST(none.sync.shards[0].server == 0);
  BOOST_TEST(none.sync.shards[2].server == 1);
}

// A job growing after a server loss (issue #17) compiles over the servers running now and adopts the running
// ownership: the program of 2 servers takes the fail-over's shards and pieces, sized by the compiler's code as
// fail_over_servers sized them; tables that do not fit are refused naming the entry.
BOOST_AUTO_TEST_CASE(a_grown_job_adopts_the_ownership_after_a_fail_over) {
  const par::Job job = three_servers_one_replica();
  par::CompiledJob failed = par::compile_job(job, 5);
  par::fail_over_servers(failed, {1}, false);  // 2 workers, servers {0}, {1, 2}
  par::Job grown = job;
  grown.parallel.servers = 2;
  grown.parallel.server_replicas = failed.sync.replicas;
  par::CompiledJob cj = par::compile_job(grown, 5);  // 3 workers, 2 servers
  BOOST_TEST(cj.sync.workers == 3);
  par::adopt_ownership(cj.sync, failed.sync.shards, failed.sync.pieces, failed.sync.replicas, job.optimizer);
  BOOST_TEST(cj.sync.shards.size() == 3u);
  BOOST_TEST(cj.sync.shards[2].server == 1);
  BOOST_TEST(cj.sync.pieces.size() == failed.sync.pieces.size());
  for (int s = 0; s < 2; ++s) {  // the servers hold what they held, whatever the workers
    BOOST_TEST(cj.sync.server_memory[static_cast<size_t>(s)].param_bytes ==
               failed.sync.server_memory[static_cast<size_t>(s)].param_bytes);
    BOOST_TEST(cj.sync.replica_bytes_per_update[static_cast<size_t>(s)] ==
               failed.sync.replica_bytes_per_update[static_cast<size_t>(s)]);
  }
  std::vector<par::KeyRange> bad = failed.sync.shards;
  bad[1].server = 2;  // no such server among 2
  BOOST_CHECK_EXCEPTION(
      par::adopt_ownership(cj.sync, bad, failed.sync.pieces, 1, job.optimizer), Error, [](const Error& e) {
        return e.status() == Status::kInvalidArgument && contains(e.what(), "shard 1") && contains(e.what(), "server 2");
      });
}

// Bad settings get a clear error before any communication.
BOOST_AUTO_TEST_CASE(bad_replica_settings_are_refused_naming_the_flag) {
  const auto refused = [](par::ParallelConfig p, int world, Status status, const std::string& part) {
    try {
      par::resolve_grid(p, world, 0, 8, 4);
    } catch (const Error& e) {
      BOOST_TEST_CONTEXT(e.what()) {
        BOOST_TEST((e.status() == status));
        BOOST_TEST(contains(e.what(), part));
      }
      return;
    }
    BOOST_ERROR("accepted: " << part);
  };
  par::ParallelConfig p = ps_config(par::Strategy::kPs, 2);  // 2 servers: at most 1 replica
  refused(p, 4, Status::kInvalidArgument, "at most servers - 1 = 1 replicas");
  p.server_replicas = -1;
  refused(p, 4, Status::kInvalidArgument, "--server-replicas must be >= 0");
  p = ps_config(par::Strategy::kPs, 1);
  p.servers = 1;
  refused(p, 3, Status::kInvalidArgument, "at most servers - 1 = 0 replicas");
  p = ps_config(par::Strategy::kPs, 1);
  p.elastic = false;
  refused(p, 4, Status::kInvalidArgument, "needs --elastic");
  p.strategy = par::Strategy::kDdp;
  refused(p, 4, Status::kInvalidArgument, "strategy ddp has no parameter servers");
  p = ps_config(par::Strategy::kEasgd, 1);
  p.easgd_async = true;
  refused(p, 4, Status::kUnsupported, "asynchronous EASGD centre is not replicated");
  p = ps_config(par::Strategy::kSsp, 1);
  par::resolve_grid(p, 4, 0, 8, 4);  // accepted
}

// Server 1 (world rank 3) is lost inside the first epoch's save, before it sends its shard's optimizer state (the
// chaos benchmark's "DEFECT blamed": the saving ranks met the loss in the save and stopped while the others re-formed
// without them). The save is given up on every survivor, with no file written; they re-form at the next step, server
// 0 taking the lost shard over from its replica, and train the second epoch, whose save writes the file.
BOOST_AUTO_TEST_CASE(a_server_lost_inside_a_save_is_absorbed_at_the_next_step) {
  const SaveFaultRun run = two_epochs_saving_with("3:1:leave");
  BOOST_TEST(contains(run.errors[3].message, "TANDEM_TEST_SAVE_FAULT"), run.errors[3].message);
  require_survivors_finished(run);
  for (int r : {0, 1, 2}) BOOST_TEST((run.members[static_cast<size_t>(r)] == std::vector<int>{0, 1, 2}));
  BOOST_TEST((sorted(run.owned[2]) == std::vector<int32_t>{0, 1}));
  BOOST_TEST(run.meta.at("parallel").at("servers").get<int>() == 1);
}

// Server 1 stalls inside the first epoch's save for 6 s, past the 4 s deadline, and then goes on (a stopped process
// continued): the others time out in the save's gather and give it up; they re-form at the next step, without the
// stalled server (it missed the survivors' agreement: its own next operation names that), and finish.
BOOST_AUTO_TEST_CASE(a_server_stalled_inside_a_save_drops_no_other_rank) {
  const SaveFaultRun run = two_epochs_saving_with("3:1:6");
  require_survivors_finished(run);
  const RankError& stalled = run.errors[3];
  BOOST_TEST(((stalled.status == Status::kOk && run.members[3].size() == 4u) ||
              contains(stalled.message, "declared dead")),
             stalled.message);
}

BOOST_AUTO_TEST_SUITE_END()
