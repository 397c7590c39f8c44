// Point-to-point transport benchmark: two ranks (threads of this process, each with its own
// transport) exchange messages in both directions at once -- the pattern of a 2-rank ring step --
// and ping-pong small messages for latency. Prints one line per size (or JSON with --json).
// Besides wall-clock rates it prints the process CPU time (user + system, all threads, kernel TCP
// work included) per byte exchanged: on a shared machine that figure is the stable one.
//   p2p_bench [--transport NAME] [--min BYTES] [--max BYTES] [--iters N] [--json]
#include <algorithm>
#include <barrier>
#include <sys/resource.h>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "engine/core/error.hpp"
#include "transports/memory_store.hpp"
#include "transports/transport.hpp"

using namespace tandem::transports;
using Clock = std::chrono::steady_clock;

namespace {

void wait(Transport& t, Request& r) {
  const auto until = Clock::now() + std::chrono::seconds(60);
  while (!r.test()) {
    if (Clock::now() > until) TANDEM_THROW(tandem::Status::kTimeout, "rank {}: request stuck for 60 s", t.rank());
    t.wait_for_progress(std::chrono::microseconds(500));
  }
}

struct Result {
  double exchange_gbps = 0;  // bytes sent per rank per second, both directions busy
  double cpu_ns_per_byte = 0;  // process CPU time per byte sent (both ranks' bytes counted)
  double pingpong_us = 0;    // half round trip
};

double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

Result run(Transport& t, std::barrier<>& sync, size_t bytes, int iters) {
  const int peer = 1 - t.rank();
  std::vector<char> out(bytes, static_cast<char>(t.rank() + 1)), in(bytes);
  ConstPart sp{out.data(), bytes};
  MutPart rp{in.data(), bytes};
  auto exchange = [&] {
    auto rq = t.irecv(peer, 1, std::span<const MutPart>(&rp, 1));
    auto sq = t.isend(peer, 1, std::span<const ConstPart>(&sp, 1));
    wait(t, *sq);
    wait(t, *rq);
  };
  for (int i = 0; i < 2; ++i) exchange();  // warm-up
  sync.arrive_and_wait();
  const double cpu0 = cpu_seconds();
  auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) exchange();
  const double exch = std::chrono::duration<double>(Clock::now() - t0).count();
  sync.arrive_and_wait();
  const double cpu = cpu_seconds() - cpu0;
  TANDEM_CHECK(in[0] == static_cast<char>(peer + 1) && in[bytes - 1] == static_cast<char>(peer + 1),
               tandem::Status::kInternal, "rank {} received wrong data", t.rank());
  sync.arrive_and_wait();
  t0 = Clock::now();
  for (int i = 0; i < iters; ++i) {
    if (t.rank() == 0) {
      auto sq = t.isend(peer, 2, std::span<const ConstPart>(&sp, 1));
      auto rq = t.irecv(peer, 2, std::span<const MutPart>(&rp, 1));
      wait(t, *sq);
      wait(t, *rq);
    } else {
      auto rq = t.irecv(peer, 2, std::span<const MutPart>(&rp, 1));
      wait(t, *rq);
      auto sq = t.isend(peer, 2, std::span<const ConstPart>(&sp, 1));
      wait(t, *sq);
    }
  }
  const double pp = std::chrono::duration<double>(Clock::now() - t0).count();
  return Result{bytes * double(iters) / exch / 1e9, cpu / (2.0 * bytes * iters) * 1e9, pp / iters / 2 * 1e6};
}

}  // namespace

int main(int argc, char** argv) {
  std::string name = "zmq";
  size_t min_bytes = 8, max_bytes = size_t{64} << 20;
  int iters = 0;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return std::string(argv[++i]);
    };
    if (a == "--transport") name = next();
    else if (a == "--min") min_bytes = std::stoull(next());
    else if (a == "--max") max_bytes = std::stoull(next());
    else if (a == "--iters") iters = std::stoi(next());
    else if (a == "--json") json = true;
    else {
      std::fprintf(stderr, "usage: p2p_bench [--transport NAME] [--min BYTES] [--max BYTES] [--iters N] [--json]\n");
      return 2;
    }
  }
  MemoryStore store;
  std::barrier<> sync(2);
  std::vector<Result> results;
  std::vector<size_t> sizes;
  for (size_t b = min_bytes; b <= max_bytes; b *= 4) sizes.push_back(b);
  results.resize(sizes.size());
  std::string error;
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      try {
        TransportOptions o;
        o.name = name;
        o.rank = r;
        o.size = 2;
        o.store = &store;
        o.key_prefix = "p2p_bench";
        auto t = create_transport(o);
        for (size_t i = 0; i < sizes.size(); ++i) {
          const int n = iters > 0 ? iters : static_cast<int>(std::clamp<size_t>((size_t{256} << 20) / sizes[i], 10, 2000));
          Result res = run(*t, sync, sizes[i], n);
          if (r == 0) results[i] = res;
        }
        sync.arrive_and_wait();
      } catch (const std::exception& e) {
        error = e.what();
        sync.arrive_and_drop();
      }
    });
  }
  for (auto& th : ranks) th.join();
  if (!error.empty()) {
    std::fprintf(stderr, "p2p_bench: %s\n", error.c_str());
    return 1;
  }
  if (!json)
    std::printf("%12s %14s %14s %14s   (transport %s, 2 ranks as threads)\n", "bytes", "exchange GB/s",
                "cpu ns/byte", "pingpong us", name.c_str());
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (json)
      std::printf("{\"transport\":\"%s\",\"bytes\":%zu,\"exchange_gbps\":%.3f,\"cpu_ns_per_byte\":%.3f,"
                  "\"pingpong_us\":%.2f}\n",
                  name.c_str(), sizes[i], results[i].exchange_gbps, results[i].cpu_ns_per_byte, results[i].pingpong_us);
    else
      std::printf("%12zu %14.3f %14.3f %14.2f\n", sizes[i], results[i].exchange_gbps, results[i].cpu_ns_per_byte,
                  results[i].pingpong_us);
  }
  return 0;
}
