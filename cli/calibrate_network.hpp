#pragma once
// `tandem calibrate --network`: TCP round-trip time and bulk goodput between two hosts, the figures the simulator's
// link model wants (simulator/cluster.hpp: nic_latency_us, tcp_goodput). One host listens:
//   tandem calibrate --network --listen PORT                      (PORT 0: any; it prints the port it got)
// the other measures against it and writes the JSON:
//   tandem calibrate --network --peer HOST:PORT [--nominal-mbps R] [--seconds S] [--out net.json]
// Protocol (one TCP connection, peer -> listener): a 16-byte hello each way ("TANDEM-NET v1\n" + 2 bytes of 0),
// `rounds` ping-pongs of 64-byte messages (RTT: their median), then a bulk phase: frames of a 4-byte big-endian
// length and that many bytes for S seconds, ended by a frame of length 0; the listener answers with the bytes it
// received and its receive time (first byte to last, ns), 8 bytes each, big-endian. The goodput is the listener's
// bytes over its receive time: what reaches the application, after the kernel's buffers.
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
};

// Runs the listener or the peer side; returns the exit code (errors printed as "tandem: ...").
int run_network_calibrate(const NetworkCalibrateOptions& o);

}  // namespace tandem::cli
