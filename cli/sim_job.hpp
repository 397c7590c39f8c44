#pragma once
// The job options `tandem simulate` and `tandem plan` share, turned into the C ABI's typed job: the model and
// optimizer become handles, every enum-valued option is checked against cli/enums.hpp. Only options given on the
// command line are passed, so a --job file's values stand unless overridden; the defaults in --help are the
// library's.
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "tandem/tandem.h"

namespace tandem::cli {

struct SimJobCli {
  CLI::App* app = nullptr;
  std::string cluster, job_file, job_json, model = "mobilenetv2", model_file, dataset = "cifar10", input,
      optimizer = "momentum", profile, cut;
  int strategy = TANDEM_STRATEGY_SINGLE, schedule = TANDEM_SCHEDULE_1F1B, algo = TANDEM_ALGO_AUTO,
      compression = TANDEM_COMPRESSION_NONE, partition = TANDEM_PARTITION_FLOPS, credit_mode = TANDEM_CREDIT_MODE_PRESET;
  std::vector<int32_t> cut_layers;
  int64_t samples = 0, classes = 0, batch = 64;
  double epochs = 1, bucket_mb = 25, epoch_time_s = 0, initial_credits = -1, width_mult = 1;
  double first_bucket_mb = 0;           // --first-bucket-mb (unset: the framework's)
  double comm_cycle_ms = 0;             // --comm-cycle-ms
  double comm_negotiation_ms = 0;       // --comm-negotiation-ms
  double host_staging_gbps = 0;         // --host-staging-gbps
  std::vector<double> bucket_sizes_mb;  // --bucket-sizes-mb
  int32_t dp = 0, pp = 0, micro_batches = 1, accumulation = 1;
  uint64_t chunk_bytes = 0;
  bool no_overlap = false, profile_network = false, json = false;
  // the strategies of issue #13 (tandem train's options of the same names)
  int32_t servers = 1, staleness = 2, tau = 4, clients = 0, local_epochs = 1, average_every = 8, warmup_steps = 0;
  double alpha = 0, dirichlet_alpha = 0, client_fraction = 1, round_deadline_s = 0;
  bool easgd_async = false;
  std::string staleness_lr = "none";  // ps-async (update math: not timed; passed in the job JSON)
  // issue #17: the elastic settings the simulator times (server replicas, the joiner check); passed in the job JSON
  int32_t server_replicas = 0, max_ranks = 0, join_poll_steps = 1;
  bool elastic = false;
  uint64_t seed = 0;          // the training run's --seed: fedavg's client draw and shares, asgd's matching
  int64_t limit_batches = 0;  // the training run's --limit-batches: batches per epoch (0: all)
  int32_t prefetch = 2;       // the training run's --prefetch: the loader's batches ahead (memory; job JSON key)
  bool no_broadcast_buffers = false;  // pytorch-ddp with broadcast_buffers=False
  // issue #16: memory options and the framework's process
  int precision = TANDEM_PRECISION_F32, framework = TANDEM_FRAMEWORK_TANDEM;
  std::string recompute = "none";
  int32_t zero = 0;
  bool given(const char* opt) const { return app->count(opt) > 0; }
};

// The typed job and the handles it points to (destroyed with it).
class SimJob {
 public:
  SimJob() = default;
  SimJob(const SimJob&) = delete;
  SimJob& operator=(const SimJob&) = delete;
  ~SimJob();
  tandem_sim_job_params_t params = TANDEM_SIM_JOB_PARAMS_INIT;
  tandem_context_t* ctx = nullptr;
  tandem_model_t* model = nullptr;
  tandem_optimizer_t* optimizer = nullptr;
  std::string job_text;  // --job's file, read here
};

std::shared_ptr<SimJobCli> add_sim_job_options(CLI::App& app, bool strategy_options);
// Builds the job on a fresh context. Returns 0, or the exit code after printing the error.
int make_sim_job(SimJobCli& o, SimJob& job);

// The command that runs the simulated configuration `s` for real with these options' model and data
// (tandem launch -n RANKS -- tandem train ...; the all-reduce through TANDEM_ALLREDUCE_ALGO). It runs as printed:
// a data set `tandem train` cannot load without more options becomes synthetic data of its shape, and `note` (when
// given) says how to train on the real one.
std::string train_command(const SimJobCli& o, const tandem_sim_summary_t& s, std::string* note = nullptr);

std::string human_bytes(double b);
std::string human_seconds(double s);

}  // namespace tandem::cli
