#pragma once
// A calibration profile for lenet5 (every layer 1 ms forward / 2 ms backward at batch 64, optimizer
// 1 ms) written to `path`, with extra top-level fields merged in.
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/nn/zoo.hpp"
#include "simulator/compute/workload.hpp"
#include "simulator/simulate.hpp"

namespace tandem::simulator::testing {

inline std::string write_lenet5_profile(const std::string& path, const nlohmann::json& extra = nlohmann::json::object()) {
  nlohmann::json p = {{"format", "tandem-calibration"}, {"version", 1}, {"model", "lenet5"}, {"batch", 64},
                      {"optimizer_step_s", 0.001}, {"layers", nlohmann::json::array()}};
  const auto work = make_workload(engine::nn::zoo_model("lenet5", {1, 28, 28}, 10));
  for (const auto& l : work.layers)
    p["layers"].push_back(nlohmann::json{{"name", l.name}, {"forward_s", 0.001}, {"backward_s", 0.002}});
  p.update(extra);
  std::ofstream(path) << p.dump();
  return path;
}

// lenet5 on fashion-mnist, DDP over `dp` ranks at batch 64, a hundredth of an epoch, priced by `profile`.
inline JobSpec lenet5_ddp(int32_t dp, const std::string& profile) {
  JobSpec j;
  j.model = "lenet5";
  j.dataset = "fashion-mnist";
  j.batch = 64;
  j.epochs = 0.01;
  j.strategy = Strategy::kDdp;
  j.dp = dp;
  j.profile = profile;
  return j;
}

}  // namespace tandem::simulator::testing
