#pragma once
// The structs behind the simulation handles of the C ABI.
#include <cstdint>
#include <string>
#include <vector>

#include "api/src/handles.hpp"
#include "simulator/cluster.hpp"
#include "simulator/simulate.hpp"
#include "tandem/tandem.h"

namespace tandem::api {
constexpr uint32_t kSimClusterMagic = 0x5453434c;  // "TSCL"
constexpr uint32_t kSimResultMagic = 0x54535253;   // "TSRS"
}  // namespace tandem::api

struct tandem_sim_cluster {
  static constexpr uint32_t kMagic = tandem::api::kSimClusterMagic;
  uint32_t magic = kMagic;
  tandem::simulator::ClusterSpec spec;
  ~tandem_sim_cluster() { magic = 0; }
};

struct tandem_sim_result {
  static constexpr uint32_t kMagic = tandem::api::kSimResultMagic;
  uint32_t magic = kMagic;
  // One result (tandem_simulate), or a plan search's candidates, best first (tandem_sim_plan).
  std::vector<tandem::simulator::SimResult> results;
  bool search = false;
  int32_t evaluated = 0, fitting = 0;
  double search_wall_s = 0;
  std::string text;                    // the JSON extra, built once
  std::vector<std::string> rank_names;
  bool has_trace = false;
  ~tandem_sim_result() { magic = 0; }
};
