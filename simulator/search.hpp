#pragma once
// `tandem plan`: searches data-parallel x pipeline splits, micro-batch counts, pipeline schedules and
// all-reduce algorithms for a job on a cluster, simulating each configuration, and ranks those that
// fit in memory by predicted total time.
#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "simulator/simulate.hpp"

namespace tandem::simulator {

struct SearchOptions {
  int32_t top = 5;                                     // configurations to return
  std::vector<int32_t> micro_batches = {1, 2, 4, 8, 16, 32};
  bool use_all_devices = true;                         // dp x pp = every device (else also fewer, powers of 2)
  // Also the strategies of issue #13 on every device, with the job's knobs (staleness, tau, H, clients...): ps,
  // ps-async and ssp with 1, 2, 4, ... servers (fewer than the devices), localsgd and synchronous easgd with each
  // all-reduce, asgd, fedavg. Compared by time, not time to accuracy (statistical efficiency is not simulated).
  bool strategies = true;
};

struct Candidate {
  JobSpec job;
  SimResult result;
};

struct SearchResult {
  std::vector<Candidate> best;   // fitting configurations, fastest first (then non-fitting, if none fit)
  int32_t evaluated = 0;
  int32_t fitting = 0;
  double baseline_total_time_s = 0;
  double wall_s = 0;
  nlohmann::json to_json() const;
};

SearchResult search_plans(const ClusterSpec& cluster, const JobSpec& base, const SearchOptions& options = {});

}  // namespace tandem::simulator
