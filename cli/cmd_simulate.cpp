// tandem simulate: predict a training job on a cluster (and sweeps over node counts with --nodes).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/command.hpp"
#include "cli/enums.hpp"
#include "cli/sim_job.hpp"
#include "tandem/tandem.h"

namespace tandem::cli {

namespace {

struct ClusterPtr {
  tandem_sim_cluster_t* p = nullptr;
  ~ClusterPtr() { tandem_sim_cluster_destroy(p); }
};
struct ResultPtr {
  tandem_sim_result_t* p = nullptr;
  ~ResultPtr() { tandem_sim_result_destroy(p); }
};

// One JSON object on stdout: the library's JSON extra, as it gave it.
void print_json(const tandem_sim_result_t* r) {
  size_t n = 0;
  tandem_sim_result_json(r, nullptr, &n);
  std::string s(n, '\0');
  tandem_sim_result_json(r, s.data(), &n);
  std::printf("%s\n", s.c_str());
}

constexpr uint64_t kAllSummary = TANDEM_SIM_SUMMARY_TIMES | TANDEM_SIM_SUMMARY_SCALING | TANDEM_SIM_SUMMARY_SPLIT |
                                 TANDEM_SIM_SUMMARY_MEMORY | TANDEM_SIM_SUMMARY_COST | TANDEM_SIM_SUMMARY_LAYOUT |
                                 TANDEM_SIM_SUMMARY_JOB | TANDEM_SIM_SUMMARY_NAMES | TANDEM_SIM_SUMMARY_STRATEGY |
                                 TANDEM_SIM_SUMMARY_MEMORY_DETAIL;

void print_summary(const tandem_sim_result_t* r) {
  tandem_sim_summary_t j = TANDEM_SIM_SUMMARY_INIT;
  j.field_mask = kAllSummary;
  tandem_sim_result_query(r, &j);
  const std::string pipe = j.pp > 1 ? fmt::format(", {} micro-batches, {}", j.micro_batches,
                                                  name_of(schedule_names(), j.schedule))
                                    : "";
  std::printf("tandem simulate: %s on %s, %s (dp %d x pp %d%s), batch %lld per replica\n", j.model, j.cluster,
              name_of(strategy_names(), j.strategy), j.dp, j.pp, pipe.c_str(), static_cast<long long>(j.batch));
  const bool fedavg = j.strategy == TANDEM_STRATEGY_FEDAVG;
  if (j.strategy >= TANDEM_STRATEGY_PS) {
    std::printf("  exchange       %s; %d worker%s%s\n", j.allreduce, j.workers, j.workers == 1 ? "" : "s",
                j.servers > 0 ? fmt::format(" + {} server{}", j.servers, j.servers == 1 ? "" : "s").c_str() : "");
  } else if (j.dp > 1) {
    std::printf("  all-reduce     %s\n", j.allreduce);
  }
  if (fedavg) {
    std::printf("  round time     %s (mean of %d simulated): %g clients sampled, %g counted, %g dropped\n",
                human_seconds(j.round_time_s).c_str(), j.window_steps, j.clients_sampled, j.clients_counted,
                j.clients_dropped);
  } else {
    std::printf("  step time      %s at full speed%s\n", human_seconds(j.step_time_s).c_str(),
                j.window_steps > 1 ? fmt::format(" (mean of {} simulated steps)", j.window_steps).c_str() : "");
  }
  std::printf("  epoch time     %s\n", human_seconds(j.epoch_time_s).c_str());
  if (fedavg) {
    std::printf("  total time     %s for %g epochs (%.1f rounds)\n", human_seconds(j.total_time_s).c_str(), j.epochs,
                j.total_steps);
  } else {
    std::printf("  total time     %s for %g epochs (%lld steps of %lld samples)\n", human_seconds(j.total_time_s).c_str(),
                j.epochs, static_cast<long long>(std::llround(j.total_steps)), static_cast<long long>(j.global_batch));
  }
  std::printf("  throughput     %.1f images/s\n", j.images_per_sec);
  if (j.speedup > 0 && fedavg) {  // a round (the epoch) trains only the sampled clients' data: compare per sample
    std::printf("  speedup        %.2fx in trained images/s against one device (%s for an epoch of all %lld samples; "
                "a round here trains %.0f), efficiency %.0f%%\n", j.speedup,
                human_seconds(j.baseline_total_time_s).c_str(), static_cast<long long>(j.samples),
                j.images_per_sec * j.epoch_time_s, 100 * j.efficiency);
  } else if (j.speedup > 0) {
    std::printf("  speedup        %.2fx against one device (%s), efficiency %.0f%%\n", j.speedup,
                human_seconds(j.baseline_total_time_s).c_str(), 100 * j.efficiency);
  }
  std::printf("  time split     compute %s | exposed comm %s | bubble %s | throttled %s | idle %s\n",
              human_seconds(j.compute_s).c_str(), human_seconds(j.comm_exposed_s).c_str(),
              human_seconds(j.bubble_s).c_str(), human_seconds(j.throttled_s).c_str(), human_seconds(j.idle_s).c_str());
  if (j.staleness_wait_s > 0)
    std::printf("                 + staleness waits %s\n", human_seconds(j.staleness_wait_s).c_str());
  if (*j.busiest_nic != '\0') std::printf("  busiest NIC    %s\n", j.busiest_nic);
  std::printf("  memory/node    %s needed%s\n", human_bytes(j.memory_per_node_bytes).c_str(),
              j.fits ? ", fits" : " -- DOES NOT FIT on at least one node");
  if (!j.fits) {
    std::printf("  memory need    node %d, rank %d: parameters %s | gradients %s | optimizer state %s | activations %s | "
                "runtime %s | buffers %s\n", j.memory_node, j.memory_rank, human_bytes(j.memory_param_bytes).c_str(),
                human_bytes(j.memory_grad_bytes).c_str(), human_bytes(j.memory_optimizer_bytes).c_str(),
                human_bytes(j.memory_activation_bytes).c_str(), human_bytes(j.memory_runtime_bytes).c_str(),
                human_bytes(j.memory_buffer_bytes).c_str());
    if (*j.memory_advice != '\0') std::printf("  to fit         %s\n", j.memory_advice);
  }
  std::printf("  bottleneck     %s\n", j.bottleneck);
  if (*j.scaling_note != '\0') std::printf("  note           %s\n", j.scaling_note);
  if (*j.note != '\0') std::printf("  note           %s\n", j.note);
  std::printf("  cost           $%.4f", j.cost_usd);
  if (j.surplus_usd > 0) std::printf(" (incl. $%.4f unlimited-mode surplus)", j.surplus_usd);
  std::printf("\n");
  for (int32_t i = 0; i < j.num_nodes; ++i) {
    tandem_sim_node_t n = TANDEM_SIM_NODE_INIT;
    n.field_mask = TANDEM_SIM_NODE_MEMORY | TANDEM_SIM_NODE_CREDITS;
    if (tandem_sim_result_node(r, i, &n) != TANDEM_OK || n.ranks == 0) continue;
    std::string credits;
    if (n.credits_start > 0 || n.cpu_utilization > 0)
      credits = fmt::format(", CPU credits {:.1f} -> {:.1f}{}", n.credits_start, n.credits_end,
                            n.throttled ? fmt::format(" (throttled from {})", human_seconds(n.throttle_start_s))
                                        : std::string(" (never throttled)"));
    std::printf("  node %-6s %-13s memory %s of %s%s%s\n", n.name, n.preset, human_bytes(n.memory_bytes).c_str(),
                human_bytes(n.memory_capacity_bytes).c_str(), n.swapping ? " (swapping)" : "", credits.c_str());
  }
}

// A point of a sweep: the node count and the run's summary.
struct SweepRow {
  int32_t nodes = 0;
  tandem_sim_summary_t s = TANDEM_SIM_SUMMARY_INIT;  // its strings die with the result: use the copies below
  std::string scaling_note, bottleneck;
};

std::string svg_plot(const std::vector<SweepRow>& rows, const std::string& title) {
  const double W = 640, H = 420, L = 60, R = 20, T = 40, B = 50;
  double max_n = 1, max_s = 1;
  for (const auto& r : rows) {
    max_n = std::max(max_n, static_cast<double>(r.nodes));
    max_s = std::max(max_s, r.s.speedup);
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
    const double n = r.nodes;
    o << fmt::format(R"svg(<text x="{:.1f}" y="{}" text-anchor="middle">{}</text>)svg", x(n), H - B + 18, n) << "\n";
    o << fmt::format(R"svg(<text x="{:.1f}" y="{:.1f}" text-anchor="middle" font-size="10">{}x{}</text>)svg", x(n),
                     y(r.s.speedup) - 8, r.s.dp, r.s.pp) << "\n";
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
  for (const auto& r : rows) pts += fmt::format("{:.1f},{:.1f} ", x(r.nodes), y(r.s.speedup));
  o << R"svg(<polyline fill="none" stroke="#1f77b4" stroke-width="2" points=")svg" << pts << "\"/>\n";
  for (const auto& r : rows)
    o << fmt::format(R"svg(<circle cx="{:.1f}" cy="{:.1f}" r="4" fill="{}"/>)svg", x(r.nodes), y(r.s.speedup),
                     r.s.fits ? "#1f77b4" : "#d62728") << "\n";
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
    SimJob job;
    if (const int rc = make_sim_job(*o, job)) return rc;
    ClusterPtr cluster;
    if (tandem_sim_cluster_create(job.ctx, o->cluster.c_str(), &cluster.p) != TANDEM_OK) return fail("bad --cluster");
    tandem_sim_job_params_t p = job.params;
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
      if (o->json) {
        print_json(r.p);
      } else {
        print_summary(r.p);
        if (!trace->empty()) std::printf("  trace          %s\n", trace->c_str());
        tandem_sim_summary_t j = TANDEM_SIM_SUMMARY_INIT;
        j.field_mask = kAllSummary;
        tandem_sim_result_query(r.p, &j);
        std::string note;
        if (!j.fits) {  // a command that cannot fit was offered as the way to run it
          std::printf("  run it         nothing to run: the job does not fit (see the memory lines above)\n");
        } else {
          std::printf("  run it         %s\n", train_command(*o, j, &note).c_str());
          if (!note.empty()) std::printf("                 (%s)\n", note.c_str());
        }
      }
      return 0;
    }
    std::vector<int32_t> counts = parse_nodes(*nodes);
    // every sweep starts from one node: the point speedups are measured against
    if (std::find(counts.begin(), counts.end(), 1) == counts.end()) counts.insert(counts.begin(), 1);
    if (!plot->empty())
      if (const int rc = check_output_path("tandem simulate", "--plot", *plot, "nothing was simulated")) return rc;
    std::vector<SweepRow> rows;
    std::vector<std::string> skipped;  // counts that cannot host the job: said, not dropped silently
    const bool tty = isatty(STDERR_FILENO);
    if (o->json) std::printf("[");
    for (size_t i = 0; i < counts.size(); ++i) {
      if (tty) std::fprintf(stderr, "\rsimulating %zu/%zu (%d nodes)...", i + 1, counts.size(), counts[i]);
      ClusterPtr c;
      if (tandem_sim_cluster_resize(cluster.p, counts[i], &c.p) != TANDEM_OK) return fail("cannot resize the cluster");
      int32_t devices = 0;
      tandem_sim_cluster_info(c.p, nullptr, &devices);
      // every device is a replica (ddp, and single beyond one node), a stage (pipeline), or hybrid keeps --pp
      tandem_sim_job_params_t q = p;
      q.field_mask |= TANDEM_SIM_JOB_STRATEGY | TANDEM_SIM_JOB_DP | TANDEM_SIM_JOB_PP;
      q.strategy = static_cast<tandem_strategy_t>(o->strategy);
      q.dp = q.pp = 0;
      if (o->strategy == TANDEM_STRATEGY_DDP) {
        q.dp = devices;
      } else if (o->strategy == TANDEM_STRATEGY_PIPELINE) {
        q.pp = devices;
      } else if (o->strategy == TANDEM_STRATEGY_HYBRID) {
        if (o->pp <= 0 || devices % o->pp != 0) {  // this size cannot host the pipeline
          skipped.push_back(fmt::format("{} nodes: not simulated ({} device(s) do not split into --pp {} stages)",
                                        counts[i], devices, o->pp));
          continue;
        }
        q.pp = o->pp;
        q.dp = devices / o->pp;
      } else if (o->strategy >= TANDEM_STRATEGY_PS) {
        // every device takes part; servers, where the strategy has them, are the last ones
        const bool servers = o->strategy <= TANDEM_STRATEGY_SSP || (o->strategy == TANDEM_STRATEGY_EASGD && o->easgd_async);
        if (servers && devices <= o->servers) {
          skipped.push_back(fmt::format("{} nodes: not simulated ({} device(s) leave no worker beside --servers {})",
                                        counts[i], devices, o->servers));
          continue;
        }
      } else if (counts[i] > 1) {
        q.strategy = TANDEM_STRATEGY_DDP;
        q.dp = devices;
      }
      ResultPtr r;
      if (tandem_simulate(c.p, &q, &r.p) != TANDEM_OK) return fail(fmt::format("simulation of {} nodes failed", counts[i]));
      SweepRow row;
      row.nodes = counts[i];
      row.s.field_mask = kAllSummary;
      tandem_sim_result_query(r.p, &row.s);
      row.scaling_note = row.s.scaling_note != nullptr ? row.s.scaling_note : "";
      row.bottleneck = row.s.bottleneck != nullptr ? row.s.bottleneck : "";
      row.s.cluster = row.s.model = row.s.dataset = row.s.allreduce = row.s.compute_source = row.s.bottleneck =
          row.s.scaling_note = nullptr;  // the result owned them
      rows.push_back(row);
      if (o->json) {
        std::printf("%s{\"nodes\": %d, \"result\": ", rows.size() > 1 ? ",\n " : "", counts[i]);
        std::fflush(stdout);
        size_t n = 0;
        tandem_sim_result_json(r.p, nullptr, &n);
        std::string text(n, '\0');
        tandem_sim_result_json(r.p, text.data(), &n);
        std::printf("%s}", text.c_str());
      }
    }
    if (tty) std::fprintf(stderr, "\r%40s\r", "");
    if (rows.empty()) {
      if (o->json) std::printf("]\n");
      for (const auto& why : skipped) std::fprintf(stderr, "tandem simulate: %s\n", why.c_str());
      std::fprintf(stderr, "tandem simulate: --nodes %s: no node count can host this job\n", nodes->c_str());
      return 1;
    }
    if (o->json)  // stdout stays one JSON document
      for (const auto& why : skipped) std::fprintf(stderr, "tandem simulate: %s\n", why.c_str());
    if (o->json) {
      std::printf("]\n");
    } else {
      std::printf("%6s %8s %10s %11s %12s %10s %8s %10s %10s %5s\n", "nodes", "dp x pp", "step_s", "epoch_s", "total_s",
                  "img/s", "speedup", "efficiency", "cost_usd", "fits");
      for (const auto& row : rows) {
        const tandem_sim_summary_t& j = row.s;
        std::printf("%6d %8s %10.3f %11.1f %12.1f %10.1f %8.2f %9.0f%% %10.4f %5s\n", row.nodes,
                    fmt::format("{}x{}", j.dp, j.pp).c_str(), j.step_time_s, j.epoch_time_s, j.total_time_s,
                    j.images_per_sec, j.speedup, 100 * j.efficiency, j.cost_usd, j.fits ? "yes" : "no");
      }
      if (o->strategy == TANDEM_STRATEGY_FEDAVG)
        std::printf("  speedup: trained images/s against one device (a round trains only its sampled clients' data)\n");
      for (const auto& row : rows)
        if (!row.scaling_note.empty()) std::printf("  %d nodes: %s\n", row.nodes, row.scaling_note.c_str());
      for (const auto& why : skipped) std::printf("  %s\n", why.c_str());
      for (const auto& row : rows) std::printf("  %d nodes: bottleneck %s\n", row.nodes, row.bottleneck.c_str());
      // the fastest point that fits, and the command that runs it (as a single simulate prints)
      const SweepRow* best = nullptr;
      for (const auto& row : rows)
        if (row.s.fits && (best == nullptr || row.s.total_time_s < best->s.total_time_s)) best = &row;
      if (best == nullptr) {
        std::printf("  run it         nothing to run: no point of the sweep fits (see the fits column)\n");
      } else {
        std::string note;
        std::printf("  fastest        %d nodes (dp %d x pp %d): %s total, $%.4f\n", best->nodes, best->s.dp,
                    best->s.pp, human_seconds(best->s.total_time_s).c_str(), best->s.cost_usd);
        std::printf("  run it         %s\n", train_command(*o, best->s, &note).c_str());
        if (!note.empty()) std::printf("                 (%s)\n", note.c_str());
      }
    }
    if (!plot->empty()) {
      std::ofstream f(*plot);
      if (!f) return fail("cannot write " + *plot);
      const std::string model = o->model_file.empty() ? o->model : o->model_file;
      // the sweep resizes the cluster: name its node kind, not the count given
      const std::string kind = o->cluster.find(':') != std::string::npos && o->cluster.find('{') == std::string::npos
                                   ? o->cluster.substr(0, o->cluster.find(':'))
                                   : std::string("the cluster's first node");
      f << svg_plot(rows, fmt::format("{} on N x {}, {} (labels: dp x pp)", model, kind,
                                      name_of(strategy_names(), o->strategy)));
      if (!f) return fail("cannot write " + *plot);
    }
    return 0;
  };
}};

}  // namespace
}  // namespace tandem::cli

