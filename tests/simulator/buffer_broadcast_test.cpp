// PyTorch DDP's per-step buffer broadcast (simulator/broadcast.hpp): gloo's binomial tree in closed form, the bytes
// PyTorch broadcasts, and --framework pytorch-ddp paying it before every forward.
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "engine/nn/zoo.hpp"
#include "simulator/broadcast.hpp"
#include "simulator/cluster.hpp"
#include "simulator/simulate.hpp"

using namespace tandem::simulator;
using namespace tandem::simulator::network;
namespace nn = tandem::engine::nn;
namespace tt = boost::test_tools;

namespace {

// A broadcast of `bytes` from endpoint 0 over n hosts of an RDMA star (1 MB/s, `lat` s one way).
double tree_time(int n, double bytes, double lat) {
  std::vector<HostNet> h(n);
  for (auto& x : h) {
    x.nic_bytes_per_s = 1e6;
    x.nic_latency_s = lat;
  }
  des::Simulator sim;
  Network net(sim);
  Topology topo(TopologySpec{}, h, net);
  BroadcastGroup g;
  for (int i = 0; i < n; ++i) g.members.push_back(i);
  g.bytes = bytes;
  return simulate_tree_broadcast(topo, sim, {g});
}

}  // namespace

BOOST_AUTO_TEST_SUITE(buffer_broadcast)

// gloo's tree: 2 ranks: one message. 4 ranks: the root sends to 1 and 2 at once (half its uplink each), then 1
// sends to 3: 2L + 3B/C. 8 ranks: the root's 3 sends share its uplink (3B/C after L); 1 received at L + 3B/C
// (as 2 and 4) and sends to 3 and 5 at once (+ L + 2B/C), 2 to 6, 3 to 7 after: 3L + 6B/C.
BOOST_AUTO_TEST_CASE(gloo_binomial_tree_in_closed_form) {
  const double B = 1e5, C = 1e6, L = 1e-3;
  BOOST_TEST(tree_time(2, B, L) == L + B / C, tt::tolerance(1e-8));
  BOOST_TEST(tree_time(4, B, L) == 2 * L + 3 * B / C, tt::tolerance(1e-8));
  BOOST_TEST(tree_time(8, B, L) == 3 * L + 6 * B / C, tt::tolerance(1e-8));
  BOOST_TEST(tree_time(1, B, L) == 0.0);
  BOOST_TEST(tree_time(4, 0, L) == 0.0);
}

// running_mean and running_var (f32) of every BatchNorm plus its num_batches_tracked (i64): torchvision's ResNet-18
// has 20 BatchNorms over 4,800 channels: 4,800 x 2 x 4 + 20 x 8 = 38,560 bytes (sum of its buffers' nbytes)
BOOST_AUTO_TEST_CASE(pytorch_buffer_bytes_match_torch) {
  const nn::ModelSpec r18 = nn::zoo_model("resnet18", nn::zoo_default_input("resnet18"), 10);
  BOOST_TEST(pytorch_buffer_bytes(r18, 0, r18.layers.size()) == 38560.0);
  const nn::ModelSpec lenet5 = nn::zoo_model("lenet5", nn::zoo_default_input("lenet5"), 10);
  BOOST_TEST(pytorch_buffer_bytes(lenet5, 0, lenet5.layers.size()) == 0.0);
}

namespace {

SimResult ddp(const std::string& model, Framework f, bool broadcast) {
  JobSpec j;
  j.model = model;
  j.dataset = model == "lenet5" ? "fashion-mnist" : "cifar10";
  j.batch = 8;
  j.epochs = 0.001;
  j.strategy = Strategy::kDdp;
  j.framework = f;
  j.broadcast_buffers = broadcast;
  // two hosts on a slow TCP link: 10 Mbit/s, 5 ms one way
  const ClusterSpec c = parse_cluster(R"({"nodes": [{"preset": "c5.large", "count": 2, "nic_mbps": 10,
                                          "nic_latency_ms": 5}]})");
  return simulate(c, j, {.baseline = false});
}

}  // namespace

// pytorch-ddp resnet18 on 2 hosts: every step starts with one 38,560-byte message 0 -> 1, L + B x (1514/1448) / C
// (TCP's headers; its ACKs ride the other direction); lenet5 has no buffers and tandem's jobs broadcast none
BOOST_AUTO_TEST_CASE(pytorch_ddp_pays_the_broadcast_before_every_step) {
  const double with = ddp("resnet18", Framework::kPytorchDdp, true).step_time_s;
  const double without = ddp("resnet18", Framework::kPytorchDdp, false).step_time_s;
  const double expect = 5e-3 + 38560.0 * (kTcpFrameBytes / kTcpMssBytes) / (10e6 / 8);
  BOOST_TEST(with - without == expect, tt::tolerance(1e-6));
  BOOST_TEST(ddp("lenet5", Framework::kPytorchDdp, true).step_time_s ==
             ddp("lenet5", Framework::kPytorchDdp, false).step_time_s);
  BOOST_TEST(ddp("resnet18", Framework::kTandem, true).step_time_s ==
             ddp("resnet18", Framework::kTandem, false).step_time_s);
}

BOOST_AUTO_TEST_SUITE_END()
