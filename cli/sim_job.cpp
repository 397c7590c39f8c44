// The job options of `tandem simulate` and `tandem plan` (cli/sim_job.hpp).
#include "cli/sim_job.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "cli/command.hpp"
#include "cli/cut.hpp"
#include "cli/enums.hpp"

namespace tandem::cli {

std::string human_bytes(double b) {
  if (b >= 1073741824.0) return fmt::format("{:.2f} GiB", b / 1073741824.0);
  return fmt::format("{:.0f} MiB", b / 1048576.0);
}

std::string human_seconds(double s) {
  if (s == 0) return "0 s";
  if (s >= 3600) return fmt::format("{:.0f} s ({:.2f} h)", s, s / 3600);
  if (s >= 1) return fmt::format("{:.2f} s", s);
  return fmt::format("{:.2f} ms", s * 1e3);
}

namespace {

// The data set as `tandem train` loads it with no further option: Fashion-MNIST from its Debian package as itself,
// any other one as synthetic data of the same sample shape (so the command runs as printed and its step is the one
// simulated), and then `note` says how to train on the real data.
std::string train_data_args(const SimJobCli& o, std::string* note) {
  if (o.dataset == "fashion-mnist" && !o.given("--input")) return " --dataset fashion-mnist";
  std::string shape;
  int64_t c = 0, h = 0, w = 0, classes = 0;
  if (o.given("--input")) {
    shape = o.input;
  } else if (!o.dataset.empty() &&
             tandem_sim_dataset_info(o.dataset.c_str(), nullptr, &c, &h, &w, &classes) == TANDEM_OK) {
    shape = fmt::format("{}x{}x{}", c, h, w);
  }
  std::string args = " --dataset synthetic";
  if (!shape.empty() && shape != "1x28x28") args += " --input " + shape;  // 1x28x28: synthetic's own default
  if (note == nullptr || o.dataset.empty()) return args;
  if (o.dataset == "cifar10") {
    *note = "for the real CIFAR-10, '--dataset cifar10 --data-dir DIR' in place of '" + args.substr(1) +
            "', DIR holding its binary batches";
  } else if (o.dataset != "fashion-mnist") {
    *note = "tandem train reads fashion-mnist and cifar10; '" + o.dataset + "' runs here as synthetic data of its "
            "sample shape (10 classes)";
  }
  return args;
}

}  // namespace

std::string train_command(const SimJobCli& o, const tandem_sim_summary_t& s, std::string* note) {
  std::string cmd;
  if (s.dp > 1 && s.algorithm != TANDEM_ALGO_AUTO) cmd += fmt::format("TANDEM_ALLREDUCE_ALGO={} ", tandem_algo_string(s.algorithm));
  if (s.ranks > 1) cmd += fmt::format("tandem launch -n {} -- ", s.ranks);
  cmd += "tandem train ";
  cmd += o.model_file.empty() ? "--model " + o.model : "--model " + o.model_file;
  if (o.model == "mobilenetv2" && o.width_mult != 1) cmd += fmt::format(" --width-mult {}", o.width_mult);
  cmd += train_data_args(o, note);
  cmd += fmt::format(" --batch {}", s.batch);
  cmd += fmt::format(" --strategy {}", name_of(strategy_names(), s.strategy));
  if (s.strategy == TANDEM_STRATEGY_HYBRID) cmd += fmt::format(" --dp {} --pp {}", s.dp, s.pp);
  if (s.strategy >= TANDEM_STRATEGY_PS) {
    // the strategy's knobs as given (tandem plan has none: a candidate's server count comes from its summary)
    const bool has_knobs = o.app->get_option_no_throw("--servers") != nullptr;
    if (s.field_mask & TANDEM_SIM_SUMMARY_STRATEGY && s.servers > 0 && !(has_knobs && o.given("--servers")))
      cmd += fmt::format(" --servers {}", s.servers);
    for (const char* opt : {"--servers", "--staleness", "--staleness-lr", "--tau", "--alpha", "--easgd-async", "--clients",
                            "--dirichlet-alpha", "--client-fraction", "--local-epochs", "--round-deadline-s",
                            "--average-every", "--warmup-steps", "--seed", "--server-replicas", "--elastic",
                            "--max-ranks", "--join-poll-steps"}) {
      if (!has_knobs || !o.given(opt)) continue;
      const CLI::Option* x = o.app->get_option(opt);
      // a flag takes no value (its type size is 1 for a bound bool: "--elastic true" was printed, which train refuses)
      cmd += x->get_expected_max() == 0 ? fmt::format(" {}", opt) : fmt::format(" {} {}", opt, x->as<std::string>());
    }
  }
  if (s.pp > 1)
    cmd += fmt::format(" --microbatches {} --pipeline-schedule {}", s.micro_batches, name_of(schedule_names(), s.schedule));
  if (s.compression != TANDEM_COMPRESSION_NONE) cmd += fmt::format(" --compress {}", name_of(compression_names(), s.compression));
  if (o.given("--bucket-mb")) cmd += fmt::format(" --bucket-mb {}", o.bucket_mb);
  if (o.given("--first-bucket-mb")) cmd += fmt::format(" --first-bucket-mb {}", o.first_bucket_mb);
  if (o.given("--bucket-sizes-mb")) cmd += fmt::format(" --bucket-sizes-mb {}", fmt::join(o.bucket_sizes_mb, ","));
  if (o.given("--limit-batches")) cmd += fmt::format(" --limit-batches {}", o.limit_batches);
  if (o.given("--prefetch")) cmd += fmt::format(" --prefetch {}", o.prefetch);
  // --samples N: the runtime's counterpart is --train-limit N (the training set's first N samples)
  if (o.given("--samples") && o.samples > 0) cmd += fmt::format(" --train-limit {}", o.samples);
  return cmd;
}

SimJob::~SimJob() {
  tandem_model_destroy(model);
  tandem_optimizer_destroy(optimizer);
  tandem_context_destroy(ctx);
}

std::shared_ptr<SimJobCli> add_sim_job_options(CLI::App& app, bool strategy_options) {
  auto o = std::make_shared<SimJobCli>();
  o->app = &app;
  auto names = [](const std::map<std::string, int>& m) { return CLI::CheckedTransformer(m, CLI::ignore_case); };
  app.add_option("--cluster", o->cluster, "PRESET:COUNT (e.g. t2.micro:4, joined by '+'), or a cluster JSON file")
      ->required();
  app.add_option("--job", o->job_file, "a job JSON file (keys as these options); options given here override it");
  app.add_option("--model", o->model, std::string("zoo model (") + kZooHelp + ")")
      ->capture_default_str();
  app.add_option("--model-file", o->model_file, "a JSON model spec file instead of a zoo model")->excludes("--model");
  app.add_option("--dataset", o->dataset, "cifar10, cifar100, fashion-mnist, mnist, imagenet; or '' with --samples "
                 "--input --classes")->capture_default_str();
  app.add_option("--samples", o->samples, "training samples per epoch (default: the dataset's)");
  app.add_option("--input", o->input, "sample shape CxHxW of a zoo model (default: the dataset's)");
  app.add_option("--classes", o->classes, "classes of a zoo model (default: the dataset's)")->check(kPositive);
  app.add_option("--batch", o->batch, "batch per data-parallel replica (as in PyTorch DDP)")->capture_default_str();
  app.add_option("--epochs", o->epochs, "epochs")->capture_default_str();
  app.add_option("--limit-batches", o->limit_batches, "the training run's --limit-batches: an epoch (a fedavg "
                 "client's local epoch) ends after this many batches (0: all)")->check(tandem::cli::kNonNegative);
  app.add_option("--prefetch", o->prefetch, "the training run's --prefetch: batches its loader assembles ahead, "
                 "charged to every worker's memory")->check(CLI::Range(0, 64));
  if (strategy_options) {
    app.add_option("--strategy", o->strategy, "single, ddp, pipeline, hybrid, ps, ps-async, ssp, asgd, easgd, fedavg, "
                   "localsgd")->transform(names(strategy_names()));
    app.add_option("--dp", o->dp, "data-parallel replicas (default: derived)");
    app.add_option("--pp", o->pp, "pipeline stages (default: derived)");
    app.add_option("--microbatches", o->micro_batches, "micro-batches per step")->capture_default_str();
    app.add_option("--schedule", o->schedule, "pipeline schedule: 1f1b, gpipe")->transform(names(schedule_names()));
    app.add_option("--algo", o->algo, "all-reduce algorithm: auto, ring, hd, tree, hier, det")
        ->transform(names(algo_names()));
    app.add_option("--cut", o->cut, "explicit pipeline cut: pp + 1 layer indices, e.g. 0,78,151");
    const char* grp = "Parameter servers, asynchronous and averaging strategies";
    app.add_option("--servers", o->servers, "ps, ps-async, ssp, easgd --easgd-async: server ranks (the last ones)")
        ->group(grp)->capture_default_str();
    app.add_option("--staleness", o->staleness, "ssp: clocks a worker may run ahead of the slowest (0: as ps)")
        ->group(grp)->capture_default_str();
    app.add_option("--staleness-lr", o->staleness_lr, "ps-async: none, inverse (a push's rate / its staleness) or "
                   "momentum (its momentum lowered by it); update math: not timed")
        ->group(grp)->check(CLI::IsMember({"none", "inverse", "momentum"}));
    app.add_option("--tau", o->tau, "easgd: local steps between elastic exchanges")->group(grp)->capture_default_str();
    app.add_option("--alpha", o->alpha, "easgd: moving rate (update math: not timed)")->group(grp);
    app.add_flag("--easgd-async", o->easgd_async, "easgd: push/pull with the servers, no barrier")->group(grp);
    app.add_option("--clients", o->clients, "fedavg: virtual clients (default: one per worker)")->group(grp);
    app.add_option("--dirichlet-alpha", o->dirichlet_alpha, "fedavg: label skew of the clients' data (the shares "
                   "are cut as the trainer cuts them, with --seed; a round waits for its largest client)")->group(grp);
    app.add_option("--seed", o->seed, "the training run's seed (tandem train --seed): fedavg's client draw and "
                   "Dirichlet shares, asgd's gossip matching")->group(grp)->check(kNonNegative)->capture_default_str();
    app.add_option("--client-fraction", o->client_fraction, "fedavg: clients sampled per round")->group(grp)
        ->capture_default_str();
    app.add_option("--local-epochs", o->local_epochs, "fedavg: epochs a client runs per round")->group(grp)
        ->capture_default_str();
    app.add_option("--round-deadline-s", o->round_deadline_s, "fedavg: a round closes then, stragglers dropped (0: "
                   "none)")->group(grp);
    app.add_option("--average-every", o->average_every, "localsgd: H, steps between parameter averages")->group(grp)
        ->capture_default_str();
    app.add_option("--warmup-steps", o->warmup_steps, "localsgd: DDP steps first (post-local SGD)")->group(grp);
    app.add_option("--server-replicas", o->server_replicas, "ps, ps-async, ssp: backups of each server's shard (the "
                   "replica traffic is timed; ps needs --elastic)")->group(grp)->check(tandem::cli::kNonNegative);
    app.add_flag("--elastic", o->elastic, "the training run's --elastic (with --max-ranks: its joiner checks are timed)")
        ->group(grp);
    app.add_option("--max-ranks", o->max_ranks, "the training run's --max-ranks: above the job's ranks, a ps-family "
                   "job checks for joiners every --join-poll-steps steps (timed)")->group(grp)
        ->check(tandem::cli::kNonNegative);
    app.add_option("--join-poll-steps", o->join_poll_steps, "the training run's --join-poll-steps")->group(grp)
        ->check(tandem::cli::kPositive)->capture_default_str();
  }
  app.add_option("--accumulate", o->accumulation, "batches per optimizer step (one all-reduce)")->capture_default_str();
  app.add_option("--partition", o->partition, "pipeline cut balanced by flops (as tandem train) or measured (the "
                 "profile's or roofline's layer times)")->transform(names(partition_names()));
  app.add_option("--bucket-mb", o->bucket_mb, "gradient bucket size (MiB)")->capture_default_str();
  app.add_option("--first-bucket-mb", o->first_bucket_mb, "cap of the first gradient bucket formed (default: the "
                 "framework's: 1 MiB for pytorch-ddp, none for tandem; 0: --bucket-mb)");
  app.add_option("--bucket-sizes-mb", o->bucket_sizes_mb, "explicit sizes of the first gradient buckets in ready "
                 "order, e.g. 1,24.5 (the rest at --bucket-mb); another framework's bucket bytes / 1048576 rebuild "
                 "its buckets")->delimiter(',')->excludes("--first-bucket-mb");
  app.add_option("--comm-cycle-ms", o->comm_cycle_ms, "a framework whose loop starts collectives in cycles (Horovod's "
                 "HOROVOD_CYCLE_TIME, 5 by default): ready buckets wait for the next tick; 0: none (Tandem, PyTorch DDP)")
      ->capture_default_str();
  app.add_option("--comm-negotiation-ms", o->comm_negotiation_ms, "with --comm-cycle-ms: each cycle's negotiation "
                 "(Horovod's rank-0 gather of ready lists and broadcast of the plan) before its collectives start")
      ->capture_default_str();
  app.add_option("--host-staging-gbps", o->host_staging_gbps, "a framework that all-reduces device buffers through "
                 "host memory (Caffe2's Gloo): each bucket copied down and back at this rate, Gbit/s; 0: none")
      ->capture_default_str();
  app.add_flag("--no-overlap", o->no_overlap, "all-reduce after backward instead of during it");
  app.add_option("--compress,--compression", o->compression, "data-parallel gradients on the wire: none, fp16, bf16")
      ->transform(names(compression_names()));
  app.add_option("--optimizer", o->optimizer, "sgd, momentum, adam")->check(CLI::IsMember(sim_optimizer_names()))
      ->capture_default_str();
  app.add_option("--profile", o->profile, "calibration profile (tandem calibrate) instead of the roofline");
  app.add_flag("--profile-network", o->profile_network, "use the profile's measured p2p bandwidth for every NIC");
  app.add_option("--epoch-time-s", o->epoch_time_s, "measured full-speed single-node epoch time: scales compute");
  app.add_option("--credit-mode", o->credit_mode, "burstable nodes: standard or unlimited (default: the preset's)")
      ->transform(names(credit_mode_names()));
  app.add_option("--initial-credits", o->initial_credits, "burstable nodes' starting CPU credits");
  app.add_option("--width-mult", o->width_mult, "mobilenetv2 width multiplier")
      ->capture_default_str()
      ->check(kPositive);
  app.add_option("--chunk-bytes", o->chunk_bytes, "collective pipelining chunk (default: the runtime's)");
  app.add_option("--precision", o->precision, "f32, or mixed precision bf16/fp16 (16-bit weights, gradients and "
                 "activations; f32 master weights). fp16 of Tandem's runtime (single, ddp, pipeline, hybrid) also "
                 "pays loss scaling: an unscale pass and a found-inf flag all-reduced over every rank per step")
      ->transform(names(precision_names()));
  app.add_option("--recompute", o->recompute, "activation recomputation: none, stage (keep only stage inputs) or K "
                 "(keep every K-th layer's output)");
  app.add_option("--zero", o->zero, "sharded optimizer state over data-parallel ranks: 0, 1 (ZeRO-1), 2 (gradients too)")
      ->check(CLI::Range(0, 2));
  app.add_option("--framework", o->framework, "whose training process: tandem or pytorch-ddp (runtime memory; pytorch-ddp: its first gradient bucket capped at 1 MiB)")
      ->transform(names(framework_names()));
  app.add_flag("--no-broadcast-buffers", o->no_broadcast_buffers, "pytorch-ddp: the job sets DDP's broadcast_buffers="
               "False (by default rank 0's buffers, e.g. BatchNorm statistics, are broadcast before every forward)");
  app.add_flag("--json", o->json, "one JSON object on stdout");
  return o;
}

namespace {

// A --job file may use the flags' names too (they differed from the JSON keys, issue #15): dashes for
// underscores, and --microbatches, --algo, --accumulate, --compress, --no-overlap, --cut for micro_batches,
// algorithm, accumulation, compression, overlap (negated) and boundaries. Renamed in place; "" or why not.
std::string job_keys_from_flags(nlohmann::json& j) {
  if (!j.is_object()) return "";  // the library says what it expects
  static const std::pair<const char*, const char*> kRenamed[] = {{"microbatches", "micro_batches"},
                                                                  {"algo", "algorithm"},
                                                                  {"accumulate", "accumulation"},
                                                                  {"compress", "compression"},
                                                                  {"cut", "boundaries"}};
  nlohmann::json out = nlohmann::json::object();
  for (auto it = j.begin(); it != j.end(); ++it) {
    std::string key = it.key();
    std::replace(key.begin(), key.end(), '-', '_');
    nlohmann::json value = it.value();
    for (const auto& [flag, field] : kRenamed)
      if (key == flag) key = field;
    if (key == "no_overlap") {
      if (!value.is_boolean()) return "\"" + it.key() + "\" must be true or false";
      key = "overlap";
      value = !value.get<bool>();
    }
    if (key == "boundaries" && value.is_string()) {
      nlohmann::json layers = nlohmann::json::array();
      for (const int32_t layer : parse_cut(value.get<std::string>())) layers.push_back(layer);
      value = layers;
    }
    if (out.contains(key)) return "\"" + it.key() + "\" gives " + key + " a second time";
    out[key] = value;
  }
  j = std::move(out);
  return "";
}

// Options without a typed field (the C ABI takes them in job_json), by (option, JSON key): those given are merged into
// the --job text, overriding it. Returns 0, or the exit code after printing the error.
struct JobKey {
  const char* option;
  const char* key;
  nlohmann::json value;
};
int merge_job_keys(const SimJobCli& o, SimJob& job, std::initializer_list<JobKey> keys) {
  bool any = false;
  for (const JobKey& k : keys) any = any || o.given(k.option);
  if (!any) return 0;
  nlohmann::json j = nlohmann::json::object();
  if (!job.job_text.empty()) {
    j = nlohmann::json::parse(job.job_text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return fail(fmt::format("--job file '{}' is not a JSON object", o.job_file));
  }
  for (const JobKey& k : keys)
    if (o.given(k.option)) j[k.key] = k.value;
  job.job_text = j.dump();
  job.params.field_mask |= TANDEM_SIM_JOB_JSON;
  job.params.job_json = job.job_text.c_str();
  return 0;
}

// The zoo model for the options: its input and classes from --input/--classes, else from the dataset.
int make_model(SimJobCli& o, SimJob& job) {
  tandem_model_params_t mp = TANDEM_MODEL_PARAMS_INIT;
  mp.field_mask = TANDEM_MODEL_PARAM_BACKEND;
  mp.backend = "none";  // the spec alone: no parameters are allocated
  if (!o.model_file.empty()) {
    mp.field_mask |= TANDEM_MODEL_PARAM_SPEC_PATH;
    mp.spec_path = o.model_file.c_str();
  } else {
    if (const std::string why = width_mult_error(o.model); o.given("--width-mult") && !why.empty()) return fail(why);
    mp.field_mask |= TANDEM_MODEL_PARAM_NAME | TANDEM_MODEL_PARAM_WIDTH_MULT;
    mp.name = o.model.c_str();
    mp.width_mult = o.width_mult;
    int64_t c = 0, h = 0, w = 0, classes = 0;
    if (!o.dataset.empty() && tandem_sim_dataset_info(o.dataset.c_str(), nullptr, &c, &h, &w, &classes) != TANDEM_OK)
      return fail("bad --dataset");
    if (o.given("--input")) {
      long long ic = 0, ih = 0, iw = 0;
      char tail = 0;
      if (std::sscanf(o.input.c_str(), "%lldx%lldx%lld%c", &ic, &ih, &iw, &tail) != 3)
        throw CLI::ValidationError("--input", "expected CxHxW, e.g. 3x32x32, got \"" + o.input + "\"");
      c = ic, h = ih, w = iw;
    }
    if (o.given("--classes")) classes = o.classes;
    if (c > 0) {
      mp.field_mask |= TANDEM_MODEL_PARAM_INPUT_SHAPE;
      mp.input_channels = c;
      mp.input_height = h;
      mp.input_width = w;
    }
    if (classes > 0) {
      mp.field_mask |= TANDEM_MODEL_PARAM_NUM_CLASSES;
      mp.num_classes = classes;
    }
  }
  if (tandem_model_create(job.ctx, &mp, &job.model) != TANDEM_OK) return fail("bad --model");
  job.params.field_mask |= TANDEM_SIM_JOB_MODEL;
  job.params.model = job.model;
  return 0;
}

}  // namespace

int make_sim_job(SimJobCli& o, SimJob& job) {
  if (tandem_context_create(nullptr, &job.ctx) != TANDEM_OK) return fail("cannot create a context");
  tandem_sim_job_params_t& p = job.params;
  auto set = [&](const char* opt, uint64_t bit) {
    if (!o.given(opt)) return false;
    p.field_mask |= bit;
    return true;
  };
  if (o.given("--job")) {
    if (std::error_code ec; std::filesystem::is_directory(o.job_file, ec))
      return fail(fmt::format("--job '{}' is a directory, not a job JSON file", o.job_file));
    std::ifstream in(o.job_file);
    if (!in) return fail(fmt::format("cannot read --job file '{}'", o.job_file));
    std::stringstream ss;
    ss << in.rdbuf();
    job.job_text = ss.str();
    nlohmann::json parsed;
    try {  // the library's own message says "job JSON: parse error ..." without naming the file
      parsed = nlohmann::json::parse(job.job_text);
    } catch (const nlohmann::json::exception& e) {
      return fail(fmt::format("--job file '{}' is not valid JSON: {}", o.job_file, e.what()));
    }
    if (const std::string why = job_keys_from_flags(parsed); !why.empty())
      return fail(fmt::format("--job file '{}': {}", o.job_file, why));
    job.job_text = parsed.dump();
    p.field_mask |= TANDEM_SIM_JOB_JSON;
    p.job_json = job.job_text.c_str();
  }
  // The model: a zoo name or a spec file, as a handle; a --job file may name its own.
  if (o.given("--model") || o.given("--model-file") || !o.given("--job")) {
    if (const int rc = make_model(o, job)) return rc;
  }
  if (set("--dataset", TANDEM_SIM_JOB_DATASET)) p.dataset = o.dataset.c_str();
  if (set("--samples", TANDEM_SIM_JOB_SAMPLES)) p.samples = o.samples;
  if (set("--batch", TANDEM_SIM_JOB_BATCH)) p.batch = o.batch;
  if (set("--epochs", TANDEM_SIM_JOB_EPOCHS)) p.epochs = o.epochs;
  if (set("--limit-batches", TANDEM_SIM_JOB_LIMIT_BATCHES)) p.limit_batches = o.limit_batches;
  if (o.app->get_option_no_throw("--strategy") != nullptr) {
    if (set("--strategy", TANDEM_SIM_JOB_STRATEGY)) p.strategy = static_cast<tandem_strategy_t>(o.strategy);
    if (set("--dp", TANDEM_SIM_JOB_DP)) p.dp = o.dp;
    if (set("--pp", TANDEM_SIM_JOB_PP)) p.pp = o.pp;
    if (set("--microbatches", TANDEM_SIM_JOB_MICRO_BATCHES)) p.micro_batches = o.micro_batches;
    if (set("--schedule", TANDEM_SIM_JOB_SCHEDULE)) p.schedule = static_cast<tandem_schedule_t>(o.schedule);
    if (set("--algo", TANDEM_SIM_JOB_ALGORITHM)) p.algorithm = static_cast<tandem_algo_t>(o.algo);
    if (set("--cut", TANDEM_SIM_JOB_BOUNDARIES)) {
      o.cut_layers = parse_cut(o.cut);
      p.boundaries = o.cut_layers.data();
      p.num_boundaries = o.cut_layers.size();
    }
    if (set("--servers", TANDEM_SIM_JOB_SERVERS)) p.servers = o.servers;
    if (set("--staleness", TANDEM_SIM_JOB_STALENESS)) p.staleness = o.staleness;
    if (set("--tau", TANDEM_SIM_JOB_TAU)) p.tau = o.tau;
    if (set("--alpha", TANDEM_SIM_JOB_ALPHA)) p.alpha = o.alpha;
    if (set("--easgd-async", TANDEM_SIM_JOB_EASGD_ASYNC)) p.easgd_async = o.easgd_async ? 1 : 0;
    if (set("--clients", TANDEM_SIM_JOB_CLIENTS)) p.clients = o.clients;
    if (set("--dirichlet-alpha", TANDEM_SIM_JOB_DIRICHLET_ALPHA)) p.dirichlet_alpha = o.dirichlet_alpha;
    if (set("--client-fraction", TANDEM_SIM_JOB_CLIENT_FRACTION)) p.client_fraction = o.client_fraction;
    if (set("--local-epochs", TANDEM_SIM_JOB_LOCAL_EPOCHS)) p.local_epochs = o.local_epochs;
    if (set("--round-deadline-s", TANDEM_SIM_JOB_ROUND_DEADLINE)) p.round_deadline_s = o.round_deadline_s;
    if (set("--average-every", TANDEM_SIM_JOB_AVERAGE_EVERY)) p.average_every = o.average_every;
    if (set("--warmup-steps", TANDEM_SIM_JOB_WARMUP_STEPS)) p.warmup_steps = o.warmup_steps;
    if (set("--seed", TANDEM_SIM_JOB_SEED)) p.seed = o.seed;
    if (const int rc = merge_job_keys(o, job, {{"--server-replicas", "server_replicas", o.server_replicas},
                                                {"--staleness-lr", "staleness_lr", o.staleness_lr},
                                                {"--elastic", "elastic", o.elastic},
                                                {"--max-ranks", "max_ranks", o.max_ranks},
                                                {"--join-poll-steps", "join_poll_steps", o.join_poll_steps}}))
      return rc;
  }
  if (const int rc = merge_job_keys(o, job, {{"--prefetch", "prefetch", o.prefetch}})) return rc;
  if (set("--accumulate", TANDEM_SIM_JOB_ACCUMULATION)) p.accumulation = o.accumulation;
  if (set("--bucket-mb", TANDEM_SIM_JOB_BUCKET_MB)) p.bucket_mb = o.bucket_mb;
  if (o.given("--first-bucket-mb") || o.given("--bucket-sizes-mb")) {
    p.field_mask |= TANDEM_SIM_JOB_BUCKETS;
    // --bucket-sizes-mb alone leaves the first bucket to the list (the job compiler refuses both)
    p.first_bucket_mb = o.first_bucket_mb;
    p.bucket_sizes_mb = o.bucket_sizes_mb.data();
    p.num_bucket_sizes = o.bucket_sizes_mb.size();
  }
  if (set("--comm-cycle-ms", TANDEM_SIM_JOB_COMM_CYCLE)) p.comm_cycle_ms = o.comm_cycle_ms;
  if (set("--comm-negotiation-ms", TANDEM_SIM_JOB_COMM_NEGOTIATION)) p.comm_negotiation_ms = o.comm_negotiation_ms;
  if (set("--host-staging-gbps", TANDEM_SIM_JOB_HOST_STAGING)) p.host_staging_gbps = o.host_staging_gbps;
  if (set("--no-overlap", TANDEM_SIM_JOB_OVERLAP)) p.overlap = 0;
  if (set("--compress", TANDEM_SIM_JOB_COMPRESSION)) p.compression = static_cast<tandem_compression_t>(o.compression);
  if (o.given("--optimizer")) {
    tandem_optimizer_params_t op = TANDEM_OPTIMIZER_PARAMS_INIT;
    op.field_mask = TANDEM_OPTIMIZER_PARAM_KIND | TANDEM_OPTIMIZER_PARAM_MOMENTUM;
    op.kind = o.optimizer == "adam" ? TANDEM_OPTIMIZER_ADAM : TANDEM_OPTIMIZER_SGD;
    op.momentum = o.optimizer == "momentum" ? 0.9f : 0.0f;
    if (tandem_optimizer_create(job.ctx, &op, &job.optimizer) != TANDEM_OK) return fail("bad --optimizer");
    p.field_mask |= TANDEM_SIM_JOB_OPTIMIZER;
    p.optimizer = job.optimizer;
  }
  if (set("--profile", TANDEM_SIM_JOB_PROFILE)) {
    p.profile = o.profile.c_str();
    p.profile_network = o.profile_network ? 1 : 0;
  }
  if (set("--epoch-time-s", TANDEM_SIM_JOB_EPOCH_TIME)) p.epoch_time_s = o.epoch_time_s;
  if (set("--credit-mode", TANDEM_SIM_JOB_CREDIT_MODE)) p.credit_mode = static_cast<tandem_credit_mode_t>(o.credit_mode);
  if (set("--initial-credits", TANDEM_SIM_JOB_INITIAL_CREDITS)) p.initial_credits = o.initial_credits;
  if (set("--chunk-bytes", TANDEM_SIM_JOB_CHUNK_BYTES)) p.chunk_bytes = o.chunk_bytes;
  if (set("--partition", TANDEM_SIM_JOB_PARTITION)) p.partition = static_cast<tandem_partition_t>(o.partition);
  if (set("--precision", TANDEM_SIM_JOB_PRECISION)) p.precision = static_cast<tandem_precision_t>(o.precision);
  if (set("--recompute", TANDEM_SIM_JOB_RECOMPUTE)) {
    if (o.recompute == "none" || o.recompute == "stage") {
      p.recompute = o.recompute == "none" ? TANDEM_RECOMPUTE_NONE : TANDEM_RECOMPUTE_STAGE_INPUTS;
    } else {
      char* end = nullptr;
      const long k = std::strtol(o.recompute.c_str(), &end, 10);
      if (end == o.recompute.c_str() || *end != '\0' || k < 1)
        return fail(fmt::format("--recompute {}: expected none, stage or a layer count K >= 1", o.recompute));
      p.recompute = TANDEM_RECOMPUTE_EVERY_K;
      p.recompute_every = static_cast<int32_t>(k);
    }
  }
  if (set("--zero", TANDEM_SIM_JOB_ZERO)) p.zero = o.zero;
  if (set("--framework", TANDEM_SIM_JOB_FRAMEWORK)) p.framework = static_cast<tandem_framework_t>(o.framework);
  if (set("--no-broadcast-buffers", TANDEM_SIM_JOB_BROADCAST_BUFFERS)) p.broadcast_buffers = 0;
  return 0;
}

}  // namespace tandem::cli
