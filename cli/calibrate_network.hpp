#pragma once
// `tandem calibrate --network`: TCP round-trip time, bulk goodput and the CPU a transfer costs on each side between
// two hosts, the figures the simulator's link model (simulator/cluster.hpp: nic_latency_us, tcp_goodput) and transfer
// CPU model (simulator/comm_cpu.hpp: tcp_cpu_s_per_byte, tcp_cpu_s_per_wakeup) want. One host listens:
//   tandem calibrate --network --listen PORT                      (PORT 0: any; it prints the port it got)
// the other measures against it and writes the JSON:
//   tandem calibrate --network --peer HOST:PORT [--nominal-mbps R] [--seconds S] [--out net.json]
// Protocol v3 (one TCP connection, peer -> listener): a 16-byte hello each way ("TANDEM-NET v3\n" + 2 bytes of 0; a
// tandem speaking another version, e.g. v1 from before the CPU phases or v2 from before the two-way phase, is named
// as such), `rounds` ping-pongs of
// 64-byte messages (RTT: their median), then
// - bulk: frames of a 4-byte big-endian length and that many bytes (1 MiB) for S seconds, ended by a frame of
//   length 0; the listener answers with the bytes it received, its receive time (first byte to last, ns) and its
//   thread CPU time over the phase (ns), 8 bytes each, big-endian. The goodput is the listener's bytes over its
//   receive time: what reaches the application, after the kernel's buffers.
// - paced: the peer sends {chunk bytes, writes, interval us} (8 bytes each; 2,896 bytes = two segments, 1,000
//   writes (--paced-writes), 400 us: 58 Mbit/s before the sleep's overshoot, under a 65 Mbit/s link's rate) and then the writes, a
//   sleep after each; the listener reads what arrives (each read one wake-up) and answers with the bytes, its reads
//   and its thread CPU time (ns).
// - two-way (v3): the peer sends {bytes B, repetitions N, gap us} (8 bytes each; --two-way-bytes, default 1 MiB;
//   --two-way-reps, default 8, 0: none; --two-way-gap-ms, default 300 -- idle longer than TCP's minimum RTO, 200 ms,
//   so each transfer restarts slow start after idle as a training step's exchange does). Each repetition, a gap
//   before each of: (1) B bytes peer -> listener, answered by 8 bytes (the repetition) once in; (2) an 8-byte go,
//   on which the listener sends B bytes; (3) an 8-byte go, after which the peer sends B bytes while the listener,
//   on the go, sends its B bytes too (one connection, both directions at once: a gossip swap), answered by the
//   listener's receive time from the go (ns) once both directions are done there. Every time runs from the
//   sender's first write to the receiver's last byte, with the one-way latency (rtt / 2) of the small message in
//   the span taken out. The factor of a repetition is the exchange's time (its slower direction) over the slower
//   of (1) and (2); `tcp_two_way_factor` is their mean (1: the directions do not slow each other; 2: as if one
//   waited for the other), with `two_way` holding the spread and every time. The cluster JSON node takes
//   max(1, mean) as `tcp_two_way_factor` (simulator/cluster.hpp). The slowdown is TCP's, not the line's: in a
//   simultaneous exchange one direction can leave slow start early (CUBIC's HyStart ACK-train test) while the
//   other's data delays its ACKs, and which direction loses is a packet-level race (bench/strategies/README.md,
//   session 14). It depends on the size: measure at the size the job swaps (e.g. the model's parameter bytes).
// The CPU a transfer costs on the real path, per side, the loopback calibration's arithmetic (api/src/comm_cpu_fit.hpp;
// `tandem calibrate`, api/src/calibrate_comm_cpu.cpp): per byte = the bulk phase's thread CPU / bytes; per wake-up =
// (the paced phase's thread CPU - its bytes x per byte) / writes (sender) or reads (receiver), at least 0. The JSON
// has `tcp_cpu_s_per_byte` and `tcp_cpu_s_per_wakeup`, each {sender, receiver, mean}, and the raw times under
// `comm_cpu`. The means override a profile's loopback figures (simulator/compute/profile.hpp):
//   jq -s '.[0] + {tcp_cpu_s_per_byte: .[1].tcp_cpu_s_per_byte.mean,
//                  tcp_cpu_s_per_wakeup: .[1].tcp_cpu_s_per_wakeup.mean}' profile.json net.json > merged.json
// What is measured: CLOCK_THREAD_CPUTIME_ID of the thread that sends or receives, i.e. its system calls and
// whatever kernel work runs in its context -- including softirq work (segments, ACKs, the qdisc) that happens to run
// while that thread is on the CPU (on return from its own transmit, or interrupting it); softirq work that runs on
// another CPU, in ksoftirqd or while the thread sleeps is in neither side's figure. So the split between the sides
// follows where the kernel ran the work (over veth pairs the receiver's ACKs are processed at the sender's socket in
// the receiver's context: emulated hosts showed ~4e-10 s per byte at the sender and ~1-1.6e-8 at the receiver); use
// the mean, which is what the profile's per-side figures are. The bulk per-byte figure holds the wake-ups a bulk
// transfer takes at the link's pace (on a slow link the receiver wakes per arriving segment or two), so where the
// paced phase costs no more per byte than the bulk phase, the per-wake-up figure comes out near 0.
// Every read and write has a deadline (--timeout-s); a peer that sends anything else, closes early or stops
// answering ends the run with an error naming the phase.
#include <cstdint>
#include <string>

namespace tandem::cli {

struct NetworkCalibrateOptions {
  int listen_port = -1;     // >= 0: listen (0: any port)
  std::string peer;         // HOST:PORT
  double nominal_mbps = 0;  // the link's line rate (Mbit/s), for tcp_goodput
  double seconds = 3;       // bulk phase
  int rounds = 50;          // ping-pongs
  double timeout_s = 60;    // per read/write, and the listener's wait for a peer
  std::string out;          // JSON file (peer side); empty: stdout
  int paced_writes = 1000;  // paced phase: writes (bench/emu/netcpu_calibrate.py varies it to separate the phases)
  uint64_t two_way_bytes = 1u << 20;  // two-way phase: bytes each way
  int two_way_reps = 8;               // its repetitions (0: none)
  double two_way_gap_ms = 300;        // idle before each transfer
};

// Runs the listener or the peer side; returns the exit code (errors printed as "tandem: ...").
int run_network_calibrate(const NetworkCalibrateOptions& o);

}  // namespace tandem::cli
