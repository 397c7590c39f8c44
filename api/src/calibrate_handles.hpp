#pragma once
// The struct behind tandem_calibration_t, and the measurements the calibration shims share.
#include <time.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/src/handles.hpp"
#include "engine/comm/communicator.hpp"
#include "engine/parallel/grad_reducer.hpp"
#include "engine/train/calibrate.hpp"
#include "tandem/tandem.h"

namespace tandem::api {
// This thread's CPU time in seconds (CLOCK_THREAD_CPUTIME_ID): what the calibration's CPU figures are timed in.
inline double thread_cpu_s() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}
constexpr uint32_t kCalibrationMagic = 0x5443414c;  // "TCAL"

struct P2pFigures {
  double bytes_per_s = 0;  // both directions busy
  double latency_s = 0;    // per message, as the simulator charges it: max(ping_s, allreduce_round_s)
  double ping_s = 0;       // one way: half the median round trip of a 4-byte ping
  // A small all-reduce over every rank, as the runtime runs it: its time per round less the round's bytes at
  // bytes_per_s -- the runtime's cost per message and round (posting, progress, waking the waiter, the
  // reduction), which a ping alone does not pay. 0 with fewer than 2 ranks.
  double allreduce_round_s = 0;
  double allreduce_s = 0;          // the whole small all-reduce (the slowest rank's median)
  uint64_t allreduce_bytes = 0;
  int32_t allreduce_rounds = 0;    // rounds with transfers in the plan the communicator runs
  std::string allreduce_algorithm;
};

// Ranks 0 and 1 of `c` measure the link between them: pings of 4 bytes (10 x iters), then exchanges of `bytes`
// -- both ranks sending at once, as collectives and 1F1B pipelines use a link, each direction's
// acknowledgements queued behind the other's data -- whose median (of `iters`) less the one-way latency gives
// the bandwidth. The figures are broadcast from rank 0, so every rank returns them. Collective over `c`
// (size >= 2).
P2pFigures measure_p2p(engine::comm::Communicator& c, uint64_t bytes, int iters);
// Every rank of `c` times all-reduces of `count` f32 one by one (the slowest rank's median) and derives the per-round cost from the plan the communicator runs for it (its rounds with
// transfers and the bytes each round moves at p.bytes_per_s); fills p's allreduce_* fields and raises
// p.latency_s to the per-round cost where that is larger. Collective over `c` (size >= 2).
void measure_allreduce_rounds(engine::comm::Communicator& c, P2pFigures& p, uint64_t count = 16);
// This thread's local reduction bandwidth: dst += src over f32 buffers larger than the caches, counted as
// the simulator counts a reduction (read dst, read src, write dst: 12 bytes per element).
// Timed in thread CPU time, so a quota's pauses do not lower it (a full-speed figure, like the layers'
// after full_speed_profile).
double measure_reduce_bandwidth();
// CPU seconds per payload byte that moving a message costs one side (simulator/compute/profile.hpp
// tcp_cpu_s_per_byte, copy_cpu_s_per_byte), from thread CPU time (CLOCK_THREAD_CPUTIME_ID): a loopback TCP
// transfer of `bytes` between two threads of this process (half the sender's and the receiver's CPU per byte),
// and a memcpy pass over buffers past the caches (one copy into or out of a shared-memory ring). Thread CPU time
// is what a CFS quota charges and is not stretched by the quota's pauses: full-speed seconds. Throws kIo (naming
// the call) when a loopback socket cannot be set up.
// Also the CPU per wake-up (tcp_cpu_s_per_wakeup), by measure_tcp_wakeup_cpu.
struct CommCpuFigures {
  double tcp_s_per_byte = 0, copy_s_per_byte = 0, tcp_s_per_wakeup = 0;
};
CommCpuFigures measure_comm_cpu(uint64_t bytes = uint64_t{8} << 20, int iters = 3);
// The CPU one side of a TCP transfer spends per wake-up at a slow link's pace (simulator/compute/profile.hpp
// tcp_cpu_s_per_wakeup; the model: simulator/comm_cpu.hpp): a loopback transfer of kTcpWakeupWrites sends of
// kTcpWakeupChunkBytes (two segments) kTcpWakeupIntervalUs apart -- about 65 Mbit/s with the sleep's overshoot --
// and a receiver reading what arrives, each in thread CPU time; per side, the sender's CPU per write and the
// receiver's per read, each less the bytes' share at `tcp_s_per_byte`, averaged (tcp_cpu_s_per_wakeup). The
// minimum over `reps` repetitions (other work on the machine only adds to a thread's CPU time); ~0.1 s each.
constexpr size_t kTcpWakeupChunkBytes = 2896;
constexpr uint64_t kTcpWakeupWrites = 300;
constexpr long kTcpWakeupIntervalUs = 200;
double measure_tcp_wakeup_cpu(double tcp_s_per_byte, int reps = 4);
// What sharing cores costs compute (simulator/compute/profile.hpp corun_slowdown; the model:
// simulator/compute/node_cpu.hpp): k threads, each with its own single-threaded backend `backend` and copy of the
// model, run forward + loss + backward passes of `batch` samples at once for k = 1, c and 2c (c: the CPUs this
// process may use; at most 8 threads), ~5 passes each at their share of the CPU (and of the cgroup's quota). Per k,
// (k / c, the median thread CPU seconds of a pass over the same at k = 1): thread CPU time, which counts the
// caches, memory bandwidth and context switches shared, not the waits for a core.
std::vector<std::pair<double, double>> measure_corun_slowdown(const engine::nn::ModelSpec& spec,
                                                             const std::string& backend, int64_t batch);
// The reduction of one default pipeline chunk (engine/comm kDefaultChunkBytes of f32, 12 bytes moved per element as
// the simulator counts it) at `reduce_bytes_per_s`: what an all-reduce peer computes between two messages.
inline double chunk_reduction_s(double reduce_bytes_per_s) {
  return reduce_bytes_per_s > 0 ? 3.0 * static_cast<double>(engine::comm::kDefaultChunkBytes) / reduce_bytes_per_s
                                : 1e-4;
}
// How long a rank blocked in a receive, woken by a message, waits for a core its peers hold (simulator/compute/
// profile.hpp wakeup_latency_s; charged per message to a blocked receiver on a node with more ranks than cores):
// a ring of ranks_per_core x c rank-like threads (c: the CPUs this process may use, at most 8), unpinned, each
// computing `burst_s` of CPU time between blocking on its neighbour's message (engine/train/wakeup_probe.hpp),
// against the same ring of c threads (one per core; on one CPU, two with no bursts); `repetitions` interleaved pairs
// of `window_s` each; the median of the per-pair differences of the mean wake-up latency. Wake-ups during which the
// cgroup was throttled (cpu.stat nr_throttled) are left out, so that a CFS quota's pauses are not counted (which
// biases long bursts under a quota toward 0: bench/emu/README.md, session 28). A pure spinner as
// the competitor measured ~0 under EEVDF (a woken thread preempts it at once); ranks that sleep and wake as this
// ring's threads do are not preempted so. ~repetitions x 2 x window_s. Throws kIo naming the call when a pipe or
// thread cannot be made, kInvalidArgument naming a bad field.
struct WakeupProbe {
  double burst_s = 0;      // CPU seconds a competing rank computes between messages (0: chunk_reduction_s)
  int ranks_per_core = 2;  // ranks sharing a core (bench/emu's 4r2c: 4 ranks on 2 cores)
  int repetitions = 5;     // interleaved pairs (alone, shared): ~4 s in all
  double window_s = 0.4;
};
struct WakeupFigures {
  double wait_s = 0;      // the profile's wakeup_latency_s
  int64_t throttled = 0;  // wake-ups left out (throttled periods)
  std::string note;       // the distribution, for the profile's machine text
};
WakeupFigures measure_wakeup_latency(const WakeupProbe& probe = {});
// Seconds per gradient element of the runtime's 16-bit wire conversion (engine/parallel compress_gradients and
// back), timed on a bucket-sized buffer: {to, back}.
std::pair<double, double> measure_convert_s(engine::parallel::GradCompression c);
// "host <name>, <CPU model>, <n> threads" (+ the emulated host and the CPU quota where there are some).
std::string describe_machine(int threads);
// The CFS quota of this process's cgroup in cores (cgroup v1 cpu.cfs_quota_us / cpu.cfs_period_us, else v2
// cpu.max); nullopt when unlimited or unknown. A profile records it: its times are the quota's average.
std::optional<double> cpu_quota_cores();
// What this process holds besides its tensors, once the model's kernels have run at the job's batch (call it after
// those passes, before the cost curve's other batch sizes add primitives and plans of their own): its resident size
// (VmRSS) less the tensor blocks the host allocator still hands out, its cache emptied and malloc's free pages
// returned first -- the runtime's own memory (libraries' code and data as far as training touches them, the
// backend's JIT kernels, primitive caches and plans, threads, the communicator) the simulator adds per rank.
// Measured before the passes it missed what the first step loads (issue #16: ~10 MiB for lenet5). 0 without /proc.
// `one_process`: no other rank will train beside this one; the shared-memory segments its communicator's transport
// mapped (RssShmem: UCX's, ~5 MiB) are left out, as a process training alone maps none.
double runtime_rss_bytes(bool one_process);
// On a device backend: the device memory this process holds besides its live tensors, by the driver's per-process
// count (process_device_memory_bytes) once the device allocator's free blocks are released -- the CUDA context, the
// libraries' handles and workspaces and the loaded kernels. 0 when the driver does not tell.
double runtime_device_bytes(Device device);
// What whole training steps add to the process's resident size at their peak: start() releases the allocator's cache
// and malloc's free pages, takes the resident size (VmRSS) as the baseline and resets the peak (VmHWM) by writing
// "5" to /proc/self/clear_refs; stop() is the peak since less the baseline. start() is false (and stop() 0) where
// /proc or the reset is unavailable (a kernel without it, a sandbox refusing the write).
class PeakRssProbe {
 public:
  bool start();
  double stop() const;

 private:
  double baseline_ = 0;
  bool armed_ = false;
};
}  // namespace tandem::api

struct tandem_calibration : tandem::api::Handle<tandem::api::kCalibrationMagic> {
  tandem::engine::train::Calibration cal;
  int32_t ranks = 1;
  double memory_bytes_per_s = 0;
  tandem::api::CommCpuFigures comm_cpu;  // 0: not measured (not written)
  std::vector<std::pair<double, double>> corun_slowdown;  // empty: not measured (not written)
  double wakeup_latency_s = -1;                          // < 0: not measured (not written)
  std::optional<tandem::api::P2pFigures> p2p;
  double runtime_rss_bytes = 0;  // 0: unknown (not written)
  double runtime_device_bytes = 0;  // a device backend's (runtime_device_bytes); 0: a CPU, or unknown (not written)
  double activation_peak_bytes = 0;  // 0: not measured (not written): a device backend, no /proc, the reset refused
  std::vector<std::pair<int64_t, double>> activation_peak_curve;  // (batch, peak) measured, ascending; written with 2+
  std::vector<std::pair<int64_t, double>> primitive_bytes_curve;  // (batch, one more shape's primitives), ascending
  std::pair<double, double> fp16_convert_s{0, 0}, bf16_convert_s{0, 0};  // per element {to, back}; 0: not measured
  std::string machine;
  std::string text;  // the profile JSON, built once
};
