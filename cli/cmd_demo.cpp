// `tandem demo`: the main job on an embedded default. For now, the collective demo: 4 local ranks
// on loopback run `tandem bench allreduce` (every result checked) and the demo summarises
// correctness and bandwidth. Finishes in seconds.
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
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
  int nranks = 4;
  std::string transport = "auto";
  bool json = false;
};

struct Captured {
  int status = -1;  // exit code, or 128 + signal
  std::string out;
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
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return c;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) c.out.append(buf, n);
  const int status = ::pclose(p);
  c.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  return c;
}

std::string human_bytes(uint64_t b) {
  if (b >= (1u << 20) && b % (1u << 20) == 0) return fmt::format("{} MiB", b >> 20);
  if (b >= (1u << 10) && b % (1u << 10) == 0) return fmt::format("{} KiB", b >> 10);
  return fmt::format("{} B", b);
}

int run_demo(const DemoOptions& o) {
  std::vector<char> exe(4096);
  const ssize_t len = ::readlink("/proc/self/exe", exe.data(), exe.size() - 1);
  if (len <= 0) return tandem::cli::fail("cannot find this program (/proc/self/exe)");
  const std::string self(exe.data(), static_cast<size_t>(len));
  if (!o.json) {
    std::printf("Tandem %s demo: allreduce (f32 sum) on %d local ranks over loopback, every element checked\n",
                tandem_version_string(), o.nranks);
    std::fflush(stdout);
  }
  const auto t0 = std::chrono::steady_clock::now();
  const Captured c = run_capture({self, "bench", "allreduce", "-n", std::to_string(o.nranks), "--sizes",
                                  "4K,64K,1M,16M", "--iters", "10", "--warmup", "2", "--transport", o.transport,
                                  "--timeout-ms", "30000", "--json"});
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  std::vector<nlohmann::json> rows;
  std::istringstream lines(c.out);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] != '{') continue;
    try {
      rows.push_back(nlohmann::json::parse(line));
    } catch (const nlohmann::json::exception&) {
      return tandem::cli::fail("the benchmark printed malformed JSON: " + line);
    }
  }
  if (c.status != 0 && rows.empty()) {
    return tandem::cli::fail(fmt::format("the allreduce benchmark failed (exit status {})", c.status));
  }
  int64_t wrong = 0;
  double peak = 0;
  uint64_t peak_bytes = 0;
  for (const auto& r : rows) {
    wrong += r.at("wrong").get<int64_t>();
    if (r.at("busbw_gbps").get<double>() > peak) {
      peak = r.at("busbw_gbps").get<double>();
      peak_bytes = r.at("bytes").get<uint64_t>();
    }
  }
  const bool ok = c.status == 0 && wrong == 0 && rows.size() == 4;
  if (o.json) {
    nlohmann::json j = {{"demo", "allreduce"}, {"world", o.nranks}, {"ok", ok}, {"wrong", wrong},
                        {"seconds", seconds},   {"results", rows}};
    std::printf("%s\n", j.dump().c_str());
    return ok ? 0 : 1;
  }
  const std::string transport = rows.empty() ? "?" : rows.front().at("transport").get<std::string>();
  std::printf("  %10s  %14s  %12s  %12s  %s\n", "size", "algorithm", "time", "bus bw", "check");
  for (const auto& r : rows) {
    std::printf("  %10s  %14s  %9.1f us  %7.2f GB/s  %s\n", human_bytes(r.at("bytes").get<uint64_t>()).c_str(),
                r.at("algo").get<std::string>().c_str(), r.at("time_us").get<double>(),
                r.at("busbw_gbps").get<double>(),
                r.at("wrong").get<int64_t>() == 0
                    ? "ok"
                    : fmt::format("{} wrong elements", r.at("wrong").get<int64_t>()).c_str());
  }
  if (ok) {
    std::printf("All %zu sizes correct on %d ranks over %s; peak bus bandwidth %.2f GB/s at %s (%.1f s in all).\n",
                rows.size(), o.nranks, transport.c_str(), peak, human_bytes(peak_bytes).c_str(), seconds);
    std::printf("Next: `tandem bench allreduce --help`, or the Python package in bindings/python.\n");
    return 0;
  }
  std::fprintf(stderr, "tandem demo: FAILED: %lld wrong elements, %zu of 4 sizes reported, benchmark exit %d\n",
               static_cast<long long>(wrong), rows.size(), c.status);
  return 1;
}

tandem::cli::Registration reg{"demo", "the main job on an embedded default (for now: 4-rank allreduce demo)",
                              [](CLI::App& app) -> tandem::cli::Runner {
                                auto o = std::make_shared<DemoOptions>();
                                app.add_option("-n,--ranks", o->nranks, "local ranks")
                                    ->check(CLI::Range(2, 64))
                                    ->capture_default_str();
                                app.add_option("--transport", o->transport, "auto, zmq or ucx")
                                    ->capture_default_str();
                                app.add_flag("--json", o->json, "one JSON summary object");
                                return [o] { return run_demo(*o); };
                              }};

}  // namespace
