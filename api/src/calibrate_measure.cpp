// Measurements behind tandem_calibrate besides compute: point-to-point figures between two ranks, the local
// reduction bandwidth, and a description of the machine.
#include <time.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "api/src/calibrate_handles.hpp"
#include "engine/comm/plan.hpp"
#include "engine/comm/reduce_kernels.hpp"
#include "engine/core/allocator.hpp"
#include "engine/core/error.hpp"
#include "engine/core/host_info.hpp"
#include "engine/core/settings.hpp"

namespace tandem::api {

namespace {

using Clock = std::chrono::steady_clock;
// Tags of the calibration's own point-to-point messages (user tags; the communicator is not shared
// with anything else during the call).
constexpr uint32_t kTagPing = 0x7ca1;
constexpr uint32_t kTagPong = 0x7ca2;
constexpr uint32_t kTagBulk = 0x7ca3;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string first_line_with(const char* path, const char* key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) return {};
    const size_t b = line.find_first_not_of(" \t", colon + 1);
    return b == std::string::npos ? std::string() : line.substr(b);
  }
  return {};
}

}  // namespace

std::optional<double> cpu_quota_cores() { return cgroup_cpu_quota_cores(); }

P2pFigures measure_p2p(engine::comm::Communicator& c, uint64_t bytes, int iters) {
  TANDEM_REQUIRE(c.size() >= 2, "calibrate: point-to-point needs 2 ranks, the communicator has {}", c.size());
  TANDEM_REQUIRE(bytes >= 64 && iters >= 1, "calibrate: p2p_bytes must be >= 64 and p2p_iters >= 1 (got {}, {})",
                 bytes, iters);
  const int rank = c.rank();
  double fig[2] = {0, 0};  // bytes_per_s, latency_s
  if (rank <= 1) {
    const int peer = 1 - rank;
    float word = 0;
    std::vector<uint8_t> out(bytes, 1), in(bytes);
    auto ping = [&] {  // rank 0 asks, rank 1 answers; returns rank 0's round trip (and lines the two ranks up)
      const auto t0 = Clock::now();
      if (rank == 0) {
        c.send(&word, 1, DType::kF32, peer, kTagPing)->wait();
        c.recv(&word, 1, DType::kF32, peer, kTagPong)->wait();
      } else {
        c.recv(&word, 1, DType::kF32, peer, kTagPing)->wait();
        c.send(&word, 1, DType::kF32, peer, kTagPong)->wait();
      }
      return std::chrono::duration<double>(Clock::now() - t0).count();
    };
    // Both ranks send n bytes to each other at once, as collectives and 1F1B pipelines load a link: both
    // directions busy, each direction's acknowledgements queued behind the other's data.
    auto exchange = [&](size_t n) {
      ping();
      const auto t0 = Clock::now();
      auto s = c.send(out.data(), n, DType::kU8, peer, kTagBulk);
      auto r = c.recv(in.data(), n, DType::kU8, peer, kTagBulk);
      s->wait();
      r->wait();
      return std::chrono::duration<double>(Clock::now() - t0).count();
    };
    std::vector<double> rtt;
    for (int i = 0; i < 3 + 10 * iters; ++i) {
      const double t = ping();
      if (i >= 3) rtt.push_back(t);
    }
    // Bandwidth from the exchange less the one-way latency; latency from the pings. (A fit of
    // t(n) = alpha + n / beta over two sizes was tried: on a shared machine its alpha swung from 0 to 3 ms
    // between runs minutes apart, while the pings agree within tens of microseconds.)
    std::vector<double> tl;
    for (int i = 0; i < 1 + iters; ++i) {
      const double t = exchange(bytes);
      if (i >= 1) tl.push_back(t);
    }
    const double half_rtt = median(rtt) / 2;
    fig[0] = static_cast<double>(bytes) / std::max(median(tl) - half_rtt, 1e-9);
    fig[1] = half_rtt;
  }
  c.broadcast(fig, 2, DType::kF64, 0)->wait();
  P2pFigures p;
  p.bytes_per_s = fig[0];
  p.latency_s = p.ping_s = fig[1];
  return p;
}

void measure_allreduce_rounds(engine::comm::Communicator& c, P2pFigures& p, uint64_t count) {
  TANDEM_REQUIRE(c.size() >= 2, "calibrate: the all-reduce round needs 2 ranks, the communicator has {}", c.size());
  TANDEM_REQUIRE(count >= 1 && p.bytes_per_s > 0, "calibrate: all-reduce count {} / bandwidth {} not positive",
                 count, p.bytes_per_s);
  using engine::comm::OpKind;
  // The plan the communicator runs for this all-reduce: its rounds with transfers, and per round the largest
  // message a rank sends (the round ends when its slowest transfer does).
  engine::comm::PlanRequest req;
  req.collective = engine::comm::Collective::kAllreduce;
  req.algorithm = c.allreduce_algorithm_for(count, DType::kF32);
  req.world = c.size();
  req.count = count;
  req.elem_bytes = 4;
  req.in_place = true;
  const engine::comm::Plan plan = engine::comm::make_plan(req);
  int32_t rounds = 0;
  double wire_s = 0;
  for (const engine::comm::RankPlan& rp : plan.ranks) {
    int32_t n = 0;
    double s = 0;
    for (const engine::comm::Round& r : rp.rounds) {
      uint64_t most = 0;
      bool transfer = false;
      for (const engine::comm::Op& op : r.ops) {
        if (op.kind != OpKind::kSend && op.kind != OpKind::kRecv) continue;
        transfer = true;
        most = std::max(most, op.kind == OpKind::kSend ? op.src.count : op.dst.count);
      }
      if (!transfer) continue;
      ++n;
      s += static_cast<double>(most * 4) / p.bytes_per_s;
    }
    if (n > rounds || (n == rounds && s > wire_s)) {
      rounds = n;
      wire_s = s;
    }
  }
  TANDEM_CHECK(rounds > 0, Status::kInternal, "calibrate: the {} all-reduce plan over {} ranks has no transfers",
               engine::comm::algorithm_name(req.algorithm), c.size());

  std::vector<float> buf(count, 1.0f);
  auto once = [&] {
    const auto t0 = Clock::now();
    c.allreduce(buf.data(), buf.data(), count, DType::kF32, ReduceOp::kMax)->wait();
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  constexpr int kWarmup = 5, kTimed = 50;
  for (int i = 0; i < kWarmup; ++i) once();  // connections and plans made, caches warm
  c.barrier()->wait();
  std::vector<double> t;
  for (int i = 0; i < kTimed; ++i) t.push_back(once());
  // Each rank's median (a preempted operation on a shared machine does not count), then the slowest rank's.
  double per_op = median(t);
  c.allreduce(&per_op, &per_op, 1, DType::kF64, ReduceOp::kMax)->wait();
  p.allreduce_s = per_op;
  p.allreduce_bytes = count * 4;
  p.allreduce_rounds = rounds;
  p.allreduce_algorithm = engine::comm::algorithm_name(req.algorithm);
  p.allreduce_round_s = std::max(0.0, (p.allreduce_s - wire_s) / rounds);
  p.latency_s = std::max(p.ping_s, p.allreduce_round_s);
}

double measure_reduce_bandwidth() {
  constexpr size_t kElems = size_t{8} << 20;  // 32 MiB per buffer: past the caches, like a gradient bucket
  std::vector<float> dst(kElems, 1.0f), src(kElems, 1e-7f);
  std::vector<double> t;
  // Thread CPU time, not wall time: under a CFS quota a pass longer than the quota's window stands still between
  // windows, and the simulator applies a node's quota itself (the reductions run on its CPU model): the figure
  // must be the full-speed bandwidth, as the comm CPU figures are (calibrate_comm_cpu.cpp).
  const auto cpu_now = [] {
    timespec ts{};
    ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  };
  const CpuIsa isa = active_cpu_isa();  // the variant this context's collectives run (TANDEM_CPU_MAX_ISA)
  for (int i = 0; i < 4; ++i) {
    const double t0 = cpu_now();
    engine::comm::reduce_kernel(isa, dst.data(), src.data(), kElems, DType::kF32, ReduceOp::kSum);
    const double s = cpu_now() - t0;
    if (i > 0) t.push_back(s);  // the first pass also faults the pages in
  }
  const double s = median(t);
  return s > 0 ? 3.0 * 4.0 * static_cast<double>(kElems) / s : 0.0;
}

std::pair<double, double> measure_convert_s(engine::parallel::GradCompression c) {
  constexpr size_t kElems = size_t{4} << 20;  // 16 MiB of f32: a gradient bucket's size class, past the caches
  std::vector<float> g(kElems, 0.37f), back(kElems);
  std::vector<uint16_t> wire(kElems);
  std::vector<double> to, from;
  for (int i = 0; i < 4; ++i) {
    const auto t0 = Clock::now();
    engine::parallel::compress_gradients(c, g.data(), 0.5f, wire.data(), kElems);
    const auto t1 = Clock::now();
    engine::parallel::decompress_gradients(c, wire.data(), back.data(), kElems);
    const auto t2 = Clock::now();
    if (i == 0) continue;  // the first pass also faults the pages in
    to.push_back(std::chrono::duration<double>(t1 - t0).count());
    from.push_back(std::chrono::duration<double>(t2 - t1).count());
  }
  // 0.37 * 0.5 survives both formats' rounding within their precision: a wrong conversion shows here.
  TANDEM_CHECK(std::abs(back[kElems / 2] - 0.185f) < 1e-3f, Status::kInternal,
               "calibrate: 16-bit gradient conversion round trip gave {} for 0.185", back[kElems / 2]);
  return {median(to) / kElems, median(from) / kElems};
}

namespace {
// The freed activations go back to malloc and malloc's free pages to the system (they belong to the activations'
// peak, which the simulator counts apart); the blocks still in use are the model's.
void release_free_memory() {
  host_allocator().empty_cache();
#ifdef __GLIBC__
  ::malloc_trim(0);
#endif
}
}  // namespace

double runtime_rss_bytes(bool one_process) {
  release_free_memory();
  const double tensors = static_cast<double>(host_allocator().stats().bytes_in_use);
  const double rss = proc_kib_field_bytes("/proc/self/status", "VmRSS");
  // A job's rank maps its transport's shared-memory segments (UCX's); a process training alone has no
  // communicator, so a one-process calibration leaves them out of the figure it predicts from.
  const double shared = one_process ? std::max(0.0, proc_kib_field_bytes("/proc/self/status", "RssShmem")) : 0.0;
  return rss > 0 ? std::max(0.0, rss - tensors - shared) : 0.0;
}

double runtime_device_bytes(Device device) {
  if (device.is_cpu()) return 0;
  CachingAllocator& a = allocator_for(device);
  a.empty_cache();
  const double held = process_device_memory_bytes(device);
  return held > 0 ? std::max(0.0, held - static_cast<double>(a.stats().bytes_in_use)) : 0.0;
}

bool PeakRssProbe::start() {
  release_free_memory();
  baseline_ = proc_kib_field_bytes("/proc/self/status", "VmRSS");
  armed_ = false;
  if (baseline_ <= 0) return false;
  {
    std::ofstream clear("/proc/self/clear_refs");
    if (!clear) return false;
    clear << "5";  // resets the peak resident size (VmHWM) to the current one
    clear.flush();
    if (!clear) return false;
  }
  // the reset took where the peak is back near the resident size (the passes before peaked far above it)
  const double hwm = proc_kib_field_bytes("/proc/self/status", "VmHWM");
  const double rss = proc_kib_field_bytes("/proc/self/status", "VmRSS");
  armed_ = hwm > 0 && rss > 0 && hwm <= rss + 1048576.0;
  return armed_;
}

double PeakRssProbe::stop() const {
  if (!armed_) return 0;
  const double hwm = proc_kib_field_bytes("/proc/self/status", "VmHWM");
  return std::max(0.0, hwm - baseline_);
}

std::string describe_machine(int threads) {
  char host[256] = {0};
  if (::gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  std::string cpu = first_line_with("/proc/cpuinfo", "model name");
  std::string s = fmt::format("host {}, {}, {} thread{}", host[0] ? host : "?", cpu.empty() ? "unknown CPU" : cpu,
                              threads, threads == 1 ? "" : "s");
  if (const auto q = cpu_quota_cores()) s += fmt::format(", cpu quota {:.2f} core", *q);
  const auto env = settings::current();
  const auto emu = env->text("TANDEM_EMU_NAME");
  const auto emu_host = env->text("TANDEM_EMU_HOST");
  if (emu && emu_host) s += fmt::format(", emulated host {} of cluster {}", *emu_host, *emu);
  return s;
}

}  // namespace tandem::api
