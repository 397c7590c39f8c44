// tandem simulate: predict a training job on a cluster (and sweeps over node counts with --nodes).
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/command.hpp"
#include "cli/cut.hpp"
#include "tandem/tandem.h"

namespace tandem::cli {

// Job options shared by `simulate` and `plan` (declared again in cmd_plan.cpp). Only options given on the
// command line are passed to the library, so a --job file's values stand unless overridden; the
// defaults shown in --help are the library's.
struct SimJobCli {
  CLI::App* app = nullptr;
  std::string cluster, job, model = "mobilenetv2", dataset = "cifar10", input, strategy = "single", schedule = "1f1b",
              algo = "auto", optimizer = "momentum", profile, credit_mode, partition = "flops", cut,
              compression = "none";
  std::vector<int32_t> cut_layers;
  int64_t samples = 0, classes = 0, batch = 64;
  double epochs = 1, bucket_mb = 25, epoch_time_s = 0, initial_credits = -1, width_mult = 1;
  int32_t dp = 0, pp = 0, micro_batches = 1;
  uint64_t chunk_bytes = 0;
  bool no_overlap = false, profile_network = false, json = false;
  bool given(const char* opt) const { return app->count(opt) > 0; }
};

std::shared_ptr<SimJobCli> add_sim_job_options(CLI::App& app, bool strategy_options) {
  auto o = std::make_shared<SimJobCli>();
  o->app = &app;
  app.add_option("--cluster", o->cluster, "PRESET:COUNT (e.g. t2.micro:4, joined by '+'), or a cluster JSON file")
      ->required();
  app.add_option("--job", o->job, "a job JSON file (keys as these options); options given here override it");
  app.add_option("--model", o->model, "zoo model (mlp, lenet5, resnet18, mobilenetv2, vgg16, alexnet) or JSON spec")
      ->capture_default_str();
  app.add_option("--dataset", o->dataset, "cifar10, cifar100, fashion-mnist, mnist, imagenet; or '' with --samples "
                 "--input --classes")->capture_default_str();
  app.add_option("--samples", o->samples, "training samples per epoch (default: the dataset's)");
  app.add_option("--input", o->input, "sample shape CxHxW (default: the dataset's)");
  app.add_option("--classes", o->classes, "classes (default: the dataset's)");
  app.add_option("--batch", o->batch, "batch per data-parallel replica (as in PyTorch DDP)")->capture_default_str();
  app.add_option("--epochs", o->epochs, "epochs")->capture_default_str();
  if (strategy_options) {
    app.add_option("--strategy", o->strategy, "single, ddp, pipeline, hybrid")->capture_default_str();
    app.add_option("--dp", o->dp, "data-parallel replicas (default: derived)");
    app.add_option("--pp", o->pp, "pipeline stages (default: derived)");
    app.add_option("--microbatches", o->micro_batches, "micro-batches per step")->capture_default_str();
    app.add_option("--schedule", o->schedule, "pipeline schedule: 1f1b, gpipe")->capture_default_str();
    app.add_option("--algo", o->algo, "all-reduce algorithm: auto, ring, hd, tree, hier")->capture_default_str();
    app.add_option("--cut", o->cut, "explicit pipeline cut: pp + 1 layer indices, e.g. 0,78,151");
  }
  app.add_option("--partition", o->partition, "pipeline cut balanced by flops (as tandem train) or measured (the "
                 "profile's or roofline's layer times)")->capture_default_str();
  app.add_option("--bucket-mb", o->bucket_mb, "gradient bucket size (MiB)")->capture_default_str();
  app.add_flag("--no-overlap", o->no_overlap, "all-reduce after backward instead of during it");
  app.add_option("--compress,--compression", o->compression, "data-parallel gradients on the wire: none, fp16, bf16")
      ->capture_default_str();
  app.add_option("--optimizer", o->optimizer, "sgd, momentum, adam")->capture_default_str();
  app.add_option("--profile", o->profile, "calibration profile (tandem calibrate) instead of the roofline");
  app.add_flag("--profile-network", o->profile_network, "use the profile's measured p2p bandwidth for every NIC");
  app.add_option("--epoch-time-s", o->epoch_time_s, "measured full-speed single-node epoch time: scales compute");
  app.add_option("--credit-mode", o->credit_mode, "burstable nodes: standard or unlimited (default: the preset's)");
  app.add_option("--initial-credits", o->initial_credits, "burstable nodes' starting CPU credits");
  app.add_option("--width-mult", o->width_mult, "mobilenetv2 width multiplier")->capture_default_str();
  app.add_option("--chunk-bytes", o->chunk_bytes, "collective pipelining chunk (default: the runtime's)");
  app.add_flag("--json", o->json, "one JSON object on stdout");
  return o;
}

tandem_sim_job_params_t sim_job_params(SimJobCli& o) {
  tandem_sim_job_params_t p = TANDEM_SIM_JOB_PARAMS_INIT;
  auto set = [&](const char* opt, uint64_t bit) {
    if (!o.given(opt)) return false;
    p.field_mask |= bit;
    return true;
  };
  if (set("--job", TANDEM_SIM_JOB_JSON)) p.job_json = o.job.c_str();
  if (set("--model", TANDEM_SIM_JOB_MODEL)) p.model = o.model.c_str();
  if (set("--dataset", TANDEM_SIM_JOB_DATASET)) p.dataset = o.dataset.c_str();
  if (set("--samples", TANDEM_SIM_JOB_SAMPLES)) p.samples = o.samples;
  if (set("--classes", TANDEM_SIM_JOB_NUM_CLASSES)) p.num_classes = o.classes;
  if (set("--batch", TANDEM_SIM_JOB_BATCH)) p.batch = o.batch;
  if (set("--epochs", TANDEM_SIM_JOB_EPOCHS)) p.epochs = o.epochs;
  if (o.app->get_option_no_throw("--strategy") != nullptr) {
    if (set("--strategy", TANDEM_SIM_JOB_STRATEGY)) p.strategy = o.strategy.c_str();
    if (set("--dp", TANDEM_SIM_JOB_DP)) p.dp = o.dp;
    if (set("--pp", TANDEM_SIM_JOB_PP)) p.pp = o.pp;
    if (set("--microbatches", TANDEM_SIM_JOB_MICRO_BATCHES)) p.micro_batches = o.micro_batches;
    if (set("--schedule", TANDEM_SIM_JOB_SCHEDULE)) p.schedule = o.schedule.c_str();
    if (set("--algo", TANDEM_SIM_JOB_ALGORITHM)) p.algorithm = o.algo.c_str();
  }
  if (set("--bucket-mb", TANDEM_SIM_JOB_BUCKET_MB)) p.bucket_mb = o.bucket_mb;
  if (set("--no-overlap", TANDEM_SIM_JOB_OVERLAP)) p.overlap = 0;
  if (set("--compress", TANDEM_SIM_JOB_COMPRESSION)) p.compression = o.compression.c_str();
  if (set("--optimizer", TANDEM_SIM_JOB_OPTIMIZER)) p.optimizer = o.optimizer.c_str();
  if (set("--profile", TANDEM_SIM_JOB_PROFILE)) {
    p.profile = o.profile.c_str();
    p.profile_network = o.profile_network ? 1 : 0;
  }
  if (set("--epoch-time-s", TANDEM_SIM_JOB_EPOCH_TIME)) p.epoch_time_s = o.epoch_time_s;
  if (set("--credit-mode", TANDEM_SIM_JOB_CREDIT_MODE)) p.credit_mode = o.credit_mode.c_str();
  if (set("--initial-credits", TANDEM_SIM_JOB_INITIAL_CREDITS)) p.initial_credits = o.initial_credits;
  if (set("--width-mult", TANDEM_SIM_JOB_WIDTH_MULT)) p.width_mult = o.width_mult;
  if (set("--chunk-bytes", TANDEM_SIM_JOB_CHUNK_BYTES)) p.chunk_bytes = o.chunk_bytes;
  if (set("--partition", TANDEM_SIM_JOB_PARTITION)) p.partition = o.partition.c_str();
  if (o.app->get_option_no_throw("--cut") != nullptr && set("--cut", TANDEM_SIM_JOB_BOUNDARIES)) {
    o.cut_layers = parse_cut(o.cut);
    p.boundaries = o.cut_layers.data();
    p.num_boundaries = o.cut_layers.size();
  }
  if (o.given("--input")) {
    long long c = 0, h = 0, w = 0;
    char tail = 0;
    if (std::sscanf(o.input.c_str(), "%lldx%lldx%lld%c", &c, &h, &w, &tail) != 3)
      throw CLI::ValidationError("--input", "expected CxHxW, e.g. 3x32x32, got \"" + o.input + "\"");
    p.field_mask |= TANDEM_SIM_JOB_INPUT_SHAPE;
    p.input_channels = c;
    p.input_height = h;
    p.input_width = w;
  }
  return p;
}

nlohmann::json sim_result_json(const tandem_sim_result_t* r) {
  size_t n = 0;
  tandem_sim_result_json(r, nullptr, &n);
  std::string s(n, '\0');
  tandem_sim_result_json(r, s.data(), &n);
  s.resize(n - 1);
  return nlohmann::json::parse(s);
}

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

struct ClusterPtr {
  tandem_sim_cluster_t* p = nullptr;
  ~ClusterPtr() { tandem_sim_cluster_destroy(p); }
};
struct ResultPtr {
  tandem_sim_result_t* p = nullptr;
  ~ResultPtr() { tandem_sim_result_destroy(p); }
};
struct ContextPtr {
  tandem_context_t* p = nullptr;
  ~ContextPtr() { tandem_context_destroy(p); }
};

void print_summary(const nlohmann::json& j) {
  const std::string pipe = j["pp"].get<int>() > 1 ? fmt::format(", {} micro-batches, {}", j["micro_batches"].get<int>(),
                                                                j["schedule"].get<std::string>())
                                                  : "";
  std::printf("tandem simulate: %s on %s, %s (dp %d x pp %d%s), batch %lld per replica\n",
              j["model"].get<std::string>().c_str(), j["cluster"].get<std::string>().c_str(),
              j["strategy"].get<std::string>().c_str(), j["dp"].get<int>(), j["pp"].get<int>(), pipe.c_str(),
              static_cast<long long>(j["batch"].get<int64_t>()));
  if (j["dp"].get<int>() > 1) std::printf("  all-reduce     %s\n", j["allreduce"].get<std::string>().c_str());
  std::printf("  step time      %s at full speed\n", human_seconds(j["step_time_s"]).c_str());
  std::printf("  epoch time     %s\n", human_seconds(j["epoch_time_s"]).c_str());
  std::printf("  total time     %s for %g epochs (%lld steps of %lld samples)\n",
              human_seconds(j["total_time_s"]).c_str(), j["epochs"].get<double>(),
              static_cast<long long>(std::llround(j["total_steps"].get<double>())),
              static_cast<long long>(j["global_batch"].get<int64_t>()));
  std::printf("  throughput     %.1f images/s\n", j["images_per_sec"].get<double>());
  if (j["speedup"].get<double>() > 0)
    std::printf("  speedup        %.2fx against one device (%s), efficiency %.0f%%\n", j["speedup"].get<double>(),
                human_seconds(j["baseline_total_time_s"]).c_str(), 100 * j["efficiency"].get<double>());
  std::printf("  time split     compute %s | exposed comm %s | bubble %s | throttled %s | idle %s\n",
              human_seconds(j["compute_s"]).c_str(), human_seconds(j["comm_exposed_s"]).c_str(),
              human_seconds(j["bubble_s"]).c_str(), human_seconds(j["throttled_s"]).c_str(),
              human_seconds(j["idle_s"]).c_str());
  std::printf("  memory/node    %s needed%s\n", human_bytes(j["memory_per_node_bytes"]).c_str(),
              j["fits"].get<bool>() ? ", fits" : " -- DOES NOT FIT on at least one node");
  std::printf("  cost           $%.4f", j["cost_usd"].get<double>());
  if (j["surplus_usd"].get<double>() > 0) std::printf(" (incl. $%.4f unlimited-mode surplus)", j["surplus_usd"].get<double>());
  std::printf("\n");
  for (const auto& n : j["nodes"]) {
    if (n["ranks"].get<int>() == 0) continue;
    std::string credits;
    if (n["credits_start"].get<double>() > 0 || n["cpu_utilization"].get<double>() > 0)
      credits = fmt::format(", CPU credits {:.1f} -> {:.1f}{}", n["credits_start"].get<double>(),
                            n["credits_end"].get<double>(),
                            n["throttle_start_s"].is_null()
                                ? " (never throttled)"
                                : fmt::format(" (throttled from {})", human_seconds(n["throttle_start_s"])));
    std::printf("  node %-6s %-13s memory %s of %s%s%s\n", n["name"].get<std::string>().c_str(),
                n["preset"].get<std::string>().c_str(), human_bytes(n["memory_bytes"]).c_str(),
                human_bytes(n["memory_capacity_bytes"]).c_str(), n["swapping"].get<bool>() ? " (swapping)" : "",
                credits.c_str());
  }
}

std::string svg_plot(const std::vector<nlohmann::json>& rows, const std::string& title) {
  const double W = 640, H = 420, L = 60, R = 20, T = 40, B = 50;
  double max_n = 1, max_s = 1;
  for (const auto& r : rows) {
    max_n = std::max(max_n, r["nodes"].get<double>());
    max_s = std::max(max_s, r["speedup"].get<double>());
  }
  max_s = std::max(max_s, max_n);
  auto x = [&](double n) { return L + (W - L - R) * (n - 1) / std::max(1.0, max_n - 1); };
  auto y = [&](double s) { return H - B - (H - T - B) * s / max_s; };
  std::ostringstream o;
  o << fmt::format(R"svg(<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" font-family="sans-serif" font-size="12">)svg", W, H) << "\n";
  o << fmt::format(R"svg(<text x="{}" y="22" text-anchor="middle" font-size="14">{}</text>)svg", W / 2, title) << "\n";
  o << fmt::format(R"svg(<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="black"/>)svg", L, H - B, W - R, H - B) << "\n";
  o << fmt::format(R"svg(<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="black"/>)svg", L, T, L, H - B) << "\n";
  for (const auto& r : rows) {
    double n = r["nodes"].get<double>();
    o << fmt::format(R"svg(<text x="{:.1f}" y="{}" text-anchor="middle">{}</text>)svg", x(n), H - B + 18, n) << "\n";
  }
  for (int k = 0; k <= 4; ++k) {
    double s = max_s * k / 4;
    o << fmt::format(R"svg(<text x="{}" y="{:.1f}" text-anchor="end">{:.1f}</text>)svg", L - 6, y(s) + 4, s) << "\n";
  }
  o << fmt::format(R"svg(<text x="{}" y="{}" text-anchor="middle">nodes</text>)svg", (L + W - R) / 2, H - 12) << "\n";
  o << fmt::format(R"svg(<text x="16" y="{}" transform="rotate(-90 16 {})" text-anchor="middle">speedup</text>)svg",
                   (T + H - B) / 2, (T + H - B) / 2) << "\n";
  o << fmt::format(R"svg(<line x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" stroke="#999" stroke-dasharray="4 4"/>)svg",
                   x(1), y(1), x(max_n), y(max_n)) << "\n";
  std::string pts;
  for (const auto& r : rows) pts += fmt::format("{:.1f},{:.1f} ", x(r["nodes"].get<double>()), y(r["speedup"].get<double>()));
  o << R"svg(<polyline fill="none" stroke="#1f77b4" stroke-width="2" points=")svg" << pts << "\"/>\n";
  for (const auto& r : rows)
    o << fmt::format(R"svg(<circle cx="{:.1f}" cy="{:.1f}" r="4" fill="{}"/>)svg", x(r["nodes"].get<double>()),
                     y(r["speedup"].get<double>()), r["fits"].get<bool>() ? "#1f77b4" : "#d62728") << "\n";
  o << fmt::format(R"svg(<text x="{}" y="{}" fill="#999">ideal</text>)svg", W - R - 40, y(max_n) + 16) << "\n";
  o << "</svg>\n";
  return o.str();
}

std::vector<int32_t> parse_nodes(const std::string& s) {
  std::vector<int32_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 1 || v > 65536)
      throw CLI::ValidationError("--nodes", "expected a list of node counts like 1,2,4,8, got \"" + s + "\"");
    out.push_back(static_cast<int32_t>(v));
  }
  return out;
}

Registration reg{"simulate", "predict a training job on a cluster (time, scaling, memory, cost)", [](CLI::App& app) -> Runner {
  auto o = add_sim_job_options(app, true);
  auto trace = std::make_shared<std::string>();
  auto nodes = std::make_shared<std::string>();
  auto plot = std::make_shared<std::string>();
  app.add_option("--trace", *trace, "write the first simulated step as a Chrome trace (Perfetto)");
  app.add_option("--nodes", *nodes, "sweep node counts, e.g. 1,2,4,8 (PRESET:COUNT clusters): prints a table");
  app.add_option("--plot", *plot, "with --nodes: write the speedup curve as SVG");
  return [o, trace, nodes, plot]() -> int {
    ContextPtr ctx;
    if (tandem_context_create(nullptr, &ctx.p) != TANDEM_OK) return fail("cannot create a context");
    ClusterPtr cluster;
    if (tandem_sim_cluster_create(ctx.p, o->cluster.c_str(), &cluster.p) != TANDEM_OK) return fail("bad --cluster");
    tandem_sim_job_params_t p = sim_job_params(*o);
    if (nodes->empty()) {
      if (!plot->empty()) return fail("--plot needs --nodes");
      if (!trace->empty()) {
        p.field_mask |= TANDEM_SIM_JOB_TRACE;
        p.trace = 1;
      }
      ResultPtr r;
      if (tandem_simulate(cluster.p, &p, &r.p) != TANDEM_OK) return fail("simulation failed");
      if (!trace->empty() && tandem_sim_result_write_trace(r.p, trace->c_str()) != TANDEM_OK)
        return fail("cannot write the trace");
      nlohmann::json j = sim_result_json(r.p);
      if (o->json) {
        std::printf("%s\n", j.dump(2).c_str());
      } else {
        print_summary(j);
        if (!trace->empty()) std::printf("  trace          %s\n", trace->c_str());
      }
      return 0;
    }
    std::vector<int32_t> counts = parse_nodes(*nodes);
    std::vector<nlohmann::json> rows;
    const bool tty = isatty(STDERR_FILENO);
    for (size_t i = 0; i < counts.size(); ++i) {
      if (tty) std::fprintf(stderr, "\rsimulating %zu/%zu (%d nodes)...", i + 1, counts.size(), counts[i]);
      ClusterPtr c;
      if (tandem_sim_cluster_resize(cluster.p, counts[i], &c.p) != TANDEM_OK) return fail("cannot resize the cluster");
      int32_t devices = 0;
      tandem_sim_cluster_info(c.p, nullptr, &devices);
      // every device is a replica (ddp, and single beyond one node), a stage (pipeline), or hybrid keeps --pp
      tandem_sim_job_params_t q = p;
      q.field_mask |= TANDEM_SIM_JOB_STRATEGY | TANDEM_SIM_JOB_DP | TANDEM_SIM_JOB_PP;
      q.strategy = o->strategy.c_str();
      q.dp = q.pp = 0;
      if (o->strategy == "ddp") {
        q.dp = devices;
      } else if (o->strategy == "pipeline") {
        q.pp = devices;
      } else if (o->strategy == "hybrid") {
        if (o->pp <= 0 || devices % o->pp != 0) continue;  // this size cannot host the pipeline
        q.pp = o->pp;
        q.dp = devices / o->pp;
      } else if (counts[i] > 1) {
        q.strategy = "ddp";
        q.dp = devices;
      }
      ResultPtr r;
      if (tandem_simulate(c.p, &q, &r.p) != TANDEM_OK) return fail(fmt::format("simulation of {} nodes failed", counts[i]));
      nlohmann::json j = sim_result_json(r.p);
      j["nodes"] = counts[i];
      rows.push_back(std::move(j));
    }
    if (tty) std::fprintf(stderr, "\r%40s\r", "");
    if (o->json) {
      std::printf("%s\n", nlohmann::json(rows).dump(2).c_str());
    } else {
      std::printf("%6s %10s %11s %12s %10s %8s %10s %10s %5s\n", "nodes", "step_s", "epoch_s", "total_s", "img/s",
                  "speedup", "efficiency", "cost_usd", "fits");
      for (const auto& j : rows)
        std::printf("%6d %10.3f %11.1f %12.1f %10.1f %8.2f %9.0f%% %10.4f %5s\n", j["nodes"].get<int>(),
                    j["step_time_s"].get<double>(), j["epoch_time_s"].get<double>(), j["total_time_s"].get<double>(),
                    j["images_per_sec"].get<double>(), j["speedup"].get<double>(), 100 * j["efficiency"].get<double>(),
                    j["cost_usd"].get<double>(), j["fits"].get<bool>() ? "yes" : "no");
    }
    if (!plot->empty()) {
      std::ofstream f(*plot);
      if (!f) return fail("cannot write " + *plot);
      f << svg_plot(rows, fmt::format("{} on {} ({})", o->model, o->cluster, o->strategy));
      if (!f) return fail("cannot write " + *plot);
    }
    return 0;
  };
}};

}  // namespace
}  // namespace tandem::cli

namespace tandem::cli {
const std::string& sim_job_cluster(const SimJobCli& o) { return o.cluster; }
bool sim_job_json(const SimJobCli& o) { return o.json; }
}  // namespace tandem::cli
