// The simulation section of the C ABI: clusters, jobs, simulate, plan search, results.
#include <cstring>
#include <memory>

#include <fmt/format.h>

#include "api/src/guard.hpp"
#include "api/src/sim_handles.hpp"
#include "simulator/report/chrome_trace.hpp"
#include "simulator/search.hpp"
#include "simulator/simulate.hpp"

namespace sim = tandem::simulator;
using tandem::api::checked;
using tandem::api::guarded;

namespace {

std::string str(const char* s, const char* field) {
  TANDEM_REQUIRE(s != nullptr, "job.{}: flagged in field_mask but NULL", field);
  return s;
}

sim::JobSpec to_job(const tandem_sim_job_params_t* p) {
  sim::JobSpec j;
  if (p == nullptr) return j;
  constexpr uint64_t known = (UINT64_C(1) << 28) - 1;
  TANDEM_CHECK((p->field_mask & ~known) == 0, tandem::Status::kUnsupported,
               "tandem_sim_job_params_t: unknown field_mask bits 0x{:x}", p->field_mask & ~known);
  const uint64_t m = p->field_mask;
  if (m & TANDEM_SIM_JOB_JSON) j = sim::parse_job(str(p->job_json, "job_json"));
  if (m & TANDEM_SIM_JOB_MODEL) j.model = str(p->model, "model");
  if (m & TANDEM_SIM_JOB_DATASET) j.dataset = str(p->dataset, "dataset");
  if (m & TANDEM_SIM_JOB_SAMPLES) {
    TANDEM_REQUIRE(p->samples >= 1, "job.samples: must be >= 1, got {}", p->samples);
    j.samples = p->samples;
  }
  if (m & TANDEM_SIM_JOB_INPUT_SHAPE) {
    TANDEM_REQUIRE(p->input_channels >= 1 && p->input_height >= 1 && p->input_width >= 1,
                   "job.input: dimensions must be >= 1, got {}x{}x{}", p->input_channels, p->input_height,
                   p->input_width);
    j.input = tandem::engine::nn::SampleShape{p->input_channels, p->input_height, p->input_width};
  }
  if (m & TANDEM_SIM_JOB_NUM_CLASSES) {
    TANDEM_REQUIRE(p->num_classes >= 1, "job.num_classes: must be >= 1, got {}", p->num_classes);
    j.classes = p->num_classes;
  }
  if (m & TANDEM_SIM_JOB_BATCH) j.batch = p->batch;
  if (m & TANDEM_SIM_JOB_EPOCHS) j.epochs = p->epochs;
  if (m & TANDEM_SIM_JOB_STRATEGY) j.strategy = sim::parse_strategy(str(p->strategy, "strategy"));
  if (m & TANDEM_SIM_JOB_DP) j.dp = p->dp;
  if (m & TANDEM_SIM_JOB_PP) j.pp = p->pp;
  if (m & TANDEM_SIM_JOB_MICRO_BATCHES) j.micro_batches = p->micro_batches;
  if (m & TANDEM_SIM_JOB_SCHEDULE) j.schedule = tandem::engine::parallel::parse_schedule(str(p->schedule, "schedule"));
  if (m & TANDEM_SIM_JOB_ALGORITHM) j.algorithm = tandem::engine::comm::parse_algorithm(str(p->algorithm, "algorithm"));
  if (m & TANDEM_SIM_JOB_BUCKET_MB) j.bucket_mb = p->bucket_mb;
  if (m & TANDEM_SIM_JOB_OVERLAP) j.overlap = p->overlap != 0;
  if (m & TANDEM_SIM_JOB_OPTIMIZER) j.optimizer = sim::parse_optimizer(str(p->optimizer, "optimizer"));
  if (m & TANDEM_SIM_JOB_PROFILE) {
    j.profile = str(p->profile, "profile");
    j.profile_network = p->profile_network != 0;
  }
  if (m & TANDEM_SIM_JOB_EPOCH_TIME) j.epoch_time_s = p->epoch_time_s;
  if (m & TANDEM_SIM_JOB_CREDIT_MODE) j.credit_mode = sim::parse_credit_mode(str(p->credit_mode, "credit_mode"));
  if (m & TANDEM_SIM_JOB_INITIAL_CREDITS) {
    TANDEM_REQUIRE(p->initial_credits >= 0, "job.initial_credits: must be >= 0, got {}", p->initial_credits);
    j.initial_credits = p->initial_credits;
  }
  if (m & TANDEM_SIM_JOB_WIDTH_MULT) j.width_mult = p->width_mult;
  if (m & TANDEM_SIM_JOB_CHUNK_BYTES) j.chunk_bytes = p->chunk_bytes;
  if (m & TANDEM_SIM_JOB_PARTITION)
    j.partition = tandem::engine::parallel::parse_partition_cost(str(p->partition, "partition"));
  if (m & TANDEM_SIM_JOB_BOUNDARIES) {
    TANDEM_REQUIRE(p->boundaries != nullptr && p->num_boundaries >= 2 && p->num_boundaries <= 65536,
                   "job.boundaries: need a non-null array of pp + 1 (>= 2) layer indices, got {}", p->num_boundaries);
    j.boundaries.assign(p->boundaries, p->boundaries + p->num_boundaries);
  }
  if (m & TANDEM_SIM_JOB_COMPRESSION) {
    const std::string c = str(p->compression, "compression");
    try {
      j.compression = tandem::engine::parallel::parse_compression(c);
    } catch (const tandem::Error& e) {
      TANDEM_THROW(tandem::Status::kInvalidArgument, "job.compression: {}", e.what());
    }
  }
  return j;
}

sim::SimOptions to_options(const tandem_sim_job_params_t* p) {
  sim::SimOptions o;
  if (p == nullptr) return o;
  if (p->field_mask & TANDEM_SIM_JOB_TRACE) o.trace = p->trace != 0;
  if (p->field_mask & TANDEM_SIM_JOB_BASELINE) o.baseline = p->baseline != 0;
  return o;
}

}  // namespace

extern "C" {

TANDEM_API tandem_status_t tandem_sim_cluster_create(tandem_context_t* ctx, const char* spec,
                                                     tandem_sim_cluster_t** out) TANDEM_NOEXCEPT {
  return guarded([&] {
    checked(ctx, "context");
    TANDEM_REQUIRE(spec != nullptr && out != nullptr, "tandem_sim_cluster_create: spec and out must be non-null");
    auto c = std::make_unique<tandem_sim_cluster>();
    c->spec = sim::parse_cluster(spec);
    *out = c.release();
  });
}

TANDEM_API tandem_status_t tandem_sim_cluster_resize(const tandem_sim_cluster_t* cluster, int32_t nodes,
                                                     tandem_sim_cluster_t** out) TANDEM_NOEXCEPT {
  return guarded([&] {
    const auto& c = checked(cluster, "simulation cluster");
    TANDEM_REQUIRE(out != nullptr, "tandem_sim_cluster_resize: out must be non-null");
    auto r = std::make_unique<tandem_sim_cluster>();
    r->spec = sim::resize_cluster(c.spec, nodes);
    *out = r.release();
  });
}

TANDEM_API tandem_status_t tandem_sim_cluster_info(const tandem_sim_cluster_t* cluster, int32_t* nodes,
                                                   int32_t* devices) TANDEM_NOEXCEPT {
  return guarded([&] {
    const auto& c = checked(cluster, "simulation cluster");
    if (nodes != nullptr) *nodes = static_cast<int32_t>(c.spec.nodes.size());
    if (devices != nullptr) *devices = c.spec.endpoints();
  });
}

TANDEM_API void tandem_sim_cluster_destroy(tandem_sim_cluster_t* cluster) TANDEM_NOEXCEPT { delete cluster; }

TANDEM_API tandem_status_t tandem_simulate(const tandem_sim_cluster_t* cluster, const tandem_sim_job_params_t* job,
                                           tandem_sim_result_t** out) TANDEM_NOEXCEPT {
  return guarded([&] {
    const auto& c = checked(cluster, "simulation cluster");
    TANDEM_REQUIRE(out != nullptr, "tandem_simulate: out must be non-null");
    const sim::SimOptions opt = to_options(job);
    sim::SimResult r = sim::simulate(c.spec, to_job(job), opt);
    auto h = std::make_unique<tandem_sim_result>();
    h->json = r.to_json();
    h->summary = h->json;
    h->text = h->json.dump();
    h->has_trace = opt.trace;
    h->trace = std::move(r.trace);
    for (int32_t rk = 0; rk < r.ranks; ++rk) {
      const int32_t node = c.spec.node_of_endpoint(rk);
      h->rank_names.push_back(fmt::format("rank {} (stage {}, replica {}) on {} {}", rk, rk % r.pp, rk / r.pp,
                                          c.spec.nodes[node].name, c.spec.nodes[node].hw.name));
    }
    *out = h.release();
  });
}

TANDEM_API tandem_status_t tandem_sim_plan(const tandem_sim_cluster_t* cluster, const tandem_sim_job_params_t* job,
                                           int32_t top, tandem_sim_result_t** out) TANDEM_NOEXCEPT {
  return guarded([&] {
    const auto& c = checked(cluster, "simulation cluster");
    TANDEM_REQUIRE(out != nullptr, "tandem_sim_plan: out must be non-null");
    TANDEM_REQUIRE(top >= 1, "tandem_sim_plan: top must be >= 1, got {}", top);
    sim::SearchOptions so;
    so.top = top;
    sim::SearchResult s = sim::search_plans(c.spec, to_job(job), so);
    auto h = std::make_unique<tandem_sim_result>();
    h->json = s.to_json();
    h->summary = h->json["candidates"].at(0);
    h->text = h->json.dump();
    *out = h.release();
  });
}

TANDEM_API tandem_status_t tandem_sim_result_query(const tandem_sim_result_t* result,
                                                   tandem_sim_summary_t* s) TANDEM_NOEXCEPT {
  return guarded([&] {
    const auto& r = checked(result, "simulation result");
    TANDEM_REQUIRE(s != nullptr, "tandem_sim_result_query: summary must be non-null");
    constexpr uint64_t known = (UINT64_C(1) << 6) - 1;
    TANDEM_CHECK((s->field_mask & ~known) == 0, tandem::Status::kUnsupported,
                 "tandem_sim_summary_t: unknown field_mask bits 0x{:x}", s->field_mask & ~known);
    const auto& j = r.summary;
    auto d = [&](const char* k) { return j.at(k).get<double>(); };
    auto i = [&](const char* k) { return j.at(k).get<int32_t>(); };
    tandem_sim_summary_t o = *s;
    if (s->field_mask & TANDEM_SIM_SUMMARY_TIMES) {
      o.step_time_s = d("step_time_s");
      o.epoch_time_s = d("epoch_time_s");
      o.total_time_s = d("total_time_s");
      o.images_per_sec = d("images_per_sec");
    }
    if (s->field_mask & TANDEM_SIM_SUMMARY_SCALING) {
      o.speedup = d("speedup");
      o.efficiency = d("efficiency");
    }
    if (s->field_mask & TANDEM_SIM_SUMMARY_SPLIT) {
      o.compute_s = d("compute_s");
      o.comm_exposed_s = d("comm_exposed_s");
      o.bubble_s = d("bubble_s");
      o.throttled_s = d("throttled_s");
      o.idle_s = d("idle_s");
    }
    if (s->field_mask & TANDEM_SIM_SUMMARY_MEMORY) {
      o.memory_per_node_bytes = d("memory_per_node_bytes");
      o.fits = j.at("fits").get<bool>() ? 1 : 0;
    }
    if (s->field_mask & TANDEM_SIM_SUMMARY_COST) o.cost_usd = d("cost_usd");
    if (s->field_mask & TANDEM_SIM_SUMMARY_LAYOUT) {
      o.dp = i("dp");
      o.pp = i("pp");
      o.micro_batches = i("micro_batches");
      o.ranks = i("ranks");
    }
    *s = o;
  });
}

TANDEM_API tandem_status_t tandem_sim_result_json(const tandem_sim_result_t* result, char* json,
                                                  size_t* json_bytes) TANDEM_NOEXCEPT {
  return guarded([&] {
    const auto& r = checked(result, "simulation result");
    TANDEM_REQUIRE(json_bytes != nullptr, "tandem_sim_result_json: json_bytes must be non-null");
    if (json != nullptr && *json_bytes > 0) {
      const size_t n = std::min(r.text.size(), *json_bytes - 1);
      std::memcpy(json, r.text.data(), n);
      json[n] = '\0';
    }
    *json_bytes = r.text.size() + 1;
  });
}

TANDEM_API tandem_status_t tandem_sim_result_write_trace(const tandem_sim_result_t* result,
                                                         const char* path) TANDEM_NOEXCEPT {
  return guarded([&] {
    const auto& r = checked(result, "simulation result");
    TANDEM_REQUIRE(path != nullptr, "tandem_sim_result_write_trace: path must be non-null");
    TANDEM_REQUIRE(r.has_trace, "tandem_sim_result_write_trace: the job did not ask for a trace (set trace)");
    nlohmann::json other = {{"source", "tandem simulator"}};
    for (const char* k : {"cluster", "model", "strategy", "dp", "pp", "micro_batches", "schedule", "step_time_s"})
      other[k] = r.json.at(k);
    sim::write_chrome_trace(path, sim::chrome_trace(r.trace, r.rank_names, other));
  });
}

TANDEM_API void tandem_sim_result_destroy(tandem_sim_result_t* result) TANDEM_NOEXCEPT { delete result; }

}  // extern "C"
