// tandem plan: search the fastest DP x PP x micro-batch x schedule x all-reduce configuration that fits.
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "cli/command.hpp"
#include "cli/enums.hpp"
#include "cli/sim_job.hpp"
#include "tandem/tandem.h"

namespace tandem::cli {
namespace {

Registration reg{"plan", "search the fastest parallel configuration that fits (DP x PP x micro-batches)",
                 [](CLI::App& app) -> Runner {
  auto o = add_sim_job_options(app, false);
  auto top = std::make_shared<int>(5);
  app.add_option("--top", *top, "configurations to print")->capture_default_str();
  return [o, top]() -> int {
    SimJob job;
    if (const int rc = make_sim_job(*o, job)) return rc;
    tandem_sim_cluster_t* cluster = nullptr;
    tandem_sim_result_t* r = nullptr;
    int rc = 0;
    const bool tty = isatty(STDERR_FILENO) && !o->json;
    if (tandem_sim_cluster_create(job.ctx, o->cluster.c_str(), &cluster) != TANDEM_OK) {
      rc = fail("bad --cluster");
    } else {
      if (tty) std::fprintf(stderr, "searching configurations...");
      tandem_status_t s = tandem_sim_plan(cluster, &job.params, *top, &r);
      if (tty) std::fprintf(stderr, "\r%30s\r", "");
      if (s != TANDEM_OK) {
        rc = fail("plan search failed");
      } else if (o->json) {
        size_t n = 0;
        tandem_sim_result_json(r, nullptr, &n);
        std::string text(n, '\0');
        tandem_sim_result_json(r, text.data(), &n);
        std::printf("%s\n", text.c_str());
      } else {
        tandem_sim_summary_t sum = TANDEM_SIM_SUMMARY_INIT;
        sum.field_mask = TANDEM_SIM_SUMMARY_SEARCH | TANDEM_SIM_SUMMARY_SCALING;
        tandem_sim_result_query(r, &sum);
        std::printf("tandem plan: %d configurations simulated in %.2f s, %d fit; one device alone: %.1f s\n",
                    sum.evaluated, sum.search_wall_s, sum.fitting, sum.baseline_total_time_s);
        std::printf("%4s %-12s %4s %4s %4s %9s %-10s %10s %11s %12s %8s %11s %5s %10s\n", "rank", "strategy", "dp", "pp",
                    "mb", "schedule", "allreduce", "step_s", "epoch_s", "total_s", "speedup", "mem/node", "fits",
                    "cost_usd");
        for (int32_t k = 0; k < sum.candidates; ++k) {
          tandem_sim_summary_t c = TANDEM_SIM_SUMMARY_INIT;
          c.field_mask = TANDEM_SIM_SUMMARY_TIMES | TANDEM_SIM_SUMMARY_SCALING | TANDEM_SIM_SUMMARY_MEMORY |
                         TANDEM_SIM_SUMMARY_COST | TANDEM_SIM_SUMMARY_LAYOUT | TANDEM_SIM_SUMMARY_JOB |
                         TANDEM_SIM_SUMMARY_STRATEGY;
          if (tandem_sim_result_candidate(r, k, &c) != TANDEM_OK) continue;
          const bool allreduce = c.dp > 1 && (c.strategy <= TANDEM_STRATEGY_HYBRID || c.strategy == TANDEM_STRATEGY_LOCALSGD ||
                                              (c.strategy == TANDEM_STRATEGY_EASGD && c.servers == 0));
          const char* algo = allreduce ? tandem_algo_string(c.algorithm) : "none";
          // step_s of fedavg is its round
          const std::string strategy = c.servers > 0 ? fmt::format("{}/{}s", name_of(strategy_names(), c.strategy), c.servers)
                                                     : std::string(name_of(strategy_names(), c.strategy));
          std::printf("%4d %-12s %4d %4d %4d %9s %-10s %10.3f %11.1f %12.1f %8.2f %11s %5s %10.4f\n", k + 1,
                      strategy.c_str(), c.dp, c.pp,
                      c.micro_batches, c.pp > 1 ? name_of(schedule_names(), c.schedule) : "-", algo, c.step_time_s,
                      c.epoch_time_s, c.total_time_s, c.speedup, human_bytes(c.memory_per_node_bytes).c_str(),
                      c.fits ? "yes" : "no", c.cost_usd);
        }
        tandem_sim_summary_t best = TANDEM_SIM_SUMMARY_INIT;
        best.field_mask = TANDEM_SIM_SUMMARY_LAYOUT | TANDEM_SIM_SUMMARY_JOB | TANDEM_SIM_SUMMARY_NAMES |
                          TANDEM_SIM_SUMMARY_STRATEGY | TANDEM_SIM_SUMMARY_MEMORY;
        if (sum.candidates > 0 && tandem_sim_result_candidate(r, 0, &best) == TANDEM_OK) {
          std::printf("bottleneck of the best: %s\n", best.bottleneck);
          std::string note;
          if (!best.fits) {  // the fastest of configurations that all run out of memory was offered to run
            std::printf("run the best: nothing to run: no configuration fits in memory\n");
          } else {
            std::printf("run the best: %s\n", train_command(*o, best, &note).c_str());
            if (!note.empty()) std::printf("              (%s)\n", note.c_str());
          }
        }
        std::printf("(the search compares time per step (fedavg: per round; ps/Ns: N servers), not time to accuracy: "
                    "statistical efficiency -- staleness, averaging periods, client sampling -- is not simulated)\n");
      }
    }
    tandem_sim_result_destroy(r);
    tandem_sim_cluster_destroy(cluster);
    return rc;
  };
}};

}  // namespace
}  // namespace tandem::cli
