// tandem plan: search the fastest DP x PP x micro-batch x schedule x all-reduce configuration that fits.
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/command.hpp"
#include "tandem/tandem.h"

namespace tandem::cli {

struct SimJobCli;  // job options shared with `simulate` (cmd_simulate.cpp)
std::shared_ptr<SimJobCli> add_sim_job_options(CLI::App& app, bool strategy_options);
tandem_sim_job_params_t sim_job_params(SimJobCli& o);
const std::string& sim_job_cluster(const SimJobCli& o);
bool sim_job_json(const SimJobCli& o);
nlohmann::json sim_result_json(const tandem_sim_result_t* r);
std::string human_bytes(double b);

namespace {

Registration reg{"plan", "search the fastest parallel configuration that fits (DP x PP x micro-batches)",
                 [](CLI::App& app) -> Runner {
  auto o = add_sim_job_options(app, false);
  auto top = std::make_shared<int>(5);
  app.add_option("--top", *top, "configurations to print")->capture_default_str();
  return [o, top]() -> int {
    tandem_context_t* ctx = nullptr;
    if (tandem_context_create(nullptr, &ctx) != TANDEM_OK) return fail("cannot create a context");
    tandem_sim_cluster_t* cluster = nullptr;
    tandem_sim_result_t* r = nullptr;
    int rc = 0;
    tandem_sim_job_params_t p = sim_job_params(*o);
    const bool tty = isatty(STDERR_FILENO) && !sim_job_json(*o);
    if (tandem_sim_cluster_create(ctx, sim_job_cluster(*o).c_str(), &cluster) != TANDEM_OK) {
      rc = fail("bad --cluster");
    } else {
      if (tty) std::fprintf(stderr, "searching configurations...");
      tandem_status_t s = tandem_sim_plan(cluster, &p, *top, &r);
      if (tty) std::fprintf(stderr, "\r%30s\r", "");
      if (s != TANDEM_OK) {
        rc = fail("plan search failed");
      } else {
        nlohmann::json j = sim_result_json(r);
        if (sim_job_json(*o)) {
          std::printf("%s\n", j.dump(2).c_str());
        } else {
          std::printf("tandem plan: %d configurations simulated in %.2f s, %d fit; one device alone: %.1f s\n",
                      j["evaluated"].get<int>(), j["search_wall_s"].get<double>(), j["fitting"].get<int>(),
                      j["baseline_total_time_s"].get<double>());
          std::printf("%4s %4s %4s %4s %9s %-10s %10s %11s %12s %8s %11s %5s %10s\n", "rank", "dp", "pp", "mb",
                      "schedule", "allreduce", "step_s", "epoch_s", "total_s", "speedup", "mem/node", "fits",
                      "cost_usd");
          int k = 0;
          for (const auto& c : j["candidates"]) {
            std::string algo = c["allreduce"].get<std::string>();
            if (algo != "none") algo = algo.substr(algo.find(' ') + 1, algo.find(" world") - algo.find(' ') - 1);
            std::printf("%4d %4d %4d %4d %9s %-10s %10.3f %11.1f %12.1f %8.2f %11s %5s %10.4f\n", ++k,
                        c["dp"].get<int>(), c["pp"].get<int>(), c["micro_batches"].get<int>(),
                        c["pp"].get<int>() > 1 ? c["schedule"].get<std::string>().c_str() : "-", algo.c_str(),
                        c["step_time_s"].get<double>(), c["epoch_time_s"].get<double>(),
                        c["total_time_s"].get<double>(), c["speedup"].get<double>(),
                        human_bytes(c["memory_per_node_bytes"]).c_str(), c["fits"].get<bool>() ? "yes" : "no",
                        c["cost_usd"].get<double>());
          }
        }
      }
    }
    tandem_sim_result_destroy(r);
    tandem_sim_cluster_destroy(cluster);
    tandem_context_destroy(ctx);
    return rc;
  };
}};

}  // namespace
}  // namespace tandem::cli
