// A rank of a 3-rank ucx communicator in a process of its own, for ucx_shrink_test (tests/comm), whose process is
// rank 0:
//   comm_peer STORE_DIR RANK flood|partner
// Each creates the world over ucx through a FileStore in STORE_DIR and splits it as the test does ({0, 2}; rank 1
// takes no part).
//  flood (rank 1): sends 4,000-byte messages with tag 7 to rank 0 until the test kills it.
//  partner (rank 2): waits for rank 1's death (a receive from it fails), sends 1 MiB with tag 9 to rank 0 on {0, 2}
//  (the test learns from it whether it still hears), then shrinks the world to the survivors and all-reduces there
//  (1000 floats, then 256 Ki floats: each rank gives its old rank + 1, so every element must be 4). Exits 0 when
//  every sum is right, 3 when one is not, 4 when an operation failed (printed), 8 when it could not start.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "engine/comm/communicator.hpp"
#include "engine/core/error.hpp"
#include "tests/transports/file_store.hpp"

using namespace tandem;
using namespace tandem::engine::comm;

namespace {

bool sums_right(Communicator& c, float mine, size_t count) {
  std::vector<float> in(count, mine), out(count, -1.f);
  c.allreduce(in.data(), out.data(), count, DType::kF32, ReduceOp::kSum)->wait();
  for (float v : out)
    if (v != 4.f) return false;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4 || (std::string(argv[3]) != "flood" && std::string(argv[3]) != "partner")) {
    std::fprintf(stderr, "usage: comm_peer STORE_DIR RANK flood|partner\n");
    return 2;
  }
  const int rank = std::stoi(argv[2]);
  std::unique_ptr<Communicator> world, pair;
  try {
    BootstrapInfo info;
    info.rank = rank;
    info.size = 3;
    info.host = "localhost";
    CommOptions options;
    options.transport = "ucx";
    options.timeout = std::chrono::milliseconds(4000);
    world = Communicator::create(info, std::make_shared<transports::testing::FileStore>(argv[1]), options);
    pair = world->split(rank == 1 ? -1 : 0, rank);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "comm_peer rank %d: %s\n", rank, e.what());
    return 8;
  }
  try {
    if (rank == 1) {
      std::vector<unsigned char> data(4000, 0x11);
      for (;;) world->send(data.data(), data.size(), DType::kU8, 0, 7)->wait();  // until SIGKILL
    }
    unsigned char never = 0;
    try {
      world->recv(&never, 1, DType::kU8, 1, 8)->wait();
      std::fprintf(stderr, "comm_peer rank 2: a message from rank 1, which should be dead\n");
      return 4;
    } catch (const Error&) {
    }
    std::vector<unsigned char> big(size_t{1} << 20, 0x22);
    pair->send(big.data(), big.size(), DType::kU8, 0, 9)->wait();  // buffered: done once copied
    auto survivors = world->shrink();
    const bool right = survivors->size() == 2 && sums_right(*survivors, 3.f, 1000) &&
                       sums_right(*survivors, 3.f, size_t{1} << 18);
    survivors->barrier()->wait();
    return right ? 0 : 3;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "comm_peer rank %d: %s\n", rank, e.what());
    return 4;
  }
}
