// A rank program for the launcher tests: joins the job described by the environment through the
// rendezvous store, exchanges one value with every rank, and prints what it saw.
//   rendezvous_probe exchange    -> "rank R of N: saw 0,1,...,N-1"; exit 0 when every value was right
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include "engine/comm/bootstrap.hpp"
#include "engine/core/error.hpp"

int main(int argc, char** argv) {
  using namespace tandem::engine::comm;
  if (argc < 2 || std::strcmp(argv[1], "exchange") != 0) {
    std::fprintf(stderr, "usage: rendezvous_probe exchange\n");
    return 2;
  }
  try {
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
  } catch (const tandem::Error& e) {
    std::fprintf(stderr, "probe failed: %s\n", e.what());
    return 1;
  }
}
