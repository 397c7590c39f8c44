// The strategies of issue #13 (simulator/strategy.hpp): parameter servers (sync, async, bounded staleness),
// local SGD, EASGD, gossip and FedAvg, checked against closed forms on a star of known rates.
#include <algorithm>
#include <cmath>
#include <functional>

#include <boost/test/unit_test.hpp>

#include "engine/core/error.hpp"
#include "engine/parallel/fedavg.hpp"
#include "simulator/compute/step_noise.hpp"
#include "simulator/simulate.hpp"
#include "simulator/strategy.hpp"

using namespace tandem::simulator;
using namespace tandem::engine;
namespace tt = boost::test_tools;

namespace {

constexpr double kNic = 1e8;  // bytes/s each way, no latency

// A push-pull program: `workers` workers, `servers` servers, one bucket of `params` elements cut along the
// balanced shards (as compile_job cuts it).
StrategySetup push_pull(int32_t workers, int32_t servers, int64_t params, int32_t staleness) {
  StrategySetup s;
  s.sync.exchange = parallel::Exchange::kPushPull;
  s.sync.workers = workers;
  s.sync.servers = servers;
  s.sync.staleness = staleness;
  s.sync.shards = parallel::shard_key_ranges(params, servers);
  for (const parallel::KeyRange& r : s.sync.shards) s.sync.pieces.push_back({0, r.server, r.begin, r.end});
  s.param_bytes = 4.0 * static_cast<double>(params);
  for (int32_t r = 0; r < workers + servers; ++r) {
    RankSetup rs;
    rs.forward_s = {0};
    rs.backward_s = {0};
    rs.bucket_backward_s = {0};
    s.ranks.push_back(rs);
  }
  return s;
}

// `set`, where given, sets more of each host's link figures.
StepResult run_on_star(const StrategySetup& s, int32_t hosts, double nic = kNic,
                       const std::function<void(network::HostNet&)>& set = {}) {
  std::vector<network::HostNet> h(static_cast<size_t>(hosts));
  for (auto& x : h) {
    x.nic_bytes_per_s = nic;
    if (set) set(x);
  }
  des::Simulator sim;
  network::Network net(sim);
  network::Topology topo(network::TopologySpec{}, h, net);
  return s.sync.exchange == parallel::Exchange::kRound ? simulate_rounds(s, topo, sim) : simulate_async_steps(s, topo, sim);
}

// Workers' compute per step: forward t/3, backward 2t/3 (one bucket).
void set_compute(StrategySetup& s, int32_t rank, double t) {
  RankSetup& r = s.ranks[static_cast<size_t>(rank)];
  r.forward_s = {t / 3};
  r.backward_s = {2 * t / 3};
  r.bucket_backward_s = {2 * t / 3};
}

// A cluster of identical c5.large nodes (one slower by `slow` in compute) with known NICs and no latency; memory
// so fast that local reductions and optimizer passes are negligible against the network.
ClusterSpec star(int32_t count, double slow_peak_factor = 1) {
  nlohmann::json nodes = nlohmann::json::array();
  nlohmann::json fast = {{"preset", "c5.large"}, {"count", slow_peak_factor == 1 ? count : count - 1}, {"nic_gbps", 0.8},
                         {"nic_latency_us", 0}, {"mem_gbps", 1e6}, {"kernel_overhead_us", 0},
                         {"protocol", "rdma"}};  // the closed forms count payload at the NIC rate (no TCP costs)
  nodes.push_back(fast);
  if (slow_peak_factor != 1) {
    nlohmann::json slow = fast;
    slow["count"] = 1;
    slow["peak_gflops"] = find_preset("c5.large").peak_flops / 1e9 * slow_peak_factor;
    nodes.push_back(slow);
  }
  return cluster_from_json({{"nodes", nodes}});
}

JobSpec lenet(Strategy s) {
  JobSpec j;
  j.model = "lenet5";
  j.dataset = "fashion-mnist";
  j.batch = 32;
  j.epochs = 0.1;
  j.strategy = s;
  j.bucket_mb = 1000;  // one bucket
  return j;
}

// Every rank on a node of its own with `share`.
void own_nodes(StrategySetup& s, CpuShare share) {
  s.node_of_rank.clear();
  for (size_t r = 0; r < s.ranks.size(); ++r) s.node_of_rank.push_back(static_cast<int32_t>(r));
  s.node_cpu.assign(s.ranks.size(), share);
}

double model_bytes(const SimResult& r) { return r.job->stages.front().memory.param_bytes; }

// Whether parse_cluster refuses the JSON `j` with a message containing `what`.
bool refused(const std::string& j, const std::string& what) {
  try {
    parse_cluster(j);
  } catch (const std::exception& e) {
    return std::string(e.what()).find(what) != std::string::npos;
  }
  return false;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(strategies)

// (a) Synchronous PS: every worker pushes its piece of a server's shard through that server's NIC (incast), then
// pulls it back the same way: 2 x workers x shard bytes / NIC rate. Two servers halve it.
BOOST_AUTO_TEST_CASE(sync_ps_incast_is_workers_times_shard_over_the_server_nic) {
  const int32_t W = 4;
  const int64_t P = 1000000;
  double one = 0;
  for (int32_t S : {1, 2}) {
    const StepResult r = run_on_star(push_pull(W, S, P, 0), W + S);
    const double shard = 4.0 * static_cast<double>(P) / S;
    BOOST_TEST(r.step_s == 2 * W * shard / kNic, tt::tolerance(0.01));
    for (int32_t w = 0; w < W; ++w) BOOST_TEST(r.ranks[static_cast<size_t>(w)].comm_exposed_s == r.step_s, tt::tolerance(0.01));
    for (int32_t s = 0; s < S; ++s) {
      BOOST_TEST(r.nic_in_bytes[static_cast<size_t>(W + s)] == W * shard, tt::tolerance(1e-9));
      BOOST_TEST(r.nic_out_bytes[static_cast<size_t>(W + s)] == W * shard, tt::tolerance(1e-9));
    }
    if (S == 1) one = r.step_s;
    else BOOST_TEST(r.step_s == one / 2, tt::tolerance(0.01));
  }
  // shard imbalance shows: a server holding 3/4 of the parameters sets the time
  StrategySetup uneven = push_pull(W, 2, P, 0);
  uneven.sync.shards = {{0, 0, 3 * P / 4}, {1, 3 * P / 4, P}};
  uneven.sync.pieces = {{0, 0, 0, 3 * P / 4}, {0, 1, 3 * P / 4, P}};
  BOOST_TEST(run_on_star(uneven, W + 2).step_s == 2 * W * 3.0 * P / kNic, tt::tolerance(0.01));
}

// The servers' optimizer runs once per piece per step (synchronous) after every push, in series with the pulls.
BOOST_AUTO_TEST_CASE(sync_ps_server_update_sits_between_push_and_pull) {
  StrategySetup s = push_pull(2, 1, 1000000, 0);
  s.ranks[2].optimizer_s = 0.05;
  const StepResult r = run_on_star(s, 3);
  BOOST_TEST(r.step_s == 2 * 2 * 4e6 / kNic + 0.05, tt::tolerance(0.01));
  BOOST_TEST(r.ranks[2].compute_s == 0.05, tt::tolerance(1e-6));
}

// (c) SSP as the runtime runs it (engine/parallel/param_server.cpp): a piece applies clock c once every worker's
// push of c is in, and the reply to a push of clock c is withheld until clock c - S is applied; a worker starts
// its next step when it has its pulls (no gate at the start of a step). With one worker 2x slower (2t a step) and
// negligible messages, the slow worker pushes clock c at 2tc and is never held; a fast one pushes clock c at
// end_{c-1} + t and gets its pull at end_c = max(end_{c-1} + t, 2t (c - S)), the slow worker's push of c - S.
// ps-async: the fast workers never wait for the slow one; ps (S = 0): everyone waits for the slow worker, the wait
// counted as exposed communication.
BOOST_AUTO_TEST_CASE(ssp_withheld_pulls_match_the_closed_form) {
  const double t = 0.01;
  const int32_t K = 24;
  for (int32_t S : {1, 2, 4}) {
    StrategySetup s = push_pull(3, 1, 10, S);
    s.steps = K;
    set_compute(s, 0, t);
    set_compute(s, 1, t);
    set_compute(s, 2, 2 * t);
    const StepResult r = run_on_star(s, 4);
    double end = 0, wait = 0;
    for (int32_t c = 1; c <= K; ++c) {
      const double pushed = end + t;
      end = std::max(pushed, 2 * t * (c - S));
      wait += end - pushed;
    }
    BOOST_TEST_INFO("S = " << S);
    BOOST_TEST(wait > 0);
    BOOST_TEST(r.ranks[0].staleness_wait_s * K == wait, tt::tolerance(0.01));
    BOOST_TEST(r.ranks[1].staleness_wait_s * K == wait, tt::tolerance(0.01));
    BOOST_TEST(r.ranks[0].finish_s * K == end, tt::tolerance(0.01));
    BOOST_TEST(r.ranks[2].staleness_wait_s == 0.0);
    BOOST_TEST(r.step_s == 2 * t, tt::tolerance(0.01));  // the slow worker sets the pace
    // a fast worker is never more than S + 1 clocks of the slow one's pace ahead: its clock c ends no earlier
    // than the slow worker's push of c - S
    BOOST_TEST(r.ranks[0].finish_s * K >= 2 * t * (K - S) * (1 - 1e-9));
  }
  // asynchronous: each fast worker runs at its own speed
  StrategySetup a = push_pull(3, 1, 10, -1);
  set_compute(a, 0, t);
  set_compute(a, 1, t);
  set_compute(a, 2, 2 * t);
  const StepResult r = run_on_star(a, 4);
  BOOST_TEST(r.ranks[0].finish_s == t, tt::tolerance(0.01));
  BOOST_TEST(r.ranks[0].staleness_wait_s == 0.0);
  BOOST_TEST(r.ranks[0].comm_exposed_s < 0.01 * t);
  BOOST_TEST(r.ranks[2].finish_s == 2 * t, tt::tolerance(0.01));
  // synchronous (staleness 0): everyone waits for the slow worker, the wait counted as exposed communication
  StrategySetup y = a;
  y.sync.staleness = 0;
  const StepResult q = run_on_star(y, 4);
  BOOST_TEST(q.ranks[0].comm_exposed_s == t, tt::tolerance(0.01));
  BOOST_TEST(q.ranks[0].staleness_wait_s == 0.0);
  BOOST_TEST(q.step_s == 2 * t, tt::tolerance(0.01));
}

// SSP's server applies a piece once per clock (one optimizer step of u), ps-async once per push (W of them). With
// identical workers (compute t, no noise, negligible messages), every push but the last of a clock is answered at
// once; the last waits for the update, so its worker takes t + u a step and sets the pace, falling u further behind
// the others each step. With K u < t its lag stays under a clock: the bound (S >= 1) never binds and the others
// finish K steps in K t, never held -- with S = 2 as with S = K.
BOOST_AUTO_TEST_CASE(ssp_applies_once_per_clock) {
  const double t = 0.01;
  const int32_t W = 4, K = 20;
  const double u = t / (2 * K);
  for (int32_t S : {2, K}) {
    StrategySetup s = push_pull(W, 1, 10, S);
    s.steps = K;
    for (int32_t w = 0; w < W; ++w) set_compute(s, w, t);
    s.ranks[static_cast<size_t>(W)].optimizer_s = u;
    const StepResult r = run_on_star(s, W + 1);
    BOOST_TEST_INFO("S = " << S);
    BOOST_TEST(r.ranks[static_cast<size_t>(W)].compute_s == u, tt::tolerance(1e-6));  // one update per clock
    BOOST_TEST(r.step_s == t + u, tt::tolerance(0.001));
    int32_t last = 0;  // the worker whose push completes every clock
    for (int32_t w = 0; w < W; ++w)
      if (r.ranks[static_cast<size_t>(w)].finish_s > r.ranks[static_cast<size_t>(last)].finish_s) last = w;
    for (int32_t w = 0; w < W; ++w) {
      BOOST_TEST(r.ranks[static_cast<size_t>(w)].staleness_wait_s == 0.0);
      if (w != last) BOOST_TEST(r.ranks[static_cast<size_t>(w)].finish_s == t, tt::tolerance(0.001));
    }
  }
  StrategySetup a = push_pull(W, 1, 10, -1);
  a.steps = K;
  for (int32_t w = 0; w < W; ++w) set_compute(a, w, t);
  a.ranks[static_cast<size_t>(W)].optimizer_s = u;
  BOOST_TEST(run_on_star(a, W + 1).ranks[static_cast<size_t>(W)].compute_s == W * u, tt::tolerance(1e-6));
}

// The replies one applied clock releases leave together and share the server's uplink (the NIC's FIFO entry).
// Two workers, S = 1: worker 0 computes nothing, worker 1 takes T a step; a piece crosses a link in L. Worker 0's
// push of clock c + 1 is held until worker 1's push of clock c arrives (T + L after worker 1's step began); then
// both replies leave at once and take 2L. So worker 1's step is T + 3L (its last one T + 2L, alone): the mean
// step is T + 3L - L / K. A gate at the start of a step instead of withheld replies would give T + 2L.
BOOST_AUTO_TEST_CASE(ssp_released_replies_share_the_uplink) {
  const int64_t P = 1000000;
  const double L = 4.0 * P / kNic, T = 10 * L;
  const int32_t K = 12;
  StrategySetup s = push_pull(2, 1, P, 1);
  s.steps = K;
  set_compute(s, 1, T);
  const StepResult r = run_on_star(s, 3);
  BOOST_TEST(r.step_s == T + 3 * L - L / K, tt::tolerance(0.001));
  BOOST_TEST(r.ranks[1].finish_s == T + 3 * L - L / K, tt::tolerance(0.001));
  BOOST_TEST(r.ranks[1].staleness_wait_s == 0.0);  // its own replies are never withheld
  BOOST_TEST(r.ranks[0].staleness_wait_s > 0);
}

// End to end: ssp with staleness 0 compiles to ps's program and times the same; with one node at half speed
// ssp reports staleness waits and ps-async none.
BOOST_AUTO_TEST_CASE(ssp_zero_is_ps_end_to_end) {
  const ClusterSpec c = star(4, 0.5);
  JobSpec ps = lenet(Strategy::kPs), ssp = lenet(Strategy::kSsp), async = lenet(Strategy::kPsAsync);
  ssp.staleness = 0;
  const SimResult a = simulate(c, ps, {.baseline = false}), b = simulate(c, ssp, {.baseline = false});
  BOOST_TEST(a.step_time_s == b.step_time_s);
  BOOST_TEST(a.comm_exposed_s == b.comm_exposed_s);
  // the slow node hosts the server (the last rank): make a worker slow instead
  nlohmann::json j = {{"nodes", {{{"preset", "c5.large"}, {"count", 1}, {"peak_gflops", 5}, {"nic_gbps", 0.8}},
                                 {{"preset", "c5.large"}, {"count", 3}, {"nic_gbps", 0.8}}}}};
  const ClusterSpec slow_first = cluster_from_json(j);
  ssp.staleness = 1;
  const SimResult s1 = simulate(slow_first, ssp, {.baseline = false});
  BOOST_TEST(s1.staleness_wait_s > 0);
  BOOST_TEST(s1.rank_step[1].staleness_wait_s > 0);
  BOOST_TEST(s1.rank_step[0].staleness_wait_s == 0.0);
  BOOST_TEST(s1.to_json()["step_ranks"][1]["staleness_wait_s"].get<double>() > 0);
  const SimResult as = simulate(slow_first, async, {.baseline = false});
  BOOST_TEST(as.staleness_wait_s == 0.0);
  BOOST_TEST(as.rank_step[1].finish_s < as.rank_step[0].finish_s);
}

// (b) Local SGD with period H: the parameters are all-reduced once per H steps, so the mean step is
// compute + allreduce / H; one step of `single` gives the compute, H = 1 the all-reduce (a ring of 2(n-1)/n of
// the model through each NIC). Warmup steps of DDP mix in by their share of the run.
// asgd as the runtime's Gossip runs it (engine/parallel/averaging.cpp): each worker sends one snapshot of its state
// per step to its partner of the seeded matching, beside the step's compute; the step ends when both are done.
StrategySetup gossip(int32_t workers, double param_bytes, double compute_s) {
  StrategySetup s;
  s.sync.exchange = parallel::Exchange::kGossip;
  s.sync.workers = workers;
  s.param_bytes = param_bytes;
  s.seed = 7;
  for (int32_t w = 0; w < workers; ++w) {
    s.ranks.emplace_back();
    set_compute(s, w, compute_s);
  }
  return s;
}

BOOST_AUTO_TEST_CASE(gossip_overlaps_one_model_per_step_with_compute) {
  // link-bound: one model each way per worker link, overlapped with compute -- not compute + a model each way
  // in turn (80 ms), nor two models through each uplink
  const double P = 4e6, link = P / kNic;  // 40 ms
  const StepResult r = run_on_star(gossip(4, P, 0.25 * link), 4);
  BOOST_TEST(r.step_s == link, tt::tolerance(0.001));
  for (int32_t w = 0; w < 4; ++w) {
    const auto k = static_cast<size_t>(w);
    BOOST_TEST(r.nic_out_bytes[k] == P, tt::tolerance(1e-9));  // its own snapshot only
    BOOST_TEST(r.nic_in_bytes[k] == P, tt::tolerance(1e-9));   // its partner's
    BOOST_TEST(r.ranks[k].comm_exposed_s == 0.75 * link, tt::tolerance(0.001));
  }
  // compute-bound: the exchange hides entirely behind the step
  const StepResult c = run_on_star(gossip(4, P, 4 * link), 4);
  BOOST_TEST(c.step_s == 4 * link, tt::tolerance(0.001));
  BOOST_TEST(c.ranks[0].comm_exposed_s < 1e-6);
  // three workers: a perfect matching pairs two, the third sits the step out, so two models move per step
  const StepResult o = run_on_star(gossip(3, P, 0.25 * link), 3);
  double sent = 0;
  for (double b : o.nic_out_bytes) sent += b;
  BOOST_TEST(sent == 2 * P, tt::tolerance(1e-9));
}

// Step noise (simulator/compute/step_noise.hpp). Two gossip workers are partners every step. A worker sends its snapshot when it starts a step and ends the step when
// its compute is done and its partner's snapshot has arrived (the exchange of 4 bytes is free): with S_w(k) the step
// starts, S_w(k + 1) = max(S_w(k) + f_w(k) c, S_p(k)). The window's step is the later worker's end over the steps.
BOOST_AUTO_TEST_CASE(gossip_pair_waits_for_the_slower_partner) {
  const double c = 0.01;
  StrategySetup s = gossip(2, 4, c);
  s.seed = 5;
  s.steps = 64;
  const auto run = [&](double cv) {
    s.compute_cv = cv;
    return run_on_star(s, 2, 1e12);
  };
  BOOST_TEST(run(0).step_s == c, tt::tolerance(1e-6));
  double s0 = 0, s1 = 0;
  for (int k = 0; k < s.steps; ++k) {
    const double e0 = std::max(s0 + compute_factor(0.4, 5, 0, k) * c, s1);
    const double e1 = std::max(s1 + compute_factor(0.4, 5, 1, k) * c, s0);
    s0 = e0, s1 = e1;
  }
  const StepResult r = run(0.4);
  BOOST_TEST(r.step_s == std::max(s0, s1) / s.steps, tt::tolerance(1e-4));  // (nanosecond rounding per event)
  BOOST_TEST(r.step_s > c);  // a worker ahead waits for its partner to start: more than the mean compute
  BOOST_TEST(run(0.4).step_s == r.step_s);  // seeded: the same again
}

// A measured two-way factor f (`tandem calibrate --network`'s tcp_two_way_factor) on TCP hosts: two gossip partners
// swap at the same moment every step (equal compute, no noise), so the swap takes max(the fluid two-way time
// S (d + a) / C, f S d / C) with d = 1514 / 1448 wire bytes per payload byte and a the reverse flow's ACKs, 66 / (2 x
// 1448); a link-bound step is that time. f = 1 (or no field) is the fluid model's time, an rdma node refuses f, and
// the NICs still count one model each way.
BOOST_AUTO_TEST_CASE(gossip_swap_takes_the_measured_two_way_factor) {
  const double P = 4e6, d = 1514.0 / 1448, a = 66.0 / (2 * 1448);
  const auto run = [&](network::Protocol proto, double f, int32_t workers = 2) {
    return run_on_star(gossip(workers, P, 0.01 * P / kNic), workers, kNic, [&](network::HostNet& x) {
      x.protocol = proto;
      x.tcp_slow_start_after_idle = false;
      x.tcp_two_way_factor = f;
    });
  };
  const double two_way = P * (d + a) / kNic, one_way = P * d / kNic;
  BOOST_TEST(run(network::Protocol::kTcp, 1.0).step_s == two_way, tt::tolerance(1e-4));
  const StepResult r = run(network::Protocol::kTcp, 1.6);
  BOOST_TEST(r.step_s == 1.6 * one_way, tt::tolerance(1e-4));
  BOOST_TEST(r.nic_out_bytes[0] == P, tt::tolerance(1e-9));  // the wire factor is time, not bytes sent
  BOOST_TEST(r.nic_in_bytes[1] == P, tt::tolerance(1e-9));
  // a factor under the fluid model's own (d + a) / d changes nothing
  BOOST_TEST(run(network::Protocol::kTcp, 1.01).step_s == two_way, tt::tolerance(1e-4));
  BOOST_TEST(run(network::Protocol::kRdma, 1.0).step_s == P / kNic, tt::tolerance(1e-4));
  // a payload-rate link (a TCP node under profile_network, whose measured p2p rate has TCP's costs in it): no ACK
  // costs, so the factor applies as measured
  BOOST_TEST(run(network::Protocol::kRdma, 1.6).step_s == 1.6 * P / kNic, tt::tolerance(1e-4));
  // four workers: two pairs, each swapping on its own links -- the same time
  BOOST_TEST(run(network::Protocol::kTcp, 1.6, 4).step_s == 1.6 * one_way, tt::tolerance(1e-4));
  // the cluster JSON's field reaches the hosts, and bad values are refused naming it
  const ClusterSpec c = parse_cluster(R"({"nodes": [{"preset": "t2.micro", "count": 2, "protocol": "tcp",
                                          "tcp_two_way_factor": 1.4}]})");
  BOOST_TEST(c.host_nets()[1].tcp_two_way_factor == 1.4);
  BOOST_TEST(parse_cluster(R"({"nodes": [{"preset": "t2.micro", "count": 2}]})").host_nets()[0].tcp_two_way_factor == 1.0);
  BOOST_TEST(refused(R"({"nodes": [{"preset": "t2.micro", "count": 2, "tcp_two_way_factor": 0.9}]})",
                     "cluster.nodes[0].tcp_two_way_factor: expected a factor in [1, 16]"));
  BOOST_TEST(refused(R"({"nodes": [{"preset": "t2.micro", "count": 2, "protocol": "rdma", "tcp_two_way_factor": 1.2}]})",
                     "tcp_two_way_factor: the node's protocol is rdma"));
}

// The window of ps-async and ssp (window_steps) is long enough for ssp's bound to bind: two workers of known unequal
// pace a = 1.1 t and b = t on a fast network, S = 2, the default window. The fast worker runs free while c b >= (c -
// S) a, i.e. for c <= S a / (a - b) = 22 steps, and is then held every step until the slow one's push of c - S: it
// ends clock K at (K - S) a, so its staleness wait is ((K - S) a - K b) / K per step (the slower's pace less b, less S
// a / K) and the step is a, the slower's pace (x 1). A 20-step window (the old one) ends before the bound binds
// (wait 0); the new one is kLongWindowSteps = 1024 steps, cut to a cost bound of 2^17 answers for a large job.
BOOST_AUTO_TEST_CASE(ssp_window_is_long_enough_for_the_bound_to_bind) {
  const double t = 0.01, a = 1.1 * t, b = t;
  const int32_t S = 2;
  StrategySetup s = push_pull(2, 1, 10, S);
  set_compute(s, 0, a);
  set_compute(s, 1, b);
  const int32_t K = window_steps(s);
  BOOST_TEST(K == 1024);
  const StepResult r = run_on_star(s, 3);
  const double wait = ((K - S) * a - K * b) / K;
  BOOST_TEST(wait > 0.9 * (a - b));
  BOOST_TEST(r.ranks[1].staleness_wait_s == wait, tt::tolerance(0.01));
  BOOST_TEST(r.ranks[0].staleness_wait_s == 0.0);
  BOOST_TEST(r.step_s == a, tt::tolerance(0.005));
  // ps-async: the same two run at their own paces (the step is the slower's), nobody held
  StrategySetup y = s;
  y.sync.staleness = -1;
  BOOST_TEST(window_steps(y) == 1024);
  const StepResult q = run_on_star(y, 3);
  BOOST_TEST(q.ranks[1].staleness_wait_s == 0.0);
  BOOST_TEST(q.ranks[1].finish_s == b, tt::tolerance(0.005));
  BOOST_TEST(q.step_s == a, tt::tolerance(0.005));
  // the cost bound: 64 workers x 64 pieces a step gives 2^17 / 4096 = 32 steps; never below 16 + 2 S
  StrategySetup big = push_pull(64, 1, 64 * 100, S);
  big.sync.pieces.clear();
  for (int64_t p = 0; p < 64; ++p) big.sync.pieces.push_back({0, 0, p * 100, (p + 1) * 100});
  BOOST_TEST(window_steps(big) == 32);
  big.sync.workers = 512;
  BOOST_TEST(window_steps(big) == 16 + 2 * S);
  // sync ps keeps its short window
  StrategySetup z = s;
  z.sync.staleness = 0;
  BOOST_TEST(window_steps(z) == 4);
}

// fanout_weight: 1 at CV 0; otherwise lognormal of mean 1 and the CV given, its log an AR(1) from clock to clock with
// the lag-one correlation given (0: independent), reproducible from (seed, worker, clock), and bad figures refused.
BOOST_AUTO_TEST_CASE(fanout_weights_have_the_measured_spread_and_persistence) {
  BOOST_TEST(fanout_weight(0.0, 0.5, 1, 0, 7).weight == 1.0);
  for (const double corr : {0.0, 0.85}) {
    const int32_t n = 40000;
    double sum = 0, sq = 0, zz = 0, z0 = 0;
    FanoutDraw d;
    double prev = 0;
    for (int32_t c = 0; c < n; ++c) {
      d = fanout_weight(0.3, corr, 5, 1, c, d);
      sum += d.weight;
      sq += d.weight * d.weight;
      if (c > 0) zz += prev * d.z;
      z0 += d.z * d.z;
      prev = d.z;
    }
    const double mean = sum / n, cv = std::sqrt(sq / n - mean * mean) / mean;
    BOOST_TEST_INFO("corr " << corr);
    BOOST_TEST(mean == 1.0, tt::tolerance(corr > 0 ? 0.03 : 0.01));
    BOOST_TEST(cv == 0.3, tt::tolerance(corr > 0 ? 0.1 : 0.05));
    if (corr > 0) BOOST_TEST(zz / z0 == corr, tt::tolerance(0.02));
    if (corr == 0) BOOST_TEST(std::abs(zz / z0) < 0.02);
  }
  // the same draws again, and another worker's differ
  FanoutDraw a, b, c;
  for (int32_t k = 0; k < 10; ++k) {
    a = fanout_weight(0.3, 0.85, 5, 1, k, a);
    b = fanout_weight(0.3, 0.85, 5, 1, k, b);
    c = fanout_weight(0.3, 0.85, 5, 2, k, c);
  }
  BOOST_TEST(a.weight == b.weight);
  BOOST_TEST(a.weight != c.weight);
  BOOST_CHECK_THROW(fanout_weight(1.5, 0.0, 1, 0, 0), tandem::Error);
  BOOST_CHECK_THROW(fanout_weight(0.3, 1.0, 1, 0, 0), tandem::Error);
  BOOST_CHECK_THROW(fanout_weight(0.3, -0.1, 1, 0, 0), tandem::Error);
  BOOST_CHECK_THROW(fanout_weight(0.3, 0.5, 1, 0, -1), tandem::Error);
}

// A server host with a measured fan-out spread (tcp_fanout_cv, tcp_fanout_corr): four identical workers, link-bound
// (a model of 4 MB on 100 MB/s, compute 1% of a transfer). Without it the answers queue one batch after another,
// the workers stay evenly out of phase and ssp's bound never binds (no staleness wait; ssp's step is ps-async's).
// With it the answers share the uplink at unequal, persisting weights, a worker's answer overtakes another's, the
// clocks drift apart and the bound binds: ssp waits and is slower than ps-async. The bytes each NIC carries stay a
// model per answer; the cluster JSON's fields reach the hosts and bad values are refused naming them.
BOOST_AUTO_TEST_CASE(fanout_spread_lets_the_clocks_drift_and_the_bound_bind) {
  const int64_t params = 1000000;
  const auto run = [&](int32_t staleness, double cv, double corr) {
    StrategySetup s = push_pull(4, 1, params, staleness);
    s.seed = 3;
    for (int32_t w = 0; w < 4; ++w) set_compute(s, w, 0.01 * 4.0 * params / kNic);
    return run_on_star(s, 5, kNic, [&](network::HostNet& x) {
      x.tcp_fanout_cv = cv;
      x.tcp_fanout_corr = corr;
    });
  };
  const auto waits = [](const StepResult& r) {
    double w = 0;
    for (int32_t k = 0; k < 4; ++k) w += r.ranks[static_cast<size_t>(k)].staleness_wait_s;
    return w;
  };
  const StepResult ssp0 = run(2, 0.0, 0.0), async0 = run(-1, 0.0, 0.0);
  BOOST_TEST(waits(ssp0) == 0.0);
  BOOST_TEST(ssp0.step_s == async0.step_s, tt::tolerance(1e-6));
  const StepResult ssp = run(2, 0.3, 0.85), async = run(-1, 0.3, 0.85);
  BOOST_TEST(waits(ssp) > 0.05 * ssp.step_s);
  BOOST_TEST(ssp.step_s > 1.05 * async.step_s);
  // the server's NIC sends one model per answer either way
  BOOST_TEST(ssp.nic_out_bytes[4] == ssp0.nic_out_bytes[4], tt::tolerance(1e-9));
  BOOST_TEST(ssp.nic_out_bytes[4] == 4 * 4.0 * params, tt::tolerance(1e-9));
  const ClusterSpec c = parse_cluster(R"({"nodes": [{"preset": "t2.micro", "count": 2, "protocol": "tcp",
                                          "tcp_fanout_cv": 0.2, "tcp_fanout_corr": 0.8}]})");
  BOOST_TEST(c.host_nets()[1].tcp_fanout_cv == 0.2);
  BOOST_TEST(c.host_nets()[1].tcp_fanout_corr == 0.8);
  BOOST_TEST(parse_cluster(R"({"nodes": [{"preset": "t2.micro", "count": 2}]})").host_nets()[0].tcp_fanout_cv == 0.0);
  BOOST_TEST(refused(R"({"nodes": [{"preset": "t2.micro", "count": 2, "tcp_fanout_cv": 1.5}]})",
                     "cluster.nodes[0].tcp_fanout_cv: expected a coefficient of variation in [0, 1]"));
  BOOST_TEST(refused(R"({"nodes": [{"preset": "t2.micro", "count": 2, "tcp_fanout_corr": 1}]})",
                     "cluster.nodes[0].tcp_fanout_corr: expected a correlation in [0, 1)"));
  BOOST_TEST(refused(R"({"nodes": [{"preset": "t2.micro", "count": 2, "protocol": "rdma", "tcp_fanout_cv": 0.2}]})",
                     "tcp_fanout_cv: the node's protocol is rdma"));
}

BOOST_AUTO_TEST_CASE(localsgd_all_reduces_once_per_period) {
  const int32_t n = 4;
  const ClusterSpec c = star(n);
  JobSpec single = lenet(Strategy::kSingle);
  const double compute = simulate(c, single, {.baseline = false}).step_time_s;
  JobSpec j = lenet(Strategy::kLocalSgd);
  j.algorithm = comm::Algorithm::kRing;
  j.average_every = 1;
  const SimResult h1 = simulate(c, j, {.baseline = false});
  const double allreduce = h1.step_time_s - compute;
  BOOST_TEST(allreduce == 2.0 * (n - 1) / n * model_bytes(h1) / kNic, tt::tolerance(0.02));
  for (int32_t H : {2, 8}) {
    j.average_every = H;
    const SimResult r = simulate(c, j, {.baseline = false});
    BOOST_TEST(r.step_time_s == compute + allreduce / H, tt::tolerance(1e-3));
    BOOST_TEST(r.window_steps == H);
    BOOST_TEST(r.exchange == "param-average");
  }
  // easgd (synchronous) is the same pattern every tau steps, plus its elastic update
  JobSpec e = lenet(Strategy::kEasgd);
  e.algorithm = comm::Algorithm::kRing;
  e.tau = 8;
  const SimResult es = simulate(c, e, {.baseline = false});
  BOOST_TEST(es.step_time_s >= (compute + allreduce / 8) * (1 - 1e-5));  // (nanosecond rounding)
  BOOST_TEST(es.step_time_s < compute + allreduce / 4);
  // post-local SGD: half the run's steps are DDP steps
  j.average_every = 8;
  const SimResult local = simulate(c, j, {.baseline = false});
  JobSpec ddp = lenet(Strategy::kDdp);
  ddp.algorithm = comm::Algorithm::kRing;
  const SimResult d = simulate(c, ddp, {.baseline = false});
  j.warmup_steps = static_cast<int32_t>(local.total_steps / 2);
  const SimResult post = simulate(c, j, {.baseline = false});
  const double share = j.warmup_steps / local.total_steps;
  BOOST_TEST(post.step_time_s == share * d.step_time_s + (1 - share) * local.step_time_s, tt::tolerance(1e-6));
}

// (d) FedAvg: a client slower than the deadline is dropped and the round closes at the deadline, then the
// model is broadcast: deadline + model / NIC. Without a deadline the round waits for the slow client.
BOOST_AUTO_TEST_CASE(fedavg_deadline_drops_the_straggler) {
  StrategySetup s;
  s.sync.exchange = parallel::Exchange::kRound;
  s.sync.workers = 2;
  s.param_bytes = 1e6;
  s.clients = s.sampled = 2;
  s.client_steps = {1, 1};
  s.steps = 3;
  s.ranks.resize(2);
  for (auto& r : s.ranks) r.forward_s = {0}, r.backward_s = {0};
  s.ranks[0].optimizer_s = 1.0;
  s.ranks[1].optimizer_s = 3.0;  // the straggler
  s.deadline_s = 2.0;
  const StepResult r = run_on_star(s, 2);
  BOOST_TEST(r.rounds.size() == 3u);
  for (const RoundReport& rr : r.rounds) {
    BOOST_TEST(rr.time_s == 2.0 + 1e6 / kNic, tt::tolerance(1e-6));
    BOOST_TEST(rr.counted == 1);
    BOOST_TEST(rr.dropped == 1);
  }
  BOOST_TEST(r.step_s == 2.0 + 1e6 / kNic, tt::tolerance(1e-6));
  s.deadline_s = 0;
  const StepResult all = run_on_star(s, 2);
  BOOST_TEST(all.step_s == 3.0 + 2 * 1e6 / kNic, tt::tolerance(1e-6));  // upload, then broadcast
  BOOST_TEST(all.rounds.front().dropped == 0);
  // client sampling: 4 virtual clients on 2 workers, half sampled per round, each round visits two of them
  s.clients = 4;
  s.sampled = 2;
  s.client_fraction = 0.5;
  s.client_steps = {1, 1, 1, 1};
  s.steps = 0;
  s.ranks[1].optimizer_s = 1.0;
  const StepResult sampled = run_on_star(s, 2);
  BOOST_TEST(sampled.rounds.size() == 2u);
  BOOST_TEST(sampled.step_s == 1.0 + 2 * 1e6 / kNic, tt::tolerance(1e-6));
}

// A worker sends worker 0 one update a round, the sum over its clients, as the runtime's RoundExchange does; so a
// round's work is linear in the clients. Before, every client uploaded the model as it finished, and the flows' rates
// were solved again among all the uploads in flight at each start and end: quadratic (t2.micro:4, lenet5, 16,000
// clients: 108 s and 1 GB), and a round timed K / W times the bytes the runtime sends.
BOOST_AUTO_TEST_CASE(fedavg_sends_one_update_per_worker_and_its_work_is_linear_in_the_clients) {
  const int32_t W = 4, rounds = 2;
  for (const int32_t K : {4, 400, 4000}) {
    BOOST_TEST_CONTEXT(K << " clients") {
      StrategySetup s;
      s.sync.exchange = parallel::Exchange::kRound;
      s.sync.workers = W;
      s.param_bytes = 1e6;
      s.clients = s.sampled = K;
      s.client_steps.assign(static_cast<size_t>(K), 1);
      s.steps = rounds;
      s.ranks.resize(W);
      for (auto& r : s.ranks) r.forward_s = {0}, r.backward_s = {0}, r.optimizer_s = 0.01;
      std::vector<network::HostNet> h(static_cast<size_t>(W));
      for (auto& x : h) x.nic_bytes_per_s = kNic;
      des::Simulator sim;
      network::Network net(sim);
      network::Topology topo(network::TopologySpec{}, h, net);
      const StepResult r = simulate_rounds(s, topo, sim);
      BOOST_REQUIRE(r.rounds.size() == static_cast<size_t>(rounds));
      // per round: W - 1 uploads and W - 1 broadcasts, whatever the clients
      BOOST_TEST(net.flows_started() == static_cast<uint64_t>(rounds * 2 * (W - 1)));
      // a client's compute is an event; the rest is a few per worker
      BOOST_TEST(sim.events_processed() <= static_cast<uint64_t>(rounds * (K + 8 * W)), sim.events_processed());
      for (const RoundReport& rr : r.rounds) {
        // K / W clients one after the other, then the W - 1 updates into worker 0's NIC, then the model back out
        BOOST_TEST(rr.time_s == K / W * 0.01 + 2 * (W - 1) * 1e6 / kNic, tt::tolerance(1e-6));
        BOOST_TEST(rr.counted == K);
      }
      BOOST_TEST(r.nic_in_bytes[0] == (W - 1) * 1e6, tt::tolerance(1e-9));
    }
  }
}

BOOST_AUTO_TEST_CASE(fedavg_end_to_end_reports_rounds) {
  nlohmann::json j = {{"nodes", {{{"preset", "c5.large"}, {"count", 3}}, {{"preset", "c5.large"}, {"count", 1}, {"peak_gflops", 2}}}}};
  const ClusterSpec c = cluster_from_json(j);
  JobSpec f = lenet(Strategy::kFedAvg);
  f.epochs = 1;
  const SimResult all = simulate(c, f, {.baseline = false});
  BOOST_TEST(all.clients_dropped == 0.0);
  BOOST_TEST(all.clients_counted == 4.0);
  f.round_deadline_s = all.round_time_s * 0.8;  // the slow node's client misses it
  const SimResult r = simulate(c, f, {.baseline = false});
  BOOST_TEST(r.clients_dropped == 1.0);
  BOOST_TEST(r.clients_counted == 3.0);
  BOOST_TEST(r.round_time_s < all.round_time_s);
  BOOST_TEST(r.round_time_s > f.round_deadline_s);
  BOOST_TEST(r.total_steps == 1.0);  // one round passes over every client's data once
  const nlohmann::json out = r.to_json();
  BOOST_TEST(out["rounds"].size() == r.rounds.size());
  BOOST_TEST(out["clients_dropped"].get<double>() == 1.0);
  BOOST_TEST(out["note"].get<std::string>().find("time to accuracy") != std::string::npos);
}

// One description, two executors (#13): an epoch of the run is the compiled job's rounds_per_epoch rounds -- one, as
// the trainer runs it (ParallelTrainer::fedavg_round closes the epoch after its round; the parallel test
// fedavg_epoch_is_one_round) -- whatever the fraction sampled or the local epochs; the time, cost and throughput
// follow. Before: clients / (sampled x E) rounds per epoch (2 at C = 0.5).
BOOST_AUTO_TEST_CASE(fedavg_epoch_is_the_trainers_round) {
  const ClusterSpec c = star(4);
  for (const double C : {0.5, 1.0})
    for (const int32_t E : {1, 2}) {
      BOOST_TEST_CONTEXT("C " << C << ", E " << E) {
        JobSpec f = lenet(Strategy::kFedAvg);
        f.samples = 6400;
        f.clients = 8;
        f.client_fraction = C;
        f.local_epochs = E;
        f.epochs = 3;
        const SimResult r = simulate(c, f, {.baseline = false});
        BOOST_REQUIRE(r.job != nullptr);
        BOOST_TEST(r.job->sync.rounds_per_epoch == 1);
        BOOST_TEST(r.steps_per_epoch == 1);
        BOOST_TEST(r.total_steps == 3.0);
        BOOST_TEST(r.total_time_s == 3 * r.round_time_s, tt::tolerance(1e-6));
        // a round trains 8 x C clients of 800 samples, E times each
        BOOST_TEST(r.images_per_sec == 8 * C * 800 * E * 3 / r.total_time_s, tt::tolerance(1e-6));
      }
    }
  // the other exchanges hold no rounds
  BOOST_TEST(simulate(c, lenet(Strategy::kDdp), {.baseline = false}).job->sync.rounds_per_epoch == 0);
}

// The speedup compares trained samples per second: a round (fedavg's epoch) at C = 0.25 trains a quarter of the data
// that the one-device baseline's epoch trains, so the ratio of their times was ~4x too high ("7.2x, 180% efficiency",
// blamed on caches). At C = 1 a round is an epoch of the same data and the two measures agree.
BOOST_AUTO_TEST_CASE(fedavg_speedup_is_per_trained_sample) {
  const ClusterSpec c = star(4);
  for (const double C : {0.25, 1.0}) {
    BOOST_TEST_CONTEXT("C " << C) {
      JobSpec f = lenet(Strategy::kFedAvg);
      f.samples = 6400;
      f.clients = 8;
      f.client_fraction = C;
      f.epochs = 1;
      const SimResult r = simulate(c, f);
      const SimResult one = Simulation().baseline(c, f);
      BOOST_TEST(r.baseline_total_time_s == one.total_time_s, tt::tolerance(1e-9));
      BOOST_TEST(one.images_per_sec == 6400 / one.total_time_s, tt::tolerance(1e-9));
      BOOST_TEST(r.speedup == r.images_per_sec / one.images_per_sec, tt::tolerance(1e-9));
      BOOST_TEST(r.speedup == C * one.total_time_s / r.total_time_s, tt::tolerance(1e-6));
      BOOST_TEST(r.efficiency == r.speedup / r.ranks, tt::tolerance(1e-9));
      BOOST_TEST(r.scaling_note.find("caches") == std::string::npos, r.scaling_note);
    }
  }
}

// The runtime's draw and shards, not a model of them: round r's clients are sample_clients(..., seed, r) dealt as
// clients_of_worker deals them, and each client computes its own shard's steps -- so a skewed (Dirichlet) split,
// whose largest client holds more than an even share, makes longer rounds than IID (the straggler client).
BOOST_AUTO_TEST_CASE(fedavg_rounds_follow_the_runtimes_clients_and_shards) {
  StrategySetup s;
  s.sync.exchange = parallel::Exchange::kRound;
  s.sync.workers = 2;
  s.param_bytes = 0;
  s.clients = 6;
  s.client_fraction = 0.5;
  s.sampled = 3;
  s.seed = 11;
  s.client_steps = {1, 2, 3, 4, 5, 6};  // client k: k + 1 steps of 1 s
  s.steps = 4;
  s.ranks.resize(2);
  for (auto& r : s.ranks) r.forward_s = {0}, r.backward_s = {0}, r.optimizer_s = 1.0;
  const StepResult r = run_on_star(s, 2);
  BOOST_REQUIRE(r.rounds.size() == 4u);
  for (int32_t round = 0; round < 4; ++round) {
    const std::vector<int32_t> drawn = parallel::sample_clients(6, 0.5, 11, round);
    double longest = 0;
    for (int32_t w = 0; w < 2; ++w) {
      double t = 0;
      for (const int32_t k : parallel::clients_of_worker(drawn, w, 2)) t += k + 1;
      longest = std::max(longest, t);
    }
    BOOST_TEST(r.rounds[static_cast<size_t>(round)].time_s == longest, tt::tolerance(1e-6));
  }
  // End to end: the same job with Dirichlet(0.5) shards has rounds longer than with IID shards.
  const ClusterSpec c = star(4);
  JobSpec f = lenet(Strategy::kFedAvg);
  f.clients = 8;
  const SimResult iid = simulate(c, f, {.baseline = false});
  f.dirichlet_alpha = 0.5;
  const SimResult skew = simulate(c, f, {.baseline = false});
  BOOST_TEST(skew.round_time_s > 1.2 * iid.round_time_s);
  BOOST_TEST(skew.note.find("client shards cut as the runtime cuts them") != std::string::npos);
}

// (e) As the papers compare them: a PS with one server moves workers x model bytes through the server's NIC
// (each way) per step, a ring all-reduce 2(n - 1)/n x model through every NIC.
BOOST_AUTO_TEST_CASE(ps_and_ring_bytes_through_the_busiest_nic) {
  const int32_t n = 4;
  const ClusterSpec c = star(n);
  const SimResult ps = simulate(c, lenet(Strategy::kPs), {.baseline = false});
  JobSpec ring = lenet(Strategy::kDdp);
  ring.algorithm = comm::Algorithm::kRing;
  const SimResult ar = simulate(c, ring, {.baseline = false});
  const double model = model_bytes(ps);
  BOOST_TEST(ps.workers == n - 1);
  BOOST_TEST(ps.servers == 1);
  BOOST_TEST(ps.busiest_nic_rank == n - 1);
  BOOST_TEST(ps.busiest_nic_bytes == (n - 1) * model, tt::tolerance(1e-9));
  BOOST_TEST(ar.busiest_nic_bytes == 2.0 * (n - 1) / n * model, tt::tolerance(1e-3));
  BOOST_TEST(ps.busiest_nic.find("server 0") != std::string::npos, ps.busiest_nic);
  BOOST_TEST(ps.bottleneck.find("server NIC incast") != std::string::npos, ps.bottleneck);
  // memory: the server holds its shard and the optimizer state, workers no optimizer state
  const auto& sync = ps.job->sync;
  BOOST_TEST(sync.worker_memory.optimizer_bytes == 0.0);
  BOOST_TEST(sync.server_memory.at(0).param_bytes == model);
  BOOST_TEST(sync.server_memory.at(0).optimizer_bytes == model);  // momentum: 4 bytes per parameter
  const SimResult ps2 = simulate(cluster_from_json({{"nodes", {{{"preset", "c5.large"}, {"count", 5}, {"nic_gbps", 0.8},
                                                                {"nic_latency_us", 0}, {"mem_gbps", 1e6}}}}}),
                                 [] {
                                   JobSpec j = lenet(Strategy::kPs);
                                   j.servers = 2;
                                   return j;
                                 }(),
                                 {.baseline = false});
  BOOST_TEST(ps2.busiest_nic_bytes == 3 * model / 2, tt::tolerance(1e-3));
}

BOOST_AUTO_TEST_CASE(gossip_and_async_easgd_run_without_a_barrier) {
  const ClusterSpec c = star(4, 0.5);
  const SimResult g = simulate(c, lenet(Strategy::kAsgd), {.baseline = false});
  BOOST_TEST(g.exchange == "gossip");
  // a matching: each worker sends its own snapshot and receives its partner's, one model each way per step
  BOOST_TEST(g.busiest_nic_bytes == model_bytes(g), tt::tolerance(1e-6));
  BOOST_TEST(g.staleness_wait_s == 0.0);
  JobSpec e = lenet(Strategy::kEasgd);
  e.easgd_async = true;
  e.tau = 4;
  const SimResult ea = simulate(c, e, {.baseline = false});
  BOOST_TEST(ea.exchange == "elastic");
  BOOST_TEST(ea.servers == 1);
  BOOST_TEST(ea.window_steps == 16);
  // the server NIC takes one whole shard per worker every tau steps
  BOOST_TEST(ea.busiest_nic_bytes == 3 * model_bytes(ea) / 4, tt::tolerance(1e-6));
  BOOST_TEST(ea.job->sync.server_memory.at(0).optimizer_bytes == 0.0);  // the centre only
}

BOOST_AUTO_TEST_CASE(job_json_takes_the_strategy_fields) {
  const JobSpec j = parse_job_text(R"({"strategy": "ssp", "servers": 2, "staleness": 3, "tau": 5, "alpha": 0.1,
      "easgd_async": true, "clients": 8, "dirichlet_alpha": 0.5, "client_fraction": 0.25, "local_epochs": 2,
      "round_deadline_s": 10, "average_every": 4, "warmup_steps": 100, "limit_batches": 50})");
  BOOST_TEST((j.strategy == Strategy::kSsp));
  BOOST_TEST(j.servers == 2);
  BOOST_TEST(j.staleness == 3);
  BOOST_TEST(j.tau == 5);
  BOOST_TEST(j.easgd_async);
  BOOST_TEST(j.clients == 8);
  BOOST_TEST(j.client_fraction == 0.25);
  BOOST_TEST(j.local_epochs == 2);
  BOOST_TEST(j.round_deadline_s == 10.0);
  BOOST_TEST(j.average_every == 4);
  BOOST_TEST(j.warmup_steps == 100);
  BOOST_TEST(j.limit_batches == 50);
  try {
    simulate(parse_cluster("c5.large:2"), [] {
      JobSpec p = lenet(Strategy::kPs);
      p.servers = 2;
      return p;
    }());
    BOOST_ERROR("two servers and no worker were accepted");
  } catch (const tandem::Error& e) {
    BOOST_TEST(std::string(e.what()).find("server") != std::string::npos, e.what());
  }
}


// ---- the executors' queues and CPU: a parameter server serves one request at a time in arrival order and its NIC
// sends one update's replies at a time (FIFO), so asynchronous workers spread out instead of moving as a convoy;
// moving a message costs CPU (the DDP executor's per-byte figures) on nodes with a CPU model.
// ps-async, W workers with no compute, the server's link the bottleneck (b = one model over the NIC): the
// pushes of the first step share the server's downlink and land together at W b; the server answers them one
// after another (b each, in arrival order), so worker i's first step ends at (W + i + 1) b. From then on each
// worker pushes alone (b) while the others' replies leave, and its reply waits its turn: the server's uplink is
// never idle and every worker's step is W b. After K steps worker i ends at (W + i + 1 + (K - 1) W) b. A convoy
// (every reply sharing the link, then every push) would take 2 W b per step.
BOOST_AUTO_TEST_CASE(async_ps_replies_leave_the_server_one_at_a_time) {
  const int32_t W = 4, K = 12;
  const int64_t P = 250000;
  const double b = 4.0 * P / kNic;  // 10 ms
  StrategySetup s = push_pull(W, 1, P, -1);
  s.steps = K;
  const StepResult r = run_on_star(s, W + 1);
  std::vector<double> finish;
  for (int32_t w = 0; w < W; ++w) finish.push_back(r.ranks[static_cast<size_t>(w)].finish_s * K);
  std::sort(finish.begin(), finish.end());
  for (int32_t i = 0; i < W; ++i) BOOST_TEST(finish[static_cast<size_t>(i)] == (W + i + 1 + (K - 1) * W) * b, tt::tolerance(1e-6));
  BOOST_TEST(r.step_s * K == (K + 1) * W * b, tt::tolerance(1e-6));
  // the server's uplink carries one model per worker per step, and is busy all the time from W b on
  BOOST_TEST(r.nic_out_bytes[static_cast<size_t>(W)] == W * 4.0 * P, tt::tolerance(1e-9));
  // synchronous: one update answers every worker, its W replies share the link (2 W b per step, as before)
  StrategySetup y = push_pull(W, 1, P, 0);
  y.steps = K;
  BOOST_TEST(run_on_star(y, W + 1).step_s == 2 * W * b, tt::tolerance(1e-6));
}

// The server's CPU as a queue (machine repairman, deterministic): 2 workers computing c0 < c1 per step, a
// network too fast to matter, each update u on the server, served in arrival order.
//  - saturated (every c_i <= (W - 1) u): the server never idles after the first push and serves the workers in
//    turn, so each worker's step is W u whatever its compute; utilisation 1.
//  - unsaturated (c >= (W - 1) u, equal compute): each step is c + u, the second worker a constant u behind;
//    utilisation W u / (c + u).
BOOST_AUTO_TEST_CASE(async_ps_server_cpu_follows_the_machine_repairman_closed_form) {
  const int32_t W = 2, K = 10;
  const double u = 0.01;
  StrategySetup s = push_pull(W, 1, 10, -1);  // 40 bytes: 0.4 ns on the wire
  s.steps = K;
  s.ranks[static_cast<size_t>(W)].optimizer_s = u;
  set_compute(s, 0, 0.2 * u);
  set_compute(s, 1, 0.7 * u);
  const StepResult a = run_on_star(s, W + 1);
  // worker 0 is served at [0.2u + 2k u, 1.2u + 2k u], worker 1 a u later
  BOOST_TEST(a.ranks[0].finish_s * K == 0.2 * u + (2 * K - 1) * u, tt::tolerance(1e-5));
  BOOST_TEST(a.ranks[1].finish_s * K == 0.2 * u + 2 * K * u, tt::tolerance(1e-5));
  const double busy = a.ranks[static_cast<size_t>(W)].compute_s;  // the server's update time per step
  BOOST_TEST(busy == W * u, tt::tolerance(1e-9));
  BOOST_TEST(busy / a.step_s == 2 * K * u / (0.2 * u + 2 * K * u), tt::tolerance(1e-5));  // utilisation -> 1
  // unsaturated
  set_compute(s, 0, 3 * u);
  set_compute(s, 1, 3 * u);
  const StepResult b = run_on_star(s, W + 1);
  // (each push and pull of 40 bytes adds a few nanoseconds on the wire)
  BOOST_TEST(b.ranks[0].finish_s * K == K * 4 * u, tt::tolerance(1e-4));
  BOOST_TEST(b.ranks[1].finish_s * K == K * 4 * u + u, tt::tolerance(1e-4));
  BOOST_TEST(b.ranks[static_cast<size_t>(W)].compute_s / b.step_s == W * u / (4 * u + u / K), tt::tolerance(1e-4));
}

// Without per-byte transfer CPU the executors take the plain path: the same events and times whether or not
// the nodes' CPUs are described (with cores to spare), and no communication CPU.
BOOST_AUTO_TEST_CASE(no_transfer_cpu_changes_nothing) {
  StrategySetup ps = push_pull(3, 1, 100000, -1);
  ps.ranks[3].optimizer_s = 0.002;
  set_compute(ps, 0, 0.003);
  set_compute(ps, 1, 0.005);
  StrategySetup g = gossip(4, 4e5, 0.004);
  StrategySetup e = push_pull(3, 1, 100000, 0);
  e.sync.exchange = parallel::Exchange::kElastic;
  e.sync.period = 2;
  for (StrategySetup* s : {&ps, &g, &e}) {
    const int32_t n = static_cast<int32_t>(s->ranks.size());
    const StepResult plain = run_on_star(*s, n);
    StrategySetup d = *s;
    own_nodes(d, CpuShare{4, 1, 0, 0.1});
    d.host_of_rank = d.node_of_rank;
    const StepResult described = run_on_star(d, n);
    BOOST_TEST(described.step_s == plain.step_s);
    BOOST_TEST(described.events == plain.events);
    for (const RankBreakdown& rb : described.ranks) BOOST_TEST(rb.comm_cpu_s == 0.0);
  }
}

// CPU-bound: moving a message costs k s/B on each side. Gossip on one-core nodes: a worker's step runs its
// compute c, the CPU of sending its snapshot (B k) and of receiving its partner's (B k) on the one core, so a
// step takes c + 2 B k (the link, 100x faster, does not matter); under a CFS quota of half a core with a period
// p, the same work takes windows of p / 2: K steps of n half-periods of work end at (K n - 1/2) p (to p / 2).
BOOST_AUTO_TEST_CASE(transfer_cpu_makes_gossip_cpu_bound) {
  const double c = 0.004, B = 1e5, k = 1e-8;  // 2 B k = 2 ms
  StrategySetup g = gossip(2, B, c);
  g.steps = 8;
  for (RankSetup& r : g.ranks) r.net_cpu_s_per_byte = k;
  StrategySetup one = g;
  own_nodes(one, CpuShare{1, 1, 0, 0.1});
  const StepResult r = run_on_star(one, 2, 100 * kNic);
  BOOST_TEST(r.step_s == c + 2 * B * k, tt::tolerance(1e-6));
  BOOST_TEST(r.ranks[0].comm_cpu_s == 2 * B * k, tt::tolerance(1e-9));
  // without a CPU model the transfers' CPU runs beside the compute (another thread on cores to spare)
  const StepResult spare = run_on_star(g, 2, 100 * kNic);
  BOOST_TEST(spare.step_s == c, tt::tolerance(1e-6));
  BOOST_TEST(spare.ranks[0].comm_cpu_s == 2 * B * k, tt::tolerance(1e-9));
  // quota 0.5 core, period 2 ms: 6 ms of work a step is 6 half-periods
  StrategySetup q = g;
  const double p = 0.002;
  own_nodes(q, CpuShare{1, 1, 0.5, p});
  const StepResult h = run_on_star(q, 2, 100 * kNic);
  // (a step whose work ends exactly as the window's quota runs out may be reported at the next period's start)
  BOOST_TEST(h.step_s * 8 >= (8 * 6 - 0.5) * p * (1 - 1e-6));
  BOOST_TEST(h.step_s * 8 <= 8 * 6 * p * (1 + 1e-6));
}

// The same charge when the link is the bound (bench/strategies/README.md's LeNet-5 asgd rows): two gossip workers
// on nodes held to q = 1/2 core, compute c, a B-byte snapshot each way over a link of L = B / nic, k s/B on each
// side of each message. The node runs its compute and both messages' CPU work, c + 2 B k, at q, so the compute
// phase ends at (c + 2 B k) / q; the flows do not wait for the CPU. While that is under L the step stays L and
// the charge only shortens the exposed wait; past L the step is (c + 2 B k) / q: longer than without the charge
// by exactly what the CPU work adds over the link. k = 0 is the plain step.
BOOST_AUTO_TEST_CASE(transfer_cpu_hides_behind_a_link_bound_gossip_step) {
  const double c = 0.002, B = 1e6, q = 0.5, L = B / kNic;  // L = 10 ms
  auto step = [&](double k) {
    StrategySetup g = gossip(2, B, c);
    g.steps = 8;
    for (RankSetup& r : g.ranks) r.net_cpu_s_per_byte = k;
    own_nodes(g, CpuShare{1, 1, q, 1e-4});
    return run_on_star(g, 2);
  };
  const StepResult plain = step(0);
  BOOST_TEST(plain.step_s == L, tt::tolerance(1e-6));
  BOOST_TEST(plain.ranks[0].comm_cpu_s == 0.0);
  BOOST_TEST(plain.ranks[0].comm_exposed_s == L - c / q, tt::tolerance(0.01));
  // 2 B k = 2 ms: the CPU path (c + 2 B k) / q = 8 ms, under the link's 10 ms
  const StepResult hidden = step(1e-9);
  BOOST_TEST(hidden.step_s == L, tt::tolerance(1e-6));
  BOOST_TEST(hidden.ranks[0].comm_cpu_s == 2 * B * 1e-9, tt::tolerance(1e-9));
  BOOST_TEST(hidden.ranks[0].comm_exposed_s == L - (c + 2 * B * 1e-9) / q, tt::tolerance(0.01));
  // 2 B k = 8 ms: the CPU path is 20 ms, past the link
  const double k = 4e-9;
  const StepResult bound = step(k);
  BOOST_TEST(bound.step_s == (c + 2 * B * k) / q, tt::tolerance(0.01));
  BOOST_TEST(bound.step_s - plain.step_s == (c + 2 * B * k) / q - L, tt::tolerance(0.02));
  BOOST_TEST(bound.ranks[0].comm_cpu_s == 2 * B * k, tt::tolerance(1e-9));
}

// ps-async and asynchronous EASGD (period 1) charge it through the same flows: one worker and its server on nodes
// held to q = 1/2 core, a link 100x too fast to matter. A step computes c, then the push (B k on the worker and on
// the server at once) and the reply (the same), one after the other: (c + 2 B k) / q, and c / q at k = 0.
BOOST_AUTO_TEST_CASE(transfer_cpu_lengthens_ps_async_and_elastic_steps_under_a_quota) {
  const int64_t P = 25000;  // B = 100 kB
  const double B = 4.0 * P, c = 0.004, q = 0.5;
  for (const bool elastic : {false, true}) {
    auto step = [&](double k) {
      StrategySetup s = push_pull(1, 1, P, elastic ? 0 : -1);
      if (elastic) s.sync.exchange = parallel::Exchange::kElastic, s.sync.period = 1;
      s.steps = 8;
      set_compute(s, 0, c);
      for (RankSetup& r : s.ranks) r.net_cpu_s_per_byte = k;
      own_nodes(s, CpuShare{1, 1, q, 1e-4});
      return run_on_star(s, 2, 100 * kNic);
    };
    const double k = 1e-8;  // 2 B k = 2 ms
    const StepResult plain = step(0), charged = step(k);
    BOOST_TEST_CONTEXT("elastic " << elastic) {
      BOOST_TEST(plain.step_s == c / q, tt::tolerance(0.01));
      BOOST_TEST(plain.ranks[0].comm_cpu_s == 0.0);
      BOOST_TEST(charged.step_s == (c + 2 * B * k) / q, tt::tolerance(0.01));
      BOOST_TEST(charged.ranks[0].comm_cpu_s == 2 * B * k, tt::tolerance(1e-9));
      BOOST_TEST(charged.ranks[1].comm_cpu_s == 2 * B * k, tt::tolerance(1e-9));  // the server: the push in, the reply out
    }
  }
}

// The parameter server's CPU-bound closed form: ps with W workers, no compute, a link 100x too fast to matter,
// k s/B on every side, every rank on a one-core node. The server receives W pushes (W B k of its CPU, shared on
// its core, all done together) and then sends W replies (W B k): a step is 2 W B k; each worker spends B k on
// its push and B k on its pull.
BOOST_AUTO_TEST_CASE(transfer_cpu_on_the_server_is_2_w_b_k_per_ps_step) {
  const int32_t W = 2;
  const int64_t P = 25000;  // B = 100 kB
  const double B = 4.0 * P, k = 1e-8;
  StrategySetup s = push_pull(W, 1, P, 0);
  s.steps = 4;
  for (RankSetup& r : s.ranks) r.net_cpu_s_per_byte = k;
  own_nodes(s, CpuShare{1, 1, 0, 0.1});
  const StepResult r = run_on_star(s, W + 1, 100 * kNic);
  BOOST_TEST(r.step_s == 2 * W * B * k, tt::tolerance(1e-5));
  BOOST_TEST(r.ranks[static_cast<size_t>(W)].comm_cpu_s == 2 * W * B * k, tt::tolerance(1e-9));
  BOOST_TEST(r.ranks[0].comm_cpu_s == 2 * B * k, tt::tolerance(1e-9));
  // FedAvg: a round's upload and broadcast cost rank 0 B k each (1 other worker), the other worker the same
  StrategySetup f;
  f.sync.exchange = parallel::Exchange::kRound;
  f.sync.workers = 2;
  f.param_bytes = B;
  f.clients = f.sampled = 2;
  f.client_steps = {1, 1};
  f.steps = 2;
  f.ranks.resize(2);
  for (auto& rk : f.ranks) rk.forward_s = {0}, rk.backward_s = {0}, rk.optimizer_s = 0.01, rk.net_cpu_s_per_byte = k;
  own_nodes(f, CpuShare{1, 1, 0, 0.1});
  const StepResult fr = run_on_star(f, 2, 100 * kNic);
  // the clients compute 10 ms, then the upload (B k on both cores) and the broadcast (B k on both)
  BOOST_TEST(fr.step_s == 0.01 + 2 * B * k, tt::tolerance(1e-4));
  BOOST_TEST(fr.ranks[1].comm_cpu_s == 2 * B * k, tt::tolerance(1e-9));
}

BOOST_AUTO_TEST_SUITE_END()
