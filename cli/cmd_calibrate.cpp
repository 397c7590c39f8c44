// `tandem calibrate --model M --batch B [--threads T] [--warmup W --iters N] --out profile.json`: measures this
// machine for the simulator (per-layer forward/backward, optimizer step; under `tandem launch -n 2` also
// point-to-point bandwidth and latency between ranks 0 and 1) and writes a calibration profile atomically, for
// `tandem simulate --profile`. Run through `tools/emu-cluster exec I --` it measures an emulated host.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <algorithm>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/calibrate_network.hpp"
#include "cli/command.hpp"
#include "cli/device.hpp"
#include "tandem/tandem.h"

namespace tandem::cli {

namespace {

std::string ms(double s) { return fmt::format("{:.3f} ms", s * 1e3); }

struct CalibrateOptions {
  std::string model = "lenet5";
  std::string curve = "auto";  // --curve: auto (powers of two below --batch), none, or B1,B2,...
  std::string precision = "f32";  // --precision f32|bf16 (cli/device.hpp)
  std::string device = "cpu";  // --device: cpu, cuda, cuda:N (a GPU profile, for the simulator's GPU presets)
  std::string input;    // CxHxW; default from --dataset, else the zoo's usual input
  std::string dataset;  // fashion-mnist/mnist/synthetic (1x28x28) or cifar10 (3x32x32): the input shape
  int64_t classes = 10;
  double width_mult = 0;
  int64_t batch = 64;
  int threads = 0;
  int warmup = 2;
  int iters = 10;
  std::string optimizer = "momentum";
  std::string machine;
  std::string out;
  uint64_t p2p_bytes = uint64_t{4} << 20;
  int p2p_iters = 3;
  double wakeup_burst_us = 0;  // the shared-core wake-up ring's compute bursts; 0: one chunk's reduction
  int wakeup_ranks_per_core = 2;
  bool json = false;
  bool network = false;  // --network: RTT and TCP goodput between two hosts instead (calibrate_network.hpp)
  NetworkCalibrateOptions net;
};

struct Handles {
  tandem_context_t* ctx = nullptr;
  tandem_comm_t* comm = nullptr;
  tandem_model_t* model = nullptr;
  tandem_optimizer_t* opt = nullptr;
  tandem_calibration_t* cal = nullptr;
  ~Handles() {
    tandem_calibration_destroy(cal);
    tandem_optimizer_destroy(opt);
    tandem_model_destroy(model);
    tandem_comm_destroy(comm);
    tandem_context_destroy(ctx);
  }
};

bool is_file(const std::string& p) {
  struct stat st{};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

int run_calibrate(const CalibrateOptions& o) {
  if (const int rc = tandem::cli::check_output_path("tandem calibrate", "--out", o.out, "nothing was measured"))
    return rc;
  Handles h;
  tandem_context_params_t cp = TANDEM_CONTEXT_PARAMS_INIT;
  if (o.threads > 0) {
    cp.field_mask = TANDEM_CONTEXT_PARAM_NUM_THREADS;
    cp.num_threads = o.threads;
  }
  const char* math = nullptr;
  if (const std::string why = tandem::cli::math_setting(o.precision, o.device, math); !why.empty()) return fail(why);
  if (math != nullptr) {
    cp.field_mask |= TANDEM_CONTEXT_PARAM_SETTINGS;
    cp.settings = &math;
    cp.num_settings = 1;
  }
  if (tandem_context_create(&cp, &h.ctx) != TANDEM_OK) return fail("cannot create a context");

  tandem_model_params_t mp = TANDEM_MODEL_PARAMS_INIT;
  mp.field_mask = TANDEM_MODEL_PARAM_BACKEND;
  const auto backend = backend_for_device(o.device);
  if (!backend) return fail("--device '" + o.device + "' is not cpu, cuda or cuda:N");
  mp.backend = backend->c_str();
  if (is_file(o.model) || o.model.find(".json") != std::string::npos) {
    mp.field_mask |= TANDEM_MODEL_PARAM_SPEC_PATH;
    mp.spec_path = o.model.c_str();
  } else {
    mp.field_mask |= TANDEM_MODEL_PARAM_NAME | TANDEM_MODEL_PARAM_NUM_CLASSES;
    mp.name = o.model.c_str();
    mp.num_classes = o.classes;
    std::string shape = o.input;
    if (shape.empty() && !o.dataset.empty()) {
      if (o.dataset == "cifar10") {
        shape = "3x32x32";
      } else if (o.dataset == "fashion-mnist" || o.dataset == "mnist" || o.dataset == "synthetic") {
        shape = "1x28x28";
      } else {
        std::fprintf(stderr, "tandem: --dataset '%s' is not fashion-mnist, mnist, synthetic or cifar10\n",
                     o.dataset.c_str());
        return 2;
      }
    }
    if (!shape.empty()) {
      int64_t c = 0, hh = 0, w = 0;
      if (!tandem::cli::parse_chw(shape, c, hh, w)) {
        std::fprintf(stderr, "tandem: --input '%s' must look like 3x32x32\n", shape.c_str());
        return 2;
      }
      mp.field_mask |= TANDEM_MODEL_PARAM_INPUT_SHAPE;
      mp.input_channels = c;
      mp.input_height = hh;
      mp.input_width = w;
    }
    if (o.width_mult > 0) {
      if (const std::string why = tandem::cli::width_mult_error(o.model); !why.empty()) {
        std::fprintf(stderr, "tandem calibrate: %s\n", why.c_str());
        return 2;
      }
      mp.field_mask |= TANDEM_MODEL_PARAM_WIDTH_MULT;
      mp.width_mult = o.width_mult;
    }
  }
  if (tandem_model_create(h.ctx, &mp, &h.model) != TANDEM_OK) return fail(fmt::format("cannot create model '{}'", o.model));

  tandem_optimizer_params_t op = TANDEM_OPTIMIZER_PARAMS_INIT;
  op.field_mask = TANDEM_OPTIMIZER_PARAM_KIND | TANDEM_OPTIMIZER_PARAM_MOMENTUM;
  if (o.optimizer == "sgd" || o.optimizer == "momentum") {
    op.kind = TANDEM_OPTIMIZER_SGD;
    op.momentum = o.optimizer == "momentum" ? 0.9f : 0.0f;
  } else if (o.optimizer == "adam" || o.optimizer == "adamw") {
    op.kind = o.optimizer == "adam" ? TANDEM_OPTIMIZER_ADAM : TANDEM_OPTIMIZER_ADAMW;
    op.field_mask = TANDEM_OPTIMIZER_PARAM_KIND;
  } else {
    std::fprintf(stderr, "tandem: --optimizer '%s' is not sgd, momentum, adam or adamw\n", o.optimizer.c_str());
    return 2;
  }
  if (tandem_optimizer_create(h.ctx, &op, &h.opt) != TANDEM_OK) return fail("bad optimizer settings");

  // The job's ranks, from the launcher's environment. Alone (no launcher, or a world of one) there is no communicator:
  // a process training alone has none, and its transport's context, threads and touched code (UCX's: 2.7 MiB, 2.3 of
  // it code) would count in the runtime's resident size the profile records (runtime_rss_bytes) -- issue #16.
  int32_t rank = 0, world = 1;
  if (launched_world() > 1) {
    if (tandem_comm_create(h.ctx, nullptr, &h.comm) != TANDEM_OK) return fail("cannot join the job's ranks");
    tandem_comm_rank(h.comm, &rank);
    tandem_comm_size(h.comm, &world);
  }

  tandem_calibrate_params_t p = TANDEM_CALIBRATE_PARAMS_INIT;
  p.field_mask = TANDEM_CALIBRATE_PARAM_BATCH | TANDEM_CALIBRATE_PARAM_WARMUP | TANDEM_CALIBRATE_PARAM_ITERS |
                 TANDEM_CALIBRATE_PARAM_OPTIMIZER | TANDEM_CALIBRATE_PARAM_P2P;
  p.batch = o.batch;
  p.warmup = o.warmup;
  p.iters = o.iters;
  p.optimizer = h.opt;
  p.p2p_bytes = o.p2p_bytes;
  p.p2p_iters = o.p2p_iters;
  p.field_mask |= TANDEM_CALIBRATE_PARAM_WAKEUP;
  p.wakeup_burst_s = o.wakeup_burst_us * 1e-6;
  p.wakeup_ranks_per_core = o.wakeup_ranks_per_core;
  std::vector<int64_t> curve;
  if (o.curve == "auto") {
    for (int64_t b = 1; b < o.batch; b *= 2) curve.push_back(b);
  } else if (o.curve != "none") {
    size_t at = 0;
    while (at <= o.curve.size()) {
      const size_t comma = std::min(o.curve.find(',', at), o.curve.size());
      const std::string item = o.curve.substr(at, comma - at);
      char* end = nullptr;
      const long long v = std::strtoll(item.c_str(), &end, 10);
      if (item.empty() || *end != '\0' || v < 1)
        return fail("--curve '" + o.curve + "': '" + item + "' is not a batch size >= 1 (expected auto, none or B1,B2,...)");
      curve.push_back(v);
      at = comma + 1;
    }
  }
  if (!curve.empty()) {
    p.field_mask |= TANDEM_CALIBRATE_PARAM_CURVE;
    p.curve_batches = curve.data();
    p.num_curve_batches = curve.size();
  }
  if (!o.machine.empty()) {
    p.field_mask |= TANDEM_CALIBRATE_PARAM_MACHINE;
    p.machine = o.machine.c_str();
  }
  if (tandem_calibrate(h.model, &p, h.comm, &h.cal) != TANDEM_OK) return fail("calibration failed");
  if (rank != 0) return 0;
  if (tandem_calibration_write(h.cal, o.out.c_str()) != TANDEM_OK) return fail(fmt::format("cannot write '{}'", o.out));

  tandem_calibration_attr_t a = TANDEM_CALIBRATION_ATTR_INIT;
  a.field_mask = TANDEM_CALIBRATION_ATTR_SHAPE | TANDEM_CALIBRATION_ATTR_TIMES | TANDEM_CALIBRATION_ATTR_P2P |
                 TANDEM_CALIBRATION_ATTR_CURVE;
  tandem_calibration_query(h.cal, &a);
  std::vector<std::pair<int64_t, double>> points(a.num_curve_points);
  for (size_t i = 0; i < points.size(); ++i) tandem_calibration_curve(h.cal, i, &points[i].first, &points[i].second);
  if (o.json) {
    nlohmann::json j = {{"out", o.out},
                        {"model", o.model},
                        {"batch", a.batch},
                        {"layers", a.num_layers},
                        {"threads", a.threads},
                        {"ranks", a.ranks},
                        {"forward_s", a.forward_s},
                        {"backward_s", a.backward_s},
                        {"optimizer_step_s", a.optimizer_step_s},
                        {"step_mean_s", a.step_mean_s},
                        {"step_median_s", a.step_median_s},
                        {"scale", a.scale},
                        {"memory_bytes_per_s", a.memory_bytes_per_s}};
    if (!points.empty()) j["batch_curve"] = points;
    if (a.has_p2p) {
      j["p2p_bytes_per_s"] = a.p2p_bytes_per_s;
      j["p2p_latency_s"] = a.p2p_latency_s;
    }
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("calibrated %s, batch %lld, %d thread%s%s: %zu layers\n", o.model.c_str(),
              static_cast<long long>(a.batch), a.threads, a.threads == 1 ? "" : "s",
              a.ranks > 1 ? fmt::format(", averaged over {} ranks", a.ranks).c_str() : "", a.num_layers);
  for (size_t i = 0; i < a.num_layers; ++i) {
    const char* name = nullptr;
    double f = 0, b = 0;
    tandem_calibration_layer(h.cal, i, &name, &f, &b);
    std::printf("  %-24s forward %10s  backward %10s\n", name, ms(f).c_str(), ms(b).c_str());
  }
  std::printf("forward %s + backward %s + optimizer %s = step %s (mean of %d; median %s; layer medians scaled by "
              "%.3f)\n",
              ms(a.forward_s).c_str(), ms(a.backward_s).c_str(), ms(a.optimizer_step_s).c_str(),
              ms(a.step_mean_s).c_str(), o.iters, ms(a.step_median_s).c_str(), a.scale);
  if (!points.empty()) {
    // Per sample, relative to the calibrated batch: what the simulator charges a micro-batch of that size.
    double ref = 0;
    for (const auto& [b, t] : points)
      if (b == a.batch) ref = t / static_cast<double>(b);
    std::printf("cost per sample by batch (forward + backward, x the cost at batch %lld):",
                static_cast<long long>(a.batch));
    for (const auto& [b, t] : points) std::printf(" %lld: %.2fx", static_cast<long long>(b), t / b / ref);
    std::printf("\n");
  }
  std::printf("local reduction bandwidth %.2f GB/s\n", a.memory_bytes_per_s / 1e9);
  if (a.has_p2p) {
    std::printf("point-to-point rank 0 <-> 1: %.2f MB/s (%.1f Mbit/s), latency %.1f us one-way\n",
                a.p2p_bytes_per_s / 1e6, a.p2p_bytes_per_s * 8 / 1e6, a.p2p_latency_s * 1e6);
  }
  std::printf("wrote %s\n", o.out.c_str());
  return 0;
}

Registration reg{"calibrate", "measure this machine for the simulator (writes a calibration profile)",
                 [](CLI::App& app) -> Runner {
                   auto o = std::make_shared<CalibrateOptions>();
                   app.add_option("--model", o->model, "zoo name or a JSON model spec file")->capture_default_str();
                   app.add_option("--precision", o->precision, kPrecisionHelp)->capture_default_str();
                   app.add_option("--device", o->device, std::string("where to measure: ") + kDeviceHelp +
                                  "; a cuda profile serves the simulator's GPU presets")
                       ->capture_default_str();
                   app.add_option("--curve", o->curve,
                                  "batch sizes whose whole pass is also timed, so the simulator prices micro-batches "
                                  "by what they cost: auto (powers of two below --batch), none, or B1,B2,...")
                       ->capture_default_str();
                   app.add_option("--batch", o->batch, "samples per measured pass (calibrate at the job's micro-batch)")
                       ->capture_default_str()
                       ->check(tandem::cli::kPositive);
                   app.add_option("--input", o->input, "input shape CxHxW (zoo models; default: the usual one)");
                   app.add_option("--dataset", o->dataset,
                                  "take the input shape from a data set: fashion-mnist, mnist, synthetic, cifar10");
                   app.add_option("--classes", o->classes, "classes (zoo models)")
                       ->capture_default_str()
                       ->check(tandem::cli::kPositive);
                   app.add_option("--width-mult", o->width_mult, "mobilenetv2 width multiplier")
                       ->check(tandem::cli::kPositive);
                   app.add_option("--threads", o->threads, "compute threads (default, or 0: all cores)")
                       ->check(tandem::cli::kNonNegative);
                   app.add_option("--warmup", o->warmup, "untimed passes first")->capture_default_str();
                   app.add_option("--iters", o->iters, "timed passes (per-layer medians)")
                       ->capture_default_str()
                       ->check(tandem::cli::kPositive);
                   app.add_option("--optimizer", o->optimizer, "sgd, momentum, adam or adamw")->capture_default_str();
                   app.add_option("--machine", o->machine, "description stored in the profile (default: found here)");
                   app.add_option("--p2p-bytes", o->p2p_bytes, "bandwidth message size (two or more ranks)")
                       ->capture_default_str();
                   app.add_option("--p2p-iters", o->p2p_iters, "timed bandwidth transfers")->capture_default_str();
                   app.add_option("--wakeup-burst-us", o->wakeup_burst_us,
                                  "shared-core wake-up latency: CPU microseconds a competing rank computes between "
                                  "messages, in [0, 100000] (0: an all-reduce peer's, one 512 KiB chunk's "
                                  "reduction at the measured bandwidth)")
                       ->capture_default_str();
                   app.add_option("--wakeup-ranks-per-core", o->wakeup_ranks_per_core,
                                  "shared-core wake-up latency: ranks sharing each core, in [2, 8]")
                       ->capture_default_str();
                   app.add_option("--out", o->out, "the profile to write (atomically); with --network the JSON "
                                  "(default: stdout)");
                   app.add_flag("--json", o->json, "a JSON summary on stdout instead of the table");
                   app.add_flag("--network", o->network, "measure TCP RTT and goodput between two hosts instead: "
                                "--listen PORT on one, --peer HOST:PORT on the other");
                   app.add_option("--listen", o->net.listen_port, "--network: wait for one peer on this port (0: any)");
                   app.add_option("--peer", o->net.peer, "--network: measure against HOST:PORT");
                   app.add_option("--nominal-mbps", o->net.nominal_mbps,
                                  "--network: the link's line rate, for tcp_goodput (goodput over what TCP's headers "
                                  "allow at that rate)");
                   app.add_option("--seconds", o->net.seconds, "--network: bulk transfer time")->capture_default_str();
                   app.add_option("--rounds", o->net.rounds, "--network: RTT ping-pongs")->capture_default_str();
                   app.add_option("--paced-writes", o->net.paced_writes,
                                  "--network: writes of the paced phase (the per-wake-up figure)")
                       ->capture_default_str();
                   app.add_option("--two-way-bytes", o->net.two_way_bytes,
                                  "--network: bytes each way of the simultaneous two-way exchange (e.g. the model's "
                                  "parameter bytes, which a gossip step swaps)")
                       ->capture_default_str();
                   app.add_option("--two-way-reps", o->net.two_way_reps, "--network: two-way repetitions (0: none)")
                       ->capture_default_str();
                   app.add_option("--two-way-gap-ms", o->net.two_way_gap_ms,
                                  "--network: idle before each two-way phase transfer (over 200 ms: slow start after "
                                  "idle, as between training steps)")
                       ->capture_default_str();
                   app.add_option("--timeout-s", o->net.timeout_s,
                                  "--network: deadline of every read and write, and of the wait for a peer")
                       ->capture_default_str();
                   return [o] {
                     if (o->network) {
                       if (const int rc = check_output_path("tandem calibrate --network", "--out", o->out,
                                                            "nothing was measured"))
                         return rc;
                       o->net.out = o->out;
                       return run_network_calibrate(o->net);
                     }
                     if (o->net.listen_port >= 0 || !o->net.peer.empty())
                       return fail("--listen and --peer are for --network");
                     if (o->out.empty()) return fail("--out: required (the profile to write)");
                     return run_calibrate(*o);
                   };
                 }};

}  // namespace
}  // namespace tandem::cli
