// C shims: calibration (tandem_calibrate and the tandem_calibration_t queries), written as the simulator's
// calibration profile (simulator/compute/profile.hpp).
#include <algorithm>
#include <chrono>
#include <cstring>
#include <ctime>
#include <functional>
#include <memory>

#include "api/src/calibrate_handles.hpp"
#include "api/src/comm_handles.hpp"
#include "api/src/guard.hpp"
#include "api/src/train_handles.hpp"
#include "engine/core/atomic_file.hpp"
#include "simulator/compute/profile.hpp"
#include "simulator/compute/step_noise.hpp"

using tandem::Status;
using tandem::api::check_field_mask;
using tandem::api::checked;
using tandem::api::ContextScope;
using tandem::api::guarded;
using tandem::api::mask_through;
namespace train = tandem::engine::train;

static_assert(offsetof(tandem_calibrate_params_t, field_mask) == 0);
static_assert(offsetof(tandem_calibration_attr_t, field_mask) == 0);

namespace {


std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string profile_text(const tandem_calibration& h) {
  const train::Calibration& c = h.cal;
  tandem::simulator::CalibrationProfile p;
  p.machine = h.machine;
  p.backend = c.backend;
  p.model = c.model;
  p.optimizer = c.optimizer;
  p.input = {c.input.c, c.input.h, c.input.w};
  p.batch = c.batch;
  for (const train::LayerTime& l : c.layers) p.layers.push_back({l.name, l.forward_s, l.backward_s});
  p.optimizer_step_s = c.optimizer_step_s;
  p.batch_curve = c.batch_curve;
  // The passes' variability: of their wall time; under a CFS quota of their CPU time, since the simulator applies the
  // quota's on/off windows itself (compute/node_cpu.hpp) and the wall times' spread would count them twice.
  const double cv = tandem::api::cpu_quota_cores() ? c.pass_cpu_cv : c.pass_cv;
  if (cv > 0) p.compute_cv = std::min(cv, tandem::simulator::kMaxComputeCv);
  if (h.memory_bytes_per_s > 0) p.memory_bytes_per_s = h.memory_bytes_per_s;
  if (h.comm_cpu.tcp_s_per_byte > 0) p.tcp_cpu_s_per_byte = h.comm_cpu.tcp_s_per_byte;
  if (h.comm_cpu.copy_s_per_byte > 0) p.copy_cpu_s_per_byte = h.comm_cpu.copy_s_per_byte;
  if (h.comm_cpu.tcp_s_per_wakeup > 0) p.tcp_cpu_s_per_wakeup = h.comm_cpu.tcp_s_per_wakeup;
  p.corun_slowdown = h.corun_slowdown;
  if (h.wakeup_latency_s >= 0) p.wakeup_latency_s = h.wakeup_latency_s;
  if (h.fp16_convert_s.first > 0) p.fp16_convert_s = h.fp16_convert_s;
  if (h.bf16_convert_s.first > 0) p.bf16_convert_s = h.bf16_convert_s;
  if (h.p2p) {
    p.p2p_bytes_per_s = h.p2p->bytes_per_s;
    p.p2p_latency_s = h.p2p->latency_s;
  }
  nlohmann::json j = tandem::simulator::profile_to_json(p);
  // The runtime's own resident memory per rank (see runtime_rss_bytes), for the simulator's memory check.
  if (h.runtime_rss_bytes > 0) j["runtime_rss_bytes"] = static_cast<int64_t>(h.runtime_rss_bytes);
  // ... and on a GPU the device memory a rank holds besides its tensors (the simulator's GPU runtime allowance)
  if (h.runtime_device_bytes > 0) j["runtime_device_bytes"] = static_cast<int64_t>(h.runtime_device_bytes);
  // ... and what a whole training step at the batch adds to it at its peak (the simulator's activation memory)
  if (h.activation_peak_bytes > 0) j["activation_peak_bytes"] = static_cast<int64_t>(h.activation_peak_bytes);
  // ... and at the other batch measured: the peak's batch-independent part shows between the two
  if (h.activation_peak_curve.size() >= 2) {
    j["activation_peak_curve"] = nlohmann::json::array();
    for (const auto& [b, bytes] : h.activation_peak_curve)
      j["activation_peak_curve"].push_back({b, static_cast<int64_t>(bytes)});
  }
  // ... and what one more batch shape's primitives keep resident, at the batches measured
  if (!h.primitive_bytes_curve.empty()) {
    j["primitive_bytes_curve"] = nlohmann::json::array();
    for (const auto& [b, bytes] : h.primitive_bytes_curve)
      j["primitive_bytes_curve"].push_back({b, static_cast<int64_t>(bytes)});
  }
  j["threads"] = c.threads;
  // Measured under a CFS quota, the times are the quota's average; the simulator takes it out (full_speed_profile).
  if (const auto q = tandem::api::cpu_quota_cores()) j["cpu_quota"] = *q;
  // ... and the cores it really sustained under it over the timed passes (below the quota where cores are short)
  if (c.sustained_cores > 0 && j.contains("cpu_quota")) j["cpu_quota_sustained"] = c.sustained_cores;
  j["created"] = utc_now();
  return j.dump(1);
}

// Every rank must calibrate the same thing: compare (layers, batch, a hash of the layer names) over the ranks.
void agree(tandem::engine::comm::Communicator& c, const tandem::engine::nn::ModelSpec& spec, int64_t batch,
           const std::vector<int64_t>& curve_batches) {
  uint64_t h = 1469598103934665603ull;
  for (const auto& l : spec.layers)
    for (char ch : l.name) h = (h ^ static_cast<uint8_t>(ch)) * 1099511628211ull;
  for (int64_t b : curve_batches) h = (h ^ static_cast<uint64_t>(b)) * 1099511628211ull;
  const int64_t mine[3] = {static_cast<int64_t>(spec.layers.size()), batch, static_cast<int64_t>(h >> 1)};
  int64_t lo[3], hi[3];
  c.allreduce(mine, lo, 3, tandem::DType::kI64, tandem::ReduceOp::kMin)->wait();
  c.allreduce(mine, hi, 3, tandem::DType::kI64, tandem::ReduceOp::kMax)->wait();
  TANDEM_CHECK(lo[0] == hi[0] && lo[1] == hi[1] && lo[2] == hi[2], Status::kMismatch,
               "tandem_calibrate: rank {} calibrates model '{}' ({} layers, batch {}) but the ranks disagree on the "
               "model, batch or curve batches (layers {}..{}, batch {}..{})",
               c.rank(), spec.name, mine[0], batch, lo[0], hi[0], lo[1], hi[1]);
}

// The compute figures averaged over the ranks (each rank measured its own, all at once).
void average(tandem::engine::comm::Communicator& c, tandem_calibration& h) {
  train::Calibration& k = h.cal;
  std::vector<double> v;
  for (const auto& l : k.layers) {
    v.push_back(l.forward_s);
    v.push_back(l.backward_s);
  }
  v.insert(v.end(), {k.optimizer_step_s, k.step_mean_s, k.step_median_s, k.unscaled_sum_s, k.pass_cv, k.pass_cpu_cv,
                     k.sustained_cores,
                     h.memory_bytes_per_s,
                     h.fp16_convert_s.first, h.fp16_convert_s.second, h.bf16_convert_s.first,
                     h.bf16_convert_s.second});
  for (const auto& point : k.batch_curve) v.push_back(point.second);  // same batches on every rank (agree())
  c.allreduce(v.data(), v.data(), v.size(), tandem::DType::kF64, tandem::ReduceOp::kAvg)->wait();
  size_t i = 0;
  for (auto& l : k.layers) {
    l.forward_s = v[i++];
    l.backward_s = v[i++];
  }
  k.optimizer_step_s = v[i++];
  k.step_mean_s = v[i++];
  k.step_median_s = v[i++];
  k.unscaled_sum_s = v[i++];
  k.pass_cv = v[i++];  // the ranks' mean CVs, each over its own passes
  k.pass_cpu_cv = v[i++];
  k.sustained_cores = v[i++];  // the ranks' mean, each measured while every rank computed
  h.memory_bytes_per_s = v[i++];
  for (auto* conv : {&h.fp16_convert_s, &h.bf16_convert_s}) {
    conv->first = v[i++];
    conv->second = v[i++];
  }
  for (auto& point : k.batch_curve) point.second = v[i++];
  k.scale = k.unscaled_sum_s > 0 ? k.step_mean_s / k.unscaled_sum_s : 1.0;
  double mn = k.step_min_s, mx = k.step_max_s;
  c.allreduce(&mn, &mn, 1, tandem::DType::kF64, tandem::ReduceOp::kMin)->wait();
  c.allreduce(&mx, &mx, 1, tandem::DType::kF64, tandem::ReduceOp::kMax)->wait();
  k.step_min_s = mn;
  k.step_max_s = mx;
}

// Runs `body` on the communicator; a failure is recorded on the handle (sticky) before it propagates.
void on_comm(tandem::api::CommState& s, const std::function<void(tandem::engine::comm::Communicator&)>& body) {
  try {
    body(*s.comm);
  } catch (const tandem::Error& e) {
    s.record_failure(e.status(), e.what());
    throw;
  }
}

}  // namespace

extern "C" {

TANDEM_API tandem_status_t tandem_calibrate(tandem_model_t* model, const tandem_calibrate_params_t* params,
                                            tandem_comm_t* comm, tandem_calibration_t** out) TANDEM_NOEXCEPT {
  return guarded([&] {
    constexpr const char* fn = "tandem_calibrate";
    TANDEM_REQUIRE(out != nullptr, "{}: out must be non-null", fn);
    auto& m = checked(model, fn, "model");
    const ContextScope scope(m.env);
    TANDEM_REQUIRE(m.model != nullptr, "{}: model '{}' has no backend (created with backend \"none\")", fn,
                   m.spec.name);
    train::CalibrationOptions o;
    uint64_t p2p_bytes = uint64_t{4} << 20;
    int p2p_iters = 3;
    tandem::api::WakeupProbe wakeup_probe;
    std::string machine;
    if (params != nullptr) {
      const uint64_t k = params->field_mask;
      check_field_mask(k, mask_through(TANDEM_CALIBRATE_PARAM_WAKEUP), "tandem_calibrate_params_t");
      if (k & TANDEM_CALIBRATE_PARAM_BATCH) o.batch = params->batch;
      if (k & TANDEM_CALIBRATE_PARAM_WARMUP) o.warmup = params->warmup;
      if (k & TANDEM_CALIBRATE_PARAM_ITERS) o.iters = params->iters;
      if (k & TANDEM_CALIBRATE_PARAM_OPTIMIZER) o.optimizer = checked(params->optimizer, fn, "optimizer").config;
      if (k & TANDEM_CALIBRATE_PARAM_MACHINE) {
        TANDEM_REQUIRE(params->machine != nullptr, "{}: machine flagged but NULL", fn);
        machine = params->machine;
      }
      if (k & TANDEM_CALIBRATE_PARAM_P2P) {
        TANDEM_REQUIRE(params->p2p_bytes >= 64 && params->p2p_bytes <= (uint64_t{1} << 31),
                       "{}: p2p_bytes must be in [64, 2 GiB], got {}", fn, params->p2p_bytes);
        TANDEM_REQUIRE(params->p2p_iters >= 1 && params->p2p_iters <= 1000, "{}: p2p_iters must be in [1, 1000], got {}",
                       fn, params->p2p_iters);
        p2p_bytes = params->p2p_bytes;
        p2p_iters = params->p2p_iters;
      }
      if (k & TANDEM_CALIBRATE_PARAM_SEED) o.seed = params->seed;
      if (k & TANDEM_CALIBRATE_PARAM_CURVE) {
        TANDEM_REQUIRE(params->num_curve_batches <= 64, "{}: num_curve_batches {} is more than 64", fn,
                       params->num_curve_batches);
        TANDEM_REQUIRE(params->num_curve_batches == 0 || params->curve_batches != nullptr,
                       "{}: curve_batches is NULL with num_curve_batches {}", fn, params->num_curve_batches);
        o.curve_batches.assign(params->curve_batches, params->curve_batches + params->num_curve_batches);
      }
      if (k & TANDEM_CALIBRATE_PARAM_WAKEUP) {
        TANDEM_REQUIRE(params->wakeup_burst_s >= 0 && params->wakeup_burst_s <= 0.1,
                       "{}: wakeup_burst_s must be in [0, 0.1] s (0: one chunk's reduction), got {}", fn,
                       params->wakeup_burst_s);
        TANDEM_REQUIRE(params->wakeup_ranks_per_core >= 2 && params->wakeup_ranks_per_core <= 8,
                       "{}: wakeup_ranks_per_core must be in [2, 8], got {}", fn, params->wakeup_ranks_per_core);
        wakeup_probe.burst_s = params->wakeup_burst_s;
        wakeup_probe.ranks_per_core = params->wakeup_ranks_per_core;
      }
    }
    o.cpu_quota = tandem::api::cpu_quota_cores().value_or(0.0);
    o.validate();
    tandem::api::StateRef state;
    if (comm != nullptr) state = checked(comm, fn, "comm").state;
    const bool multi = comm != nullptr && state->comm->size() >= 2;

    auto h = std::make_unique<tandem_calibration>();
    if (multi) on_comm(*state, [&](auto& c) {
      agree(c, m.spec, o.batch, o.curve_batches);
      c.barrier()->wait();  // every rank starts measuring at once, as the ranks of a job compute at once
    });
    // Once the passes at the job's batch ran the model's kernels (before the curve's other batch sizes add their
    // own primitives and plans): the runtime as a training step has it, without its tensors.
    o.after_batch_passes = [&] {
      h->runtime_rss_bytes = tandem::api::runtime_rss_bytes(!multi);
      h->runtime_device_bytes = tandem::api::runtime_device_bytes(m.model->backend().device());
    };
    // Then what whole steps at that batch add at their peak (host memory: CPU backends only), with the input batch
    // they train on (calibrate_model makes it inside the window, as a training step holds its batch).
    // At the batch and at half of it (2 at batch 1): the curve the simulator takes a micro-batch's peak from.
    tandem::api::PeakRssProbe peak;
    double shape_before = 0;
    if (m.model->backend().device().is_cpu()) {
      o.peak_batches = {o.batch >= 2 ? o.batch / 2 : 2};
      o.before_peak_steps = [&](int64_t) { peak.start(); };
      o.after_peak_steps = [&](int64_t b) {
        const double bytes = peak.stop();
        if (b == o.batch) h->activation_peak_bytes = bytes;
        if (bytes > 0) h->activation_peak_curve.emplace_back(b, bytes);
      };
      // What the primitives of one more batch shape keep resident: the runtime figure's growth over the first step at
      // half the batch (the peak's other point) and at a quarter of it -- an epoch's short last batch is such a
      // shape, and the line through the two gives the primitives at the batch a job runs (issue #16). Below the batch,
      // so that calibrating at the largest batch a host fits does not run out of memory.
      o.shape_batches = {std::max<int64_t>(1, o.batch / 4)};
      o.before_new_shape = [&](int64_t) { shape_before = tandem::api::runtime_rss_bytes(!multi); };
      o.after_new_shape = [&](int64_t b) {
        const double after = tandem::api::runtime_rss_bytes(!multi);
        if (shape_before > 0 && after > 0) h->primitive_bytes_curve.emplace_back(b, std::max(0.0, after - shape_before));
      };
    }
    h->cal = train::calibrate_model(*m.model, o);
    std::sort(h->activation_peak_curve.begin(), h->activation_peak_curve.end());
    std::sort(h->primitive_bytes_curve.begin(), h->primitive_bytes_curve.end());
    if (h->activation_peak_bytes <= 0) h->activation_peak_curve.clear();  // no point at the batch: none at all
    h->memory_bytes_per_s = tandem::api::measure_reduce_bandwidth();
    std::string comm_cpu_note;
    try {
      h->comm_cpu = tandem::api::measure_comm_cpu();
    } catch (const tandem::Error& e) {  // no loopback here: the profile says so and goes without the figures
      comm_cpu_note = fmt::format("; communication CPU not measured ({})", e.what());
    }
    // Cores shared by several ranks (CPU backends only: a GPU's compute is not the host's).
    if (m.model->backend().device().is_cpu()) {
      try {
        h->corun_slowdown = tandem::api::measure_corun_slowdown(m.spec, m.backend_name, o.batch);
        if (wakeup_probe.burst_s <= 0)  // an all-reduce peer's work between messages: one chunk's reduction
          wakeup_probe.burst_s = std::clamp(tandem::api::chunk_reduction_s(h->memory_bytes_per_s), 1e-5, 0.1);
        const tandem::api::WakeupFigures w = tandem::api::measure_wakeup_latency(wakeup_probe);
        h->wakeup_latency_s = w.wait_s;
        if (machine.empty()) comm_cpu_note += "; " + w.note;  // the distribution; a caller's own text stays as given
      } catch (const tandem::Error& e) {
        comm_cpu_note += fmt::format("; shared-core costs not measured ({})", e.what());
      }
    }
    h->fp16_convert_s = tandem::api::measure_convert_s(tandem::engine::parallel::GradCompression::kF16);
    h->bf16_convert_s = tandem::api::measure_convert_s(tandem::engine::parallel::GradCompression::kBF16);
    if (multi) {
      on_comm(*state, [&](auto& c) {
        average(c, *h);
        h->p2p = tandem::api::measure_p2p(c, p2p_bytes, p2p_iters);
        tandem::api::measure_allreduce_rounds(c, *h->p2p);
      });
      h->ranks = state->comm->size();
    }
    h->machine = machine.empty() ? tandem::api::describe_machine(h->cal.threads) : machine;
    if (h->ranks > 1) h->machine += fmt::format("; compute averaged over {} ranks measuring at once", h->ranks);
    h->machine += comm_cpu_note;
    if (h->p2p) {
      const tandem::api::P2pFigures& q = *h->p2p;
      h->machine += fmt::format(
          "; p2p ranks 0-1: {:.2f} MB/s each way with both directions busy, ping {:.1f} us one-way; all-reduce of {} B "
          "over {} ranks ({}, {} rounds) {:.1f} us: {:.1f} us per round; p2p.latency_s {:.1f} us is the larger",
          q.bytes_per_s / 1e6, q.ping_s * 1e6, q.allreduce_bytes, h->ranks, q.allreduce_algorithm, q.allreduce_rounds,
          q.allreduce_s * 1e6, q.allreduce_round_s * 1e6, q.latency_s * 1e6);
    }
    h->text = profile_text(*h);
    *out = h.release();
  });
}

TANDEM_API void tandem_calibration_destroy(tandem_calibration_t* calibration) TANDEM_NOEXCEPT {
  tandem::api::destroy_handle(calibration);
}

TANDEM_API tandem_status_t tandem_calibration_query(const tandem_calibration_t* calibration,
                                                    tandem_calibration_attr_t* attr) TANDEM_NOEXCEPT {
  return guarded([&] {
    const auto& h = checked(calibration, "tandem_calibration_query", "calibration");
    TANDEM_REQUIRE(attr != nullptr, "tandem_calibration_query: attr must be non-null");
    check_field_mask(attr->field_mask, mask_through(TANDEM_CALIBRATION_ATTR_CURVE), "tandem_calibration_attr_t");
    const train::Calibration& c = h.cal;
    if (attr->field_mask & TANDEM_CALIBRATION_ATTR_SHAPE) {
      attr->batch = c.batch;
      attr->num_layers = c.layers.size();
      attr->threads = c.threads;
      attr->ranks = h.ranks;
    }
    if (attr->field_mask & TANDEM_CALIBRATION_ATTR_TIMES) {
      attr->forward_s = c.forward_s();
      attr->backward_s = c.backward_s();
      attr->optimizer_step_s = c.optimizer_step_s;
      attr->step_mean_s = c.step_mean_s;
      attr->step_median_s = c.step_median_s;
      attr->scale = c.scale;
      attr->memory_bytes_per_s = h.memory_bytes_per_s;
    }
    if (attr->field_mask & TANDEM_CALIBRATION_ATTR_P2P) {
      attr->has_p2p = h.p2p ? 1 : 0;
      attr->p2p_bytes_per_s = h.p2p ? h.p2p->bytes_per_s : 0.0;
      attr->p2p_latency_s = h.p2p ? h.p2p->latency_s : 0.0;
    }
    if (attr->field_mask & TANDEM_CALIBRATION_ATTR_CURVE) attr->num_curve_points = c.batch_curve.size();
  });
}

TANDEM_API tandem_status_t tandem_calibration_layer(const tandem_calibration_t* calibration, size_t index,
                                                    const char** name, double* forward_s,
                                                    double* backward_s) TANDEM_NOEXCEPT {
  return guarded([&] {
    const auto& h = checked(calibration, "tandem_calibration_layer", "calibration");
    TANDEM_REQUIRE(index < h.cal.layers.size(), "tandem_calibration_layer: index {} out of range (model has {} layers)",
                   index, h.cal.layers.size());
    const train::LayerTime& l = h.cal.layers[index];
    if (name != nullptr) *name = l.name.c_str();
    if (forward_s != nullptr) *forward_s = l.forward_s;
    if (backward_s != nullptr) *backward_s = l.backward_s;
  });
}

TANDEM_API tandem_status_t tandem_calibration_curve(const tandem_calibration_t* calibration, size_t index,
                                                    int64_t* batch, double* seconds) TANDEM_NOEXCEPT {
  return guarded([&] {
    const auto& h = checked(calibration, "tandem_calibration_curve", "calibration");
    TANDEM_REQUIRE(index < h.cal.batch_curve.size(),
                   "tandem_calibration_curve: index {} out of range (the calibration has {} curve points)", index,
                   h.cal.batch_curve.size());
    if (batch != nullptr) *batch = h.cal.batch_curve[index].first;
    if (seconds != nullptr) *seconds = h.cal.batch_curve[index].second;
  });
}

TANDEM_API tandem_status_t tandem_calibration_json(const tandem_calibration_t* calibration, char* json,
                                                   size_t* json_bytes) TANDEM_NOEXCEPT {
  return guarded([&] {
    const auto& h = checked(calibration, "tandem_calibration_json", "calibration");
    tandem::api::copy_text_out(h.text, json, json_bytes, "tandem_calibration_json: json_bytes");
  });
}

TANDEM_API tandem_status_t tandem_calibration_write(const tandem_calibration_t* calibration,
                                                    const char* path) TANDEM_NOEXCEPT {
  return guarded([&] {
    const auto& h = checked(calibration, "tandem_calibration_write", "calibration");
    TANDEM_REQUIRE(path != nullptr && *path != '\0', "tandem_calibration_write: path must be a non-empty string");
    tandem::write_file_atomic(path, h.text + "\n", "calibration profile");
  });
}

}  // extern "C"
