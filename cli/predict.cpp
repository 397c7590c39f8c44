// `--predict` for the training commands (cli/predict.hpp): the simulator's prediction for the job just trained,
// through tandem_trainer_predict, printed beside the measured figures.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/command.hpp"
#include "cli/enums.hpp"
#include "cli/predict.hpp"
#include "tandem/tandem.h"

namespace tandem::cli {

namespace {

std::string mib(double b) { return fmt::format("{:.1f} MiB", b / 1048576.0); }
std::string ms(double s) { return fmt::format("{:.3f} ms", s * 1e3); }
std::string pct(double e) { return std::isfinite(e) ? fmt::format("{:+.1f}%", e * 100) : std::string("n/a"); }

// This machine as a cluster of `world` identical nodes, for --predict without a cluster description. Its
// network figures are loopback guesses; the profile's measured p2p figures replace them where present.
std::string local_cluster(int32_t world) {
  double mem = 0;
  std::ifstream in("/proc/meminfo");
  std::string key;
  double kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit)
    if (key == "MemTotal:") mem = kb * 1024;
  const long cpus = std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN));
  nlohmann::json node = {{"name", "local"},     {"count", std::max(1, world)}, {"vcpus", cpus},
                         {"memory_bytes", mem}, {"os_reserved_mib", 0},      {"peak_gflops", 100 * cpus},
                         {"mem_gbps", 10},      {"nic_gbps", 20},            {"nic_latency_us", 30}};
  return nlohmann::json{{"nodes", {node}}}.dump();
}

}  // namespace

void add_predict_options(CLI::App& app, PredictOptions& o) {
  app.add_flag("--predict", o.enabled,
               "at the end, print the simulator's prediction for this job beside the measured figures (rank 0)");
  app.add_option("--predict-cluster", o.cluster,
                 "cluster for --predict: PRESET:COUNT, a JSON file or JSON text (default $TANDEM_PREDICT_CLUSTER, "
                 "else this machine)");
  app.add_option("--profile", o.profile,
                 "calibration profile for --predict (tandem calibrate; default $TANDEM_PROFILE, else the roofline)");
  app.add_flag("--profile-network", o.profile_network, "--predict: use the profile's measured p2p figures as every NIC");
}

int print_prediction(tandem_trainer_t* trainer, const PredictOptions& o, bool json, double single_step_s,
                     int64_t single_steps) {
  std::string cluster = o.cluster, profile = o.profile, where;
  if (cluster.empty() && std::getenv("TANDEM_PREDICT_CLUSTER") != nullptr) cluster = std::getenv("TANDEM_PREDICT_CLUSTER");
  if (profile.empty() && std::getenv("TANDEM_PROFILE") != nullptr) profile = std::getenv("TANDEM_PROFILE");
  if (cluster.empty()) {
    tandem_parallel_attr_t pa = TANDEM_PARALLEL_ATTR_INIT;
    pa.field_mask = TANDEM_PARALLEL_ATTR_GRID;
    const int32_t world = tandem_trainer_parallel_query(trainer, &pa) == TANDEM_OK ? pa.world : 1;
    cluster = local_cluster(world);
    where = fmt::format("this machine x {} (network guessed; give --predict-cluster)", world);
  } else {
    where = cluster.size() > 80 ? cluster.substr(0, 77) + "..." : cluster;
  }
  tandem_predict_params_t p = TANDEM_PREDICT_PARAMS_INIT;
  p.field_mask = TANDEM_PREDICT_PARAM_CLUSTER;
  p.cluster = cluster.c_str();
  if (!profile.empty()) {
    p.field_mask |= TANDEM_PREDICT_PARAM_PROFILE;
    p.profile = profile.c_str();
    p.profile_network = o.profile_network ? 1 : 0;
  }
  if (single_steps > 0) {
    p.field_mask |= TANDEM_PREDICT_PARAM_MEASURED;
    p.measured_step_s = single_step_s;
    p.measured_steps = single_steps;
  }
  tandem_prediction_t r = TANDEM_PREDICTION_INIT;
  r.field_mask = TANDEM_PREDICTION_STEP | TANDEM_PREDICTION_MEMORY | TANDEM_PREDICTION_LAYOUT | TANDEM_PREDICTION_JOB;
  if (tandem_trainer_predict(trainer, &p, &r, nullptr, nullptr) != TANDEM_OK) return fail("--predict failed");
  // The simulator timed the trainer's own compiled job: its stage cut is the run's.
  std::string run_cut;
  {
    tandem_parallel_attr_t pa = TANDEM_PARALLEL_ATTR_INIT;
    pa.field_mask = TANDEM_PARALLEL_ATTR_PLAN;
    if (tandem_trainer_parallel_query(trainer, &pa) == TANDEM_OK && pa.partition != nullptr) run_cut = pa.partition;
  }
  const char* compression = name_of(compression_names(), r.compression);
  auto num = [](double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); };
  if (json) {
    const nlohmann::json j = {
        {"prediction",
         {{"cluster", cluster}, {"profile", profile}, {"compute_source", r.compute_source}, {"strategy", r.strategy},
          {"dp", r.dp}, {"pp", r.pp}, {"micro_batches", r.micro_batches}, {"rank", r.rank}, {"steps", r.steps},
          {"measured_step_s", num(r.measured_step_s)}, {"predicted_step_s", num(r.predicted_step_s)},
          {"step_error", num(r.step_error)}, {"measured_compute_s", num(r.measured_compute_s)},
          {"predicted_compute_s", num(r.predicted_compute_s)}, {"measured_comm_s", num(r.measured_comm_s)},
          {"predicted_comm_s", num(r.predicted_comm_s)}, {"measured_bubble_s", num(r.measured_bubble_s)},
          {"predicted_bubble_s", num(r.predicted_bubble_s)}, {"measured_memory_bytes", num(r.measured_memory_bytes)},
          {"predicted_memory_bytes", num(r.predicted_memory_bytes)}, {"memory_error", num(r.memory_error)},
          {"predicted_fits", r.predicted_fits != 0}, {"run_partition", run_cut}, {"same_cut", r.same_cut != 0},
          {"compression", compression}, {"allreduce", r.num_buckets > 0 ? tandem_algo_string(r.algorithm) : "none"},
          {"buckets", r.num_buckets}, {"allreduce_bytes_per_step", r.allreduce_bytes_per_step}}}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("prediction: %s dp=%d pp=%d micro-batches=%d on %s, compute from %s%s; measured over %lld steps\n",
                r.strategy, r.dp, r.pp, r.micro_batches, where.c_str(), r.compute_source,
                profile.empty() ? "" : fmt::format(" ({})", profile).c_str(), static_cast<long long>(r.steps));
    std::printf("  %-22s %14s %14s %9s\n", "per step", "measured", "predicted", "error");
    auto row = [&](const char* what, double m, double pr, double e) {
      std::printf("  %-22s %14s %14s %9s\n", what, ms(m).c_str(), ms(pr).c_str(), pct(e).c_str());
    };
    row("step time", r.measured_step_s, r.predicted_step_s, r.step_error);
    row("compute", r.measured_compute_s, r.predicted_compute_s, r.compute_error);
    row("exposed communication", r.measured_comm_s, r.predicted_comm_s, r.comm_error);
    row("pipeline bubble", r.measured_bubble_s, r.predicted_bubble_s, r.bubble_error);
    std::printf("  %-22s %14s %14s %9s  (predicted %s of %s)\n", fmt::format("memory (rank {})", r.rank).c_str(),
                mib(r.measured_memory_bytes).c_str(), mib(r.predicted_memory_bytes).c_str(), pct(r.memory_error).c_str(),
                r.predicted_fits ? "fits" : "does NOT fit", mib(r.predicted_memory_capacity_bytes).c_str());
    if (r.num_buckets > 0)
      std::printf("  all-reduce: %d bucket(s), %s, %s on the wire, %s sent per rank and step\n", r.num_buckets,
                  tandem_algo_string(r.algorithm), compression, mib(r.allreduce_bytes_per_step).c_str());
    if (r.pp > 1) std::printf("  stage cut (the run's, simulated as it ran): %s\n", run_cut.c_str());
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace tandem::cli
