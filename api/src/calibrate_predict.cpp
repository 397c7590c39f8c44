// C shim: tandem_trainer_predict -- the simulator's prediction for the job a trainer runs, beside what the
// trainer measured.
#include <cmath>
#include <cstring>
#include <algorithm>
#include <limits>

#include "api/src/calibrate_handles.hpp"
#include "api/src/guard.hpp"
#include "api/src/train_handles.hpp"
#include "engine/core/host_info.hpp"
#include "engine/nn/model_spec.hpp"
#include "simulator/cluster.hpp"
#include "simulator/simulate.hpp"

using tandem::Status;
using tandem::api::checked;
using tandem::api::guarded;
namespace par = tandem::engine::parallel;
namespace sim = tandem::simulator;

static_assert(offsetof(tandem_predict_params_t, field_mask) == 0);

namespace {

double rel_error(double predicted, double measured) {
  return measured > 0 ? (predicted - measured) / measured : std::numeric_limits<double>::quiet_NaN();
}

}  // namespace

extern "C" {

TANDEM_API tandem_status_t tandem_trainer_predict(tandem_trainer_t* trainer, const tandem_predict_params_t* params,
                                                  tandem_prediction_t* out, char* json,
                                                  size_t* json_bytes) TANDEM_NOEXCEPT {
  return guarded([&] {
    constexpr const char* fn = "tandem_trainer_predict";
    auto& h = checked(trainer, "trainer");
    TANDEM_REQUIRE(out != nullptr, "{}: out must be non-null", fn);
    TANDEM_REQUIRE(params != nullptr, "{}: params must be non-null (the cluster is required)", fn);
    TANDEM_REQUIRE(json == nullptr || (json_bytes != nullptr && *json_bytes > 0),
                   "{}: json given without a capacity in json_bytes", fn);
    const uint64_t m = params->field_mask;
    constexpr uint64_t kKnownPrediction = (TANDEM_PREDICTION_JOB << 1) - 1;
    TANDEM_CHECK((out->field_mask & ~kKnownPrediction) == 0, Status::kUnsupported,
                 "tandem_prediction_t: unknown field_mask bits 0x{:x}", out->field_mask & ~kKnownPrediction);
    TANDEM_CHECK((m & ~((TANDEM_PREDICT_PARAM_MEASURED << 1) - 1)) == 0, Status::kUnsupported,
                 "{}: unknown field_mask bits 0x{:x}", fn, m & ~((TANDEM_PREDICT_PARAM_MEASURED << 1) - 1));
    TANDEM_REQUIRE((m & TANDEM_PREDICT_PARAM_CLUSTER) && params->cluster != nullptr && *params->cluster != '\0',
                   "{}: params.cluster is required (a preset like \"t2.micro:4\", a JSON file or JSON text)", fn);

    const tandem::engine::train::TrainerConfig& cfg = h.trainer->config();
    par::ParallelTrainer* pt = h.trainer->parallel();
    tandem_prediction_t r{};  // filled whole here, copied out by group
    // ---- measured ----
    if (pt != nullptr && !(m & TANDEM_PREDICT_PARAM_MEASURED)) {
      const par::EpochSplit& s = pt->last_split();
      TANDEM_REQUIRE(s.steps > 0, "{}: the trainer has not trained an epoch yet (call tandem_trainer_epoch first)", fn);
      r.steps = s.steps;
      r.measured_step_s = s.step_s;
      r.measured_compute_s = s.compute_s;
      r.measured_comm_s = s.comm_s;
      r.measured_bubble_s = s.bubble_s;
    } else {
      TANDEM_REQUIRE((m & TANDEM_PREDICT_PARAM_MEASURED) && params->measured_step_s > 0 && params->measured_steps > 0,
                     "{}: a single-process trainer keeps no time split; pass measured_step_s and measured_steps "
                     "(TANDEM_PREDICT_PARAM_MEASURED)",
                     fn);
      r.steps = params->measured_steps;
      r.measured_step_s = params->measured_step_s;
      r.measured_compute_s = params->measured_step_s;  // one process: all of it is compute (and data loading)
    }
    // A GPU rank's prediction is of its device memory: measured by the driver's per-process count when it gives one.
    r.measured_memory_bytes = h.epoch_device_bytes > 0   ? h.epoch_device_bytes
                              : h.epoch_peak_rss_bytes > 0 ? h.epoch_peak_rss_bytes
                                                           : tandem::api::peak_rss_bytes();

    // ---- the trainer's own compiled job, timed by the simulator ----
    par::CompiledJob single;
    if (pt != nullptr) {
      const par::Grid& g = pt->grid();
      r.rank = g.rank;
      r.world = g.world;
      r.dp = g.dp;
      r.pp = g.pp;
      r.micro_batches = pt->parallel_config().micro_batches;
      r.strategy = par::strategy_name(pt->parallel_config().strategy);
    } else {
      par::Job job;
      job.model = h.model->spec;
      job.batch = cfg.batch_size;
      job.optimizer = cfg.optimizer;
      job.prefetch = cfg.prefetch;
      job.train_samples = h.train_samples;  // whether its epoch ends with a short batch, as the trainer's loader cuts it
      job.limit_batches = cfg.limit_batches;
      single = par::compile_job(std::move(job), 1);
      r.world = r.dp = r.pp = r.micro_batches = 1;
      r.strategy = "single";
    }
    const par::CompiledJob& job = pt != nullptr ? pt->job() : single;
    sim::RunSpec run;
    run.dataset = "";
    run.input = job.job.model.input;
    run.classes = job.job.model.num_classes();
    run.samples = std::max<int64_t>(1, r.steps * job.step_batch * job.dp());  // the measured epoch, so its steps match
    run.seed = cfg.seed;
    if (pt != nullptr && job.sync.exchange == par::Exchange::kRound) {
      // A FedAvg "step" is a round: every sampled client trains on its own shard of the whole training set.
      run.samples = pt->train_samples();
      run.limit_batches = cfg.limit_batches;
    }
    run.epochs = 1;
    run.data_bytes = h.data_bytes;  // the sets this trainer holds, as the simulator counts them
    if (m & TANDEM_PREDICT_PARAM_PROFILE) {
      TANDEM_REQUIRE(params->profile != nullptr && *params->profile != '\0', "{}: profile flagged but empty", fn);
      run.profile = params->profile;
      run.profile_network = params->profile_network != 0;
    }
    const sim::ClusterSpec cluster = sim::parse_cluster(params->cluster);
    sim::SimOptions opt;
    opt.baseline = false;
    const sim::SimResult res = sim::simulate(cluster, job, run, opt);

    // ---- predicted: the first (full-speed) phase's step, per rank means ----
    r.predicted_step_s = res.step_time_s;
    if (!res.rank_step.empty()) {
      const double n = static_cast<double>(res.rank_step.size());
      for (const sim::RankBreakdown& b : res.rank_step) {
        r.predicted_compute_s += b.compute_s / n;
        r.predicted_comm_s += b.comm_exposed_s / n;
        r.predicted_bubble_s += b.bubble_s / n;
      }
    }
    const int32_t node = r.rank < cluster.endpoints() ? cluster.node_of_endpoint(r.rank) : 0;
    if (node >= 0 && static_cast<size_t>(node) < res.nodes.size()) {
      r.predicted_memory_bytes = res.nodes[static_cast<size_t>(node)].memory_bytes;
      r.predicted_memory_capacity_bytes = res.nodes[static_cast<size_t>(node)].memory_capacity_bytes;
      r.predicted_fits = res.nodes[static_cast<size_t>(node)].fits ? 1 : 0;
    } else {
      r.predicted_memory_bytes = res.memory_per_node_bytes;
      r.predicted_fits = res.fits ? 1 : 0;
    }
    r.compute_source = res.compute_source == "profile" ? "profile" : "roofline";
    r.same_cut = res.stage_boundaries == job.boundaries ? 1 : 0;
    r.step_error = rel_error(r.predicted_step_s, r.measured_step_s);
    r.compute_error = rel_error(r.predicted_compute_s, r.measured_compute_s);
    r.comm_error = rel_error(r.predicted_comm_s, r.measured_comm_s);
    r.bubble_error = rel_error(r.predicted_bubble_s, r.measured_bubble_s);
    r.memory_error = rel_error(r.predicted_memory_bytes, r.measured_memory_bytes);
    const par::StageProgram& mine = job.stages[static_cast<size_t>(r.rank % job.pp())];
    r.compression = job.dp() > 1 ? static_cast<tandem_compression_t>(job.job.parallel.compression)
                                 : TANDEM_COMPRESSION_NONE;
    r.algorithm = mine.bucket_allreduces.empty()
                      ? TANDEM_ALGO_AUTO
                      : static_cast<tandem_algo_t>(tandem::engine::comm::choose_algorithm(mine.bucket_allreduces[0]));
    r.num_buckets = static_cast<int32_t>(mine.bucket_allreduces.size());
    r.allreduce_bytes_per_step = res.allreduce_bytes_per_rank;
    if (json_bytes != nullptr) tandem::api::copy_text_out(res.to_json().dump(), json, json_bytes);
    tandem_prediction_t o = *out;
    const uint64_t want = out->field_mask;
    if (want & TANDEM_PREDICTION_STEP) {
      o.measured_step_s = r.measured_step_s, o.predicted_step_s = r.predicted_step_s, o.step_error = r.step_error;
      o.measured_compute_s = r.measured_compute_s, o.predicted_compute_s = r.predicted_compute_s;
      o.compute_error = r.compute_error;
      o.measured_comm_s = r.measured_comm_s, o.predicted_comm_s = r.predicted_comm_s, o.comm_error = r.comm_error;
      o.measured_bubble_s = r.measured_bubble_s, o.predicted_bubble_s = r.predicted_bubble_s;
      o.bubble_error = r.bubble_error;
      o.steps = r.steps;
    }
    if (want & TANDEM_PREDICTION_MEMORY) {
      o.measured_memory_bytes = r.measured_memory_bytes, o.predicted_memory_bytes = r.predicted_memory_bytes;
      o.memory_error = r.memory_error;
      o.predicted_memory_capacity_bytes = r.predicted_memory_capacity_bytes;
      o.predicted_fits = r.predicted_fits;
    }
    if (want & TANDEM_PREDICTION_LAYOUT) {
      o.rank = r.rank, o.world = r.world, o.dp = r.dp, o.pp = r.pp, o.micro_batches = r.micro_batches;
      o.strategy = r.strategy;
      o.compute_source = r.compute_source;
      o.same_cut = r.same_cut;
    }
    if (want & TANDEM_PREDICTION_JOB) {
      o.compression = r.compression, o.algorithm = r.algorithm, o.num_buckets = r.num_buckets;
      o.allreduce_bytes_per_step = r.allreduce_bytes_per_step;
    }
    *out = o;
  });
}

}  // extern "C"
