#pragma once
// Calibration profile: per-layer times measured on a real machine (`tandem calibrate --model M --out
// profile.json` writes one), used instead of the roofline. Format (JSON, version 1):
//   {"format": "tandem-calibration", "version": 1,
//    "machine": "free text: host, CPU/GPU, threads", "backend": "cpu" | "cuda" | "reference",
//    "model": "mobilenetv2", "input": [3, 32, 32], "batch": 64,
//    "layers": [{"name": "conv0", "forward_s": 0.0021, "backward_s": 0.0043}, ...],   // every layer, in order
//    "optimizer": "sgd", "optimizer_step_s": 0.0031,        // one step over all parameters
//    "memory_bytes_per_s": 1.2e10,                          // optional: local reductions in collectives
//                                                           // (tandem calibrate: thread CPU time, full speed)
//    "p2p": {"bandwidth_bytes_per_s": 1.1e9, "latency_s": 4.2e-5},   // optional: measured point-to-point
//    "runtime_rss_bytes": 4.2e7,   // optional: the process's resident memory besides its tensors once the
//                                  // model's kernels ran (the simulator's per-rank runtime allowance on CPU nodes)
//    "runtime_device_bytes": 6.5e8,  // optional (GPU backends): device memory held besides live tensors (context,
//                                  // libraries), by the driver's count (the runtime allowance on GPU nodes)
//    "activation_peak_bytes": 6.1e7,  // optional (CPU backends): how far whole training steps at "batch" (forward,
//                                  // loss, backward, optimizer) raise the process's peak resident size (VmHWM, reset
//                                  // through /proc/self/clear_refs) above its resident size between steps -- the
//                                  // activations, their gradients, workspaces and the caching allocator's blocks.
//                                  // The simulator scales a Tandem CPU rank's derived activation peak (the job
//                                  // compiler's StageMemory::cpu_activation_peak_bytes) by this over the peak it
//                                  // derives for one process of "model" at "batch" (tandem_cpu_activation_peak in
//                                  // simulate.hpp) when the job's model is "model"; absent: the derived peak
//    "activation_peak_curve": [[16, 1.3e8], [32, 2.5e8]],
//        // optional (CPU backends): the same peak measured at several batches, ascending by batch; a point at
//        // "batch" equals activation_peak_bytes. A peak has a part every sample adds (its activations and their
//        // gradients) and a part that does not grow with the batch (workspaces, the largest layer's scratch, the
//        // allocator's blocks), so one measurement scaled by batch / "batch" is too low below "batch" and too high
//        // above it (resnet18 calibrated at 32: -18% at 8, +6% at 128). With two or more points the simulator takes
//        // the peak at a rank's micro-batch from the curve (activation_peak_at): linear between points, the end
//        // segments' lines beyond them (floored at 0); one point, or activation_peak_bytes alone: proportional.
//        // tandem calibrate measures "batch" and half of it (2 at batch 1)
//    "primitive_bytes_curve": [[8, 9.1e5], [16, 1.0e6]],
//        // optional (CPU backends): what the backend keeps resident for one more batch shape -- the primitives
//        // oneDNN builds for it (kernels, scratchpads, reordered weights) once a step runs at a batch size the process
//        // has not run before -- at each batch measured, ascending (tandem calibrate: the runtime figure's growth over
//        // the first step at a quarter and at half the batch). runtime_rss_bytes holds the primitives of "batch"; the
//        // simulator adds the difference of the curve between a job's micro-batch and "batch" to it, and charges a
//        // rank whose epoch ends with a short batch the curve's figure at that batch (simulate.hpp;
//        // primitive_bytes_at: two or more points piecewise linear, the end segments' lines beyond them, floored at 0;
//        // one point the same at every batch)
//    "fp16_convert_s": [1.7e-9, 2.3e-9], "bf16_convert_s": [1.1e-9, 0.7e-9]}
//        // optional: seconds per gradient element to convert f32 -> 16 bits and back (compression)
//    "batch_curve": [[1, 0.0009], [2, 0.0012], ..., [64, 0.0150]]
//        // optional: seconds of one forward + loss + backward pass at each batch, ascending, with a point at
//        // "batch"; the simulator prices m samples by the curve (interpolated) instead of m/batch of the layers
//    "threads": 1,         // optional: compute threads the passes ran on (default 1)
//    "cpu_quota": 0.5,     // optional: the CFS quota, in cores, of the process that measured (a cgroup's
//                          // cpu.cfs_quota_us / cpu.cfs_period_us); see full_speed_profile
//    "cpu_quota_sustained": 0.45,  // optional, with cpu_quota: the cores the measuring process really sustained
//                          // over its timed passes (process CPU time over wall time, back to back): the quota where
//                          // the kernel delivers it, less where the machine's cores are oversubscribed (emulated
//                          // hosts whose quotas add up to the cores, other work beside them). full_speed_profile
//                          // keeps it as quota_efficiency = sustained / cpu_quota; the simulator gives every node
//                          // with a CFS quota that fraction of its quota (simulate.cpp). Absent: 1.
//    "tcp_cpu_s_per_byte": 2.1e-10,   // optional: CPU seconds one side of a TCP transfer spends per payload byte
//                                     // (system calls, the kernel's protocol work, copies): half the sender's and
//                                     // receiver's thread CPU time over a loopback transfer, per byte
//    "copy_cpu_s_per_byte": 1.3e-10,  // optional: CPU seconds per byte of one copy into or out of the shared-memory
//                                     // ring between two ranks of a host (a memcpy pass past the caches)
//    "tcp_cpu_s_per_wakeup": 3.5e-5   // optional: CPU seconds one side of a TCP transfer spends per wake-up (a
//                                     // sleeping receiver woken by arriving segments, a sender by the ACKs that free
//                                     // its window: scheduler, softirq, system call), on top of the per-byte figure:
//                                     // a loopback transfer paced by small writes at a fixed interval, half the
//                                     // sender's and receiver's thread CPU per write, less the writes' per-byte
//                                     // part. How many wake-ups a transfer takes: simulator/comm_cpu.hpp
//    "compute_cv": 0.42,   // optional: how much a whole pass (forward + loss + backward at "batch") varies from
//                          // pass to pass on the measuring host: the sample standard deviation of the timed passes'
//                          // wall times over their mean -- of their process CPU time where the measuring process ran
//                          // under a CFS quota (whose on/off windows the node model applies itself, so the wall
//                          // times' spread would count them twice). The simulator times every rank's step with its compute
//                          // times a seeded factor of mean 1 and this CV (simulator/compute/step_noise.hpp). Absent
//                          // or 0: every step computes alike, the behaviour before the field existed.
//        // All three are thread CPU time (CLOCK_THREAD_CPUTIME_ID), which a CFS quota does not stretch: they are
//        // full-speed seconds as measured, and full_speed_profile leaves them alone. Absent: 0 -- messages cost
//        // no CPU, the simulator's behaviour before these fields existed (simulator/README.md).
//    "corun_slowdown": [[0.5, 1.0], [1, 1.04], [2, 1.31], [4, 1.33]],
//        // optional: CPU seconds per unit of compute when k copies of the pass run at once on the host's c cores,
//        // relative to one alone, at k / c runnable threads per core, ascending (cache and memory-bandwidth
//        // sharing, context switches; tandem calibrate: thread CPU time, k = 1, c, 2c, 4c). The node CPU model
//        // (compute/node_cpu.hpp) slows each task by it at its node's runnable tasks per core. Absent: no slow-down.
//    "wakeup_latency_s": 2.1e-4,
//        // optional: mean wall time a blocked rank waits, once woken by a message, for a core its peers hold
//        // (tandem calibrate: a ring of 2 rank-like threads per CPU, each computing a burst between blocking waits
//        // for its neighbour's message, less the same ring with one thread per CPU; engine/train/wakeup_probe.hpp).
//        // The step executor delays a message to a blocked receiver by it where the receiver's node has more
//        // ranks than cores. Absent: 0.
//    "step_overhead_cpu_s": 1.3e-4,
//        // optional: CPU seconds a training step of `batch` samples costs a worker rank beyond the pass and the
//        // optimizer step timed above, at full speed: the loader thread assembling the batch from the real data set,
//        // the batch's copy into the model's input, the trainer's own bookkeeping -- the job's data path, which
//        // the calibration's synthetic in-memory batch does not take. Measured apart from the training runs it
//        // predicts, on one calibrating host: the job's own training loop run at two lengths, the marginal CPU time
//        // of a step (every thread of the process) less the calibration's pass + optimizer CPU time on that host
//        // (bench/strategies/compute_probe.py). The simulator adds it, scaled linearly with the samples, to the
//        // first forward of every stage-0 rank's step (compute work on its node's CPU model: a quota pays for it).
//        // It is charged in series with the pass: right where the loader has no spare core (a quota'd or
//        // one-core host, where the probe sees the training thread wait for it); on a node with idle cores the
//        // loader's share would overlap and this over-charges by at most that share. Absent or 0: nothing.
// Times are seconds for `batch` samples on one rank; the simulator scales them linearly with the
// number of samples, or by batch_curve when the profile has one. Layer names must match the model's, in order. The p2p figures are recorded
// for reference; they replace a node's NIC only when the job asks (--profile-network).
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace tandem::simulator {

struct CalibrationProfile {
  std::string machine, backend, model, optimizer = "sgd";
  std::vector<int64_t> input;
  int64_t batch = 0;
  struct Layer {
    std::string name;
    double forward_s = 0, backward_s = 0;
  };
  std::vector<Layer> layers;
  double optimizer_step_s = 0;
  std::optional<double> memory_bytes_per_s;
  std::optional<double> p2p_bytes_per_s, p2p_latency_s;
  std::optional<double> runtime_rss_bytes;
  // A GPU rank's device memory besides its tensors (CUDA context, cuDNN and cuBLAS handles and workspaces, loaded
  // kernels): `tandem calibrate --device cuda`, by the driver's per-process count less the allocator's live blocks.
  std::optional<double> runtime_device_bytes;
  std::optional<double> activation_peak_bytes;  // what a whole step at `batch` adds to the resident size (CPU)
  std::vector<std::pair<int64_t, double>> activation_peak_curve;  // (batch, that peak), ascending by batch
  std::vector<std::pair<int64_t, double>> primitive_bytes_curve;  // (batch, one more shape's primitives), ascending
  std::optional<std::pair<double, double>> fp16_convert_s, bf16_convert_s;  // (to, back) per element
  std::vector<std::pair<int64_t, double>> batch_curve;  // (batch, forward + loss + backward seconds), ascending
  int64_t threads = 1;
  std::optional<double> cpu_quota;  // cores the measuring process was allowed by a CFS quota
  std::optional<double> cpu_quota_sustained;  // cores it sustained under that quota (<= cpu_quota)
  std::optional<double> quota_efficiency;     // full_speed_profile: sustained / cpu_quota, for nodes' quotas
  std::optional<double> tcp_cpu_s_per_byte, copy_cpu_s_per_byte;  // CPU cost of moving a byte (one side)
  std::optional<double> tcp_cpu_s_per_wakeup;                       // CPU cost of one wake-up (one side)
  std::vector<std::pair<double, double>> corun_slowdown;  // (runnable threads per core, slow-down), ascending
  std::optional<double> wakeup_latency_s;                 // a woken receiver's wait for a busy core
  std::optional<double> compute_cv;  // pass-to-pass coefficient of variation of the compute (step_noise.hpp)
  std::optional<double> step_overhead_cpu_s;  // CPU seconds of a training step beyond the pass: the data path
};

// A profile measured under a CFS quota of q cores by `threads` threads passing back to back holds the quota's
// average, not the CPU's speed: the process ran at full speed for its quota, then stood still until the period
// ended, so a mean over back-to-back passes is T / min(1, q / threads) for a pass that takes T at full speed
// (tandem calibrate scales its layer medians to that mean, and takes the mean as the passes' CPU time over q, which
// does not depend on where in the quota's period a short pass falls). The simulator's node model applies a quota as the
// on/off windows it is (compute/node_cpu.hpp), so it needs T: this returns the profile with its times (layers,
// optimizer, batch curve, conversions) multiplied by q / threads where that is below 1, and cpu_quota cleared;
// unchanged otherwise. With cpu_quota_sustained it also sets quota_efficiency = sustained / cpu_quota (<= 1).
CalibrationProfile full_speed_profile(CalibrationProfile p);

// What a whole training step of `samples` samples adds to the resident size at its peak, from the profile's
// activation_peak_curve (two or more points: interpolated, extrapolated along the end segments, floored at 0), else
// its single measurement scaled in proportion to the samples; nullopt when the profile measured neither. `samples`
// < 1 stands for the profile's batch.
std::optional<double> activation_peak_at(const CalibrationProfile& p, int64_t samples);

// What the backend keeps resident for the primitives of one batch shape of `samples` samples, from the profile's
// primitive_bytes_curve; nullopt when the profile has none.
std::optional<double> primitive_bytes_at(const CalibrationProfile& p, int64_t samples);

CalibrationProfile profile_from_json(const nlohmann::json& j, const std::string& where = "profile");
CalibrationProfile load_profile(const std::string& path);  // unreadable: kIo; malformed: kInvalidArgument
nlohmann::json profile_to_json(const CalibrationProfile& p);

}  // namespace tandem::simulator
