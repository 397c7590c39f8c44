#pragma once
// The structs behind the simulation handles of the C ABI.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/src/handles.hpp"
#include "simulator/cluster.hpp"
#include "simulator/step.hpp"
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
  nlohmann::json json;                 // the full result (or the plan search)
  nlohmann::json summary;              // the object the summary query reads (the best candidate for a search)
  std::string text;                    // json.dump(), built once
  std::vector<tandem::simulator::TraceSpan> trace;
  std::vector<std::string> rank_names;
  bool has_trace = false;
  ~tandem_sim_result() { magic = 0; }
};
