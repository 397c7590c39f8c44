#pragma once
// The arithmetic that turns thread CPU times of TCP transfers into the profile's tcp_cpu_s_per_byte and
// tcp_cpu_s_per_wakeup (simulator/compute/profile.hpp, the model: simulator/comm_cpu.hpp), shared by `tandem
// calibrate`'s loopback measurement (api/src/calibrate_comm_cpu.cpp) and `tandem calibrate --network`'s measurement
// on the real path between two hosts (cli/calibrate_network.hpp). Header-only: the CLI sees only the C ABI of
// libtandem.
//
// Per side: a bulk transfer of `bytes` costs `cpu_s` -> per byte cpu_s / bytes (the wake-ups a bulk transfer takes
// are in it); a paced transfer (small writes at a fixed interval, each a wake-up of both sides) of `bytes` in
// `wakeups` writes (sender) or reads (receiver) costs `cpu_s` -> per wake-up (cpu_s - bytes x per_byte) / wakeups.
#include <cstdint>
#include <stdexcept>

namespace tandem::api {

inline double comm_cpu_s_per_byte(double cpu_s, uint64_t bytes) {
  if (bytes == 0) throw std::invalid_argument("comm CPU: a bulk transfer of 0 bytes has no per-byte cost");
  return cpu_s / static_cast<double>(bytes);
}

inline double comm_cpu_s_per_wakeup(double cpu_s, uint64_t wakeups, uint64_t bytes, double s_per_byte) {
  if (wakeups == 0) throw std::invalid_argument("comm CPU: a paced transfer without wake-ups has no per-wake-up cost");
  return (cpu_s - static_cast<double>(bytes) * s_per_byte) / static_cast<double>(wakeups);
}

}  // namespace tandem::api
