// `tandem train --model M --dataset D [options] [--json]`: trains through the C ABI. On a terminal a progress bar
// (rate, ETA) is drawn on stderr; with --json, stdout gets one JSON object per epoch.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cerrno>
#include <algorithm>
#include <map>
#include <vector>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/command.hpp"
#include "cli/device.hpp"
#include "cli/cut.hpp"
#include "cli/enums.hpp"
#include "cli/predict.hpp"
#include "tandem/tandem.h"

namespace {

struct TrainOptions {
  std::string model = "lenet5";
  std::string dataset = "fashion-mnist";
  std::string input;  // --input CxHxW: the synthetic data set's sample shape
  std::string precision = "f32";  // --precision f32|bf16|fp16 (see tandem::cli::math_setting)
  // Loss scaling (engine/train/loss_scaler.hpp): "" = dynamic under fp16, else off; "dynamic", "off" or a number.
  std::string loss_scale;
  double loss_scale_init = 65536, loss_scale_growth = 2, loss_scale_backoff = 0.5;
  int64_t loss_scale_growth_interval = 2000;
  bool loss_scaler_given = false;  // any of the four above given
  std::string data_dir;
  std::string backend = "cpu";
  std::string device;  // --device: cpu, cuda, cuda:N (sets the backend)
  int64_t epochs = 1;
  int64_t batch = 64;
  float lr = 0.01f;
  std::string optimizer = "sgd";
  float momentum = 0.9f;
  bool nesterov = false;
  float weight_decay = 0;
  std::string schedule = "constant";
  double clip_norm = 0;
  int threads = 0;
  uint64_t seed = 0;
  std::string checkpoint;
  std::string resume;
  int64_t limit_batches = 0;
  int64_t eval_limit_batches = 0;
  int32_t prefetch = 2;  // the loader's batches assembled ahead
  int64_t train_limit = 0;
  int64_t test_limit = 0;
  bool augment = false;
  double width_mult = 0;
  std::string init = "kaiming";
  bool json = false;
  double target_accuracy = 0;  // --target-accuracy: stop at the first evaluation at or above it (0: off)
  tandem::cli::PredictOptions predict;  // --predict (issue #6; cli/predict.hpp)
  // Parallel training over the ranks of `tandem launch`, mpirun or srun (any of these options given).
  bool parallel = false;
  std::string strategy = "single";
  int dp = 0, pp = 0, microbatches = 1, accumulate = 1;
  std::string pipeline_schedule = "1f1b";
  double bucket_mb = 25;
  double first_bucket_mb = 0;           // --first-bucket-mb
  std::vector<double> bucket_sizes_mb;  // --bucket-sizes-mb
  std::string compression = "none";
  std::string partition = "flops";
  std::string cut;                  // --cut: explicit pipeline cut, pp + 1 layer indices
  std::vector<int32_t> cut_layers;  // parsed --cut (the params point into it)
  std::string trace;
  // The parameter-server and averaging strategies (issue #13); defaults as tandem_parallel_params_t's.
  int server_replicas = 0;  // issue #17: backups of each server's shard on the next servers (ps, ps-async, ssp)
  int servers = 1, staleness = 2, tau = 4, clients = 0, local_epochs = 1, average_every = 8, warmup_steps = 0;
  bool elastic = false;  // issue #17: ddp and ps go on when workers die (the asynchronous strategies always do)
  int min_ranks = 0;     // 0: 1
  int max_ranks = -1;    // --max-ranks (-1: TANDEM_MAX_RANKS, else 0: no bound); joiners beyond it are refused
  bool max_ranks_from_launcher = false;  // max_ranks is TANDEM_MAX_RANKS (tandem launch's bound, -n by default)
  int join_poll_steps = 1;
  double alpha = 0, dirichlet_alpha = 0, client_fraction = 1, round_deadline_s = 0;
  bool easgd_async = false;
  std::string staleness_lr = "none";  // ps-async: none | inverse | momentum (tandem_staleness_lr_t)
  std::set<std::string> given;  // the parallel options on the command line: only these set their field_mask bits
};

// Releases every handle on scope exit.
struct Handles {
  tandem_context_t* ctx = nullptr;
  tandem_model_t* model = nullptr;
  tandem_dataset_t* train = nullptr;
  tandem_dataset_t* test = nullptr;
  tandem_optimizer_t* opt = nullptr;
  tandem_trainer_t* trainer = nullptr;
  tandem_comm_t* comm = nullptr;  // parallel training only
  int32_t rank = 0;
  ~Handles() {
    tandem_trainer_destroy(trainer);
    tandem_comm_destroy(comm);
    tandem_optimizer_destroy(opt);
    tandem_dataset_destroy(test);
    tandem_dataset_destroy(train);
    tandem_model_destroy(model);
    tandem_context_destroy(ctx);
  }
};

struct Bar {
  bool enabled = false;
  int64_t epochs = 0;
  int32_t ranks = 1;  // a parallel job's: the rate is the job's (every replica's samples)
  bool loss_elsewhere = false;  // a pipeline: the bar's rank (0) runs the first stage, the loss is the last stage's
  std::chrono::steady_clock::time_point last{};
};

std::string clock_text(double s) {
  if (!std::isfinite(s) || s < 0) return "--:--";
  const auto t = static_cast<int64_t>(s + 0.5);
  return t >= 3600 ? fmt::format("{}:{:02}:{:02}", t / 3600, t / 60 % 60, t % 60) : fmt::format("{:02}:{:02}", t / 60, t % 60);
}

void draw_bar(const tandem_progress_t* p, void* user) {
  auto* bar = static_cast<Bar*>(user);
  const auto now = std::chrono::steady_clock::now();
  if (p->batch < p->batches && now - bar->last < std::chrono::milliseconds(100)) return;
  bar->last = now;
  constexpr int kWidth = 30;
  const double frac = p->batches > 0 ? static_cast<double>(p->batch) / static_cast<double>(p->batches) : 1.0;
  const int filled = static_cast<int>(frac * kWidth);
  const double eta = frac > 0 ? p->elapsed_s * (1 - frac) / frac : NAN;
  const std::string job = bar->ranks > 1 ? fmt::format(" ({} ranks)", bar->ranks) : std::string();
  // The first stage of a pipeline scores no loss (NaN, not a diverged one): "--" rather than "nan".
  const std::string loss = std::isnan(p->loss) && bar->loss_elsewhere ? "--" : fmt::format("{:.4f}", p->loss);
  std::fprintf(stderr, "\repoch %lld/%lld [%s%s] %lld/%lld loss %s %.0f img/s%s ETA %s ", static_cast<long long>(p->epoch),
               static_cast<long long>(bar->epochs), std::string(static_cast<size_t>(filled), '#').c_str(),
               std::string(static_cast<size_t>(kWidth - filled), '.').c_str(), static_cast<long long>(p->batch),
               static_cast<long long>(p->batches), loss.c_str(), p->images_per_sec, job.c_str(),
               clock_text(eta).c_str());
  std::fflush(stderr);
}

bool looks_like_file(const std::string& p) {
  struct stat st{};
  return p.find(".json") != std::string::npos || (::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode));
}

// --loss-scale and its --loss-scale-* settings into tandem_trainer_params_t.loss_scale (0 off, > 0 fixed,
// TANDEM_LOSS_SCALE_DYNAMIC); returns why they are refused ("" when fine). The values themselves are checked by
// tandem_trainer_create, whose message names the field.
std::string loss_scale_value(const TrainOptions& o, double& out) {
  std::string mode = o.loss_scale;
  if (mode.empty()) mode = o.precision == "fp16" ? "dynamic" : "off";
  if (mode == "off" || mode == "none") {
    out = 0;
  } else if (mode == "dynamic") {
    out = TANDEM_LOSS_SCALE_DYNAMIC;
  } else {
    char* end = nullptr;
    const double v = std::strtod(mode.c_str(), &end);
    if (end == mode.c_str() || *end != '\0' || !std::isfinite(v) || v <= 0)
      return "--loss-scale '" + mode + "' is not dynamic, off, or a finite scale > 0";
    out = v;
  }
  if (o.loss_scaler_given && out != TANDEM_LOSS_SCALE_DYNAMIC)
    return "--loss-scale-init/-growth/-backoff/-growth-interval set dynamic loss scaling, but --loss-scale is '" +
           mode + "'";
  if (out == TANDEM_LOSS_SCALE_DYNAMIC) {
    if (!(std::isfinite(o.loss_scale_init) && o.loss_scale_init > 0))
      return fmt::format("--loss-scale-init {} must be a finite number > 0", o.loss_scale_init);
    if (!(std::isfinite(o.loss_scale_growth) && o.loss_scale_growth > 1))
      return fmt::format("--loss-scale-growth {} must be > 1", o.loss_scale_growth);
    if (!(o.loss_scale_backoff > 0 && o.loss_scale_backoff < 1))
      return fmt::format("--loss-scale-backoff {} must be in (0, 1)", o.loss_scale_backoff);
    if (o.loss_scale_growth_interval < 1)
      return fmt::format("--loss-scale-growth-interval {} must be >= 1 step", o.loss_scale_growth_interval);
  }
  return "";
}

tandem_status_t make_dataset(const TrainOptions& o, bool train, Handles& h, tandem_dataset_t** out) {
  tandem_dataset_params_t p = TANDEM_DATASET_PARAMS_INIT;
  p.field_mask = TANDEM_DATASET_PARAM_KIND | TANDEM_DATASET_PARAM_TRAIN;
  p.kind = o.dataset.c_str();
  p.train = train ? 1 : 0;
  if (!o.data_dir.empty()) {
    p.field_mask |= TANDEM_DATASET_PARAM_PATH;
    p.path = o.data_dir.c_str();
  }
  const int64_t limit = train ? o.train_limit : o.test_limit;
  if (limit > 0) {
    p.field_mask |= TANDEM_DATASET_PARAM_LIMIT;
    p.limit = limit;
  }
  if (o.dataset == "synthetic") {  // a quick stand-in: Fashion-MNIST-shaped unless --input, different seeds per split
    p.field_mask |= TANDEM_DATASET_PARAM_COUNT | TANDEM_DATASET_PARAM_SEED;
    p.count = train ? 6000 : 1000;
    p.seed = o.seed;
    if (!o.input.empty()) {  // checked in run_train
      p.field_mask |= TANDEM_DATASET_PARAM_SHAPE;
      tandem::cli::parse_chw(o.input, p.channels, p.height, p.width);
    }
  }
  return tandem_dataset_create(h.ctx, &p, out);
}

// ---- Parallel training: DDP, pipeline, hybrid DP x PP ----------------------------------------------

// Compute threads per rank when none are asked for: the cores shared by the ranks on this host.
int parallel_threads(int asked) {
  if (asked > 0) return asked;
  for (const char* v : {"TANDEM_LOCAL_WORLD_SIZE", "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"}) {
    const char* s = std::getenv(v);
    if (s != nullptr && std::atoi(s) > 0) {
      const long cores = ::sysconf(_SC_NPROCESSORS_ONLN);
      return static_cast<int>(std::max(1L, cores / std::atoi(s)));
    }
  }
  return 0;
}

using tandem::cli::launched_rank;
using tandem::cli::launched_world;

// Joins the job (communicator from the environment) and creates this rank's parallel trainer.
int create_parallel_trainer(const TrainOptions& o, const tandem_trainer_params_t& tp, Handles& h) {
  namespace cli = tandem::cli;
  tandem_parallel_params_t pp = TANDEM_PARALLEL_PARAMS_INIT;
  pp.field_mask = TANDEM_PARALLEL_PARAM_STRATEGY | TANDEM_PARALLEL_PARAM_GRID | TANDEM_PARALLEL_PARAM_MICRO_BATCHES |
                  TANDEM_PARALLEL_PARAM_SCHEDULE | TANDEM_PARALLEL_PARAM_BUCKET_MB | TANDEM_PARALLEL_PARAM_COMPRESSION |
                  TANDEM_PARALLEL_PARAM_ACCUMULATION | TANDEM_PARALLEL_PARAM_PARTITION | TANDEM_PARALLEL_PARAM_TRACE;
  const auto s = cli::strategy_names().find(o.strategy);
  if (s == cli::strategy_names().end()) {
    std::fprintf(stderr, "tandem: --strategy '%s' is not single, ddp, pipeline, hybrid, ps, ps-async, ssp, asgd, "
                 "easgd, fedavg or localsgd\n", o.strategy.c_str());
    return 2;
  }
  pp.strategy = static_cast<tandem_strategy_t>(s->second);
  pp.dp = o.dp;
  pp.pp = o.pp;
  pp.micro_batches = o.microbatches;
  pp.schedule = o.pipeline_schedule == "gpipe" ? TANDEM_SCHEDULE_GPIPE : TANDEM_SCHEDULE_1F1B;
  pp.bucket_mb = o.bucket_mb;
  if (o.given.count("--first-bucket-mb") > 0 || o.given.count("--bucket-sizes-mb") > 0) {
    pp.field_mask |= TANDEM_PARALLEL_PARAM_BUCKETS;
    pp.first_bucket_mb = o.first_bucket_mb;
    pp.bucket_sizes_mb = o.bucket_sizes_mb.data();
    pp.num_bucket_sizes = o.bucket_sizes_mb.size();
  }
  pp.compression = o.compression == "fp16" ? TANDEM_COMPRESSION_FP16
                   : o.compression == "bf16" ? TANDEM_COMPRESSION_BF16 : TANDEM_COMPRESSION_NONE;
  pp.accumulation = o.accumulate;
  pp.partition = o.partition == "measured" ? TANDEM_PARTITION_MEASURED : TANDEM_PARTITION_FLOPS;
  if (!o.cut.empty()) {
    pp.field_mask |= TANDEM_PARALLEL_PARAM_BOUNDARIES;
    pp.boundaries = o.cut_layers.data();
    pp.num_boundaries = o.cut_layers.size();
  }
  pp.trace = o.trace.empty() ? 0 : 1;
  // The strategy fields go only when given: the library refuses one that the strategy does not read (--staleness with
  // ps-async was silently ignored), naming it; left out, the library's defaults (the same as these options').
  const auto given = [&o](std::initializer_list<const char*> flags) {
    for (const char* f : flags)
      if (o.given.count(f) > 0) return true;
    return false;
  };
  if (given({"--servers"})) pp.field_mask |= TANDEM_PARALLEL_PARAM_SERVERS;
  if (given({"--staleness"})) pp.field_mask |= TANDEM_PARALLEL_PARAM_STALENESS;
  if (given({"--staleness-lr"})) pp.field_mask |= TANDEM_PARALLEL_PARAM_STALENESS_LR;
  pp.staleness_lr = o.staleness_lr == "inverse"    ? TANDEM_STALENESS_LR_INVERSE
                    : o.staleness_lr == "momentum" ? TANDEM_STALENESS_LR_MOMENTUM
                                                   : TANDEM_STALENESS_LR_NONE;
  if (given({"--tau", "--alpha", "--easgd-async"})) pp.field_mask |= TANDEM_PARALLEL_PARAM_EASGD;
  if (given({"--clients", "--dirichlet-alpha", "--client-fraction", "--local-epochs", "--round-deadline-s"}))
    pp.field_mask |= TANDEM_PARALLEL_PARAM_FEDAVG;
  if (given({"--average-every", "--warmup-steps"})) pp.field_mask |= TANDEM_PARALLEL_PARAM_LOCALSGD;
  pp.servers = o.servers;
  pp.field_mask |= TANDEM_PARALLEL_PARAM_SERVER_REPLICAS;
  pp.server_replicas = o.server_replicas;
  pp.staleness = o.staleness;
  pp.tau = o.tau;
  pp.alpha = o.alpha;
  pp.easgd_async = o.easgd_async ? 1 : 0;
  pp.clients = o.clients;
  pp.dirichlet_alpha = o.dirichlet_alpha;
  pp.client_fraction = o.client_fraction;
  pp.local_epochs = o.local_epochs;
  pp.round_deadline_s = o.round_deadline_s;
  pp.average_every = o.average_every;
  pp.warmup_steps = o.warmup_steps;
  if (o.elastic || o.min_ranks > 0) {
    // --min-ranks alone: the strategies that absorb a lost worker without --elastic (ps-async, ssp, asgd, easgd,
    // fedavg, localsgd) stop below it.
    pp.field_mask |= TANDEM_PARALLEL_PARAM_ELASTIC;
    pp.elastic = o.elastic ? 1 : 0;
    pp.min_ranks = o.min_ranks > 0 ? o.min_ranks : 1;
    pp.elastic_checkpoint = o.checkpoint.c_str();  // below min_ranks the survivors stop with it
  }
  // Growth (issue #17): `tandem launch --join` starts ranks with TANDEM_JOIN=1; they join the running job at its next
  // step boundary that checks for joiners, and receive its state.
  const char* join = std::getenv("TANDEM_JOIN");
  const bool joining = join != nullptr && std::string(join) == "1";
  // Parameter-server jobs (ps, ps-async, ssp) grow by workers; servers do not join.
  const bool grows = o.strategy == "ddp" || o.strategy == "pipeline" || o.strategy == "hybrid" || o.strategy == "ps" ||
                     o.strategy == "ps-async" || o.strategy == "ssp";
  if (o.elastic && grows) {
    pp.field_mask |= TANDEM_PARALLEL_PARAM_GROW;
    pp.max_ranks = std::max(0, o.max_ranks);
    // A parameter-server job checks for joiners only when it has room to grow (each check costs worker 0 a store
    // read): the launcher's bound at the job's own size (its default, -n) leaves none.
    const bool ps_family = o.strategy == "ps" || o.strategy == "ps-async" || o.strategy == "ssp";
    if (ps_family && o.max_ranks_from_launcher && !joining && o.max_ranks <= launched_world())
      pp.max_ranks = 0;
    pp.join_poll_steps = o.join_poll_steps;
    pp.joining = joining ? 1 : 0;
  } else if (joining) {
    return cli::fail(fmt::format("TANDEM_JOIN=1: only elastic ddp, pipeline, hybrid, ps, ps-async and ssp jobs admit "
                                 "new ranks (give the running job's --strategy and --elastic; this one has --strategy "
                                 "{}{})",
                                 o.strategy, o.elastic ? "" : " without --elastic"));
  }
  if (joining) {
    // How long a joiner waits for the job's next step boundary that admits it: TANDEM_JOIN_WAIT_MS, else 10 minutes.
    int64_t wait_ms = 600000;
    if (const char* t = std::getenv("TANDEM_JOIN_WAIT_MS"); t != nullptr && std::atoll(t) > 0) wait_ms = std::atoll(t);
    if (tandem_comm_join(h.ctx, nullptr, wait_ms, &h.comm) != TANDEM_OK)
      return cli::fail("cannot join the running job");
  } else if (tandem_comm_create(h.ctx, nullptr, &h.comm) != TANDEM_OK) {
    return cli::fail("cannot join the job");
  }
  tandem_comm_rank(h.comm, &h.rank);
  if (tandem_trainer_create_parallel(h.model, h.train, h.test, h.opt, &tp, &pp, h.comm, &h.trainer) != TANDEM_OK) {
    return cli::fail(fmt::format("rank {}: cannot create the {} trainer", h.rank, o.strategy));
  }
  return 0;
}

// Under a launcher, SIGTERM arrives as soon as any rank dies. A parallel rank then gets 2 s to fail on its
// own -- its error names the rank that died -- before it aborts its communicator (peers learn why) and stops; still
// running 0.5 s after the abort, it exits with status 128 + the signal.
std::atomic<int> g_stop_signal{0};
extern "C" void on_stop_signal(int sig) { g_stop_signal.store(sig); }

class StopWatcher {
 public:
  explicit StopWatcher(tandem_comm_t* comm) {
    struct sigaction sa{};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGTERM, &sa, &old_term_);
    ::sigaction(SIGINT, &sa, &old_int_);
    thread_ = std::thread([this, comm] {
      using namespace std::chrono_literals;
      while (!done_.load()) {
        const int sig = g_stop_signal.load();
        if (sig == 0) {
          std::this_thread::sleep_for(20ms);
          continue;
        }
        const auto until = std::chrono::steady_clock::now() + 2s;
        while (!done_.load() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(20ms);
        if (done_.load()) return;
        tandem_comm_abort(comm, fmt::format("stopped by signal {}", sig).c_str());
        // The abort reaches every communicator the trainer made from this one (an elastic trainer that shrank or grew
        // trains on one of its own), and the trainer stops naming it. Should it still not stop (a rank inside a long
        // computation), a rank asked to stop stops: checkpoints are written atomically, so none is left torn.
        const auto grace = std::chrono::steady_clock::now() + 500ms;
        while (!done_.load() && std::chrono::steady_clock::now() < grace) std::this_thread::sleep_for(20ms);
        if (done_.load()) return;
        std::fprintf(stderr, "tandem train: stopped by signal %d (the training did not stop at its communicator's "
                     "abort)\n", sig);
        std::fflush(stderr);
        std::_Exit(128 + sig);
      }
    });
  }
  ~StopWatcher() {
    done_.store(true);
    thread_.join();
    ::sigaction(SIGTERM, &old_term_, nullptr);
    ::sigaction(SIGINT, &old_int_, nullptr);
  }
  StopWatcher(const StopWatcher&) = delete;
  StopWatcher& operator=(const StopWatcher&) = delete;

 private:
  std::atomic<bool> done_{false};
  struct sigaction old_term_{}, old_int_{};
  std::thread thread_;
};

tandem_parallel_attr_t parallel_attr(tandem_trainer_t* t) {
  tandem_parallel_attr_t a = TANDEM_PARALLEL_ATTR_INIT;
  a.field_mask = TANDEM_PARALLEL_ATTR_GRID | TANDEM_PARALLEL_ATTR_PLAN | TANDEM_PARALLEL_ATTR_SPLIT |
                 TANDEM_PARALLEL_ATTR_SYNC | TANDEM_PARALLEL_ATTR_ELASTIC | TANDEM_PARALLEL_ATTR_ASYNC;
  tandem_trainer_parallel_query(t, &a);
  return a;
}

// world, dp, pp, micro-batches and the epoch's time split per step, for the JSON epoch lines.
void add_parallel_fields(tandem_trainer_t* t, nlohmann::json& j) {
  const tandem_parallel_attr_t a = parallel_attr(t);
  j["strategy"] = a.strategy;
  j["world"] = a.world;
  j["dp"] = a.dp;
  j["pp"] = a.pp;
  j["microbatches"] = a.micro_batches;
  j["schedule"] = a.schedule;
  j["partition"] = a.partition;
  if (a.elastic || a.lost_ranks > 0) j["lost_ranks"] = a.lost_ranks;  // a lost worker absorbed (issues #13, #17)
  if (a.elastic) j["lr_scale"] = a.lr_scale;
  if (std::string(a.strategy) == "ps-async")  // the rule the trainer runs, as --staleness-lr names it
    j["staleness_lr"] = a.staleness_lr == TANDEM_STALENESS_LR_INVERSE    ? "inverse"
                        : a.staleness_lr == TANDEM_STALENESS_LR_MOMENTUM ? "momentum"
                                                                         : "none";
  j["time_split"] = {{"step_s", a.step_s},         {"compute_s", a.compute_s},   {"bubble_s", a.bubble_s},
                     {"exposed_comm_s", a.comm_s}, {"data_s", a.data_s},         {"other_s", a.other_s},
                     {"allreduce_s", a.allreduce_s}, {"bubble_fraction", a.bubble_fraction},
                     {"max_bubble_fraction", a.max_bubble_fraction}};
}

std::string parallel_summary(tandem_trainer_t* t) {
  const tandem_parallel_attr_t a = parallel_attr(t);
  // With servers the world is workers + servers ("world 3 = dp 2 x pp 1" did not add up), their exchange is push/pull
  // (not an all-reduce), and a FedAvg step is a round.
  const std::string grid = a.servers > 0 ? fmt::format("{} worker(s) + {} server(s)", a.workers, a.servers)
                                         : fmt::format("dp {} x pp {}", a.dp, a.pp);
  const bool fedavg = std::string(a.strategy) == "fedavg";
  return fmt::format(
      "  {} world {} = {}, {} micro-batch(es) ({}); per {} {:.1f} ms: compute {:.1f}, bubble {:.1f} "
      "({:.0f}%), exposed comm {:.1f} ({} {:.1f}), data {:.1f}",
      a.strategy, a.world, grid, a.micro_batches, a.schedule, fedavg ? "round" : "step", 1e3 * a.step_s,
      1e3 * a.compute_s, 1e3 * a.bubble_s, 100 * a.bubble_fraction, 1e3 * a.comm_s,
      a.servers > 0 ? "push/pull" : "all-reduce", 1e3 * a.allreduce_s, 1e3 * a.data_s);
}

int run_train(const TrainOptions& o) {
  namespace cli = tandem::cli;
  if (const int rc = cli::check_output_path("tandem train", "--checkpoint", o.checkpoint, "nothing was trained") +
                     cli::check_output_path("tandem train", "--trace", o.trace, "nothing was trained"))
    return rc;
  if (struct stat st{}; !o.resume.empty() && (::stat(o.resume.c_str(), &st) != 0 || !S_ISREG(st.st_mode))) {
    std::fprintf(stderr, "tandem train: --resume %s: %s; nothing was trained\n", o.resume.c_str(),
                 S_ISDIR(st.st_mode) ? "is a directory, not a checkpoint file" : std::strerror(errno));
    return 2;
  }
  const int world = launched_world();
  if (!o.parallel && world > 1) {
    std::fprintf(stderr, "tandem train: started as one of %d ranks with --strategy single: every rank would train the "
                 "same model alone (and write the same checkpoint); give --strategy ddp, pipeline or hybrid\n", world);
    return 2;
  }
  const char* join_env = std::getenv("TANDEM_JOIN");  // a joiner (tandem launch --join -n 1) is one rank of a larger job
  const bool joiner = join_env != nullptr && std::string(join_env) == "1";
  if (o.parallel && world == 1 && o.strategy != "single" && !joiner)
    std::fprintf(stderr, "tandem train: warning: --strategy %s on a single rank (no launcher announced more); start "
                 "ranks with `tandem launch -n N -- tandem train ...`\n", o.strategy.c_str());
  // ps-async applies every worker's push as one optimizer step, on a gradient computed from parameters about W - 1
  // updates old (W workers); SGD momentum compounds that staleness, and at 0.9 training can diverge where momentum 0
  // converges (bench/strategies/README.md, session 20). Said once, by rank 0.
  if (o.strategy == "ps-async" && o.optimizer == "sgd" && o.momentum >= 0.5f && o.staleness_lr == "none" &&
      world > 1 && launched_rank() == 0) {
    const int workers = std::max(1, world - o.servers);
    std::fprintf(stderr, "tandem train: warning: --strategy ps-async applies each push as its own optimizer step, on a "
                 "gradient about %d update(s) stale (%d workers); --momentum %g compounds that staleness and can make "
                 "training diverge (LeNet-5 on 4 workers at lr 0.02 and momentum 0.9 stayed at chance, where momentum "
                 "0 reached 86%%): --staleness-lr momentum, --momentum 0, or a lower --lr, is the stable setting\n",
                 workers - 1, workers, static_cast<double>(o.momentum));
  }
  Handles h;
  tandem_context_params_t cp = TANDEM_CONTEXT_PARAMS_INIT;
  if (const int threads = o.parallel ? parallel_threads(o.threads) : o.threads; threads > 0) {
    cp.field_mask = TANDEM_CONTEXT_PARAM_NUM_THREADS;
    cp.num_threads = threads;
  }
  const char* math = nullptr;
  if (const std::string why = cli::math_setting(o.precision, o.device.empty() ? o.backend : o.device, math, true);
      !why.empty())
    return cli::fail(why);
  double loss_scale = 0;  // tandem_trainer_params_t.loss_scale
  if (const std::string why = loss_scale_value(o, loss_scale); !why.empty()) return cli::fail(why);
  if (math != nullptr) {
    cp.field_mask |= TANDEM_CONTEXT_PARAM_SETTINGS;
    cp.settings = &math;
    cp.num_settings = 1;
  }
  if (tandem_context_create(&cp, &h.ctx) != TANDEM_OK) return cli::fail("cannot create a context");
  if (!o.input.empty()) {
    int64_t c = 0, hh = 0, w = 0;
    if (o.dataset != "synthetic") return cli::fail("--input sets the synthetic data set's shape; --dataset is '" + o.dataset + "'");
    if (!cli::parse_chw(o.input, c, hh, w)) return cli::fail("--input '" + o.input + "' must look like 3x32x32");
  }
  if (make_dataset(o, true, h, &h.train) != TANDEM_OK) return cli::fail("cannot load the training data");
  if (make_dataset(o, false, h, &h.test) != TANDEM_OK) return cli::fail("cannot load the test data");
  int64_t size = 0, c = 0, hh = 0, w = 0, classes = 0;
  tandem_dataset_info(h.train, &size, &c, &hh, &w, &classes);

  tandem_model_params_t mp = TANDEM_MODEL_PARAMS_INIT;
  mp.field_mask = TANDEM_MODEL_PARAM_BACKEND | TANDEM_MODEL_PARAM_SEED | TANDEM_MODEL_PARAM_INIT;
  std::string backend = o.backend;
  if (!o.device.empty()) {
    const auto b = tandem::cli::backend_for_device(o.device);
    if (!b) return cli::fail("--device '" + o.device + "' is not cpu, cuda or cuda:N");
    backend = *b;
  }
  mp.backend = backend.c_str();
  mp.seed = o.seed;
  mp.init = o.init.c_str();
  if (looks_like_file(o.model)) {
    mp.field_mask |= TANDEM_MODEL_PARAM_SPEC_PATH;
    mp.spec_path = o.model.c_str();
  } else {
    mp.field_mask |= TANDEM_MODEL_PARAM_NAME | TANDEM_MODEL_PARAM_INPUT_SHAPE | TANDEM_MODEL_PARAM_NUM_CLASSES;
    mp.name = o.model.c_str();
    mp.input_channels = c;
    mp.input_height = hh;
    mp.input_width = w;
    mp.num_classes = classes;
    if (o.width_mult > 0) {
      if (const std::string why = cli::width_mult_error(o.model); !why.empty()) {
        std::fprintf(stderr, "tandem train: %s\n", why.c_str());
        return 2;
      }
      mp.field_mask |= TANDEM_MODEL_PARAM_WIDTH_MULT;
      mp.width_mult = o.width_mult;
    }
  }
  if (tandem_model_create(h.ctx, &mp, &h.model) != TANDEM_OK) return cli::fail(fmt::format("cannot create model '{}'", o.model));
  // The CPU backend's vector ISAs (TANDEM_CPU_MAX_ISA), printed with the figures: machines and caps differ.
  nlohmann::json cpu_isa;
  if (backend == "cpu") {
    const char *isa_host = nullptr, *isa_cap = nullptr, *isa_kernels = nullptr, *isa_onednn = nullptr;
    if (tandem_context_cpu_isa(h.ctx, &isa_host, &isa_cap, &isa_kernels, &isa_onednn) != TANDEM_OK)
      return cli::fail("cannot query the CPU ISA");
    cpu_isa = {{"host", isa_host}, {"cap", isa_cap}, {"kernels", isa_kernels}, {"onednn", isa_onednn}};
  }

  tandem_optimizer_params_t op = TANDEM_OPTIMIZER_PARAMS_INIT;
  op.field_mask = TANDEM_OPTIMIZER_PARAM_KIND | TANDEM_OPTIMIZER_PARAM_LR | TANDEM_OPTIMIZER_PARAM_WEIGHT_DECAY |
                  TANDEM_OPTIMIZER_PARAM_SCHEDULE | TANDEM_OPTIMIZER_PARAM_CLIP_NORM;
  if (o.optimizer == "sgd") {
    op.kind = TANDEM_OPTIMIZER_SGD;
    op.field_mask |= TANDEM_OPTIMIZER_PARAM_MOMENTUM | TANDEM_OPTIMIZER_PARAM_NESTEROV;
    op.momentum = o.momentum;
    op.nesterov = o.nesterov ? 1 : 0;
  } else if (o.optimizer == "adam") {
    op.kind = TANDEM_OPTIMIZER_ADAM;
  } else if (o.optimizer == "adamw") {
    op.kind = TANDEM_OPTIMIZER_ADAMW;
  } else {
    std::fprintf(stderr, "tandem: --optimizer '%s' is not sgd, adam or adamw\n", o.optimizer.c_str());
    return 2;
  }
  op.lr = o.lr;
  op.weight_decay = o.weight_decay;
  op.schedule = o.schedule.c_str();
  op.clip_norm = o.clip_norm;
  if (tandem_optimizer_create(h.ctx, &op, &h.opt) != TANDEM_OK) return cli::fail("bad optimizer settings");

  Bar bar;
  // On a terminal, unless --json. Under tandem launch a rank's stderr is a pipe: the launcher tells rank 0 when it
  // draws the bar on a terminal, and so does tandem demo for its one-rank run; then the bar is drawn on stderr even
  // while stdout carries --json lines (they are what the launcher or the demo reads).
  const char* launch_progress = std::getenv("TANDEM_LAUNCH_PROGRESS");
  bar.enabled = (launch_progress != nullptr && std::strcmp(launch_progress, "1") == 0) || (!o.json && ::isatty(2) != 0);
  bar.epochs = o.epochs;
  tandem_trainer_params_t tp = TANDEM_TRAINER_PARAMS_INIT;
  tp.field_mask = TANDEM_TRAINER_PARAM_BATCH_SIZE | TANDEM_TRAINER_PARAM_EPOCHS | TANDEM_TRAINER_PARAM_SEED |
                  TANDEM_TRAINER_PARAM_LIMIT_BATCHES | TANDEM_TRAINER_PARAM_EVAL_LIMIT_BATCHES |
                  TANDEM_TRAINER_PARAM_AUGMENT;
  tp.batch_size = o.batch;
  tp.epochs = o.epochs;
  tp.seed = o.seed;
  tp.limit_batches = o.limit_batches;
  tp.eval_limit_batches = o.eval_limit_batches;
  tp.augment = o.augment ? 1 : 0;
  if (o.prefetch != 2) {  // the library's default otherwise
    tp.field_mask |= TANDEM_TRAINER_PARAM_PREFETCH;
    tp.prefetch = o.prefetch;
  }
  if (loss_scale != 0) {
    tp.field_mask |= TANDEM_TRAINER_PARAM_LOSS_SCALE | TANDEM_TRAINER_PARAM_LOSS_SCALER;
    tp.loss_scale = loss_scale;
    tp.loss_scale_init = o.loss_scale_init;
    tp.loss_scale_growth = o.loss_scale_growth;
    tp.loss_scale_backoff = o.loss_scale_backoff;
    tp.loss_scale_growth_interval = o.loss_scale_growth_interval;
  }
  if (bar.enabled) {
    tp.field_mask |= TANDEM_TRAINER_PARAM_PROGRESS;
    tp.progress = draw_bar;
    tp.progress_user_data = &bar;
  }
  std::unique_ptr<StopWatcher> stop;  // parallel ranks: see StopWatcher
  if (o.parallel) {
    if (const int rc = create_parallel_trainer(o, tp, h); rc != 0) return rc;
    stop = std::make_unique<StopWatcher>(h.comm);
    const tandem_parallel_attr_t a = parallel_attr(h.trainer);
    bar.ranks = a.world;
    bar.loss_elsewhere = a.pp > 1;
  } else if (tandem_trainer_create(h.model, h.train, h.test, h.opt, &tp, &h.trainer) != TANDEM_OK) {
    return cli::fail("cannot create the trainer");
  }
  if (!o.resume.empty()) {
    if (tandem_trainer_load_checkpoint(h.trainer, o.resume.c_str()) != TANDEM_OK) {
      return cli::fail(fmt::format("cannot resume from '{}'", o.resume));
    }
  }
  int64_t done = 0;
  tandem_trainer_progress(h.trainer, &done, nullptr);
  if (!o.json && h.rank == 0) {
    tandem_model_attr_t ma = TANDEM_MODEL_ATTR_INIT;
    ma.field_mask = TANDEM_MODEL_ATTR_NAME | TANDEM_MODEL_ATTR_COST;
    tandem_model_query(h.model, &ma);
    std::printf("training %s (%lld parameters, backend %s) on %s: %lld samples of %lldx%lldx%lld, %lld classes%s\n",
                ma.name, static_cast<long long>(ma.params), ma.backend, o.dataset.c_str(), static_cast<long long>(size),
                static_cast<long long>(c), static_cast<long long>(hh), static_cast<long long>(w),
                static_cast<long long>(classes),
                done > 0 ? fmt::format(", resuming after epoch {}", done).c_str() : "");
    if (o.parallel) std::printf("%s\n", parallel_attr(h.trainer).partition);
    if (!cpu_isa.is_null())
      std::printf("cpu isa: host %s, TANDEM_CPU_MAX_ISA %s: kernels %s, oneDNN %s\n",
                  cpu_isa["host"].get<std::string>().c_str(), cpu_isa["cap"].get<std::string>().c_str(),
                  cpu_isa["kernels"].get<std::string>().c_str(), cpu_isa["onednn"].get<std::string>().c_str());
    std::fflush(stdout);
  }
  tandem_epoch_result_t last = TANDEM_EPOCH_RESULT_INIT;  // for --predict
  // --target-accuracy: every rank gets the same all-reduced test accuracy, so every rank stops after the same epoch
  // (no extra agreement needed); times and samples count this process's epochs (a resumed run's, from its resume).
  double run_train_s = 0, run_wall_s = 0;
  int64_t run_samples = 0;
  bool reached = false;
  int64_t reached_epoch = 0;
  // The epochs done are read again each time: a joiner or spare of an elastic grid learns the job's count when it
  // is placed (and a spare released at the job's end is told it is done).
  for (int64_t epoch = done; epoch < o.epochs && !reached; ++epoch) {
    tandem_trainer_progress(h.trainer, &done, nullptr);
    if (done >= o.epochs) break;
    epoch = std::max(epoch, done);
    tandem_epoch_result_t r = TANDEM_EPOCH_RESULT_INIT;
    r.field_mask =
        TANDEM_EPOCH_RESULT_TRAIN | TANDEM_EPOCH_RESULT_TEST | TANDEM_EPOCH_RESULT_TIME | TANDEM_EPOCH_RESULT_REPORT;
    const int32_t lost_before = o.parallel ? parallel_attr(h.trainer).lost_ranks : 0;
    const tandem_status_t st = tandem_trainer_epoch(h.trainer, &r);
    if (bar.enabled) std::fprintf(stderr, "\n");
    if (st != TANDEM_OK) return cli::fail(fmt::format("epoch {} failed", epoch + 1));
    last = r;
    run_train_s += r.train_s;
    run_wall_s += r.wall_s;
    run_samples += r.train_samples;
    if (o.target_accuracy > 0 && std::isfinite(r.test_accuracy) && r.test_accuracy >= o.target_accuracy) {
      reached = true;
      reached_epoch = r.epoch;
    }
    // A diverged run (lr too high: the loss went inf/NaN) printed "train loss -nan", overwrote the last good checkpoint
    // with NaN weights and exited 0. One process stops here, before the checkpoint; under a launcher a rank's loss is
    // its own (servers train nothing), so rank 0 only says so here, and the collective checkpoint itself is refused on
    // every rank alike when any rank holds non-finite parameters (ParallelTrainer::refuse_diverged): every rank then
    // fails below naming the step, and the last good checkpoint stays.
    if (!std::isfinite(r.train_loss) && r.train_samples > 0) {
      if (!o.parallel) {
        std::fprintf(stderr, "tandem train: epoch %lld: the training loss is not finite (%g): the model diverged; "
                     "lower --lr or give --clip-norm%s\n", static_cast<long long>(r.epoch), r.train_loss,
                     o.checkpoint.empty() ? "" : fmt::format(" (--checkpoint {} was not overwritten)",
                                                             o.checkpoint).c_str());
        return 1;
      }
      if ((parallel_attr(h.trainer).rank) == 0)
        std::fprintf(stderr, "tandem train: warning: epoch %lld: rank 0's training loss is not finite (%g): the model "
                     "diverged; lower --lr or give --clip-norm\n", static_cast<long long>(r.epoch), r.train_loss);
    }
    // Ranks lost during the epoch: its training figures are the survivors' when the loss came before the epoch's
    // sums (ParallelTrainer's rule: a lost rank's share is not carried).
    const int32_t lost_in_epoch = o.parallel ? parallel_attr(h.trainer).lost_ranks - lost_before : 0;
    auto num = [](double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); };
    // Rank 0 speaks for the job (its figures are global); elastic: rank 0 of the survivors. It reports the epoch
    // before the checkpoint is written: when an elastic job loses rank 0 during the write (the others give the save
    // up and go on, ParallelTrainer::save_checkpoint), the epoch was reported by nobody. A survivor's rank 0 does not
    // report an epoch again that the rank 0 it replaced reported before it left (already_reported).
    if ((o.parallel ? parallel_attr(h.trainer).rank : h.rank) == 0 && r.already_reported == 0) {
      if (o.json) {
        nlohmann::json j = {{"epoch", r.epoch},
                            {"train_loss", num(r.train_loss)},
                            {"train_accuracy", num(r.train_accuracy)},
                            {"test_loss", num(r.test_loss)},
                            {"test_accuracy", num(r.test_accuracy)},
                            {"images_per_sec", num(r.images_per_sec)},
                            {"train_samples", r.train_samples},
                            {"train_s", num(r.train_s)},  // training only; wall_s adds evaluation
                            {"wall_s", num(r.wall_s)}};
        if (o.parallel) add_parallel_fields(h.trainer, j);
        if (lost_in_epoch > 0) j["lost_in_epoch"] = lost_in_epoch;
        if (loss_scale != 0) {
          double scale = 0;
          int64_t skipped = 0;
          tandem_trainer_loss_scale(h.trainer, &scale, &skipped);
          j["loss_scale"] = scale;
          j["skipped_steps"] = skipped;
        }
        if (!cpu_isa.is_null()) j["cpu_isa"] = cpu_isa;
        std::printf("%s\n", j.dump().c_str());
      } else {
        // An epoch with no sample scored has no training figures (NaN): "n/a", not a loss of "nan".
        const std::string train_fig =
            std::isnan(r.train_loss) && r.train_samples == 0
                ? std::string("train loss n/a acc n/a")
                : fmt::format("train loss {:.4f} acc {:.2f}%", r.train_loss, 100 * r.train_accuracy);
        std::printf("epoch %lld: %s | test loss %.4f acc %.2f%% | %.0f img/s | %.1f s\n",
                    static_cast<long long>(r.epoch), train_fig.c_str(), r.test_loss, 100 * r.test_accuracy,
                    r.images_per_sec, r.wall_s);
        if (o.parallel) std::printf("%s\n", parallel_summary(h.trainer).c_str());
        if (lost_in_epoch > 0)
          std::printf("  %d rank(s) lost in this epoch: if before its sums, the training figures count only the "
                      "survivors' samples (%lld)\n",
                      lost_in_epoch, static_cast<long long>(r.train_samples));
        if (loss_scale != 0) {
          double scale = 0;
          int64_t skipped = 0;
          tandem_trainer_loss_scale(h.trainer, &scale, &skipped);
          std::printf("loss scale %g, %lld step%s skipped (non-finite gradients)\n", scale,
                      static_cast<long long>(skipped), skipped == 1 ? "" : "s");
        }
      }
      std::fflush(stdout);
      // Test hook (issue #17): a reporting rank killed by a signal right after it reported the epoch, which no
      // orderly end (Communicator::leave) can tell the survivors: its standing note must.
      if (const char* k = std::getenv("TANDEM_TEST_KILL_AFTER_REPORT"); k != nullptr && std::atoll(k) == r.epoch) {
        std::fprintf(stderr, "TANDEM_TEST_KILL_AFTER_REPORT: the rank that reported epoch %lld kills itself\n",
                     static_cast<long long>(r.epoch));
        std::fflush(stderr);
        ::raise(SIGKILL);
      }
    }
    if (!o.checkpoint.empty() && tandem_trainer_save_checkpoint(h.trainer, o.checkpoint.c_str()) != TANDEM_OK) {
      return cli::fail(fmt::format("cannot write checkpoint '{}'", o.checkpoint));
    }
  }
  if (o.target_accuracy > 0 && h.rank == 0) {
    // steps per worker: the samples trained over the global batch (FedAvg: each worker's local steps)
    const int64_t workers = o.parallel ? std::max<int64_t>(1, parallel_attr(h.trainer).dp) : 1;
    const int64_t steps = run_samples / std::max<int64_t>(1, o.batch * workers);
    if (o.json) {
      nlohmann::json t = {{"accuracy", o.target_accuracy}, {"reached", reached},
                          {"epoch", reached ? nlohmann::json(reached_epoch) : nlohmann::json(nullptr)},
                          {"steps", steps}, {"samples", run_samples}, {"train_s", run_train_s},
                          {"wall_s", run_wall_s}, {"test_accuracy", std::isfinite(last.test_accuracy)
                                                                       ? nlohmann::json(last.test_accuracy)
                                                                       : nlohmann::json(nullptr)}};
      std::printf("%s\n", nlohmann::json{{"target", t}}.dump().c_str());
    } else if (reached) {
      std::printf("reached %.2f%% test accuracy (target %.2f%%) after epoch %lld: %lld steps, %.1f s training "
                  "(%.1f s with evaluation)\n", 100 * last.test_accuracy, 100 * o.target_accuracy,
                  static_cast<long long>(reached_epoch), static_cast<long long>(steps), run_train_s, run_wall_s);
    } else {
      std::printf("target %.2f%% test accuracy not reached in %lld epochs (last %.2f%%)\n", 100 * o.target_accuracy,
                  static_cast<long long>(o.epochs), 100 * last.test_accuracy);
    }
    std::fflush(stdout);
  }
  if (o.predict.enabled && h.rank == 0) {  // the simulator's prediction beside what this run measured
    const int64_t steps = last.train_samples > 0 ? (last.train_samples + o.batch - 1) / o.batch : 0;
    if (const int rc = tandem::cli::print_prediction(h.trainer, o.predict, o.json,
                                                     o.parallel || steps == 0 ? 0.0 : last.train_s / steps,
                                                     o.parallel ? 0 : steps);
        rc != 0) {
      return rc;
    }
  }
  if (!o.trace.empty()) {
    if (tandem_trainer_write_trace(h.trainer, o.trace.c_str()) != TANDEM_OK) {
      return cli::fail(fmt::format("cannot write the trace '{}'", o.trace));
    }
    if (h.rank == 0 && !o.json) std::printf("trace: %s (open in https://ui.perfetto.dev)\n", o.trace.c_str());
  }
  return 0;
}

tandem::cli::Registration reg{"train", "train a model on one process", [](CLI::App& app) -> tandem::cli::Runner {
  auto o = std::make_shared<TrainOptions>();
  app.add_option("--model", o->model, std::string("zoo name (") + tandem::cli::kZooHelp + ") or a JSON spec file")
      ->capture_default_str();
  app.add_option("--dataset", o->dataset, "fashion-mnist, cifar10 (needs --data-dir) or synthetic")->capture_default_str();
  app.add_option("--input", o->input, "synthetic: sample shape CxHxW (default 1x28x28, Fashion-MNIST's)");
  app.add_option("--precision", o->precision, tandem::cli::kPrecisionHelp)->capture_default_str();
  app.add_option("--loss-scale", o->loss_scale,
                 "loss scaling: dynamic (the default with --precision fp16; as PyTorch's GradScaler), a fixed scale "
                 "S > 0, or off (the default otherwise). The loss gradient is multiplied by S, the gradients divided "
                 "by S before clipping and the optimizer (f32 master weights); a step with an inf or NaN gradient on "
                 "any rank is skipped on every rank");
  for (auto [flag, dst, what] : {std::tuple{"--loss-scale-init", &o->loss_scale_init, "dynamic: the first scale (> 0)"},
                                 std::tuple{"--loss-scale-growth", &o->loss_scale_growth, "dynamic: growth factor (> 1)"},
                                 std::tuple{"--loss-scale-backoff", &o->loss_scale_backoff,
                                            "dynamic: factor after a skipped step, in (0, 1)"}})
    app.add_option(flag, *dst, what)->capture_default_str()->each([o](const std::string&) { o->loss_scaler_given = true; });
  app.add_option("--loss-scale-growth-interval", o->loss_scale_growth_interval,
                 "dynamic: finite steps in a row before the scale grows (>= 1)")
      ->capture_default_str()->each([o](const std::string&) { o->loss_scaler_given = true; });
  app.add_option("--data-dir", o->data_dir, "directory of the data set's files");
  app.add_option("--backend", o->backend, "compute backend: cpu (oneDNN), reference, cuda[:N]")->capture_default_str();
  app.add_option("--device", o->device, std::string("where to compute (sets --backend): ") + tandem::cli::kDeviceHelp);
  app.add_option("--epochs", o->epochs, "epochs to train (in total, counting resumed ones)")->capture_default_str()
      ->check(tandem::cli::kPositive);
  app.add_option("--target-accuracy", o->target_accuracy,
                 "stop after the first evaluation (end of an epoch; FedAvg: of a round) whose test accuracy is at or "
                 "above this, in (0, 1]; --epochs stays the cap. --json adds a {\"target\": ...} line: reached, "
                 "epoch, steps per worker, training and wall seconds")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            double x = 0;
            if (!CLI::detail::lexical_cast(v, x) || !(x > 0 && x <= 1)) return "must be in (0, 1], got " + v;
            return {};
          },
          "(0, 1]"));
  app.add_option("--batch", o->batch, "batch size")->capture_default_str()->check(tandem::cli::kPositive);
  app.add_option("--lr", o->lr, "base learning rate")->capture_default_str();
  app.add_option("--optimizer", o->optimizer, "sgd, adam or adamw")->capture_default_str();
  app.add_option("--momentum", o->momentum, "SGD momentum")->capture_default_str();
  app.add_flag("--nesterov", o->nesterov, "Nesterov momentum (SGD)");
  app.add_option("--weight-decay", o->weight_decay, "weight decay (AdamW: decoupled)")->capture_default_str();
  app.add_option("--schedule", o->schedule,
                 "constant, step:EPOCHS:GAMMA or cosine, optionally ,warmup:EPOCHS (learning rate); gpipe or 1f1b: "
                 "the pipeline schedule (as --pipeline-schedule)")
      ->capture_default_str();
  app.add_option("--clip-norm", o->clip_norm, "clip gradients to this global L2 norm (0: off)");
  app.add_option("--threads", o->threads, "compute threads (default, or 0: all cores)")
      ->check(tandem::cli::kNonNegative);
  app.add_option("--seed", o->seed, "initialisation, shuffling and augmentation seed")
      ->check(tandem::cli::kNonNegative)  // CLI11 would wrap -1 into the unsigned seed
      ->capture_default_str();
  app.add_option("--init", o->init, "weight initialisation: kaiming, xavier or uniform")->capture_default_str();
  app.add_option("--checkpoint", o->checkpoint, "write a checkpoint here after every epoch");
  app.add_option("--resume", o->resume, "resume from this checkpoint");
  app.add_option("--limit-batches", o->limit_batches, "stop each epoch after this many batches (0: all)")
      ->check(tandem::cli::kNonNegative);
  app.add_option("--eval-limit-batches", o->eval_limit_batches, "evaluate on at most this many batches (0: all)")
      ->check(tandem::cli::kNonNegative);
  app.add_option("--prefetch", o->prefetch, "batches the loader thread assembles ahead (0: none, on the training "
                 "thread); each costs batch x sample bytes of memory")
      ->check(CLI::Range(0, 64))
      ->capture_default_str();
  app.add_option("--train-limit", o->train_limit, "use only the first N training samples (0: all)")
      ->check(tandem::cli::kNonNegative);
  app.add_option("--test-limit", o->test_limit, "use only the first N test samples (0: all)")
      ->check(tandem::cli::kNonNegative);
  app.add_flag("--augment", o->augment, "random crop with padding (and flips for colour images)");
  app.add_option("--width-mult", o->width_mult, "mobilenetv2 width multiplier")->check(tandem::cli::kPositive);
  app.add_flag("--json", o->json, "one JSON object per epoch on stdout");
  tandem::cli::add_predict_options(app, o->predict);
  // Parallel training: run under `tandem launch -n N`, mpirun or srun; rank 0 prints for the job.
  const char* par = "Parallel (under tandem launch, mpirun or srun)";
  std::vector<CLI::Option*> popts{
      app.add_option("--strategy", o->strategy, "single, ddp, pipeline, hybrid (DP x PP), ps (parameter server), "
                     "ps-async, ssp (bounded staleness), asgd (gossip), easgd, fedavg or localsgd")->group(par)
          ->check(CLI::IsMember({"single", "ddp", "pipeline", "hybrid", "ps", "ps-async", "ssp", "asgd", "easgd",
                                 "fedavg", "localsgd"})),
      app.add_option("--dp", o->dp, "data-parallel replicas (default: derived from the world size)")->group(par),
      app.add_option("--pp", o->pp, "pipeline stages (default: derived from the world size)")->group(par),
      app.add_option("--microbatches", o->microbatches, "micro-batches per step (pipeline)")->group(par)
          ->capture_default_str(),
      app.add_option("--pipeline-schedule", o->pipeline_schedule, "gpipe or 1f1b")->group(par)->capture_default_str()
          ->check(CLI::IsMember({"gpipe", "1f1b"})),
      app.add_option("--bucket-mb", o->bucket_mb, "DDP gradient bucket size (MiB)")->group(par)->capture_default_str(),
      app.add_option("--first-bucket-mb", o->first_bucket_mb, "cap of the first gradient bucket formed (the last "
                     "layers' gradients), as PyTorch DDP's 1 MiB; 0: --bucket-mb")->group(par),
      app.add_option("--bucket-sizes-mb", o->bucket_sizes_mb, "explicit sizes of the first gradient buckets in "
                     "ready order, e.g. 1,24.5 (the rest at --bucket-mb); PyTorch DDP's logged bucket bytes / 1048576 "
                     "rebuild its buckets")->group(par)->delimiter(',')->excludes("--first-bucket-mb"),
      app.add_option("--compression,--compress", o->compression, "gradients on the wire: none, fp16 or bf16")->group(par)
          ->capture_default_str()->check(CLI::IsMember({"none", "fp16", "bf16"})),
      app.add_option("--accumulate", o->accumulate, "batches per optimizer step (one all-reduce)")->group(par)
          ->capture_default_str(),
      app.add_option("--partition", o->partition, "stage balance: flops (layer specs) or measured")->group(par)
          ->capture_default_str()->check(CLI::IsMember({"flops", "measured"})),
      app.add_option("--cut", o->cut, "explicit pipeline cut: pp + 1 layer indices, e.g. 0,78,151 (overrides "
                     "--partition; `tandem model summary` numbers the layers)")->group(par),
      app.add_option("--trace", o->trace, "write one Chrome trace of every rank here (Perfetto)")->group(par),
      app.add_option("--servers", o->servers, "ps, ps-async, ssp, easgd --easgd-async: server ranks (the last ones)")
          ->group(par)->capture_default_str(),
      app.add_option("--server-replicas", o->server_replicas, "ps, ps-async, ssp: backups of each server's shard on "
                     "the next servers (values, optimizer state, clock; at most --servers - 1); a lost server's shard "
                     "is taken over from its backup without a restart (ps needs --elastic)")
          ->group(par)->capture_default_str(),
      app.add_option("--staleness", o->staleness, "ssp: clocks a worker may run ahead of the slowest (0: sync)")
          ->group(par)->capture_default_str(),
      app.add_option("--staleness-lr", o->staleness_lr, "ps-async: how a push's step follows its staleness tau (the "
                     "updates its piece took on the server since its worker was sent the values it computed from): "
                     "none; inverse: the learning rate / max(tau, 1) (Zhang et al. 2016); momentum: SGD's momentum "
                     "max(0, 1 - (1 - m)(tau + 1)) for that push, the rate kept (asynchrony's own momentum taken out; "
                     "Mitliagkas et al. 2016). At --momentum 0.9 plain ps-async diverges; momentum trains from the "
                     "start, inverse after a stall (bench/strategies/README.md)")
          ->group(par)->check(CLI::IsMember({"none", "inverse", "momentum"}))->capture_default_str(),
      app.add_option("--tau", o->tau, "easgd: local steps between elastic exchanges")->group(par)
          ->capture_default_str(),
      app.add_option("--alpha", o->alpha, "easgd: moving rate in [0, 1) (0: 0.9 / workers)")->group(par)
          ->capture_default_str(),
      app.add_flag("--easgd-async", o->easgd_async, "easgd: asynchronous variant with the centre on a server")
          ->group(par),
      app.add_option("--clients", o->clients, "fedavg: virtual clients over the workers (0: one per worker)")
          ->group(par)->capture_default_str(),
      app.add_option("--dirichlet-alpha", o->dirichlet_alpha, "fedavg: Dirichlet label skew of the clients' data "
                     "(0: IID)")->group(par)->capture_default_str(),
      app.add_option("--client-fraction", o->client_fraction, "fedavg: fraction of clients sampled per round")
          ->group(par)->capture_default_str(),
      app.add_option("--local-epochs", o->local_epochs, "fedavg: epochs a sampled client runs per round")
          ->group(par)->capture_default_str(),
      app.add_option("--round-deadline-s", o->round_deadline_s, "fedavg: a round closes after this long with "
                     "whoever reported (0: the communicator's timeout)")->group(par)->capture_default_str(),
      app.add_option("--average-every", o->average_every, "localsgd: steps between parameter averages (H)")
          ->group(par)->capture_default_str(),
      app.add_option("--warmup-steps", o->warmup_steps, "localsgd: synchronous DDP steps first (post-local SGD)")
          ->group(par)->capture_default_str(),
      app.add_flag("--elastic", o->elastic, "ddp: when ranks die the survivors go on with fewer replicas (same "
                   "per-replica batch, learning rate x survivors / ranks); ps: likewise with fewer workers. "
                   "ps-async, ssp, asgd, easgd, fedavg and localsgd absorb a dead worker without it (the others go "
                   "on, each logging the lost rank); a dead parameter server's shard is taken over from a replica "
                   "(--server-replicas) or restored from --checkpoint, else the job stops naming it; see --min-ranks")->group(par),
      app.add_option("--min-ranks", o->min_ranks, "fewer ranks left (servers count) stop the job with a checkpoint "
                     "(--checkpoint) and an error naming the lost ranks (default: TANDEM_MIN_RANKS, which tandem "
                     "launch --min-ranks sets, else 1)")
          ->group(par)->check(tandem::cli::kPositive),
      app.add_option("--max-ranks", o->max_ranks, "elastic ddp, pipeline, hybrid, ps, ps-async, ssp: ranks started "
                     "later (tandem launch --join) are admitted at a step boundary up to this many ranks in all (with "
                     "parameter servers, as workers, and only when this is above the job's ranks), the others refused "
                     "(default: TANDEM_MAX_RANKS, which tandem launch sets to its --max-ranks, -n by default; else no "
                     "bound)")
          ->group(par)->check(tandem::cli::kPositive),
      app.add_option("--join-poll-steps", o->join_poll_steps, "elastic jobs that grow: check for joining ranks every "
                     "this many steps (each check: one rendezvous-store read on rank 0 and an 8-byte broadcast; ps and "
                     "ssp: the store read alone, the decision carried on the push/pull messages; ps-async: also a "
                     "sync point, the workers re-taking the servers' parameters)")
          ->group(par)->check(tandem::cli::kPositive)->capture_default_str()};
  return [o, popts] {
    for (const CLI::Option* opt : popts) {
      o->parallel = o->parallel || opt->count() > 0;
      if (opt->count() > 0) o->given.insert(opt->get_name());
    }
    if (!o->cut.empty()) o->cut_layers = tandem::cli::parse_cut(o->cut);
    if (o->min_ranks == 0) {
      // tandem launch --min-ranks A gives every rank TANDEM_MIN_RANKS=A: the same floor for the training
      const char* v = std::getenv("TANDEM_MIN_RANKS");
      if (v != nullptr && *v != '\0') {
        char* end = nullptr;
        const long n = std::strtol(v, &end, 10);
        if (*end != '\0' || n < 1 || n > 1 << 20)
          return tandem::cli::fail(fmt::format("TANDEM_MIN_RANKS='{}' is not a rank count >= 1", v));
        o->min_ranks = static_cast<int>(n);
      }
    }
    if (o->max_ranks < 0) {
      o->max_ranks = 0;
      if (const char* v = std::getenv("TANDEM_MAX_RANKS"); v != nullptr && *v != '\0') {
        char* end = nullptr;
        const long n = std::strtol(v, &end, 10);
        if (*end != '\0' || n < 1 || n > 1 << 20)
          return tandem::cli::fail(fmt::format("TANDEM_MAX_RANKS='{}' is not a rank count >= 1", v));
        o->max_ranks = static_cast<int>(n);
        o->max_ranks_from_launcher = true;
      }
    }
    if (o->schedule == "gpipe" || o->schedule == "1f1b") {  // --schedule names the pipeline's schedule
      o->pipeline_schedule = o->schedule;
      o->schedule = "constant";
      o->parallel = true;
    }
    return run_train(*o);
  };
}};

}  // namespace
