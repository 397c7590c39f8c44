#include "simulator/simulate.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <numeric>

#include <fmt/format.h>

#include "engine/core/error.hpp"
#include "engine/data/dataset.hpp"
#include "engine/data/partition.hpp"
#include "engine/parallel/fedavg.hpp"
#include "engine/nn/cpu_storage.hpp"
#include "engine/nn/zoo.hpp"
#include "simulator/broadcast.hpp"
#include "simulator/comm_cpu.hpp"
#include "simulator/compute/credits.hpp"
#include "simulator/compute/step_noise.hpp"
#include "simulator/compute/workload.hpp"
#include "simulator/strategy.hpp"

namespace tandem::simulator {

namespace {

// Whether the profile was measured for this model (same name, and the same input where it gives one): only then do
// its measured activation peak and runtime size describe the job's model.
bool profile_of_model(const engine::nn::ModelSpec& model, const std::optional<CalibrationProfile>& profile) {
  if (!profile || profile->model != model.name) return false;
  return profile->input.empty() || profile->input == std::vector<int64_t>{model.input.c, model.input.h, model.input.w};
}

}  // namespace

double tandem_cpu_activation_peak(const engine::nn::ModelSpec& model, const std::optional<CalibrationProfile>& profile,
                                  int64_t micro_batch) {
  if (!profile_of_model(model, profile)) return 1.0;
  const int64_t samples = micro_batch >= 1 ? micro_batch : profile->batch;
  const std::optional<double> peak = activation_peak_at(*profile, samples);
  if (!peak) return 1.0;
  // the peak the job compiler derives for what the profile measured: one process of the whole model at that many
  // samples, f32, nothing recomputed
  engine::parallel::Job one;
  one.model = model;
  one.batch = samples;
  const double derived = engine::parallel::compile_job(one, 1).stages.front().memory.cpu_activation_peak_bytes();
  return derived > 0 ? *peak / derived : 1.0;
}

double tandem_cpu_primitive_bytes(const engine::parallel::CompiledJob& cj, const engine::parallel::StageMemory& stage,
                                  const std::optional<CalibrationProfile>& profile, bool runtime_measured) {
  const engine::nn::ModelSpec& model = cj.job.model;
  const bool measured = profile_of_model(model, profile) && !profile->primitive_bytes_curve.empty();
  double bytes = stage.short_batch_bytes;
  if (bytes > 0 && measured) {
    const double derived = engine::nn::cpu_primitive_bytes(model, 0, model.layers.size(), stage.short_micro_batch);
    if (derived > 0) bytes *= *primitive_bytes_at(*profile, stage.short_micro_batch) / derived;
  }
  if (runtime_measured && measured && profile->batch > 0 && stage.micro_batch > 0) {  // a server runs no layers
    // a larger batch's primitives never take less (nor a smaller one's more): a curve measured falling between its
    // points (lenet5 at 8 and 16 samples, within the measurement's noise) moves nothing
    const double shift = *primitive_bytes_at(*profile, stage.micro_batch) - *primitive_bytes_at(*profile, profile->batch);
    bytes += stage.micro_batch > profile->batch ? std::max(0.0, shift) : std::min(0.0, shift);
  }
  return bytes;
}

namespace {

using engine::parallel::CompiledJob;
using engine::parallel::Exchange;
using engine::parallel::ScheduleKind;


struct Prepared {
  ClusterSpec cluster;
  CompiledJob cj;     // the job as the trainer runs it
  RunSpec run;
  DatasetInfo data;
  Workload work;
  std::vector<ComputeModel> models;  // per node
  std::vector<int32_t> node_of_rank;
  StepSetup setup;  // speeds filled per phase
  // The strategies of issue #13 (strategy.hpp): push-pull, asynchronous elastic, gossip and fedavg rounds run
  // `strategy`; parameter averaging (localsgd, synchronous easgd) runs `period`: a period of H local steps
  // ending in the parameter all-reduces, as one step of the DDP executor (setup stays localsgd's warmup step).
  StrategySetup strategy;
  StepSetup period;
  std::vector<double> base_speed;  // per node: 1, or 1/swap_slowdown when swapping
  std::vector<NodeReport> nodes;
  std::vector<double> runtime_bytes;  // per node: each rank's runtime allowance
  MemoryBreakdown memory;             // the worst node's largest rank
  int64_t steps_per_epoch = 0;
  double scale = 1;
  double compute_cv = 0;  // the profile's pass-to-pass variability (compute/step_noise.hpp); 0: steps alike
};

struct ConvertCost {
  double to_s = 0, back_s = 0;  // per gradient element: f32 -> 16 bits, and back
};

// The profile's measured conversion, else this machine's (scalar loops of engine/core/dtype as
// grad_reducer.cpp runs them; see the defaults in simulate.hpp).
ConvertCost convert_cost(engine::parallel::GradCompression c, const std::optional<CalibrationProfile>& profile) {
  const bool f16 = c == engine::parallel::GradCompression::kF16;
  if (profile) {
    const auto& measured = f16 ? profile->fp16_convert_s : profile->bf16_convert_s;
    if (measured) return {measured->first, measured->second};
  }
  return f16 ? ConvertCost{kDefaultFp16ToS, kDefaultFp16BackS} : ConvertCost{kDefaultBf16ToS, kDefaultBf16BackS};
}

// Whether a rank's runtime allowance on `node` is the profile's measured resident size (runtime_rss_bytes).
bool runtime_from_profile(const NodeSpec& node, const std::optional<CalibrationProfile>& profile, Framework framework) {
  return !node.runtime_bytes && node.hw.gpus == 0 && framework != Framework::kPytorchDdp && profile &&
         profile->runtime_rss_bytes;
}

// A rank's runtime allowance on `node`: the node's own figure, else on a CPU node the framework's (PyTorch: its
// measured process size; Tandem: the profile's measured resident size after setup), on a GPU node a Tandem rank's
// measured device memory besides tensors (the profile's runtime_device_bytes), else the defaults.
double runtime_allowance(const NodeSpec& node, const std::optional<CalibrationProfile>& profile, Framework framework) {
  if (node.runtime_bytes) return *node.runtime_bytes;
  if (node.hw.gpus > 0) {
    const bool measured = framework != Framework::kPytorchDdp && profile && profile->runtime_device_bytes;
    return measured ? *profile->runtime_device_bytes : kDefaultGpuRuntimeBytes;
  }
  if (framework == Framework::kPytorchDdp) return kPytorchCpuRuntimeBytes;
  if (runtime_from_profile(node, profile, framework)) return *profile->runtime_rss_bytes;
  return kDefaultCpuRuntimeBytes;
}

// The data sets a Tandem rank holds in host memory: the run's own figure (a trainer's loaded sets), else what the
// runtime loads for the job (engine::parallel::rank_data_bytes): the training set -- the first --samples of the
// named set (data::limited_samples, as `tandem train --train-limit` reads it), the set itself when --samples is
// not given --, the whole test set (a training limit leaves it whole), and FedAvg's client subsets.
double rank_data_bytes(const CompiledJob& cj, const RunSpec& run, const DatasetInfo& d) {
  if (run.data_bytes) return *run.data_bytes;
  if (!d.in_memory) return 0;
  const int64_t train = run.dataset.empty() ? d.samples
                                            : engine::data::limited_samples(find_dataset(run.dataset).samples, run.samples);
  return engine::parallel::rank_data_bytes(cj, train, d.test_samples, d.input.numel());
}

// Each node's need (a CPU node: the sum of its ranks; a GPU node: its largest rank) and, in `worst`, the breakdown
// of the largest rank on the node that fits worst. A Tandem rank on a CPU node holds its stage's cpu backend figures
// (StageMemory: cpu_activation_peak_bytes() as its activations, scaled by what the profile measured for the job's
// model -- tandem_cpu_activation_peak --, and its convolutions' reordered weights, conv_copy_bytes, with its runtime)
// and its data sets (`data`, per rank) with its loader's batches assembled ahead (StageMemory::loader_bytes; both not
// charged to a GPU's memory, nor to pytorch-ddp, whose measured process size stands for it). A profile's runtime_rss_bytes holds the reordered weights of the model it measured: for the
// job's model those of the whole model are replaced by the rank's own (a stage holds only its own); a profile of
// another model keeps its own (not known here) and the rank's are added.
void node_memory(const CompiledJob& cj, const std::vector<int32_t>& node_of_rank, const std::vector<double>& runtime,
                 double data, Framework framework, const std::optional<CalibrationProfile>& profile,
                 const ClusterSpec& cluster, std::vector<NodeReport>& nodes, MemoryBreakdown& worst) {
  const engine::parallel::SyncProgram& sync = cj.sync;
  const engine::nn::ModelSpec& model = cj.job.model;
  // the measured peak over the derived one at the job's micro-batch (1 without a measurement of this model); every
  // stage and worker has the same micro-batch, servers hold no activations
  const double scale = framework == Framework::kTandem
                           ? tandem_cpu_activation_peak(model, profile, cj.micro_batch_sizes.front())
                           : 1.0;
  const double measured_copies =
      profile_of_model(model, profile) ? engine::nn::cpu_workspace(model, 0, model.layers.size(), 1).conv_copy_bytes : 0.0;
  std::vector<MemoryBreakdown> largest(nodes.size());
  for (int32_t r = 0; r < cj.world; ++r) {
    const int32_t n = node_of_rank[r];
    NodeReport& nr = nodes[static_cast<size_t>(n)];
    const engine::parallel::StageMemory& m = sync.exchange == Exchange::kBucketAllreduce
                                                 ? cj.stages[static_cast<size_t>(r % cj.pp())].memory
                                             : r < sync.workers ? sync.worker_memory
                                                                : sync.server_memory.at(static_cast<size_t>(r - sync.workers));
    const NodeSpec& node = cluster.nodes[static_cast<size_t>(n)];
    const bool gpu = node.hw.gpus > 0;
    const bool tandem_cpu = framework == Framework::kTandem && !gpu;
    double rt = runtime[static_cast<size_t>(n)];
    if (tandem_cpu) {
      const bool measured_runtime = runtime_from_profile(node, profile, framework);
      rt += m.conv_copy_bytes - (measured_runtime ? measured_copies : 0.0);
      rt += tandem_cpu_primitive_bytes(cj, m, profile, measured_runtime);
    }
    MemoryBreakdown b{n, r, m.param_bytes, m.grad_bytes, m.optimizer_bytes,
                      tandem_cpu ? scale * m.cpu_activation_peak_bytes() : m.activation_bytes, rt, m.bucket_bytes};
    b.data_bytes = tandem_cpu ? data : 0.0;
    b.loader_bytes = tandem_cpu ? m.loader_bytes : 0.0;
    const double need = b.total();
    nr.memory_bytes = gpu ? std::max(nr.memory_bytes, need) : nr.memory_bytes + need;
    ++nr.ranks;
    if (largest[static_cast<size_t>(n)].rank < 0 || need > largest[static_cast<size_t>(n)].total()) largest[static_cast<size_t>(n)] = b;
  }
  double worst_ratio = -1;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (nodes[i].ranks == 0) continue;
    const double ratio = nodes[i].memory_bytes / std::max(nodes[i].memory_capacity_bytes, 1.0);
    if (ratio > worst_ratio) {
      worst_ratio = ratio;
      worst = largest[i];
      worst.node_need_bytes = nodes[i].memory_bytes;
      worst.node_capacity_bytes = nodes[i].memory_capacity_bytes;
    }
  }
}

// The data a run reads: the named dataset, or the job's own sample count and shape.
DatasetInfo run_data(const RunSpec& run, const std::optional<engine::nn::SampleShape>& input, int64_t classes) {
  DatasetInfo d;
  if (!run.dataset.empty()) {
    d = find_dataset(run.dataset);
  } else {
    TANDEM_REQUIRE(run.samples > 0 && input && classes > 0,
                   "job: without --dataset give --samples, --input CxHxW and --classes");
    d.name = "custom";
  }
  if (run.samples > 0) d.samples = run.samples;
  if (input) d.input = *input;
  if (classes > 0) d.classes = classes;
  return d;
}

std::optional<CalibrationProfile> run_profile(const RunSpec& run) {
  if (run.profile.empty()) return std::nullopt;
  return full_speed_profile(load_profile(run.profile));  // a quota's average taken out: nodes apply their own
}

ComputeModel compute_model(const Workload& w, const Preset& hw, const std::optional<CalibrationProfile>& profile,
                           const engine::optim::OptimizerConfig& optimizer) {
  return profile ? ComputeModel::from_profile(w, *profile) : ComputeModel::roofline(w, hw, optimizer_kind(optimizer));
}

// The figures of the strategies of issue #13 (see Prepared), from the DDP-like rank setups prepare() made.
void prepare_strategy(Prepared& p, PlanCache& plans) {
  const CompiledJob& cj = p.cj;
  const engine::parallel::SyncProgram& sync = cj.sync;
  const engine::parallel::ParallelConfig& c = cj.job.parallel;
  TANDEM_REQUIRE(cj.pp() == 1, "job: strategy {} is data parallel only (pp = 1)", strategy_name(c.strategy));
  if (sync.exchange == Exchange::kParamAverage || (sync.exchange == Exchange::kElastic && sync.servers == 0)) {
    // H local steps (compute and a local optimizer step each), then the parameters all-reduced bucket by bucket
    // after backward (no overlap: they are the updated parameters); the last local optimizer step is timed after
    // the average (the sum is the same); easgd adds its elastic update (one optimizer-like pass)
    StepSetup& ps = p.period;
    ps = p.setup;
    ps.overlap = false;
    ps.bucket_plans.assign(1, {});
    for (engine::comm::PlanRequest req : sync.average_allreduces) {
      for (int32_t d = 0; d < cj.dp(); ++d) req.topology.host_of.push_back(p.node_of_rank[d]);
      ps.bucket_plans[0].push_back(&plans.get(req));
    }
    const double H = sync.period;
    for (RankSetup& rs : ps.ranks) {
      double step = rs.optimizer_s;
      for (double f : rs.forward_s) step += f;
      for (double b : rs.backward_s) step += b;
      rs.forward_s.front() += (H - 1) * step;
      if (sync.exchange == Exchange::kElastic) rs.optimizer_s *= 2;
      rs.bucket_compress_s.clear();  // parameters are averaged in f32
      rs.decompress_s = 0;
    }
    return;
  }
  StrategySetup& st = p.strategy;
  st.sync = sync;
  st.ranks = p.setup.ranks;
  st.node_of_rank = p.setup.node_of_rank;  // the node CPU model and transfer CPU, as the DDP step's
  st.node_cpu = p.setup.node_cpu;
  st.host_of_rank = p.setup.host_of_rank;
  st.param_bytes = cj.stages.front().memory.param_bytes;
  st.seed = p.run.seed;  // gossip's matching and FedAvg's client draw, as the runtime seeds them
  st.compute_cv = p.compute_cv;
  // the joiner check's store round trip on worker 0's host: two TCP wake-ups (StrategySetup::join_check_s)
  if (sync.join_check_every > 0 && !st.ranks.empty()) st.join_check_s = 2.0 * st.ranks.front().net_cpu_s_per_wakeup;
  if (sync.exchange == Exchange::kRound) {
    st.clients = c.clients > 0 ? c.clients : sync.workers;
    st.client_fraction = c.client_fraction;
    st.sampled = static_cast<int32_t>(engine::parallel::sample_clients(st.clients, c.client_fraction, st.seed, 0).size());
    // The clients' shards as the runtime cuts them; Dirichlet skew over a class-balanced training set (the
    // simulator knows the class count, not the labels).
    engine::data::ClientShards shards;
    if (c.dirichlet_alpha > 0) {
      const int64_t classes = std::max<int64_t>(1, p.data.classes);
      std::vector<int32_t> labels(static_cast<size_t>(p.data.samples));
      for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int32_t>(static_cast<int64_t>(i) % classes);
      shards = engine::data::partition_dirichlet(labels, classes, st.clients, c.dirichlet_alpha, st.seed);
    } else {
      shards = engine::data::partition_iid(p.data.samples, st.clients, st.seed);
    }
    st.client_steps.clear();
    double samples = 0;
    for (const std::vector<int64_t>& shard : shards) {
      const auto n = static_cast<int64_t>(shard.size());
      int64_t batches = (n + cj.step_batch - 1) / cj.step_batch;
      if (p.run.limit_batches > 0) batches = std::min(batches, p.run.limit_batches);
      st.client_steps.push_back(static_cast<int64_t>(c.local_epochs) * batches);
      samples += static_cast<double>(c.local_epochs) * static_cast<double>(std::min(n, batches * cj.step_batch));
    }
    st.round_samples = shards.empty() ? 0 : samples * st.sampled / static_cast<double>(shards.size());
    st.deadline_s = c.round_deadline_s;
  }
}

Prepared prepare(const ClusterSpec& cluster_in, const CompiledJob& cj, const RunSpec& run, PlanCache& plans) {
  Prepared p;
  p.cluster = cluster_in;
  TANDEM_REQUIRE(!p.cluster.nodes.empty(), "cluster: no nodes");
  TANDEM_REQUIRE(cj.world <= p.cluster.endpoints(), "job: dp {} x pp {} = {} ranks but the cluster has {} devices",
                 cj.dp(), cj.pp(), cj.world, p.cluster.endpoints());
  p.cj = cj;
  p.run = run;
  const engine::nn::ModelSpec& spec = cj.job.model;
  p.data = run_data(run, run.input, run.classes);
  p.work = make_workload(spec);
  TANDEM_REQUIRE(p.work.input == p.data.input, "job: model {} takes {} inputs but the data has {}", p.work.model,
                 engine::nn::to_string(p.work.input), engine::nn::to_string(p.data.input));
  const int32_t L = static_cast<int32_t>(p.work.layers.size());
  // compute models
  const std::optional<CalibrationProfile> profile = run_profile(run);
  if (profile && profile->compute_cv) p.compute_cv = *profile->compute_cv;
  if (profile && run.profile_network) {
    TANDEM_REQUIRE(profile->p2p_bytes_per_s && *profile->p2p_bytes_per_s > 0,
                   "job.profile_network: profile {} has no p2p.bandwidth_bytes_per_s", run.profile);
    for (NodeSpec& n : p.cluster.nodes) {
      n.hw.nic_bytes_per_s = *profile->p2p_bytes_per_s;
      n.protocol = network::Protocol::kRdma;  // a measured payload rate: TCP's costs are in it already
      // (but not a simultaneous exchange's: tcp_two_way_factor, measured on the same TCP path, stays and applies)
      n.bucket_bytes_per_s = n.bucket_burst_bytes = 0;  // the NIC's FIFO queue (nic_queue_bytes) stays
      if (profile->p2p_latency_s) n.hw.nic_latency_s = *profile->p2p_latency_s;
    }
  }
  for (const NodeSpec& n : p.cluster.nodes) {
    // A profile times the device it was measured on: CPU figures on a GPU node (or the reverse) would
    // predict another machine. Refused, naming the way to measure the node's kind.
    if (profile && !profile->backend.empty() && (profile->backend.rfind("cuda", 0) == 0) != (n.hw.gpus > 0)) {
      TANDEM_THROW(Status::kInvalidArgument,
                   "profile {}: measured on the '{}' backend, but node {} ({}) is a {} node; calibrate one of its "
                   "kind (tandem calibrate --device {})",
                   run.profile, profile->backend, n.name, n.hw.name, n.hw.gpus > 0 ? "GPU" : "CPU",
                   n.hw.gpus > 0 ? "cuda" : "cpu");
    }
    Preset hw = n.hw;  // a rank's share of a CPU node's peak (the roofline; a profile is per rank already)
    if (hw.gpus == 0 && n.ranks_per_node > 1) {
      const double k = std::min<double>(n.ranks_per_node, hw.vcpus);
      hw.peak_flops /= k;
      hw.mem_bytes_per_s /= k;
    }
    p.models.push_back(compute_model(p.work, hw, profile, cj.job.optimizer));
  }
  const auto ceil_div = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  const int64_t batch = cj.step_batch;
  if (run.epoch_time_s > 0) {
    const ComputeModel& m0 = p.models[0];
    const double step = m0.forward_s(0, L, batch) + m0.backward_s(0, L, batch) + m0.optimizer_s(0, L);
    const double epoch = step * static_cast<double>(ceil_div(p.data.samples, batch));
    TANDEM_REQUIRE(epoch > 0, "job.epoch_time_s: the model has no compute to scale");
    p.scale = run.epoch_time_s / epoch;
    for (ComputeModel& m : p.models) m.set_scale(p.scale);
  }
  p.steps_per_epoch = ceil_div(p.data.samples, batch * cj.dp());
  TANDEM_REQUIRE(run.limit_batches >= 0, "job.limit_batches: must be >= 0 (0: whole epochs), got {}", run.limit_batches);
  // the trainer's --limit-batches ends each rank's epoch after that many batches (FedAvg: each client's local
  // epoch, in prepare_strategy)
  if (run.limit_batches > 0) p.steps_per_epoch = std::min(p.steps_per_epoch, run.limit_batches);
  // ranks and stages: the compiled job's plan, buckets and their all-reduce requests
  const int32_t world = cj.world;
  for (int32_t r = 0; r < world; ++r) p.node_of_rank.push_back(p.cluster.node_of_endpoint(r));
  const std::vector<int64_t>& mbs = cj.micro_batch_sizes;
  StepSetup& s = p.setup;
  s.pipeline = cj.pipeline;
  s.dp = cj.dp();
  s.pp = cj.pp();
  s.overlap = cj.job.overlap;
  s.comm_cycle_s = run.comm_cycle_ms * 1e-3;
  s.comm_negotiation_s = run.comm_negotiation_ms * 1e-3;
  s.host_staging_bytes_per_s = run.host_staging_gbps * 1e9 / 8;
  s.symmetric = run.symmetric;
  s.node_of_rank = p.node_of_rank;
  bool cpu_model = false;
  // Moving a message costs CPU on CPU nodes (the profile's tcp_cpu_s_per_byte, copy_cpu_s_per_byte,
  // tcp_cpu_s_per_wakeup; absent: 0; simulator/comm_cpu.hpp); a rank whose transfers cost CPU keeps two threads
  // busy, its training thread and its collectives'.
  const double tcp_cpu = profile && profile->tcp_cpu_s_per_byte ? *profile->tcp_cpu_s_per_byte : 0.0;
  const double copy_cpu = profile && profile->copy_cpu_s_per_byte ? *profile->copy_cpu_s_per_byte : 0.0;
  const double wake_cpu = profile && profile->tcp_cpu_s_per_wakeup ? *profile->tcp_cpu_s_per_wakeup : 0.0;
  const int32_t threads_per_rank = tcp_cpu > 0 || copy_cpu > 0 || wake_cpu > 0 ? 2 : 1;
  for (const NodeSpec& n : p.cluster.nodes) {
    CpuShare c;  // GPU nodes: their ranks drive GPUs, never modelled
    c.cores = n.hw.gpus > 0 ? n.ranks() : n.hw.vcpus;
    c.task_cores = n.hw.gpus > 0 ? 1.0 : std::min(c.cores, n.rank_cores());
    c.quota_cores = n.hw.gpus > 0 ? 0.0 : n.cpu_quota;
    // a quota yields what it yielded the calibrating host under its own (the profile's cpu_quota_sustained): less than
    // itself where that host's cores were oversubscribed
    if (profile && profile->quota_efficiency && c.quota_cores > 0) c.quota_cores *= *profile->quota_efficiency;
    c.period_s = n.cpu_period_s;
    if (profile && n.hw.gpus == 0) {  // measured on the calibrating host (compute/profile.hpp); absent: none
      c.corun = profile->corun_slowdown;
      c.wakeup_s = profile->wakeup_latency_s.value_or(0.0);
    }
    cpu_model = cpu_model || c.needs_model(n.ranks() * (n.hw.gpus > 0 ? 1 : threads_per_rank));
    s.node_cpu.push_back(c);
  }
  if (!cpu_model) s.node_of_rank.clear(), s.node_cpu.clear();  // the plain model is exact: keep it fast
  if (threads_per_rank > 1) s.host_of_rank = p.node_of_rank;
  for (double per_sample : cj.boundary_bytes_per_sample) {
    std::vector<double> v;
    for (int64_t n : mbs) v.push_back(per_sample * static_cast<double>(n));
    s.boundary_bytes.push_back(std::move(v));
  }
  s.bucket_plans.resize(static_cast<size_t>(cj.pp()));
  const engine::parallel::SyncProgram& sync = cj.sync;
  const bool ddp_step = sync.exchange == Exchange::kBucketAllreduce ||
                        (sync.exchange == Exchange::kParamAverage && sync.warmup_steps > 0);
  for (int32_t st = 0; st < cj.pp() && cj.dp() > 1 && ddp_step; ++st) {
    for (engine::comm::PlanRequest req : cj.stages[static_cast<size_t>(st)].bucket_allreduces) {
      for (int32_t d = 0; d < cj.dp(); ++d) req.topology.host_of.push_back(p.node_of_rank[d * cj.pp() + st]);
      s.bucket_plans[st].push_back(&plans.get(req));
    }
  }
  if (cj.job.loss_scaling && world > 1) {  // the found-non-finite flag's all-reduce over every rank
    engine::comm::PlanRequest req = cj.agree_finite;
    for (int32_t r = 0; r < world; ++r) req.topology.host_of.push_back(p.node_of_rank[r]);
    s.agree_plan = &plans.get(req);
  }
  for (int32_t r = 0; r < world; ++r) {
    const int32_t st = r % cj.pp();
    const auto& sp = cj.pipeline.stage_plans[st];
    const ComputeModel& m = p.models[p.node_of_rank[r]];
    const NodeSpec& node = p.cluster.nodes[p.node_of_rank[r]];
    RankSetup rs;
    // recomputation runs each segment's forward again inside backward (checkpoint layers included, as
    // checkpointed segments are re-run whole)
    const bool recompute = cj.job.memory.recompute != engine::parallel::Recompute::kNone;
    for (int64_t n : mbs) {
      const double fwd = m.forward_s(sp.first_layer, sp.end_layer, n);
      rs.forward_s.push_back(fwd);
      rs.backward_s.push_back(m.backward_s(sp.first_layer, sp.end_layer, n) + (recompute ? fwd : 0.0));
    }
    // the last backward op's micro-batch (GPipe: 0, 1F1B: M-1) sets the split; sizes differ by <= 1 sample
    const int64_t last_mb = sp.buckets.empty() ? mbs.back() : mbs[sp.ops[sp.last_backward_op].micro_batch];
    for (const auto& bk : sp.buckets)
      rs.bucket_backward_s.push_back(m.backward_s(bk.first_layer, bk.end_layer, last_mb) +
                                     (recompute ? m.forward_s(bk.first_layer, bk.end_layer, last_mb) : 0.0));
    rs.optimizer_s = m.optimizer_s(sp.first_layer, sp.end_layer);
    // The job's data path beyond the calibrated pass (the profile's step_overhead_cpu_s, per step of its batch):
    // paid by every rank that loads batches -- stage 0, a worker -- before its first forward, as compute on its node
    if (profile && profile->step_overhead_cpu_s && st == 0 && (sync.servers == 0 || r < sync.workers) &&
        !rs.forward_s.empty() && profile->batch > 0) {
      const int64_t samples = std::accumulate(mbs.begin(), mbs.end(), int64_t{0});
      rs.forward_s.front() += *profile->step_overhead_cpu_s * p.scale * static_cast<double>(samples) /
                              static_cast<double>(profile->batch);
    }
    rs.local_bytes_per_s = profile && profile->memory_bytes_per_s ? *profile->memory_bytes_per_s : node.hw.mem_bytes_per_s;
    if (node.hw.gpus == 0) {  // GPU ranks move their gradients with the GPU's engines, not the host's cores
      // RDMA: the NIC copies. The transport as described, not as --profile-network restates the link (a measured
      // payload rate, marked RDMA so that TCP's wire overheads are not counted twice): TCP still costs CPU.
      const bool tcp = cluster_in.nodes[static_cast<size_t>(p.node_of_rank[r])].protocol == network::Protocol::kTcp;
      rs.net_cpu_s_per_byte = tcp ? tcp_cpu : 0.0;
      rs.copy_cpu_s_per_byte = copy_cpu;
      // ranks outnumbering the node's cores sleep and are woken per message (simulator/comm_cpu.hpp)
      if (node.ranks() > node.hw.vcpus) rs.copy_cpu_s_per_message = wake_cpu;
      if (tcp && wake_cpu > 0) {
        rs.net_cpu_s_per_wakeup = wake_cpu;
        rs.net_pace_bytes_per_s =
            tcp_pace_bytes_per_s(node.hw.nic_bytes_per_s, node.tcp_goodput, node.bucket_bytes_per_s);
      }
    }
    if (cj.job.loss_scaling) {
      // unscale (read and write 4 bytes per gradient) and check (read 4): a pass over the stage's gradients at the
      // memory bandwidth -- the device's on a GPU, as the conversions below
      const double bytes = 12.0 * static_cast<double>(cj.job.model.totals(sp.first_layer, sp.end_layer).params);
      const double bw = node.hw.gpus > 0 ? node.hw.mem_bytes_per_s : rs.local_bytes_per_s;
      rs.unscale_s = bw > 0 ? bytes / bw : 0.0;
    }
    if (cj.converts()) {
      // a pass per bucket (read 4 bytes, write 2; back before the optimizer), bound by the memory
      // bandwidth or by the runtime's per-element conversion, whichever is slower. On a GPU the pass is a
      // kernel over device memory: the GPU's bandwidth bounds it, not the host's loops or the profile's host figures.
      const bool gpu = node.hw.gpus > 0;
      const ConvertCost cost = gpu ? ConvertCost{} : convert_cost(cj.job.parallel.compression, profile);
      const double bw = gpu ? node.hw.mem_bytes_per_s : rs.local_bytes_per_s;
      const double per_byte = bw > 0 ? 1.0 / bw : 0.0;
      double back = 0;
      for (const auto& bk : sp.buckets) {
        const double n = static_cast<double>(bk.bytes / 4);
        rs.bucket_compress_s.push_back(n * std::max(6.0 * per_byte, cost.to_s));
        back += n * std::max(6.0 * per_byte, cost.back_s);
      }
      rs.decompress_s = back;
    }
    s.ranks.push_back(std::move(rs));
  }
  if (sync.exchange != Exchange::kBucketAllreduce) prepare_strategy(p, plans);
  // memory and node reports
  for (const NodeSpec& n : p.cluster.nodes) p.runtime_bytes.push_back(runtime_allowance(n, profile, run.framework));
  p.base_speed.assign(p.cluster.nodes.size(), 1.0);
  for (size_t i = 0; i < p.cluster.nodes.size(); ++i) {
    const NodeSpec& n = p.cluster.nodes[i];
    NodeReport nr;
    nr.name = n.name;
    nr.preset = n.hw.name;
    nr.memory_capacity_bytes = n.hw.gpus > 0 ? n.hw.gpu_memory_bytes : n.hw.memory_bytes - n.hw.os_reserved_bytes;
    nr.runtime_bytes = p.runtime_bytes[i];
    p.nodes.push_back(nr);
  }
  node_memory(p.cj, p.node_of_rank, p.runtime_bytes, rank_data_bytes(p.cj, run, p.data), run.framework, profile,
              p.cluster, p.nodes, p.memory);
  for (size_t i = 0; i < p.nodes.size(); ++i) {
    NodeReport& nr = p.nodes[i];
    const NodeSpec& n = p.cluster.nodes[i];
    if (nr.ranks == 0 || nr.memory_bytes <= nr.memory_capacity_bytes) continue;
    if (n.hw.gpus == 0 && n.swap_bytes > 0 && nr.memory_bytes <= nr.memory_capacity_bytes + n.swap_bytes) {
      nr.swapping = true;
      p.base_speed[i] = 1.0 / n.swap_slowdown;
    } else {
      nr.fits = false;
    }
  }
  return p;
}

// Draws of a synchronous step with variable compute (see ddp_step): 32 for up to 8 ranks, fewer for more (the
// maximum over many ranks varies less from draw to draw), at least 2 -- a 1,024-rank step costs 2 executions.
int32_t compute_draws(size_t ranks) { return static_cast<int32_t>(std::clamp<size_t>(256 / std::max<size_t>(ranks, 1), 2, 32)); }

// a += b * k for every time of a rank's breakdown.
void add_breakdown(RankBreakdown& a, const RankBreakdown& b, double k) {
  a.finish_s += b.finish_s * k, a.compute_s += b.compute_s * k, a.throttled_s += b.throttled_s * k;
  a.comm_exposed_s += b.comm_exposed_s * k, a.bubble_s += b.bubble_s * k, a.idle_s += b.idle_s * k;
  a.staleness_wait_s += b.staleness_wait_s * k, a.cpu_busy_s += b.cpu_busy_s * k, a.comm_cpu_s += b.comm_cpu_s * k;
}

// One step of `setup` (`steps` local steps each, for a period of parameter averaging). Slow start after idle counts
// from each connection's last transfer, which in a steady run of steps is in the previous step: an execution long
// enough that its idle could pass an RTO (the 200 ms minimum) is run once more with its connections resumed from
// the first run's tails (Topology::connection_tails: the window each held and how long before the step's end it
// went idle). One iteration: the second run's own tails are not fed back. Where the profile gives the
// compute's pass-to-pass variability and several ranks meet at a barrier, a step waits for its slowest rank: the
// step is then the mean over compute_draws seeded draws, each with every rank's compute (forward and backward) times
// its own factor of mean 1 and CV compute_cv / sqrt(steps) (compute/step_noise.hpp); the trace is the first draw's.
StepResult ddp_step(const Prepared& p, const StepSetup& setup, const std::vector<double>& node_speed, bool trace,
                    double steps = 1) {
  const bool noisy = p.compute_cv > 0 && setup.ranks.size() > 1;
  using Tails = std::vector<network::Topology::ConnectionTail>;
  const auto run = [&](int32_t draw, const Tails* resume, Tails* tails) {
    des::Simulator sim;
    network::Network net(sim, p.cluster.sharing);
    network::Topology topo(p.cluster.topology, p.cluster.host_nets(), net);
    if (resume) topo.resume_connections(*resume);
    StepSetup s = setup;
    s.record_trace = trace && draw <= 0;
    for (size_t r = 0; r < s.ranks.size(); ++r) {
      RankSetup& rs = s.ranks[r];
      rs.speed = node_speed[p.node_of_rank[r]];
      if (!noisy) continue;
      const double f = compute_factor(p.compute_cv, p.run.seed, static_cast<int64_t>(r), draw, steps);
      for (double& t : rs.forward_s) t *= f;
      for (double& t : rs.backward_s) t *= f;
      for (double& t : rs.bucket_backward_s) t *= f;
    }
    StepResult r = simulate_step(s, topo, sim);
    if (tails && r.step_s > network::kTcpMinRtoS) *tails = topo.connection_tails(des::to_ns(r.step_s));
    return r;
  };
  const auto once = [&](int32_t draw) {
    Tails tails;
    StepResult first = run(draw, nullptr, &tails);
    if (tails.empty()) return first;
    StepResult second = run(draw, &tails, nullptr);
    second.events += first.events;
    second.flows += first.flows;
    return second;
  };
  if (!noisy) return once(-1);
  const int32_t draws = compute_draws(setup.ranks.size());
  StepResult mean = once(0);
  const double k = 1.0 / draws;
  mean.step_s *= k;
  for (RankBreakdown& b : mean.ranks) {
    RankBreakdown z;
    add_breakdown(z, b, k);
    b = z;
  }
  for (int32_t d = 1; d < draws; ++d) {
    const StepResult r = once(d);
    mean.step_s += r.step_s * k;
    for (size_t i = 0; i < mean.ranks.size(); ++i) add_breakdown(mean.ranks[i], r.ranks[i], k);
    mean.events += r.events;
    mean.flows += r.flows;
    mean.symmetric_used = mean.symmetric_used && r.symmetric_used;
  }
  return mean;
}

// Every time of `r` times k (a period's figures per step, or a share of a mix).
void scale_step(StepResult& r, double k) {
  r.step_s *= k;
  for (RankBreakdown& b : r.ranks) {
    b.finish_s *= k, b.compute_s *= k, b.throttled_s *= k, b.comm_exposed_s *= k, b.bubble_s *= k, b.idle_s *= k;
    b.staleness_wait_s *= k, b.cpu_busy_s *= k, b.comm_cpu_s *= k;
  }
}

// Parameter averaging: the period as one step, per step; localsgd's warmup steps of DDP mixed in by their share
// of the run's steps.
StepResult periodic_step(const Prepared& p, const std::vector<double>& node_speed, bool trace) {
  const int32_t H = p.cj.sync.period;
  StepResult r = ddp_step(p, p.period, node_speed, trace, H);
  r.window_steps = H;
  scale_step(r, 1.0 / H);
  const double total = static_cast<double>(p.steps_per_epoch) * p.run.epochs;
  const double warm = std::min<double>(p.cj.sync.warmup_steps, total);
  if (warm <= 0) return r;
  StepResult w = ddp_step(p, p.setup, node_speed, false);
  const double share = warm / total;
  scale_step(r, 1 - share);
  scale_step(w, share);
  r.step_s += w.step_s;
  for (size_t i = 0; i < r.ranks.size(); ++i) {
    RankBreakdown &a = r.ranks[i], &b = w.ranks[i];
    a.finish_s += b.finish_s, a.compute_s += b.compute_s, a.throttled_s += b.throttled_s, a.idle_s += b.idle_s;
    a.comm_exposed_s += b.comm_exposed_s, a.bubble_s += b.bubble_s, a.cpu_busy_s += b.cpu_busy_s;
    a.comm_cpu_s += b.comm_cpu_s;
  }
  r.events += w.events;
  r.flows += w.flows;
  return r;
}

// PyTorch DDP's buffer broadcast before every forward (broadcast.hpp): each stage's data-parallel group broadcasts
// the stage's buffers from its replica 0, and every rank's step starts that much later.
void add_buffer_broadcast(const Prepared& p, StepResult& st) {
  const CompiledJob& cj = p.cj;
  const int32_t dp = cj.dp(), pp = cj.pp();
  if (p.run.framework != Framework::kPytorchDdp || !p.run.broadcast_buffers || dp < 2) return;
  std::vector<BroadcastGroup> groups(static_cast<size_t>(pp));
  for (int32_t s = 0; s < pp; ++s) {
    groups[s].bytes = pytorch_buffer_bytes(cj.job.model, static_cast<size_t>(cj.boundaries.at(s)),
                                           static_cast<size_t>(cj.boundaries.at(s + 1)));
    for (int32_t d = 0; d < dp; ++d) groups[s].members.push_back(d * pp + s);
  }
  des::Simulator sim;
  network::Network net(sim, p.cluster.sharing);
  network::Topology topo(p.cluster.topology, p.cluster.host_nets(), net);
  const double b = simulate_tree_broadcast(topo, sim, groups);
  if (b <= 0) return;
  st.step_s += b;
  for (RankBreakdown& r : st.ranks) {
    r.finish_s += b;
    r.comm_exposed_s += b;
  }
  for (TraceSpan& t : st.trace) t.start_s += b, t.end_s += b;
  if (!st.trace.empty())
    for (int32_t r = 0; r < static_cast<int32_t>(st.ranks.size()); ++r)
      st.trace.push_back({r, 1, "broadcast buffers", "comm", 0.0, b});
  st.events += sim.events_processed();
  st.flows += net.flows_started();
}

StepResult run_step(const Prepared& p, const std::vector<double>& node_speed, bool trace) {
  const engine::parallel::SyncProgram& sync = p.cj.sync;
  if (sync.exchange == Exchange::kBucketAllreduce) {
    StepResult st = ddp_step(p, p.setup, node_speed, trace);
    add_buffer_broadcast(p, st);
    return st;
  }
  if (sync.exchange == Exchange::kParamAverage || (sync.exchange == Exchange::kElastic && sync.servers == 0))
    return periodic_step(p, node_speed, trace);
  des::Simulator sim;
  network::Network net(sim, p.cluster.sharing);
  network::Topology topo(p.cluster.topology, p.cluster.host_nets(), net);
  StrategySetup s = p.strategy;
  for (size_t r = 0; r < s.ranks.size(); ++r) s.ranks[r].speed = node_speed[p.node_of_rank[r]];
  return sync.exchange == Exchange::kRound ? simulate_rounds(s, topo, sim) : simulate_async_steps(s, topo, sim);
}

// The step with the nodes in `throttled` held to their credit baseline. A throttled CPU earns credits
// while it waits on the network and spends them bursting when it computes (AWS accounts at millisecond
// resolution), so what is held is its average use: work / step time = baseline share. Its speed s is the
// fixed point of s = W / (W / baseline - C), with W its CPU work at full speed and C the step's time not
// spent computing on it (both from the step at the previous s); s = baseline when it never waits.
StepResult throttled_step(const Prepared& p, const std::vector<bool>& throttled,
                          const std::vector<std::optional<CreditAccount>>& acct, bool trace) {
  const size_t N = p.cluster.nodes.size();
  std::vector<double> speed(N);
  bool any = false;
  for (size_t i = 0; i < N; ++i) {
    speed[i] = p.base_speed[i] * (throttled[i] ? acct[i]->baseline_speed() : 1.0);
    any = any || throttled[i];
  }
  StepResult st = run_step(p, speed, trace && !any);
  for (int iter = 0; any && iter < 8; ++iter) {
    double change = 0;
    for (size_t i = 0; i < N; ++i) {
      if (!throttled[i]) continue;
      double busy = 0;  // the node's CPU rank (a CPU node hosts one)
      for (size_t r = 0; r < st.ranks.size(); ++r)
        if (p.node_of_rank[r] == static_cast<int32_t>(i)) busy = std::max(busy, st.ranks[r].cpu_busy_s);
      const double work = busy * speed[i] / p.base_speed[i];
      const double other = st.step_s - busy;
      const double base = acct[i]->baseline_speed();
      double s = work / base > other ? work / (work / base - other) : 1.0;
      s = p.base_speed[i] * std::clamp(s, base, 1.0);
      change = std::max(change, std::abs(s - speed[i]) / speed[i]);
      speed[i] = s;
    }
    if (change < 1e-6) break;
    st = run_step(p, speed, false);
  }
  if (trace && any) st = run_step(p, speed, true);
  return st;
}

// The strategy's figures known before any step runs: its exchange and roles, fedavg's round accounting, notes.
void describe_strategy(SimResult& res, const Prepared& p) {
  const CompiledJob& cj = p.cj;
  const engine::parallel::SyncProgram& sync = cj.sync;
  res.exchange = engine::parallel::exchange_name(sync.exchange);
  res.workers = sync.workers;
  res.servers = sync.servers;
  if (sync.exchange == Exchange::kBucketAllreduce) return;
  const engine::parallel::ParallelConfig& c = cj.job.parallel;
  res.compression = "none";  // the strategies' pushes, pulls and averages travel as f32
  res.note = "figures are time per step (fedavg: per round), not time to accuracy: statistical efficiency "
             "(staleness, averaging period, client sampling) is not simulated";
  switch (sync.exchange) {
    case Exchange::kPushPull:
      res.algorithm = fmt::format("push-pull with {} server{} ({})", sync.servers, sync.servers == 1 ? "" : "s",
                                  sync.staleness == 0 ? "synchronous"
                                  : sync.staleness < 0 ? "asynchronous"
                                                       : fmt::format("staleness {}", sync.staleness));
      if (sync.replicas > 0)
        res.note += fmt::format("; server replication timed: {} backup(s) per shard, {:.3g} MB per server per update "
                                "of its shard{}", sync.replicas, sync.replica_bytes_per_update.front() / 1e6,
                                sync.staleness >= 0 ? ", each pull after the backups' acknowledgement" : "");
      if (sync.join_check_every > 0)
        res.note += fmt::format("; a joiner check every {} step(s): worker 0 reads the job's store (on its own host, "
                                "{:.3g} ms)", sync.join_check_every, p.strategy.join_check_s * 1e3);
      break;
    case Exchange::kElastic:
      res.algorithm = sync.servers > 0 ? fmt::format("elastic push-pull with {} server(s) every {} steps", sync.servers, sync.period)
                      : p.period.bucket_plans[0].empty() ? "none"
                                                         : fmt::format("elastic average every {} steps: {}", sync.period,
                                                                       p.period.bucket_plans[0][0]->description);
      break;
    case Exchange::kParamAverage:
      res.algorithm = p.period.bucket_plans[0].empty() ? "none"
                                                        : fmt::format("parameter average every {} steps{}: {}", sync.period,
                                                                      sync.warmup_steps > 0 ? fmt::format(" after {} DDP steps", sync.warmup_steps) : "",
                                                                      p.period.bucket_plans[0][0]->description);
      break;
    case Exchange::kGossip: res.algorithm = "pairwise gossip (full parameters with one peer per step)"; break;
    case Exchange::kRound: {
      const StrategySetup& st = p.strategy;
      res.algorithm = "fedavg: upload to rank 0, broadcast back";
      res.clients_sampled = st.sampled;
      // an epoch of the run is the compiled job's rounds_per_epoch rounds, as the trainer runs them
      res.steps_per_epoch = sync.rounds_per_epoch;
      res.total_steps = static_cast<double>(sync.rounds_per_epoch) * p.run.epochs;
      if (c.dirichlet_alpha > 0)
        res.note += fmt::format("; --dirichlet-alpha {}: client shards cut as the runtime cuts them, from a "
                                "class-balanced training set (a client's steps follow its shard)", c.dirichlet_alpha);
      break;
    }
    case Exchange::kBucketAllreduce: break;
  }
  if (sync.exchange == Exchange::kParamAverage || sync.exchange == Exchange::kElastic) {  // per step of a period
    res.allreduce_bytes_per_rank = 0;
    for (const CompiledPlan* plan : p.period.bucket_plans.empty() ? std::vector<const CompiledPlan*>{} : p.period.bucket_plans[0])
      res.allreduce_bytes_per_rank += static_cast<double>(plan->total_bytes_sent());
    res.allreduce_bytes_per_rank /= static_cast<double>(cj.world) * sync.period;
  }
}

// The busiest NIC of the first phase's step (see SimResult::busiest_nic).
void busiest_nic(SimResult& res, const StepResult& st) {
  if (st.nic_in_bytes.empty()) {  // all-reduces: the mean a rank sends per step
    res.busiest_nic_bytes = res.allreduce_bytes_per_rank;
    if (res.busiest_nic_bytes > 0) {
      res.busiest_nic_rank = 0;
      res.busiest_nic = fmt::format("every rank: {:.3g} MB sent per step (all-reduce)", res.busiest_nic_bytes / 1e6);
    }
    return;
  }
  for (size_t r = 0; r < st.nic_in_bytes.size(); ++r) {
    const double b = std::max(st.nic_in_bytes[r], st.nic_out_bytes[r]);
    if (b > res.busiest_nic_bytes) {
      res.busiest_nic_bytes = b;
      res.busiest_nic_rank = static_cast<int32_t>(r);
    }
  }
  if (res.busiest_nic_rank < 0) return;
  const auto r = static_cast<size_t>(res.busiest_nic_rank);
  const bool in = st.nic_in_bytes[r] >= st.nic_out_bytes[r];
  const bool server = res.busiest_nic_rank >= res.workers;
  const std::string who = server ? fmt::format("rank {} (server {})", r, res.busiest_nic_rank - res.workers)
                                 : fmt::format("rank {}", r);
  const char* per = res.exchange == "round" ? "round" : "step";
  std::string why;
  if (server || (res.exchange == "round" && r == 0))
    why = fmt::format(" ({} of {} workers)", in ? "incast" : "fan-out", res.exchange == "round" ? res.workers - 1 : res.workers);
  res.busiest_nic = fmt::format("{}: {:.3g} MB {} per {}{}", who, res.busiest_nic_bytes / 1e6, in ? "in" : "out", per, why);
}

}  // namespace

static std::string cpu_slowdown_causes(const ClusterSpec& cluster, const std::vector<NodeReport>& nodes) {
  bool credits = false;
  std::string quota, shared;
  for (size_t i = 0; i < cluster.nodes.size() && i < nodes.size(); ++i) {
    if (nodes[i].ranks == 0) continue;
    const NodeSpec& n = cluster.nodes[i];
    if (n.hw.gpus > 0) continue;
    credits = credits || n.credit_mode == CreditMode::kStandard;
    if (quota.empty() && n.cpu_quota > 0 && n.cpu_quota < static_cast<double>(n.hw.vcpus))
      quota = fmt::format("a CFS quota of {:g} core(s) on {} vCPU(s)", n.cpu_quota, n.hw.vcpus);
    if (shared.empty() && nodes[i].ranks > n.hw.vcpus)
      shared = fmt::format("{} ranks time-sliced on {} vCPU(s)", nodes[i].ranks, n.hw.vcpus);
  }
  std::string out = credits ? "CPU credits: throttled to the baseline share" : "";
  for (const std::string& s : {quota, shared})
    if (!s.empty()) out += (out.empty() ? "" : ", ") + s;
  return out;
}

std::string name_bottleneck(const SimResult& r) {
  if (!r.fits) {
    const MemoryBreakdown& b = r.memory;
    if (b.rank < 0) return "memory: the job does not fit on at least one node";
    const auto mib = [](double x) { return fmt::format("{:.0f} MiB", x / 1048576.0); };
    return fmt::format("memory: node {} needs {} of {} (rank {}: parameters {}, gradients {}, optimizer state {}, "
                       "activations {}, runtime {}, buffers {}, data sets {}, loader batches {})", b.node,
                       mib(b.node_need_bytes), mib(b.node_capacity_bytes), b.rank, mib(b.param_bytes),
                       mib(b.grad_bytes), mib(b.optimizer_bytes), mib(b.activation_bytes), mib(b.runtime_bytes),
                       mib(b.buffer_bytes), mib(b.data_bytes), mib(b.loader_bytes));
  }
  const std::pair<double, const char*> parts[] = {
      {r.compute_s, "compute"},
      {r.comm_exposed_s, "exposed communication (all-reduces not hidden by backward)"},
      {r.staleness_wait_s, "staleness waits (workers held by the bound on the slowest)"},
      {r.bubble_s, "pipeline bubble (stages waiting for their neighbours)"},
      {r.throttled_s, "CPU below full speed"},
      {r.idle_s, "idle ranks (unbalanced stages or replicas)"}};
  const auto* top = &parts[0];
  for (const auto& p : parts)
    if (p.first > top->first) top = &p;
  const double share = r.total_time_s > 0 ? top->first / r.total_time_s : 0;
  if (top == &parts[1] && r.exchange != "bucket-allreduce") {  // name the exchange and its busiest NIC
    const bool incast = r.servers > 0 && r.busiest_nic_rank >= r.workers;
    return fmt::format("exposed communication ({}{}; busiest NIC {}) ({:.0f}% of the run)", r.exchange,
                       incast ? ": server NIC incast" : "", r.busiest_nic, 100 * share);
  }
  if (top == &parts[4])  // name what slows the CPU: credits, a quota or ranks sharing cores
    return fmt::format("CPU below full speed ({}) ({:.0f}% of the run)",
                       r.cpu_slowdown.empty() ? "throttled" : r.cpu_slowdown, 100 * share);
  return fmt::format("{} ({:.0f}% of the run)", top->second, 100 * share);
}

std::string explain_scaling(const SimResult& r, const SimResult& one) {
  if (r.efficiency <= 1.0 + 1e-9) return {};
  std::string why;
  const bool one_swaps = !one.nodes.empty() && one.nodes.front().swapping;
  if (!one.fits) why = "one device cannot hold the job (memory), so its time is not a real baseline";
  else if (one_swaps) why = "one device swaps (it needs more memory than it has)";
  if (one.throttled_s > r.throttled_s * static_cast<double>(r.ranks) + 1e-9) {
    if (!why.empty()) why += "; ";
    why += fmt::format("one device runs out of CPU credits and is throttled for {:.0f} s of its {:.0f} s, while the "
                       "cluster spreads the work over more credits", one.throttled_s, one.total_time_s);
  }
  if (why.empty()) why = "the per-device batch fits caches better than the whole batch on one device";
  return fmt::format("super-linear ({:.0f}% efficiency): {}", 100 * r.efficiency, why);
}

double speedup_against(const SimResult& r, const SimResult& one) {
  if (!(r.total_time_s > 0)) return 0;
  const double ratio = one.total_time_s / r.total_time_s;
  // images_per_sec counts what the run trained (fedavg: the sampled clients' samples, local_epochs times)
  if (r.exchange != "round" || !(one.images_per_sec > 0) || !(one.total_time_s > 0)) return ratio;
  return r.images_per_sec / one.images_per_sec;
}

CompiledJob Simulation::compile(const ClusterSpec& cluster, const JobSpec& job) {
  const int32_t world = ranks_for(job, cluster.endpoints());
  const DatasetInfo data = run_data(job, job.input, job.classes);
  engine::parallel::Job e = engine_job(job, data.input, data.classes);
  e.train_samples = data.samples;  // the epoch's set, as the trainer's sampler cuts it: does it end with a short batch
  e.limit_batches = job.limit_batches;
  // A measured cut balances the compute model's per-layer times of the first node kind, as the trainer balances
  // the times it measures on rank 0.
  const engine::parallel::LayerCostFn measured = [&] {
    const Workload w = make_workload(e.model);
    const ComputeModel m = compute_model(w, cluster.nodes.at(0).hw, run_profile(job), e.optimizer);
    const int64_t mb = engine::parallel::micro_batch_sizes(e.batch, e.parallel.micro_batches).front();
    std::vector<double> cost;
    for (size_t i = 0; i < w.layers.size(); ++i) cost.push_back(m.forward_s(i, i + 1, mb) + m.backward_s(i, i + 1, mb));
    return cost;
  };
  try {
    return engine::parallel::compile_job(e, world, measured);  // a copy: `measured` reads e
  } catch (const Error& err) {
    if (err.status() != Status::kInvalidArgument) throw;
    TANDEM_THROW(Status::kInvalidArgument, "job: {}", err.what());
  }
}

SimResult Simulation::run(const ClusterSpec& cluster, const JobSpec& job, const SimOptions& opt) {
  SimResult r = run(cluster, compile(cluster, job), job, opt);
  if (!r.fits && opt.advise) r.memory_advice = memory_advice(cluster, job);
  return r;
}

namespace {

// Whether `job` fits on every node of `cluster` (swap counts, as in the run), from the compiled job alone. A
// description the job compiler rejects (more micro-batches than samples, ...) does not fit.
bool fits_memory(Simulation& sim, const ClusterSpec& cluster, const JobSpec& job) {
  CompiledJob cj;
  try {
    cj = sim.compile(cluster, job);
  } catch (const Error&) {
    return false;
  }
  const std::optional<CalibrationProfile> profile = run_profile(job);
  std::vector<int32_t> node_of_rank;
  for (int32_t r = 0; r < cj.world; ++r) node_of_rank.push_back(cluster.node_of_endpoint(r));
  std::vector<double> runtime;
  std::vector<NodeReport> nodes(cluster.nodes.size());
  for (size_t i = 0; i < cluster.nodes.size(); ++i) {
    const NodeSpec& n = cluster.nodes[i];
    runtime.push_back(runtime_allowance(n, profile, job.framework));
    nodes[i].memory_capacity_bytes = n.hw.gpus > 0 ? n.hw.gpu_memory_bytes : n.hw.memory_bytes - n.hw.os_reserved_bytes;
  }
  MemoryBreakdown worst;
  node_memory(cj, node_of_rank, runtime, rank_data_bytes(cj, job, run_data(job, job.input, job.classes)), job.framework,
              profile, cluster, nodes, worst);
  for (size_t i = 0; i < nodes.size(); ++i) {
    const double swap = cluster.nodes[i].hw.gpus == 0 ? cluster.nodes[i].swap_bytes : 0.0;
    if (nodes[i].ranks > 0 && nodes[i].memory_bytes > nodes[i].memory_capacity_bytes + swap) return false;
  }
  return true;
}

}  // namespace

std::string memory_advice(const ClusterSpec& cluster, const JobSpec& job) {
  using engine::parallel::Precision;
  using engine::parallel::Recompute;
  Simulation sim;
  if (fits_memory(sim, cluster, job)) return "";
  const engine::parallel::MemoryConfig& m = job.memory;
  struct Change {
    std::string flags;
    bool precision;
    int32_t recompute;  // 0: keep, -1: stage inputs, k: every k-th output
    int32_t zero;
  };
  // smallest first: one option, then two, then three (one stage keeps as much with stage inputs as without: every
  // 2nd output is what helps it)
  const Change changes[] = {{"--recompute stage", false, -1, 0}, {"--recompute 2", false, 2, 0},
                            {"", true, 0, 0},                    {"--zero 1", false, 0, 1},
                            {"--zero 2", false, 0, 2},           {"--recompute stage", true, -1, 0},
                            {"--recompute 2", true, 2, 0},       {"--zero 2", true, 0, 2},
                            {"--zero 2 --recompute 2", true, 2, 2}};
  // 16-bit mixed precision as the devices compute it: bf16, or fp16 where a GPU used has no bf16 (T4, V100); the
  // memory is the same, fp16 adds loss scaling
  bool bf16 = true;
  for (const NodeSpec& n : cluster.nodes) bf16 = bf16 && (n.hw.gpus == 0 || n.hw.bf16);
  const Precision half = bf16 ? Precision::kBF16 : Precision::kF16;
  const std::string half_flag = bf16 ? "--precision bf16" : "--precision fp16";
  std::string option;
  for (const Change& c : changes) {
    JobSpec j = job;
    if (c.precision && m.precision == Precision::kF32) j.memory.precision = half;
    if (c.recompute != 0 && m.recompute == Recompute::kNone) {
      j.memory.recompute = c.recompute < 0 ? Recompute::kStageInputs : Recompute::kEveryK;
      j.memory.recompute_every = std::max(c.recompute, 0);
    }
    j.memory.zero = std::max(m.zero, c.zero);
    if (j.memory.precision == m.precision && j.memory.recompute == m.recompute && j.memory.zero == m.zero) continue;
    if (fits_memory(sim, cluster, j)) {
      option = "fits with " + (c.precision ? half_flag + (c.flags.empty() ? "" : " ") : std::string()) + c.flags;
      break;
    }
  }
  // the largest batch that fits with the job's own options (fitting is monotone in the batch)
  int64_t lo = 0, hi = job.batch;  // lo fits (0: none found), hi does not
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    JobSpec j = job;
    j.batch = mid;
    (fits_memory(sim, cluster, j) ? lo : hi) = mid;
  }
  const std::string batch = lo > 0 ? fmt::format("fits with --batch <= {}", lo) : "";
  if (!option.empty() && !batch.empty()) return option + "; or " + batch + " as it is";
  if (!option.empty() || !batch.empty()) return option + batch;
  return "no single change fits (tried recomputation, 16-bit mixed precision, ZeRO 1/2 and batch 1): more memory per "
         "node or more nodes are needed";
}

SimResult Simulation::run(const ClusterSpec& cluster, const CompiledJob& cj, const RunSpec& run_spec,
                          const SimOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  Prepared p = prepare(cluster, cj, run_spec, plans_);
  const RunSpec& job = p.run;
  const int32_t world = cj.world;
  const size_t N = p.cluster.nodes.size();
  SimResult res;
  res.cluster = p.cluster.describe();
  res.model = p.work.model;
  res.dataset = p.data.name;
  res.strategy = strategy_name(cj.job.parallel.strategy);
  res.schedule = engine::parallel::schedule_name(cj.job.parallel.schedule);
  res.algorithm = cj.dp() > 1 && !p.setup.bucket_plans.empty() && !p.setup.bucket_plans[0].empty()
                      ? p.setup.bucket_plans[0][0]->description
                      : "none";
  res.optimizer = optimizer_name(optimizer_kind(cj.job.optimizer));
  res.compression = cj.dp() > 1 ? engine::parallel::compression_name(cj.job.parallel.compression) : "none";
  res.compute_source = p.models[0].source();
  res.compute_scale = p.scale;
  res.dp = cj.dp();
  res.pp = cj.pp();
  res.micro_batches = cj.step_micro_batches;
  res.ranks = world;
  res.batch = cj.step_batch;
  res.global_batch = cj.step_batch * cj.dp();
  res.samples = p.data.samples;
  res.epochs = job.epochs;
  res.steps_per_epoch = p.steps_per_epoch;
  res.total_steps = static_cast<double>(p.steps_per_epoch) * job.epochs;
  res.stage_boundaries = cj.boundaries;
  for (const auto& stage : p.setup.bucket_plans)
    for (const CompiledPlan* plan : stage) res.allreduce_bytes_per_rank += static_cast<double>(plan->total_bytes_sent());
  res.allreduce_bytes_per_rank /= world;
  res.job = std::make_shared<const CompiledJob>(cj);
  describe_strategy(res, p);

  // credit accounts of the used burstable nodes
  std::vector<std::optional<CreditAccount>> acct(N);
  for (size_t i = 0; i < N; ++i) {
    const NodeSpec& n = p.cluster.nodes[i];
    if (p.nodes[i].ranks == 0 || n.hw.burst.default_mode == CreditMode::kNone) continue;
    CreditMode mode = job.credit_mode.value_or(n.credit_mode);
    std::optional<double> init = job.initial_credits ? job.initial_credits : n.initial_credits;
    acct[i].emplace(n.hw.burst, n.hw.vcpus, mode, init.value_or(-1));
    p.nodes[i].credits_start = acct[i]->balance();
  }
  std::vector<bool> throttled(N, false);
  std::map<std::vector<bool>, StepResult> steps;
  double remaining = res.total_steps, t = 0;
  std::vector<double> rank_totals(6 * world, 0.0);  // compute, throttled, comm, bubble, idle, staleness per rank
  for (size_t guard = 0; remaining > 1e-9 && guard < N + 2; ++guard) {
    auto it = steps.find(throttled);
    if (it == steps.end())
      it = steps.emplace(throttled, throttled_step(p, throttled, acct, opt.trace && steps.empty())).first;
    const StepResult& st = it->second;
    const double T = st.step_s;
    TANDEM_CHECK(T > 0, Status::kInternal, "simulated step took no time (model without compute?)");
    std::vector<double> usage(N, 0.0);
    for (int32_t r = 0; r < world; ++r) {
      const int32_t n = p.node_of_rank[r];
      usage[n] += std::min(1.0, st.ranks[r].cpu_busy_s / T);
    }
    double dt = remaining * T;
    std::vector<double> empty_at(N, std::numeric_limits<double>::infinity());
    for (size_t i = 0; i < N; ++i) {
      if (!acct[i]) continue;
      usage[i] = std::min(usage[i], 1.0) * p.cluster.nodes[i].hw.vcpus;
      if (acct[i]->mode() == CreditMode::kStandard && !throttled[i]) {
        empty_at[i] = acct[i]->seconds_until_empty(usage[i]);
        dt = std::min(dt, empty_at[i]);
      }
    }
    for (size_t i = 0; i < N; ++i) {
      if (!acct[i] || throttled[i]) continue;  // a throttled CPU spends what it earns: balance stays 0
      acct[i]->advance(dt, usage[i]);
    }
    const double steps_here = dt / T;
    PhaseReport ph;
    ph.start_s = t;
    ph.duration_s = dt;
    ph.steps = steps_here;
    ph.step_s = T;
    for (size_t i = 0; i < N; ++i)
      if (throttled[i]) ph.throttled_nodes.push_back(static_cast<int32_t>(i));
    if (res.phases.empty()) {
      res.step_time_s = T;
      res.rank_step = st.ranks;
      res.window_steps = st.window_steps;
      res.rounds = st.rounds;
      busiest_nic(res, st);
      res.trace = st.trace;
      res.symmetric_used = st.symmetric_used;
      for (size_t i = 0; i < N; ++i) p.nodes[i].cpu_utilization = acct[i] ? usage[i] / p.cluster.nodes[i].hw.vcpus : 0;
    }
    res.events += st.events;
    res.flows += st.flows;
    for (int32_t r = 0; r < world; ++r) {
      const RankBreakdown& b = st.ranks[r];
      rank_totals[6 * r + 0] += b.compute_s * steps_here;
      rank_totals[6 * r + 1] += b.throttled_s * steps_here;
      rank_totals[6 * r + 2] += b.comm_exposed_s * steps_here;
      rank_totals[6 * r + 3] += b.bubble_s * steps_here;
      rank_totals[6 * r + 4] += b.idle_s * steps_here;
      rank_totals[6 * r + 5] += b.staleness_wait_s * steps_here;
    }
    if (dt > 0 || res.phases.empty()) res.phases.push_back(ph);
    t += dt;
    remaining -= steps_here;
    for (size_t i = 0; i < N; ++i) {
      if (empty_at[i] <= dt && !throttled[i]) {
        throttled[i] = true;
        p.nodes[i].throttle_start_s = t;
      }
    }
  }
  res.total_time_s = t;
  res.epoch_time_s = t / job.epochs;
  // fedavg: a round trains its sampled clients' samples (local_epochs times), not the whole set
  const double epoch_samples = cj.sync.exchange == Exchange::kRound
                                   ? p.strategy.round_samples * cj.sync.rounds_per_epoch
                                   : static_cast<double>(p.data.samples);
  res.images_per_sec = epoch_samples * job.epochs / t;
  for (int32_t r = 0; r < world; ++r) {
    res.compute_s += rank_totals[6 * r + 0] / world;
    res.throttled_s += rank_totals[6 * r + 1] / world;
    res.comm_exposed_s += rank_totals[6 * r + 2] / world;
    res.bubble_s += rank_totals[6 * r + 3] / world;
    res.idle_s += rank_totals[6 * r + 4] / world;
    res.staleness_wait_s += rank_totals[6 * r + 5] / world;
  }
  for (size_t i = 0; i < N; ++i) {
    NodeReport& nr = p.nodes[i];
    if (acct[i]) {
      nr.credits_end = acct[i]->balance();
      nr.surplus_usd = acct[i]->surplus_usd();
      res.surplus_usd += nr.surplus_usd;
    }
    if (nr.ranks == 0) continue;
    ++res.nodes_used;
    res.cost_usd += p.cluster.nodes[i].hw.usd_per_hour * t / 3600.0 + nr.surplus_usd;
    res.memory_per_node_bytes = std::max(res.memory_per_node_bytes, nr.memory_bytes);
    res.fits = res.fits && nr.fits;
  }
  res.memory = p.memory;
  res.nodes_used -= 1;  // counted from 1
  res.cpu_slowdown = cpu_slowdown_causes(p.cluster, p.nodes);
  res.nodes = p.nodes;
  if (res.exchange == "round" && !res.rounds.empty()) {
    for (const RoundReport& rr : res.rounds) {
      res.clients_counted += rr.counted;
      res.clients_dropped += rr.dropped;
    }
    res.clients_counted /= static_cast<double>(res.rounds.size());
    res.clients_dropped /= static_cast<double>(res.rounds.size());
    res.round_time_s = res.step_time_s;
  }
  res.bottleneck = name_bottleneck(res);
  if (opt.baseline) {
    SimResult b = baseline(p.cluster, cj, run_spec);
    res.baseline_total_time_s = b.total_time_s;
    res.speedup = speedup_against(res, b);
    res.efficiency = res.speedup / world;
    res.scaling_note = explain_scaling(res, b);
  }
  res.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

SimResult Simulation::baseline(const ClusterSpec& cluster, const JobSpec& job) {
  return baseline(cluster, compile(cluster, job), job);
}

SimResult Simulation::baseline(const ClusterSpec& cluster, const CompiledJob& cj, const RunSpec& run_spec) {
  ClusterSpec one = cluster;
  one.nodes.assign(1, cluster.nodes.at(0));
  one.nodes[0].hw.gpus = std::min(one.nodes[0].hw.gpus, 1);
  one.topology = network::TopologySpec{};
  engine::parallel::Job single = cj.job;
  single.batch = cj.step_batch;
  single.parallel.strategy = Strategy::kSingle;
  single.parallel.dp = single.parallel.pp = 0;
  single.parallel.micro_batches = 1;
  single.parallel.accumulation = 1;
  single.parallel.boundaries.clear();
  // one process: nothing to replicate, no membership to keep (a job with server replicas or elastic settings was
  // refused here before)
  single.parallel.server_replicas = 0;
  single.parallel.staleness_lr = engine::parallel::StalenessLr::kNone;  // no pushes, stale or not
  single.parallel.elastic = false;
  single.parallel.max_ranks = 0;
  SimOptions o;
  o.baseline = false;
  return run(one, engine::parallel::compile_job(std::move(single), 1), run_spec, o);
}

SimResult simulate(const ClusterSpec& cluster, const JobSpec& job, const SimOptions& options) {
  Simulation s;
  return s.run(cluster, job, options);
}

SimResult simulate(const ClusterSpec& cluster, const CompiledJob& job, const RunSpec& run, const SimOptions& options) {
  Simulation s;
  return s.run(cluster, job, run, options);
}

nlohmann::json SimResult::to_json() const {
  nlohmann::json j = {
      {"cluster", cluster}, {"model", model}, {"dataset", dataset}, {"strategy", strategy}, {"dp", dp}, {"pp", pp},
      {"micro_batches", micro_batches}, {"schedule", schedule}, {"allreduce", algorithm}, {"compression", compression}, {"optimizer", optimizer},
      {"ranks", ranks}, {"nodes_used", nodes_used}, {"batch", batch}, {"global_batch", global_batch},
      {"samples", samples}, {"epochs", epochs}, {"steps_per_epoch", steps_per_epoch}, {"total_steps", total_steps},
      {"step_time_s", step_time_s}, {"epoch_time_s", epoch_time_s}, {"total_time_s", total_time_s},
      {"images_per_sec", images_per_sec}, {"speedup", speedup}, {"efficiency", efficiency},
      {"baseline_total_time_s", baseline_total_time_s}, {"compute_s", compute_s},
      {"comm_exposed_s", comm_exposed_s}, {"bubble_s", bubble_s}, {"throttled_s", throttled_s}, {"idle_s", idle_s},
      {"memory_per_node_bytes", memory_per_node_bytes}, {"allreduce_bytes_per_rank", allreduce_bytes_per_rank}, {"fits", fits}, {"cost_usd", cost_usd},
      {"surplus_usd", surplus_usd}, {"compute_source", compute_source}, {"compute_scale", compute_scale},
      {"stage_boundaries", stage_boundaries}, {"events", events}, {"flows", flows},
      {"symmetric_execution", symmetric_used}, {"sim_wall_s", wall_s},
      {"bottleneck", bottleneck}, {"cpu_slowdown", cpu_slowdown}, {"scaling_note", scaling_note}, {"exchange", exchange}, {"workers", workers},
      {"servers", servers}, {"window_steps", window_steps}, {"staleness_wait_s", staleness_wait_s},
      {"busiest_nic_bytes", busiest_nic_bytes}, {"busiest_nic_rank", busiest_nic_rank}, {"busiest_nic", busiest_nic},
      {"note", note}, {"memory_advice", memory_advice},
      {"memory_breakdown", {{"node", memory.node}, {"rank", memory.rank}, {"param_bytes", memory.param_bytes},
                            {"grad_bytes", memory.grad_bytes}, {"optimizer_bytes", memory.optimizer_bytes},
                            {"activation_bytes", memory.activation_bytes}, {"runtime_bytes", memory.runtime_bytes},
                            {"buffer_bytes", memory.buffer_bytes}, {"data_bytes", memory.data_bytes},
                            {"loader_bytes", memory.loader_bytes}}}};
  if (exchange == "round") {
    j["round_time_s"] = round_time_s;
    j["clients_sampled"] = clients_sampled;
    j["clients_counted"] = clients_counted;
    j["clients_dropped"] = clients_dropped;
    j["rounds"] = nlohmann::json::array();
    for (const RoundReport& rr : rounds)
      j["rounds"].push_back({{"start_s", rr.start_s}, {"time_s", rr.time_s}, {"sampled", rr.sampled},
                             {"counted", rr.counted}, {"dropped", rr.dropped}});
  }
  j["nodes"] = nlohmann::json::array();
  for (const NodeReport& n : nodes) {
    nlohmann::json nj = {{"name", n.name},
                         {"preset", n.preset},
                         {"ranks", n.ranks},
                         {"memory_bytes", n.memory_bytes},
                         {"memory_capacity_bytes", n.memory_capacity_bytes},
                         {"runtime_bytes", n.runtime_bytes},
                         {"fits", n.fits},
                         {"swapping", n.swapping},
                         {"cpu_utilization", n.cpu_utilization},
                         {"credits_start", n.credits_start},
                         {"credits_end", n.credits_end},
                         {"surplus_usd", n.surplus_usd}};
    nj["throttle_start_s"] = n.throttle_start_s ? nlohmann::json(*n.throttle_start_s) : nlohmann::json(nullptr);
    j["nodes"].push_back(std::move(nj));
  }
  j["phases"] = nlohmann::json::array();
  for (const PhaseReport& ph : phases)
    j["phases"].push_back({{"start_s", ph.start_s},
                           {"duration_s", ph.duration_s},
                           {"steps", ph.steps},
                           {"step_s", ph.step_s},
                           {"throttled_nodes", ph.throttled_nodes}});
  j["step_ranks"] = nlohmann::json::array();
  for (const RankBreakdown& b : rank_step)
    j["step_ranks"].push_back({{"finish_s", b.finish_s},
                               {"compute_s", b.compute_s},
                               {"throttled_s", b.throttled_s},
                               {"comm_exposed_s", b.comm_exposed_s},
                               {"bubble_s", b.bubble_s},
                               {"idle_s", b.idle_s},
                               {"staleness_wait_s", b.staleness_wait_s}});
  return j;
}

}  // namespace tandem::simulator
