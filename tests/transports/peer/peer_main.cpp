// A rank in a separate process, for the transport tests that need a peer to die for real.
//   transport_peer TRANSPORT STORE_DIR KEY_PREFIX RANK SIZE [mid|stuck|idle|flood|partner]
// Connects, sends 100 bytes (payload(rank, 1, 9, 100)) with tag 3 to rank 1, waits until the
// send completes and 200 ms more (a completed small zmq send may still sit in ZeroMQ's queue; the
// test is about what reached the peer), then kills itself with SIGKILL: no goodbye, no destructor.
// With "mid" it then starts a 64 MiB send with tag 5 and kills itself at once, mid-message; with "stuck" it starts
// a 1 MiB send with tag 5, drives progress for 100 ms (the message is announced; a ucx rendezvous waits for the
// receiver) and kills itself; with "idle" it keeps progressing (30 s at most) until the test stops or kills it.
// ucx_deaf_test's ranks of a 3-rank job (rank 0 is the test): "flood" (rank 1) sends 4,000-byte messages with tag 7
// to rank 0 until the test kills it; "partner" (rank 2) waits for rank 1's death (a receive from it fails), then sends
// 1 MiB with tag 9 to rank 0 and exits 3 when that completes, 0 when it fails as a peer failure naming rank 1 and
// rank 0's deafness, another code otherwise.
#include <csignal>
#include <cstdio>
#include <deque>
#include <string>
#include <thread>

#include "engine/core/error.hpp"
#include "tests/transports/file_store.hpp"
#include "tests/transports/harness.hpp"

using namespace tandem;
using namespace tandem::transports;

namespace {

[[noreturn]] void flood(Transport& t) {
  std::vector<unsigned char> data(4000, 0x11);
  ConstPart p{data.data(), data.size()};
  std::deque<std::unique_ptr<Request>> sent;
  for (;;) {  // until SIGKILL
    sent.push_back(t.isend(0, 7, std::span<const ConstPart>(&p, 1)));
    while (!sent.empty() && (sent.size() > 256 || sent.front()->test())) {
      if (!sent.front()->test()) t.wait_for_progress(std::chrono::microseconds(0));
      else sent.pop_front();
    }
    t.progress();
  }
}

int partner(Transport& t, std::vector<unsigned char>& big) {
  unsigned char never = 0;
  MutPart m{&never, 1};
  auto from_dead = t.irecv(1, 8, std::span<const MutPart>(&m, 1));
  try {
    if (testing::poll_for(t, *from_dead, std::chrono::seconds(20))) return 4;
    return 5;  // rank 1's death not noticed
  } catch (const Error&) {
  }
  ConstPart b{big.data(), big.size()};
  auto to_zero = t.isend(0, 9, std::span<const ConstPart>(&b, 1));
  try {
    return testing::poll_for(t, *to_zero, std::chrono::seconds(10)) ? 3 : 6;
  } catch (const Error& e) {
    const std::string what = e.what();
    std::fprintf(stderr, "transport_peer partner: %s\n", e.what());
    return e.status() == Status::kPeerFailure && what.find("rank 1 ") != std::string::npos &&
                   what.find("can receive nothing more") != std::string::npos
               ? 0
               : 7;
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 7 && (std::string(argv[6]) == "flood" || std::string(argv[6]) == "partner")) {
    try {
      testing::FileStore store(argv[2]);
      std::vector<unsigned char> big(size_t{1} << 20, 0x22);  // outlives the transport
      auto t = create_transport(testing::options_for(argv[1], std::stoi(argv[4]), std::stoi(argv[5]), store, argv[3]));
      if (std::string(argv[6]) == "flood") flood(*t);
      return partner(*t, big);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "transport_peer: %s\n", e.what());
      return 8;
    }
  }
  const bool stuck = argc == 7 && std::string(argv[6]) == "stuck";
  const bool idle = argc == 7 && std::string(argv[6]) == "idle";
  const bool mid = (argc == 7 && std::string(argv[6]) == "mid") || stuck;
  if (argc != 6 && !mid && !idle) {
    std::fprintf(stderr, "usage: transport_peer TRANSPORT STORE_DIR KEY_PREFIX RANK SIZE "
                         "[mid|stuck|idle|flood|partner]\n");
    return 2;
  }
  try {
    testing::FileStore store(argv[2]);
    const int rank = std::stoi(argv[4]), size = std::stoi(argv[5]);
    auto t = create_transport(testing::options_for(argv[1], rank, size, store, argv[3]));
    auto data = testing::payload(rank, 1, 9, 100);
    ConstPart p{data.data(), data.size()};
    auto rq = t->isend(1, 3, std::span<const ConstPart>(&p, 1));
    testing::wait(*t, *rq);
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(idle ? 30000 : 200);
    while (std::chrono::steady_clock::now() < until) t->wait_for_progress(std::chrono::milliseconds(10));
    if (mid) {
      std::vector<unsigned char> big(stuck ? size_t{1} << 20 : size_t{64} << 20, 0x5a);
      ConstPart b{big.data(), big.size()};
      auto started = t->isend(1, 5, std::span<const ConstPart>(&b, 1));
      t->progress();
      const auto announced = std::chrono::steady_clock::now() + std::chrono::milliseconds(stuck ? 100 : 0);
      while (std::chrono::steady_clock::now() < announced) t->wait_for_progress(std::chrono::milliseconds(1));
      std::raise(SIGKILL);
    }
    std::raise(SIGKILL);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "transport_peer: %s\n", e.what());
  }
  return 1;
}
