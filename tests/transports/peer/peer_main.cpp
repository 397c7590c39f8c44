// A rank in a separate process, for the transport tests that need a peer to die for real.
//   transport_peer TRANSPORT STORE_DIR KEY_PREFIX RANK SIZE [mid]
// Connects, sends 100 bytes (payload(rank, 1, 9, 100)) with tag 3 to rank 1, waits until the
// send completes and 200 ms more (a completed small zmq send may still sit in ZeroMQ's queue; the
// test is about what reached the peer), then kills itself with SIGKILL: no goodbye, no destructor.
// With "mid" it then starts a 64 MiB send with tag 5 and kills itself at once, mid-message; with "stuck" it starts
// a 1 MiB send with tag 5, drives progress for 100 ms (the message is announced; a ucx rendezvous waits for the
// receiver) and kills itself; with "idle" it keeps progressing (30 s at most) until the test stops or kills it.
#include <csignal>
#include <cstdio>
#include <string>
#include <thread>

#include "tests/transports/file_store.hpp"
#include "tests/transports/harness.hpp"

using namespace tandem::transports;

int main(int argc, char** argv) {
  const bool stuck = argc == 7 && std::string(argv[6]) == "stuck";
  const bool idle = argc == 7 && std::string(argv[6]) == "idle";
  const bool mid = (argc == 7 && std::string(argv[6]) == "mid") || stuck;
  if (argc != 6 && !mid && !idle) {
    std::fprintf(stderr, "usage: transport_peer TRANSPORT STORE_DIR KEY_PREFIX RANK SIZE [mid|stuck|idle]\n");
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
