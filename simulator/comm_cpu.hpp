#pragma once
// The CPU one side of a message spends on moving it (issue #16), shared by the step executor (simulator/step.cpp)
// and the strategies' executors (simulator/strategy.cpp), both through transfer_cpu_s (simulator/step.hpp): one
// formula, one set of constants.
//
//   cpu_s = bytes x per_byte + wakeups x per_wakeup
//
// per_byte is the profile's tcp_cpu_s_per_byte (across nodes) or copy_cpu_s_per_byte (within a node: copies into
// and out of a shared-memory ring; wake-ups only on shared cores, below); per_wakeup is tcp_cpu_s_per_wakeup (simulator/compute/
// profile.hpp). A TCP transfer at a link's pace wakes each side once per batch of arriving data: the receiver
// sleeps in recv until segments arrive, the sender until ACKs free its window. Its wake-ups are
//
//   wakeups = bytes / max(kTcpWakeupBatchBytes, pace_bytes_per_s x kTcpMinWakeIntervalS)
//
// - kTcpWakeupBatchBytes = 2 segments (2 x 1448 payload bytes): the receiver ACKs every second segment (delayed
//   ACKs), so the sender is woken once per two segments; the receiver, woken per arrival, reads what came. The data
//   behind it (bench/emu/README.md, runs 6-8): a paced loopback probe (bench/emu/results/tcp_paced_probe.c) costs
//   ~40 us of CPU per wake-up and side whether a wake-up brings 2,896 or 14,480 bytes (9.6-14 ns/B against 3.1), so
//   the cost follows the wake-ups, not the bytes; emulated t2.micro hosts at 65 Mbit/s spent ~1.0-1.65e-8 s per byte
//   and side over bare all-reduces (an upper bound), one ~40 us wake-up per ~2,400-4,000 bytes. `tandem calibrate`'s
//   paced transfer gives 14-16 us on a quiet VM (~40 us under a build), so with two segments per wake-up the model
//   accounts for about half of what the emulated hosts spent (the rest: their veth / bridge / tbf path, run 8).
// - kTcpMinWakeIntervalS = 100 us: on a fast link segments arrive faster than a side wakes, and the NIC's interrupt
//   moderation and NAPI polling (50-125 us in common drivers' defaults) gather them, so a wake-up takes what
//   arrived in that interval; the bulk per-byte figure carries the rest. Not measured here: at 65 and 200 Mbit/s
//   two segments arrive every 357 / 124 us, so the batch rules and this constant does not enter bench/emu's cases.
// Within a node a message is copied into and out of the shared-memory ring (per byte). Where the node's ranks
// outnumber its cores, each side also pays one wake-up per message (`copy_s_per_message`, the profile's
// tcp_cpu_s_per_wakeup): the transport's waiter spins for at most 100 us (transports/spin.hpp) and then sleeps until
// the peer's one-byte wake-up on the pair's socket (transports/tcp/shm_ring.hpp), and with more runnable ranks than
// cores the peer is rarely running within the spin -- the same socket wake-up the paced loopback transfer times.
// With a core per rank the spin catches the data and no wake-up is charged.
// pace_bytes_per_s is the payload rate of the slower NIC of the two ends (its line rate less TCP's headers, times
// its goodput, a token bucket's rate where it has one): the link's pace, not the flow's share of it.
#include <algorithm>

#include "simulator/network/topology.hpp"

namespace tandem::simulator {

constexpr double kTcpWakeupBatchBytes = network::kTcpSegmentsPerAck * network::kTcpMssBytes;  // 2,896
constexpr double kTcpMinWakeIntervalS = 100e-6;

// Wake-ups one side of a TCP transfer of `bytes` takes at `pace_bytes_per_s` (> 0) of payload.
inline double tcp_wakeups(double bytes, double pace_bytes_per_s) {
  return bytes / std::max(kTcpWakeupBatchBytes, pace_bytes_per_s * kTcpMinWakeIntervalS);
}

// A TCP NIC's payload pace: its line rate (a token bucket's rate where that is lower), less the headers
// (kTcpMssBytes of kTcpFrameBytes), times the goodput factor.
inline double tcp_pace_bytes_per_s(double nic_bytes_per_s, double tcp_goodput, double bucket_bytes_per_s) {
  const double line = bucket_bytes_per_s > 0 ? std::min(nic_bytes_per_s, bucket_bytes_per_s) : nic_bytes_per_s;
  return line * network::kTcpMssBytes / network::kTcpFrameBytes * tcp_goodput;
}

// CPU seconds (at full speed) one side spends on a transfer of `bytes` (one message): a copy within a node
// (`local`) costs bytes x copy_s_per_byte + copy_s_per_message; a TCP transfer bytes x tcp_s_per_byte plus its
// wake-ups at the link's pace (`pace_bytes_per_s`, used only when tcp_s_per_wakeup > 0).
struct TransferCpuCost {
  double tcp_s_per_byte = 0, tcp_s_per_wakeup = 0, copy_s_per_byte = 0, copy_s_per_message = 0;
  double seconds(double bytes, bool local, double pace_bytes_per_s) const {
    if (local) return bytes * copy_s_per_byte + copy_s_per_message;
    const double wake = tcp_s_per_wakeup > 0 ? tcp_wakeups(bytes, pace_bytes_per_s) * tcp_s_per_wakeup : 0.0;
    return bytes * tcp_s_per_byte + wake;
  }
};

}  // namespace tandem::simulator
