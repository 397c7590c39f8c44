#pragma once
// The struct behind tandem_calibration_t, and the measurements the calibration shims share.
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "api/src/handles.hpp"
#include "engine/comm/communicator.hpp"
#include "engine/train/calibrate.hpp"
#include "tandem/tandem.h"

namespace tandem::api {
constexpr uint32_t kCalibrationMagic = 0x5443414c;  // "TCAL"

struct P2pFigures {
  double bytes_per_s = 0;  // both directions busy
  double latency_s = 0;    // one way: half the median round trip of a 4-byte ping
};

// Ranks 0 and 1 of `c` measure the link between them: pings of 4 bytes (10 x iters), then exchanges of `bytes`
// -- both ranks sending at once, as collectives and 1F1B pipelines use a link, each direction's
// acknowledgements queued behind the other's data -- whose median (of `iters`) less the one-way latency gives
// the bandwidth. The figures are broadcast from rank 0, so every rank returns them. Collective over `c`
// (size >= 2).
P2pFigures measure_p2p(engine::comm::Communicator& c, uint64_t bytes, int iters);
// This thread's local reduction bandwidth: dst += src over f32 buffers larger than the caches, counted as
// the simulator counts a reduction (read dst, read src, write dst: 12 bytes per element).
double measure_reduce_bandwidth();
// Copies text into a caller's buffer (NUL-terminated, truncated to fit *bytes, which must be > 0 when dst is
// given) and sets *bytes to the size needed including the NUL.
void copy_text_out(const std::string& text, char* dst, size_t* bytes);
// "host <name>, <CPU model>, <n> threads" (+ the emulated host and the CPU quota where there are some).
std::string describe_machine(int threads);
}  // namespace tandem::api

struct tandem_calibration {
  static constexpr uint32_t kMagic = tandem::api::kCalibrationMagic;
  uint32_t magic = kMagic;
  tandem::engine::train::Calibration cal;
  int32_t ranks = 1;
  double memory_bytes_per_s = 0;
  std::optional<tandem::api::P2pFigures> p2p;
  std::string machine;
  std::string text;  // the profile JSON, built once
  ~tandem_calibration() { magic = 0; }
};
