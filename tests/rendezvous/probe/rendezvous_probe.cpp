// A rank program for the launcher tests: joins the job described by the environment through the
// rendezvous store, exchanges one value with every rank, and prints what it saw.
//   rendezvous_probe exchange    -> "rank R of N: saw 0,1,...,N-1"; exit 0 when every value was right
//   rendezvous_probe allreduce   -> create_communicator_from_env, allreduce of rank+1:
//                                   "rank R of N over T: sum S"; exit 0 when S == N(N+1)/2
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include "engine/comm/bootstrap.hpp"
#include "engine/core/error.hpp"

int main(int argc, char** argv) {
  using namespace tandem::engine::comm;
  const bool exchange = argc >= 2 && std::strcmp(argv[1], "exchange") == 0;
  const bool allreduce = argc >= 2 && std::strcmp(argv[1], "allreduce") == 0;
  if (!exchange && !allreduce) {
    std::fprintf(stderr, "usage: rendezvous_probe exchange|allreduce\n");
    return 2;
  }
  try {
    if (allreduce) {
      auto comm = create_communicator_from_env();
      double v = comm->rank() + 1;
      comm->allreduce(&v, &v, 1, tandem::DType::kF64, tandem::ReduceOp::kSum)->wait();
      const int n = comm->size();
      std::printf("rank %d of %d over %s: sum %g\n", comm->rank(), n, comm->transport_name(), v);
      comm->barrier()->wait();
      return v == n * (n + 1) / 2.0 ? 0 : 3;
    }
    const BootstrapConfig c = bootstrap_config_from_env();
    Rendezvous rdv = start_rendezvous(c, std::chrono::milliseconds(10000));
    rdv.store->set("probe/" + std::to_string(c.info.rank), std::to_string(c.info.rank));
    std::string seen;
    int wrong = 0;
    for (int p = 0; p < c.info.size; ++p) {
      const std::string v = rdv.store->get("probe/" + std::to_string(p), std::chrono::milliseconds(10000));
      wrong += v != std::to_string(p);
      seen += (p ? "," : "") + v;
    }
    if (rdv.client) rdv.client->barrier("probe/done", c.info.size, std::chrono::milliseconds(10000));
    std::printf("rank %d of %d: saw %s\n", c.info.rank, c.info.size, seen.c_str());
    return wrong == 0 ? 0 : 3;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "probe failed: %s\n", e.what());
    return 1;
  }
}
