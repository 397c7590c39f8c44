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

struct tandem_sim_cluster : tandem::api::Handle<tandem::api::kSimClusterMagic> {
  tandem::simulator::ClusterSpec spec;
};

struct tandem_sim_result : tandem::api::Handle<tandem::api::kSimResultMagic> {
  // One result (tandem_simulate), or a plan search's candidates, best first (tandem_sim_plan).
  std::vector<tandem::simulator::SimResult> results;
  bool search = false;
  int32_t evaluated = 0, fitting = 0;
  double search_wall_s = 0;
  std::string text;                    // the JSON extra, built once
  std::vector<std::string> rank_names;
  bool has_trace = false;
};
