// Simulator benchmarks (not tests): events per second, a 1,024-node data-parallel step with a ring
// all-reduce of 100 MB in 25 MB buckets, and a plan search over a 64-node cluster.
//   sim_bench ring [nodes=1024] [MB=100] [bucket_MB=25] [--full] [--whole-plan] [--compile-only]
//     --full disables symmetric execution; --whole-plan compiles from make_plan's whole plan (the
//     previous way) instead of the simulator's PlanCache (rank by rank above 256 ranks); --compile-only
//     stops after building the plans (their time and peak memory)
//   sim_bench plan [nodes=64] [model=resnet18]
//   sim_bench events [millions=20]
//   sim_bench ddp [nodes=1024] [model=vgg16] [batch=48]
//     `tandem simulate --cluster c5.large:NODES --model MODEL --strategy ddp --batch BATCH` as the CLI
//     runs it (issue #16: vgg16's ring all-reduces have unequal segments)
// Prints one JSON object per case on stdout.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/comm/plan.hpp"
#include "simulator/compiled_plan.hpp"
#include "simulator/search.hpp"
#include "simulator/simulate.hpp"
#include "simulator/step.hpp"

using namespace tandem::simulator;
using namespace tandem::engine;
using Clock = std::chrono::steady_clock;

namespace {
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Peak resident set of this process so far (VmHWM), bytes; 0 where /proc is not there.
double peak_rss_bytes() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  double kib = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, "VmHWM:", 6) == 0) kib = std::atof(line + 6);
  std::fclose(f);
  return kib * 1024;
}

int bench_ring(int n, double mb, double bucket_mb, bool symmetric, bool whole_plan, bool compile_only) {
  const double B = 10e9 / 8, L = 25e-6;  // 10 Gbit/s NICs, 25 us one-way
  // MB as PyTorch DDP's bucket_cap_mb means it: MiB
  const uint64_t total = static_cast<uint64_t>(mb * 1048576), bucket = static_cast<uint64_t>(bucket_mb * 1048576);
  const int buckets = static_cast<int>((total + bucket - 1) / bucket);
  comm::PlanRequest req;
  req.world = n;
  req.algorithm = comm::Algorithm::kRing;
  req.count = bucket / 4;
  req.in_place = true;
  req.chunk_bytes = comm::effective_chunk_bytes(0, req.count * req.elem_bytes);  // as the communicator does
  auto t0 = Clock::now();
  double make_plan_s = 0, compile_s = 0, free_s = 0, full_s = 0;
  PlanCache cache;
  const CompiledPlan* compiled = nullptr;
  std::optional<CompiledPlan> whole;
  if (whole_plan) {
    std::optional<comm::Plan> runtime_plan = comm::make_plan(req);  // the runtime's plan (engine/comm)
    make_plan_s = since(t0);
    auto tc = Clock::now();
    whole = compile_plan(*runtime_plan, 4);
    compile_s = since(tc);
    auto tf = Clock::now();
    runtime_plan.reset();
    free_s = since(tf);
    compiled = &*whole;
  } else {
    compiled = &cache.get(req);  // as the simulator does: symmetric form where proven, else full by rank
    compile_s = since(t0);
  }
  const CompiledPlan& plan = *compiled;
  if (!symmetric) {  // the full model needs every member's ops
    auto tf = Clock::now();
    (void)plan.full();
    full_s = since(tf);
  }
  const double plan_s = since(t0);
  if (compile_only) {
    const CompiledPlan& f = plan.full();  // built above when --full
    std::printf("%s\n", nlohmann::json({{"case", "ring-compile"}, {"nodes", n}, {"plan", plan.description},
                                        {"plan_form", plan.is_full() ? "full" : "symmetric"}, {"make_plan_s", make_plan_s},
                                        {"compile_plan_s", compile_s}, {"full_form_s", full_s}, {"plan_build_s", plan_s},
                                        {"full_form_bytes", f.bytes_held()},
                                        {"peak_rss_bytes", peak_rss_bytes()}})
                             .dump()
                             .c_str());
    return 0;
  }
  parallel::ScheduleRequest sr;
  sr.boundaries = {0, buckets};
  sr.data_parallel = true;
  sr.layer_grad_bytes.assign(buckets, bucket);
  sr.bucket_bytes = bucket;
  StepSetup s;
  s.pipeline = parallel::make_pipeline_plan(sr);
  s.dp = n;
  s.symmetric = symmetric;
  s.bucket_plans = {std::vector<const CompiledPlan*>(buckets, &plan)};
  for (int r = 0; r < n; ++r) {
    RankSetup rs;
    rs.forward_s = {0.05};
    rs.backward_s = {0.1};
    rs.bucket_backward_s.assign(buckets, 0.1 / buckets);
    rs.optimizer_s = 0.01;
    rs.local_bytes_per_s = 20e9;
    s.ranks.push_back(rs);
  }
  std::vector<network::HostNet> hosts(n);
  for (auto& h : hosts) {
    h.nic_bytes_per_s = B;
    h.nic_latency_s = L;
  }
  auto t1 = Clock::now();
  des::Simulator sim;
  network::Network net(sim);
  network::Topology topo(network::TopologySpec{}, hosts, net);
  StepResult r = simulate_step(s, topo, sim);
  const double run_s = since(t1);
  const uint64_t transfers = plan.transfers();
  nlohmann::json j = {{"case", "ring"},
                      {"nodes", n},
                      {"gradient_mb", mb},
                      {"bucket_mb", bucket_mb},
                      {"buckets", buckets},
                      {"plan", plan.description},
                      {"plan_form", plan.is_full() ? "full" : "symmetric (member 0, proven rank by rank)"},
                      {"transfers_per_bucket", transfers},
                      {"transfers_total", transfers * buckets},
                      {"make_plan_s", make_plan_s},
                      {"compile_plan_s", compile_s},
                      {"full_form_s", full_s},
                      {"free_plan_s", free_s},
                      {"plan_build_s", plan_s},
                      {"simulate_s", run_s},
                      {"total_s", plan_s + run_s},
                      {"events", r.events},
                      {"flows_simulated", r.flows},
                      {"events_per_s", r.events / run_s},
                      {"symmetric_execution", r.symmetric_used},
                      {"predicted_step_s", r.step_s},
                      {"peak_rss_bytes", peak_rss_bytes()}};
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

int bench_plan(int n, const std::string& model) {
  JobSpec job;
  job.model = model;
  job.batch = 64;
  job.epochs = 1;
  auto t0 = Clock::now();
  SearchOptions o;
  o.top = 3;
  SearchResult s = search_plans(parse_cluster("c5.xlarge:" + std::to_string(n)), job, o);
  nlohmann::json j = {{"case", "plan"}, {"nodes", n}, {"model", model}, {"evaluated", s.evaluated},
                      {"fitting", s.fitting}, {"search_s", since(t0)},
                      {"best", s.best.empty() ? nlohmann::json() : s.to_json()["candidates"][0]}};
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

int bench_ddp(int n, const std::string& model, int64_t batch) {
  JobSpec job;
  job.model = model;
  job.batch = batch;
  job.epochs = 1;
  job.strategy = parallel::Strategy::kDdp;
  auto t0 = Clock::now();
  const SimResult r = simulate(parse_cluster("c5.large:" + std::to_string(n)), job);
  nlohmann::json j = {{"case", "ddp"},
                      {"nodes", n},
                      {"model", model},
                      {"batch", batch},
                      {"total_s", since(t0)},
                      {"sim_wall_s", r.wall_s},
                      {"events", r.events},
                      {"flows_simulated", r.flows},
                      {"symmetric_execution", r.symmetric_used},
                      {"predicted_step_s", r.step_time_s},
                      {"allreduce_bytes_per_rank", r.allreduce_bytes_per_rank},
                      {"plan", r.algorithm},
                      {"peak_rss_bytes", peak_rss_bytes()}};
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

struct Chain : des::EventHandler {
  des::Simulator* sim;
  uint64_t left;
  void on_event(uint64_t k) override {
    if (left > 0) {
      --left;
      sim->schedule_in(static_cast<des::TimeNs>(1 + (k * 2654435761u) % 1000), this, k + 1);
    }
  }
};

int bench_events(double millions) {
  des::Simulator sim;
  Chain c;
  c.sim = &sim;
  c.left = static_cast<uint64_t>(millions * 1e6);
  for (uint64_t i = 0; i < 2048; ++i) sim.schedule_at(static_cast<des::TimeNs>(i), &c, i);  // 2048 pending
  auto t0 = Clock::now();
  uint64_t n = sim.run();
  double s = since(t0);
  std::printf("%s\n", nlohmann::json({{"case", "events"}, {"events", n}, {"seconds", s}, {"events_per_s", n / s}})
                          .dump()
                          .c_str());
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  std::string what = argc > 1 ? argv[1] : "ring";
  bool symmetric = true, whole_plan = false, compile_only = false;
  std::vector<std::string> args;
  for (int i = 2; i < argc; ++i) {
    if (std::strcmp(argv[i], "--full") == 0) {
      symmetric = false;
    } else if (std::strcmp(argv[i], "--whole-plan") == 0) {
      whole_plan = true;
    } else if (std::strcmp(argv[i], "--compile-only") == 0) {
      compile_only = true;
    } else {
      args.push_back(argv[i]);
    }
  }
  auto arg = [&](size_t i, double d) { return i < args.size() ? std::atof(args[i].c_str()) : d; };
  try {
    if (what == "ring") return bench_ring(static_cast<int>(arg(0, 1024)), arg(1, 100), arg(2, 25), symmetric, whole_plan, compile_only);
    if (what == "plan") return bench_plan(static_cast<int>(arg(0, 64)), args.size() > 1 ? args[1] : "resnet18");
    if (what == "events") return bench_events(arg(0, 20));
    if (what == "ddp")
      return bench_ddp(static_cast<int>(arg(0, 1024)), args.size() > 1 ? args[1] : "vgg16",
                       static_cast<int64_t>(arg(2, 48)));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sim_bench: %s\n", e.what());
    return 1;
  }
  std::fprintf(stderr, "usage: sim_bench ring|plan|events|ddp [args]\n");
  return 2;
}
