// `tandem demo`: the main job on an embedded default. Hybrid data + pipeline parallel training on 4
// local ranks over loopback -- 2 data-parallel replicas x 2 pipeline stages -- of a narrow MobileNetV2
// on Fashion-MNIST, next to the same training on one rank, measured in the same run: accuracy,
// throughput and the speedup. The ranks are this program again (`tandem launch -n 4 -- tandem train
// ...`); the demo reads their JSON epoch lines. A short run by default (a limited number of batches,
// said in the output) so that it finishes in a few minutes on a small machine.
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
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

// Runs the command with stdout captured (stderr passes through, so failures stay visible).
Captured run_capture(const std::vector<std::string>& args) {
  Captured c;
  std::string cmd;
  for (const auto& a : args) cmd += shell_quote(a) + " ";
  std::fflush(nullptr);
  const auto t0 = std::chrono::steady_clock::now();
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return c;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) c.out.append(buf, n);
  const int status = ::pclose(p);
  c.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return c;
}

// The last JSON epoch line in a run's output ("[rank 0] {...}" under the launcher).
nlohmann::json last_epoch(const std::string& out) {
  nlohmann::json last;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    const size_t i = line.find('{');
    if (i == std::string::npos || (i > 0 && line.rfind("[rank 0] ", 0) != 0)) continue;
    try {
      nlohmann::json j = nlohmann::json::parse(line.substr(i));
      if (j.contains("epoch")) last = std::move(j);
    } catch (const nlohmann::json::exception&) {
    }
  }
  return last;
}

double number(const nlohmann::json& j, const char* key) {
  return j.contains(key) && j.at(key).is_number() ? j.at(key).get<double>() : NAN;
}

int run_demo(const DemoOptions& o) {
  std::vector<char> exe(4096);
  const ssize_t len = ::readlink("/proc/self/exe", exe.data(), exe.size() - 1);
  if (len <= 0) return tandem::cli::fail("cannot find this program (/proc/self/exe)");
  const std::string self(exe.data(), static_cast<size_t>(len));
  const long cores = ::sysconf(_SC_NPROCESSORS_ONLN);
  const int64_t global = 2 * o.batch;
  const std::vector<std::string> common = {
      "train",          "--json",       "--model",      o.model,      "--width-mult",
      fmt::format("{}", o.width_mult),  "--dataset",    "fashion-mnist", "--epochs", "1",
      "--limit-batches", std::to_string(o.batches), "--test-limit", std::to_string(o.test_limit),
      "--optimizer",    "adam",         "--lr",         "0.005",      "--seed",     "1",  "--threads", "1"};
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
    std::printf("[1/2] 1 rank ...\n");
    std::fflush(stdout);
  }
  const Captured one = run_capture(with({self}, {"--batch", std::to_string(global)}));
  const nlohmann::json e1 = last_epoch(one.out);
  if (one.status != 0 || e1.is_null()) {
    return tandem::cli::fail(fmt::format("the one-rank run failed (exit status {})", one.status));
  }
  if (!o.json) {
    std::printf("[2/2] 4 ranks, hybrid 2 x 2 ...\n");
    std::fflush(stdout);
  }
  const Captured four = run_capture(
      with({self, "launch", "-n", "4", "--transport", o.transport, "--", self},
           {"--batch", std::to_string(o.batch), "--strategy", "hybrid", "--dp", "2", "--pp", "2", "--microbatches",
            std::to_string(o.microbatches), "--pipeline-schedule", o.schedule}));
  const nlohmann::json e4 = last_epoch(four.out);
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
  std::printf("\n  speedup of 4 ranks over 1 rank: %.2fx (on %ld core(s): 4 ranks share them)\n", speedup, cores);
  if (split.is_object() && !split.empty()) {
    const double step = number(split, "step_s");
    std::printf("  per step on 4 ranks: %.0f ms = compute %.0f + pipeline bubble %.0f (%.0f%%) + exposed "
                "communication %.0f + data %.0f + other %.0f\n",
                1e3 * step, 1e3 * number(split, "compute_s"), 1e3 * number(split, "bubble_s"),
                100 * number(split, "bubble_fraction"), 1e3 * number(split, "exposed_comm_s"),
                1e3 * number(split, "data_s"), 1e3 * number(split, "other_s"));
  }
  if (e4.contains("partition")) std::printf("  cut: %s\n", e4.at("partition").get<std::string>().c_str());
  std::printf("\nNext: `tandem train --help` (--strategy ddp|pipeline|hybrid under `tandem launch -n N`), "
              "`tandem demo --batches 400` for a longer run.\n");
  return 0;
}

tandem::cli::Registration reg{
    "demo", "hybrid DP x PP training on 4 local ranks vs 1 rank (MobileNetV2 on Fashion-MNIST)",
    [](CLI::App& app) -> tandem::cli::Runner {
      auto o = std::make_shared<DemoOptions>();
      app.add_option("--model", o->model, "zoo model")->capture_default_str();
      app.add_option("--width-mult", o->width_mult, "mobilenetv2 width multiplier")->capture_default_str();
      app.add_option("--batch", o->batch, "batch per replica")->capture_default_str()->check(CLI::PositiveNumber);
      app.add_option("--batches", o->batches, "batches each run trains")->capture_default_str()
          ->check(CLI::PositiveNumber);
      app.add_option("--microbatches", o->microbatches, "pipeline micro-batches")->capture_default_str();
      app.add_option("--schedule", o->schedule, "gpipe or 1f1b")->capture_default_str()
          ->check(CLI::IsMember({"gpipe", "1f1b"}));
      app.add_option("--test-limit", o->test_limit, "test images scored")->capture_default_str();
      app.add_option("--transport", o->transport, "auto, tcp, zmq or ucx")->capture_default_str();
      app.add_option("--data-dir", o->data_dir, "Fashion-MNIST directory (default: found automatically)");
      app.add_flag("--json", o->json, "one JSON summary object");
      return [o] { return run_demo(*o); };
    }};

}  // namespace
