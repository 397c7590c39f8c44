// `tandem demo`: the main job on an embedded default. Hybrid data + pipeline parallel training on 4
// local ranks over loopback -- 2 data-parallel replicas x 2 pipeline stages -- of a narrow MobileNetV2
// on Fashion-MNIST, next to the same training on one rank (which gets every core a single process can
// use), measured in the same run: accuracy, throughput and the speedup -- and, beside the measured step,
// the simulator's prediction for the very job the ranks ran (`tandem train --predict`, priced with a
// calibration profile measured first on as many ranks as the machine has cores, up to 4, which is how
// many of the hybrid job's ranks compute at once). The ranks are this program again (`tandem launch -n 4
// -- tandem train ...`); the demo reads their JSON lines and shows the elapsed time of each phase on a
// terminal. A short run by default (a limited number of batches, said in the output).
#include <sys/wait.h>
#include <unistd.h>

#include <poll.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/command.hpp"
#include "tandem/tandem.h"

namespace {

struct DemoOptions {
  std::string model = "mobilenetv2";
  double width_mult = 0.25;
  int64_t batch = 64;       // per replica; the one-rank run uses the same global batch (2 x 64)
  int64_t batches = 80;     // steps of the one epoch each run trains
  int microbatches = 4;
  std::string schedule = "1f1b";
  int64_t test_limit = 2000;
  std::string transport = "auto";
  std::string data_dir;
  bool json = false;
};

struct Captured {
  int status = -1;  // exit code, or 128 + signal
  std::string out;
  double seconds = 0;
};

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Runs the command with stdout captured (stderr passes through, so failures stay visible). With `ticker`, the
// elapsed time is shown on that line of the terminal while the command runs.
Captured run_capture(const std::vector<std::string>& args, const char* ticker = nullptr) {
  Captured c;
  std::string cmd;
  for (const auto& a : args) cmd += shell_quote(a) + " ";
  std::fflush(nullptr);
  const auto t0 = std::chrono::steady_clock::now();
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return c;
  const int fd = ::fileno(p);
  char buf[4096];
  for (;;) {
    pollfd pfd{fd, POLLIN, 0};
    const int ready = ::poll(&pfd, 1, 1000);
    if (ticker != nullptr) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("\r%s %.0f s", ticker, s);
      std::fflush(stdout);
    }
    if (ready <= 0) continue;
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) break;
    c.out.append(buf, static_cast<size_t>(n));
  }
  if (ticker != nullptr) std::printf("\n");
  const int status = ::pclose(p);
  c.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return c;
}

// The last JSON line with `key` in a run's output ("[rank 0] {...}" under the launcher): the ranks are other
// processes, and their --json lines are how they report.
nlohmann::json last_line_with(const std::string& out, const char* key) {
  nlohmann::json last;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    const size_t i = line.find('{');
    if (i == std::string::npos || (i > 0 && line.rfind("[rank 0] ", 0) != 0)) continue;
    try {
      nlohmann::json j = nlohmann::json::parse(line.substr(i));
      if (j.contains(key)) last = std::move(j);
    } catch (const nlohmann::json::exception&) {
    }
  }
  return last;
}
nlohmann::json last_epoch(const std::string& out) { return last_line_with(out, "epoch"); }

double number(const nlohmann::json& j, const char* key) {
  return j.contains(key) && j.at(key).is_number() ? j.at(key).get<double>() : NAN;
}

// The test split of Fashion-MNIST loads, or the demo stops before its first phase (a wrong --data-dir, or no data
// set installed, failed only after the ~10 s calibration, in the one-rank run). Prints the library's reason.
bool data_found(const DemoOptions& o) {
  tandem_context_t* ctx = nullptr;
  if (tandem_context_create(nullptr, &ctx) != TANDEM_OK) return true;  // the runs will say what is wrong
  tandem_dataset_params_t p = TANDEM_DATASET_PARAMS_INIT;
  p.field_mask = TANDEM_DATASET_PARAM_KIND | TANDEM_DATASET_PARAM_TRAIN | TANDEM_DATASET_PARAM_LIMIT;
  p.kind = "fashion-mnist";
  p.train = 0;
  p.limit = 1;
  if (!o.data_dir.empty()) {
    p.field_mask |= TANDEM_DATASET_PARAM_PATH;
    p.path = o.data_dir.c_str();
  }
  tandem_dataset_t* d = nullptr;
  const bool ok = tandem_dataset_create(ctx, &p, &d) == TANDEM_OK;
  if (!ok) tandem::cli::fail("demo: cannot load Fashion-MNIST; nothing was run");
  tandem_dataset_destroy(d);
  tandem_context_destroy(ctx);
  return ok;
}

int run_demo(const DemoOptions& o) {
  if (!data_found(o)) return 1;
  std::vector<char> exe(4096);
  const ssize_t len = ::readlink("/proc/self/exe", exe.data(), exe.size() - 1);
  if (len <= 0) return tandem::cli::fail("cannot find this program (/proc/self/exe)");
  const std::string self(exe.data(), static_cast<size_t>(len));
  const long cores = std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN));
  const int64_t global = 2 * o.batch;
  const bool tty = !o.json && ::isatty(STDOUT_FILENO);
  // the width multiplier is mobilenetv2's alone (train refuses it for another model)
  std::vector<std::string> width;
  if (tandem::cli::width_mult_error(o.model).empty()) width = {"--width-mult", fmt::format("{}", o.width_mult)};
  std::vector<std::string> common = {
      "train",          "--json",       "--model",      o.model,      "--dataset",    "fashion-mnist", "--epochs", "1",
      "--limit-batches", std::to_string(o.batches), "--test-limit", std::to_string(o.test_limit),
      "--optimizer",    "adam",         "--lr",         "0.005",      "--seed",     "1"};
  common.insert(common.end(), width.begin(), width.end());
  auto with = [&](std::vector<std::string> head, std::vector<std::string> tail) {
    head.insert(head.end(), common.begin(), common.end());
    head.insert(head.end(), tail.begin(), tail.end());
    if (!o.data_dir.empty()) head.insert(head.end(), {"--data-dir", o.data_dir});
    return head;
  };
  if (!o.json) {
    std::printf("Tandem %s demo: hybrid data + pipeline parallel training\n", tandem_version_string());
    std::printf("  %s (width x%g) on Fashion-MNIST; 4 local ranks over loopback = 2 replicas x 2 pipeline stages,\n"
                "  %d micro-batches (%s), batch %lld per replica (global %lld); compared with 1 rank on the same "
                "global batch.\n",
                o.model.c_str(), o.width_mult, o.microbatches, o.schedule.c_str(), static_cast<long long>(o.batch),
                static_cast<long long>(global));
    std::printf("  A short run: %lld batches (%lld of 60000 training images) per run, test on the first %lld test "
                "images.\n  This machine has %ld core(s); each rank uses 1 compute thread.\n",
                static_cast<long long>(o.batches), static_cast<long long>(o.batches * global),
                static_cast<long long>(o.test_limit), cores);
  }
  // The calibration profile the prediction is priced with: this model's per-layer times, measured on as many ranks
  // at once as there are cores (that many of the hybrid job's ranks compute at once), and their link.
  char profile_dir[] = "/tmp/tandem-demo-XXXXXX";
  if (::mkdtemp(profile_dir) == nullptr) return tandem::cli::fail("cannot create a temporary directory");
  const std::string profile = std::string(profile_dir) + "/profile.json";
  struct Cleanup {
    std::string dir, file;
    ~Cleanup() {
      ::unlink(file.c_str());
      ::rmdir(dir.c_str());
    }
  } cleanup{profile_dir, profile};
  const long cal_ranks = std::min(4L, cores);
  std::vector<std::string> calibrate = {self, "calibrate", "--model", o.model, "--dataset", "fashion-mnist", "--batch",
                                        std::to_string(std::max<int64_t>(1, o.batch / o.microbatches)), "--threads",
                                        "1", "--warmup", "1", "--iters", "5", "--optimizer", "adam", "--out",
                                        profile};
  calibrate.insert(calibrate.end(), width.begin(), width.end());
  if (cal_ranks > 1) calibrate.insert(calibrate.begin() + 1, {"launch", "-n", std::to_string(cal_ranks), "--", self});
  if (!o.json) std::printf("[1/3] calibrating the model on %ld rank(s) for the simulator ...%s", cal_ranks, tty ? "" : "\n");
  const Captured cal = run_capture(calibrate, tty ? "[1/3] calibrating the model for the simulator ..." : nullptr);
  const bool have_profile = cal.status == 0;
  if (!have_profile && !o.json) std::printf("  (calibration failed, exit %d: the prediction uses the roofline)\n", cal.status);
  // The training runs draw tandem train's own progress bar (epoch, batches done of the run's, loss, img/s, ETA) on
  // the terminal's stderr: the one-rank run when told TANDEM_LAUNCH_PROGRESS=1, the 4-rank job's rank 0 through the
  // launcher (which tells it so itself when its stderr is a terminal). Without a terminal: the phase lines only.
  const bool bars = tty && ::isatty(STDERR_FILENO) != 0;
  if (!o.json) std::printf("[2/3] 1 rank, %ld thread(s) ...%s", cores, tty && !bars ? "" : "\n");
  if (bars) ::setenv("TANDEM_LAUNCH_PROGRESS", "1", 1);
  const Captured one = run_capture(with({self}, {"--batch", std::to_string(global), "--threads", std::to_string(cores)}),
                                   tty && !bars ? "[2/3] 1 rank ..." : nullptr);
  if (bars) ::unsetenv("TANDEM_LAUNCH_PROGRESS");  // the launcher sets it for its rank 0 only
  const nlohmann::json e1 = last_epoch(one.out);
  if (one.status != 0 || e1.is_null()) {
    return tandem::cli::fail(fmt::format("the one-rank run failed (exit status {})", one.status));
  }
  if (!o.json) std::printf("[3/3] 4 ranks, hybrid 2 x 2, 1 thread each ...%s", tty && !bars ? "" : "\n");
  std::vector<std::string> hybrid = {"--batch", std::to_string(o.batch), "--strategy", "hybrid", "--dp", "2",
                                     "--pp", "2", "--microbatches", std::to_string(o.microbatches),
                                     "--pipeline-schedule", o.schedule, "--threads", "1", "--predict"};
  if (have_profile) hybrid.insert(hybrid.end(), {"--profile", profile, "--profile-network"});
  const Captured four = run_capture(with({self, "launch", "-n", "4", "--transport", o.transport, "--", self}, hybrid),
                                    tty && !bars ? "[3/3] 4 ranks, hybrid 2 x 2 ..." : nullptr);
  const nlohmann::json e4 = last_epoch(four.out);
  const nlohmann::json pred = last_line_with(four.out, "prediction").value("prediction", nlohmann::json::object());
  if (four.status != 0 || e4.is_null()) {
    return tandem::cli::fail(fmt::format("the 4-rank hybrid run failed (exit status {})", four.status));
  }
  const double ips1 = number(e1, "images_per_sec"), ips4 = number(e4, "images_per_sec");
  const double speedup = ips4 / ips1;
  const nlohmann::json split = e4.value("time_split", nlohmann::json::object());
  if (o.json) {
    nlohmann::json j = {{"demo", "hybrid"},
                        {"model", o.model},
                        {"width_mult", o.width_mult},
                        {"batches", o.batches},
                        {"global_batch", global},
                        {"cores", cores},
                        {"one_rank", e1},
                        {"hybrid_2x2", e4},
                        {"prediction", pred},
                        {"speedup", speedup}};
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("\n  %-22s %14s %18s\n", "", "1 rank", "4 ranks (2 x 2)");
  std::printf("  %-22s %14.0f %18.0f\n", "images/s (training)", ips1, ips4);
  std::printf("  %-22s %13.2f%% %17.2f%%\n", "test accuracy", 100 * number(e1, "test_accuracy"),
              100 * number(e4, "test_accuracy"));
  std::printf("  %-22s %14.4f %18.4f\n", "train loss", number(e1, "train_loss"), number(e4, "train_loss"));
  std::printf("  %-22s %13.1fs %17.1fs\n", "wall time (run)", one.seconds, four.seconds);
  std::printf("\n  speedup of 4 ranks over 1 rank: %.2fx (on %ld core(s): the 4 ranks share them, the 1 rank uses all "
              "of them)\n", speedup, cores);
  if (split.is_object() && !split.empty()) {
    const double step = number(split, "step_s");
    std::printf("  per step on 4 ranks: %.0f ms = compute %.0f + pipeline bubble %.0f (%.0f%%) + exposed "
                "communication %.0f + data %.0f + other %.0f\n",
                1e3 * step, 1e3 * number(split, "compute_s"), 1e3 * number(split, "bubble_s"),
                100 * number(split, "bubble_fraction"), 1e3 * number(split, "exposed_comm_s"),
                1e3 * number(split, "data_s"), 1e3 * number(split, "other_s"));
  }
  if (e4.contains("partition")) std::printf("  cut: %s\n", e4.at("partition").get<std::string>().c_str());
  if (pred.is_object() && pred.contains("predicted_step_s")) {
    auto ms = [&](const char* k) { return 1e3 * number(pred, k); };
    std::printf("\n  the simulator, for this very job (%s compute, this machine's measured link):\n",
                pred.value("compute_source", "roofline").c_str());
    std::printf("  %-22s %12s %12s %8s\n", "per step", "measured", "predicted", "error");
    std::printf("  %-22s %10.1f ms %10.1f ms %+7.1f%%\n", "step", ms("measured_step_s"), ms("predicted_step_s"),
                100 * number(pred, "step_error"));
    std::printf("  %-22s %10.1f ms %10.1f ms\n", "compute", ms("measured_compute_s"), ms("predicted_compute_s"));
    std::printf("  %-22s %10.1f ms %10.1f ms\n", "pipeline bubble", ms("measured_bubble_s"), ms("predicted_bubble_s"));
    std::printf("  %-22s %10.1f ms %10.1f ms\n", "exposed communication", ms("measured_comm_s"), ms("predicted_comm_s"));
  }
  std::printf("\nNext: `tandem train --help` (--strategy ddp|pipeline|hybrid under `tandem launch -n N`), "
              "`tandem demo --batches 400` for a longer run.\n");
  return 0;
}

tandem::cli::Registration reg{
    "demo", "hybrid DP x PP training on 4 local ranks vs 1 rank (MobileNetV2 on Fashion-MNIST)",
    [](CLI::App& app) -> tandem::cli::Runner {
      auto o = std::make_shared<DemoOptions>();
      app.add_option("--model", o->model, "zoo model")->capture_default_str();
      app.add_option("--width-mult", o->width_mult, "mobilenetv2 width multiplier")->capture_default_str()
          ->check(tandem::cli::kPositive);
      app.add_option("--batch", o->batch, "batch per replica")->capture_default_str()->check(tandem::cli::kPositive);
      app.add_option("--batches", o->batches, "batches each run trains")->capture_default_str()
          ->check(tandem::cli::kPositive);
      app.add_option("--microbatches", o->microbatches, "pipeline micro-batches")->capture_default_str()
          ->check(tandem::cli::kPositive);
      app.add_option("--schedule", o->schedule, "gpipe or 1f1b")->capture_default_str()
          ->check(CLI::IsMember({"gpipe", "1f1b"}));
      app.add_option("--test-limit", o->test_limit, "test images scored")->capture_default_str()
          ->check(tandem::cli::kNonNegative);
      app.add_option("--transport", o->transport, "auto, tcp, zmq or ucx")->capture_default_str();
      app.add_option("--data-dir", o->data_dir, "Fashion-MNIST directory (default: found automatically)");
      app.add_flag("--json", o->json, "one JSON summary object");
      return [o] { return run_demo(*o); };
    }};

}  // namespace
