// Issue #17: what an elastic parameter-server job does beside its pushes and pulls, as the compiled job describes
// it (SyncProgram::replica_bytes_per_param, join_check_every) and the runtime runs it (ParameterServerSync::replicate,
// ParallelTrainer::maybe_admit): server-to-server replicas with their acknowledgements, and worker 0's joiner check.
// Closed forms on a star of known rates (simulator/strategy.hpp's executor), then the job compiler's figures end to
// end.
#include <algorithm>

#include <boost/test/unit_test.hpp>

#include "engine/parallel/job.hpp"
#include "simulator/simulate.hpp"
#include "simulator/strategy.hpp"

using namespace tandem::simulator;
using namespace tandem::engine;
namespace tt = boost::test_tools;

namespace {

// `workers` workers and `servers` servers, one bucket of `params` elements cut along the balanced shards (as
// compile_job cuts it), each shard backed up on the next `replicas` servers with `per_param` bytes per parameter
// (values and momentum: 8); no compute.
StrategySetup replicated(int32_t workers, int32_t servers, int64_t params, int32_t staleness, int32_t replicas,
                         double per_param = 8) {
  StrategySetup s;
  s.sync.exchange = parallel::Exchange::kPushPull;
  s.sync.workers = workers;
  s.sync.servers = servers;
  s.sync.staleness = staleness;
  s.sync.replicas = replicas;
  s.sync.replica_bytes_per_param = replicas > 0 ? per_param : 0.0;
  s.sync.shards = parallel::shard_key_ranges(params, servers);
  for (const parallel::KeyRange& r : s.sync.shards) s.sync.pieces.push_back({0, r.server, r.begin, r.end});
  s.param_bytes = 4.0 * static_cast<double>(params);
  s.ranks.resize(static_cast<size_t>(workers + servers));
  for (RankSetup& rs : s.ranks) rs.forward_s = {0}, rs.backward_s = {0}, rs.bucket_backward_s = {0};
  return s;
}

StepResult on_star(const StrategySetup& s, double nic, double latency = 0) {
  std::vector<network::HostNet> h(s.ranks.size());
  for (auto& x : h) x.nic_bytes_per_s = nic, x.nic_latency_s = latency;
  des::Simulator sim;
  network::Network net(sim);
  network::Topology topo(network::TopologySpec{}, h, net);
  return simulate_async_steps(s, topo, sim);
}

constexpr double kHeader = parallel::kPsHeaderBytes;

}  // namespace

BOOST_AUTO_TEST_SUITE(ps_actions)

// ps, 2 workers, 2 servers each backing up the other (n parameters a shard, 4n bytes): a step pushes (W 4n bytes
// into each server, 4n W / nic), applies, and only then -- the runtime's release_withheld waits for the backups'
// acknowledgement -- sends the replica (a header + 8n bytes, over the owner's uplink and the backup's downlink) and
// takes back the acknowledgement (a header), before the pulls (W 4n / nic). With a one-way latency L per message:
//   step = 2 W 4n / nic + 2 L                       (no replicas)
//        + (8n + 2 header) / nic + 2 L              (the replica's round trip)
// and each server sends per step its pulls, its replica and its acknowledgement of the other's:
//   W 4n + (8n + header) + header = W 4n + replica_bytes_per_update + 2 header.
BOOST_AUTO_TEST_CASE(ps_pulls_wait_for_the_replica_round_trip) {
  const int32_t W = 2, S = 2;
  const int64_t P = 1000000;
  const double n = static_cast<double>(P) / S;
  for (const double nic : {1e8, 8e6}) {  // 800 Mbit/s, and a t2.micro-like slow link (64 Mbit/s)
    for (const double L : {0.0, 1e-3}) {
      const StepResult plain = on_star(replicated(W, S, P, 0, 0), nic, L);
      const StepResult rep = on_star(replicated(W, S, P, 0, 1), nic, L);
      BOOST_TEST(plain.step_s == 2 * W * 4 * n / nic + 2 * L, tt::tolerance(1e-6));
      BOOST_TEST(rep.step_s - plain.step_s == (8 * n + 2 * kHeader) / nic + 2 * L, tt::tolerance(1e-6));
      for (int32_t s = 0; s < S; ++s) {
        const auto r = static_cast<size_t>(W + s);
        BOOST_TEST(rep.nic_out_bytes[r] == W * 4 * n + 8 * n + 2 * kHeader, tt::tolerance(1e-12));
        BOOST_TEST(rep.nic_in_bytes[r] == W * 4 * n + 8 * n + 2 * kHeader, tt::tolerance(1e-12));
        BOOST_TEST(rep.nic_out_bytes[r] - plain.nic_out_bytes[r] == 8 * n + 2 * kHeader, tt::tolerance(1e-12));
      }
      // the workers' bytes do not change, their wait does
      BOOST_TEST(rep.nic_out_bytes[0] == plain.nic_out_bytes[0]);
      BOOST_TEST(rep.ranks[0].comm_exposed_s == rep.step_s, tt::tolerance(1e-6));
    }
  }
}

// Two backups per shard (3 servers): each update goes to both, and the pull waits for the slower acknowledgement.
// Every server sends two replicas and receives two (its uplink and its downlink each carry 2 (8n + header)), then
// takes two acknowledgements on its downlink: 2 (8n + header) / nic + 2 header / nic added.
BOOST_AUTO_TEST_CASE(ps_with_two_backups_sends_each_update_twice) {
  const int32_t W = 1, S = 3;
  const int64_t P = 300000;
  const double n = static_cast<double>(P) / S, nic = 1e8;
  const StepResult plain = on_star(replicated(W, S, P, 0, 0), nic);
  const StepResult rep = on_star(replicated(W, S, P, 0, 2), nic);
  BOOST_TEST(rep.step_s - plain.step_s == (2 * (8 * n + kHeader) + 2 * kHeader) / nic, tt::tolerance(1e-6));
  for (int32_t s = 0; s < S; ++s)
    BOOST_TEST(rep.nic_out_bytes[static_cast<size_t>(W + s)] == W * 4 * n + 2 * (8 * n + kHeader) + 2 * kHeader,
               tt::tolerance(1e-12));
}

// ps-async replicates every update (one per push: W per piece per step) and answers at once; ssp replicates each
// applied clock (one per piece per step) and waits only for clock c - staleness, long acknowledged: the bytes per
// step follow, and ssp's pulls do not wait for a round trip when the links are otherwise idle.
BOOST_AUTO_TEST_CASE(async_and_ssp_replicate_per_update) {
  const int32_t W = 3, S = 2;
  const int64_t P = 200000;
  const double n = static_cast<double>(P) / S, nic = 1e8;
  StrategySetup a = replicated(W, S, P, -1, 1);
  a.steps = 6;
  const StepResult ra = on_star(a, nic);
  for (int32_t s = 0; s < S; ++s)
    BOOST_TEST(ra.nic_out_bytes[static_cast<size_t>(W + s)] == W * 4 * n + W * (8 * n + kHeader) + W * kHeader,
               tt::tolerance(1e-12));
  StrategySetup y = replicated(W, S, P, 2, 1);
  y.steps = 8;
  const StepResult ry = on_star(y, nic);
  for (int32_t s = 0; s < S; ++s)
    BOOST_TEST(ry.nic_out_bytes[static_cast<size_t>(W + s)] == W * 4 * n + (8 * n + kHeader) + kHeader,
               tt::tolerance(1e-12));
  // with compute long enough for the replica to leave between steps, ssp's step is the compute plus its exchange
  StrategySetup slow = replicated(W, S, P, 2, 1);
  StrategySetup none = replicated(W, S, P, 2, 0);
  for (StrategySetup* s : {&slow, &none}) {
    s->steps = 8;
    for (int32_t w = 0; w < W; ++w) s->ranks[static_cast<size_t>(w)].forward_s = {0.05};
  }
  BOOST_TEST(on_star(slow, nic).step_s == on_star(none, nic).step_s, tt::tolerance(1e-9));
}

// The joiner check: every join_check_every steps worker 0 reads the store before its step (join_check_s). Under ps
// every worker waits for it (the next clock needs worker 0's push); under ps-async only worker 0 does.
BOOST_AUTO_TEST_CASE(the_joiner_check_holds_only_worker_0_unless_the_exchange_is_synchronous) {
  const int32_t W = 2, K = 8;
  const double t = 0.01, c = 0.002;
  for (const int32_t staleness : {0, -1}) {
    for (const int32_t every : {0, 1, 2}) {
      StrategySetup s = replicated(W, 1, 10, staleness, 0);  // 40 bytes: nanoseconds on the wire
      s.steps = K;
      s.sync.join_check_every = every;
      s.join_check_s = c;
      for (int32_t w = 0; w < W; ++w) s.ranks[static_cast<size_t>(w)].forward_s = {t};
      const StepResult r = on_star(s, 1e9);
      const double checks = every == 0 ? 0 : K / every;
      // (each 40-byte push and pull adds some 0.1 us a step)
      BOOST_TEST(r.ranks[0].finish_s * K == K * t + checks * c, tt::tolerance(1e-4));
      BOOST_TEST(r.ranks[0].comm_exposed_s * K >= checks * c * (1 - 1e-6));
      const double other = staleness == 0 ? K * t + checks * c : K * t;
      BOOST_TEST(r.ranks[1].finish_s * K == other, tt::tolerance(1e-4));
    }
  }
}

// End to end: the job compiler's figures reach the executor. Elastic ps with 2 servers and one replica on c5.large
// nodes: each server's NIC carries per step its replica (replica_bytes_per_update) and two headers more, and the step
// is longer; a job that may grow (elastic, max_ranks) checks for joiners every join_poll_steps steps.
BOOST_AUTO_TEST_CASE(the_compiled_jobs_replicas_are_timed_end_to_end) {
  const ClusterSpec c = cluster_from_json({{"nodes", {{{"preset", "c5.large"}, {"count", 4}, {"nic_gbps", 0.8},
                                                       {"nic_latency_us", 0}, {"mem_gbps", 1e6},
                                                       {"protocol", "rdma"}}}}});
  JobSpec j;
  j.model = "lenet5";
  j.dataset = "fashion-mnist";
  j.batch = 32;
  j.epochs = 0.1;
  j.strategy = Strategy::kPs;
  j.servers = 2;
  j.bucket_mb = 1000;
  j.elastic = true;
  const SimResult plain = simulate(c, j, {.baseline = false});
  j.server_replicas = 1;
  const SimResult rep = simulate(c, j, {.baseline = false});
  const parallel::SyncProgram& sync = rep.job->sync;
  BOOST_TEST(sync.replicas == 1);
  BOOST_TEST(sync.replica_bytes_per_param == 8.0);  // f32 values + momentum
  BOOST_TEST(sync.replica_bytes_per_update[0] == 8.0 * static_cast<double>(sync.shards[0].size()));
  BOOST_TEST(rep.busiest_nic_bytes - plain.busiest_nic_bytes == sync.replica_bytes_per_update[rep.busiest_nic_rank - 2] + 2 * kHeader,
             tt::tolerance(1e-9));
  BOOST_TEST(rep.step_time_s > plain.step_time_s);
  BOOST_TEST(rep.note.find("server replication timed") != std::string::npos, rep.note);
  BOOST_TEST(sync.join_check_every == 0);  // no bound to grow to: no check
  BOOST_TEST(rep.note.find("joiner check") == std::string::npos, rep.note);
  // the job compiler's joiner check follows the trainer's rule (ParallelTrainer::grows_workers)
  j.max_ranks = 6;
  j.join_poll_steps = 5;
  const SimResult grows = simulate(c, j, {.baseline = false});
  BOOST_TEST(grows.job->sync.join_check_every == 5);
  BOOST_TEST(grows.note.find("a joiner check every 5 step(s)") != std::string::npos, grows.note);
  parallel::Job job = grows.job->job;
  job.parallel.elastic = false;
  job.parallel.server_replicas = 0;
  BOOST_TEST(parallel::compile_job(job, 4).sync.join_check_every == 0);  // not elastic: never grows
}

BOOST_AUTO_TEST_SUITE_END()
