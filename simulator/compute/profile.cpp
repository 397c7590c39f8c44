#include "simulator/compute/profile.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "engine/core/error.hpp"
#include "simulator/compute/step_noise.hpp"
#include "simulator/units.hpp"

namespace tandem::simulator {

namespace {

// A profile's [[batch, bytes], ...] field (absent: empty): batches >= 1 ascending, bytes in (0, 1e15), or [0, 1e15)
// with `zero`.
std::vector<std::pair<int64_t, double>> bytes_curve(const nlohmann::json& j, const char* key, const std::string& where,
                                                    bool zero) {
  std::vector<std::pair<int64_t, double>> out;
  if (!j.contains(key)) return out;
  const auto& c = j[key];
  TANDEM_REQUIRE(c.is_array() && !c.empty(), "{}.{}: expected [[batch, bytes], ...], got {}", where, key, c.dump());
  for (size_t i = 0; i < c.size(); ++i) {
    const auto& q = c[i];
    TANDEM_REQUIRE(q.is_array() && q.size() == 2 && q[0].is_number_integer() && q[0].get<int64_t>() >= 1 &&
                       q[1].is_number() && (zero ? q[1].get<double>() >= 0 : q[1].get<double>() > 0) &&
                       q[1].get<double>() < 1e15,
                   "{}.{}[{}]: expected [batch >= 1, bytes in {}0, 1e15)], got {}", where, key, i, zero ? "[" : "(",
                   q.dump());
    const int64_t b = q[0].get<int64_t>();
    TANDEM_REQUIRE(out.empty() || b > out.back().first, "{}.{}[{}]: batch {} after {}: the points must ascend by batch",
                   where, key, i, b, out.back().first);
    out.emplace_back(b, q[1].get<double>());
  }
  return out;
}

// Two or more points: the segment that holds `samples`, else the nearest end's -- piecewise linear inside, affine
// beyond -- floored at 0.
double piecewise_linear(const std::vector<std::pair<int64_t, double>>& c, int64_t samples) {
  size_t k = 1;
  while (k + 1 < c.size() && samples > c[k].first) ++k;
  const auto [b0, y0] = c[k - 1];
  const auto [b1, y1] = c[k];
  return std::max(0.0, y0 + (y1 - y0) * static_cast<double>(samples - b0) / static_cast<double>(b1 - b0));
}

}  // namespace

CalibrationProfile profile_from_json(const nlohmann::json& j, const std::string& where) {
  json_check_keys(j, {"format", "version", "machine", "backend", "model", "input", "batch", "layers", "optimizer",
                      "optimizer_step_s", "memory_bytes_per_s", "p2p", "threads", "created", "runtime_rss_bytes",
                      "fp16_convert_s", "bf16_convert_s", "batch_curve", "cpu_quota", "tcp_cpu_s_per_byte",
                      "copy_cpu_s_per_byte", "tcp_cpu_s_per_wakeup", "corun_slowdown", "wakeup_latency_s",
                      "compute_cv", "step_overhead_cpu_s", "cpu_quota_sustained", "activation_peak_bytes",
                      "activation_peak_curve", "runtime_device_bytes", "primitive_bytes_curve"},
                  where);
  TANDEM_REQUIRE(j.contains("format") && j["format"].is_string() && j["format"].get<std::string>() == "tandem-calibration",
                 "{}.format: expected \"tandem-calibration\"", where);
  TANDEM_REQUIRE(j.contains("version") && j["version"].is_number_integer() && j["version"].get<int>() == 1,
                 "{}.version: expected 1", where);
  CalibrationProfile p;
  auto str = [&](const char* k, std::string& out) {
    if (!j.contains(k)) return;
    TANDEM_REQUIRE(j[k].is_string(), "{}.{}: expected a string", where, k);
    out = j[k].get<std::string>();
  };
  str("machine", p.machine);
  str("backend", p.backend);
  str("model", p.model);
  str("optimizer", p.optimizer);
  if (j.contains("input")) {
    TANDEM_REQUIRE(j["input"].is_array() && j["input"].size() == 3, "{}.input: expected [C, H, W]", where);
    for (const auto& d : j["input"]) {
      TANDEM_REQUIRE(d.is_number_integer() && d.get<int64_t>() > 0, "{}.input: dimensions must be positive integers",
                     where);
      p.input.push_back(d.get<int64_t>());
    }
  }
  TANDEM_REQUIRE(j.contains("batch") && j["batch"].is_number_integer() && j["batch"].get<int64_t>() >= 1,
                 "{}.batch: required, an integer >= 1 (samples the times were measured for)", where);
  p.batch = j["batch"].get<int64_t>();
  TANDEM_REQUIRE(j.contains("layers") && j["layers"].is_array() && !j["layers"].empty(),
                 "{}.layers: required, a non-empty array", where);
  for (size_t i = 0; i < j["layers"].size(); ++i) {
    std::string w = fmt::format("{}.layers[{}]", where, i);
    const auto& l = j["layers"][i];
    json_check_keys(l, {"name", "forward_s", "backward_s"}, w);
    CalibrationProfile::Layer L;
    TANDEM_REQUIRE(l.contains("name") && l["name"].is_string(), "{}.name: required string", w);
    L.name = l["name"].get<std::string>();
    auto f = json_number(l, "forward_s", w);
    auto b = json_number(l, "backward_s", w);
    TANDEM_REQUIRE(f && b, "{}: forward_s and backward_s are required", w);
    L.forward_s = *f;
    L.backward_s = *b;
    p.layers.push_back(std::move(L));
  }
  auto opt = json_number(j, "optimizer_step_s", where);
  TANDEM_REQUIRE(opt.has_value(), "{}.optimizer_step_s: required (seconds per optimizer step)", where);
  p.optimizer_step_s = *opt;
  if (auto v = json_number(j, "memory_bytes_per_s", where)) p.memory_bytes_per_s = *v;
  if (auto v = json_number(j, "runtime_rss_bytes", where)) p.runtime_rss_bytes = *v;
  if (auto v = json_number(j, "runtime_device_bytes", where)) {
    TANDEM_REQUIRE(*v > 0 && *v < 1e13, "{}.runtime_device_bytes: expected a GPU rank's device memory besides its "
                   "tensors in bytes, got {}", where, *v);
    p.runtime_device_bytes = *v;
  }
  if (auto v = json_number(j, "activation_peak_bytes", where)) {
    TANDEM_REQUIRE(*v > 0 && *v < 1e15,
                   "{}.activation_peak_bytes: expected the bytes a training step at the profile's batch adds to the "
                   "process's resident size, > 0 and < 1e15, got {}", where, *v);
    p.activation_peak_bytes = *v;
  }
  p.activation_peak_curve = bytes_curve(j, "activation_peak_curve", where, false);
  p.primitive_bytes_curve = bytes_curve(j, "primitive_bytes_curve", where, true);
  if (!p.activation_peak_curve.empty()) {
    // The single figure and the curve's point at the profile's batch are one measurement: they must agree.
    for (const auto& [b, bytes] : p.activation_peak_curve)
      TANDEM_REQUIRE(b != p.batch || !p.activation_peak_bytes || std::abs(bytes - *p.activation_peak_bytes) <= 1,
                     "{}.activation_peak_curve: the point at the profile's batch {} is {} bytes but "
                     "activation_peak_bytes is {}", where, b, bytes, *p.activation_peak_bytes);
  }
  for (const char* k : {"fp16_convert_s", "bf16_convert_s"}) {
    if (!j.contains(k)) continue;
    const auto& a = j[k];
    TANDEM_REQUIRE(a.is_array() && a.size() == 2 && a[0].is_number() && a[1].is_number() && a[0].get<double>() >= 0 &&
                       a[1].get<double>() >= 0,
                   "{}.{}: expected [to, back], seconds per element >= 0, got {}", where, k, a.dump());
    (std::string(k) == "fp16_convert_s" ? p.fp16_convert_s : p.bf16_convert_s) =
        std::make_pair(a[0].get<double>(), a[1].get<double>());
  }
  if (j.contains("batch_curve")) {
    const auto& c = j["batch_curve"];
    TANDEM_REQUIRE(c.is_array(), "{}.batch_curve: expected [[batch, seconds], ...]", where);
    for (size_t i = 0; i < c.size(); ++i) {
      const auto& q = c[i];
      TANDEM_REQUIRE(q.is_array() && q.size() == 2 && q[0].is_number_integer() && q[0].get<int64_t>() >= 1 &&
                         q[1].is_number() && q[1].get<double>() > 0,
                     "{}.batch_curve[{}]: expected [batch >= 1, seconds > 0], got {}", where, i, q.dump());
      const int64_t b = q[0].get<int64_t>();
      TANDEM_REQUIRE(p.batch_curve.empty() || b > p.batch_curve.back().first,
                     "{}.batch_curve[{}]: batch {} after {}: the points must ascend by batch", where, i, b,
                     p.batch_curve.back().first);
      p.batch_curve.emplace_back(b, q[1].get<double>());
    }
    TANDEM_REQUIRE(p.batch_curve.empty() || std::any_of(p.batch_curve.begin(), p.batch_curve.end(),
                                                         [&](const auto& q) { return q.first == p.batch; }),
                   "{}.batch_curve: needs a point at the profile's batch {} (what the layer times are for)", where,
                   p.batch);
  }
  if (j.contains("threads")) {
    TANDEM_REQUIRE(j["threads"].is_number_integer() && j["threads"].get<int64_t>() >= 1,
                   "{}.threads: expected an integer >= 1 (compute threads of the measured passes)", where);
    p.threads = j["threads"].get<int64_t>();
  }
  if (auto v = json_number(j, "cpu_quota", where)) {
    TANDEM_REQUIRE(*v > 0, "{}.cpu_quota: expected cores > 0 (the measuring process's CFS quota), got {}", where, *v);
    p.cpu_quota = *v;
  }
  if (auto v = json_number(j, "cpu_quota_sustained", where)) {
    TANDEM_REQUIRE(p.cpu_quota.has_value(), "{}.cpu_quota_sustained: given without the cpu_quota it was sustained under",
                   where);
    TANDEM_REQUIRE(*v > 0 && *v <= *p.cpu_quota,
                   "{}.cpu_quota_sustained: expected cores in (0, cpu_quota = {}], got {}", where, *p.cpu_quota, *v);
    p.cpu_quota_sustained = *v;
  }
  for (auto [key, field] : {std::pair{"tcp_cpu_s_per_byte", &p.tcp_cpu_s_per_byte},
                             std::pair{"copy_cpu_s_per_byte", &p.copy_cpu_s_per_byte}}) {
    if (auto v = json_number(j, key, where)) {
      TANDEM_REQUIRE(*v >= 0 && *v < 1e-3, "{}.{}: expected CPU seconds per byte in [0, 1e-3), got {}", where, key, *v);
      *field = *v;
    }
  }
  if (auto v = json_number(j, "tcp_cpu_s_per_wakeup", where)) {
    TANDEM_REQUIRE(*v >= 0 && *v < 0.1, "{}.tcp_cpu_s_per_wakeup: expected CPU seconds per wake-up in [0, 0.1), got {}",
                   where, *v);
    p.tcp_cpu_s_per_wakeup = *v;
  }
  if (j.contains("corun_slowdown")) {
    const auto& c = j["corun_slowdown"];
    TANDEM_REQUIRE(c.is_array(), "{}.corun_slowdown: expected [[threads per core, slowdown], ...]", where);
    for (size_t i = 0; i < c.size(); ++i) {
      const auto& q = c[i];
      TANDEM_REQUIRE(q.is_array() && q.size() == 2 && q[0].is_number() && q[0].get<double>() > 0 &&
                         q[0].get<double>() <= 64 && q[1].is_number() && q[1].get<double>() >= 0.5 &&
                         q[1].get<double>() <= 10,
                     "{}.corun_slowdown[{}]: expected [threads per core in (0, 64], slowdown in [0.5, 10]], got {}",
                     where, i, q.dump());
      const double x = q[0].get<double>();
      TANDEM_REQUIRE(p.corun_slowdown.empty() || x > p.corun_slowdown.back().first,
                     "{}.corun_slowdown[{}]: {} threads per core after {}: the points must ascend", where, i, x,
                     p.corun_slowdown.back().first);
      p.corun_slowdown.emplace_back(x, q[1].get<double>());
    }
  }
  if (auto v = json_number(j, "wakeup_latency_s", where)) {
    TANDEM_REQUIRE(*v >= 0 && *v < 1, "{}.wakeup_latency_s: expected seconds in [0, 1), got {}", where, *v);
    p.wakeup_latency_s = *v;
  }
  if (auto v = json_number(j, "compute_cv", where)) {
    TANDEM_REQUIRE(*v >= 0 && *v <= kMaxComputeCv,
                   "{}.compute_cv: expected the passes' coefficient of variation (sd / mean) in [0, {}], got {}", where,
                   kMaxComputeCv, *v);
    p.compute_cv = *v;
  }
  if (auto v = json_number(j, "step_overhead_cpu_s", where)) {
    TANDEM_REQUIRE(*v >= 0 && *v < 1,
                   "{}.step_overhead_cpu_s: expected CPU seconds a training step costs beyond the pass, in [0, 1), "
                   "got {}", where, *v);
    p.step_overhead_cpu_s = *v;
  }
  if (j.contains("p2p")) {
    const auto& q = j["p2p"];
    json_check_keys(q, {"bandwidth_bytes_per_s", "latency_s"}, where + ".p2p");
    p.p2p_bytes_per_s = json_number(q, "bandwidth_bytes_per_s", where + ".p2p");
    p.p2p_latency_s = json_number(q, "latency_s", where + ".p2p");
  }
  return p;
}

std::optional<double> activation_peak_at(const CalibrationProfile& p, int64_t samples) {
  const auto& c = p.activation_peak_curve;
  if (samples < 1) samples = p.batch;
  if (c.size() >= 2) return piecewise_linear(c, samples);
  // one point: the peak taken as proportional to the samples, as a single measurement can only say
  if (c.size() == 1) return c[0].second * static_cast<double>(samples) / static_cast<double>(c[0].first);
  if (p.activation_peak_bytes && p.batch > 0)
    return *p.activation_peak_bytes * static_cast<double>(samples) / static_cast<double>(p.batch);
  return std::nullopt;
}

std::optional<double> primitive_bytes_at(const CalibrationProfile& p, int64_t samples) {
  const auto& c = p.primitive_bytes_curve;
  if (c.size() >= 2) return piecewise_linear(c, samples);
  if (c.size() == 1) return c[0].second;  // one point: the same at every batch, as one measurement can only say
  return std::nullopt;
}

CalibrationProfile load_profile(const std::string& path) {
  return profile_from_json(read_json_file(path, "calibration profile"), path);
}

CalibrationProfile full_speed_profile(CalibrationProfile p) {
  if (!p.cpu_quota) return p;
  const double f = *p.cpu_quota / static_cast<double>(p.threads);
  if (p.cpu_quota_sustained) p.quota_efficiency = std::min(1.0, *p.cpu_quota_sustained / *p.cpu_quota);
  p.cpu_quota.reset();
  p.cpu_quota_sustained.reset();
  if (f >= 1.0) return p;
  for (auto& l : p.layers) {
    l.forward_s *= f;
    l.backward_s *= f;
  }
  p.optimizer_step_s *= f;
  for (auto& q : p.batch_curve) q.second *= f;
  for (auto* c : {&p.fp16_convert_s, &p.bf16_convert_s})
    if (*c) *c = std::make_pair((*c)->first * f, (*c)->second * f);
  return p;
}

nlohmann::json profile_to_json(const CalibrationProfile& p) {
  nlohmann::json j = {{"format", "tandem-calibration"}, {"version", 1},    {"machine", p.machine},
                      {"backend", p.backend},            {"model", p.model}, {"batch", p.batch},
                      {"optimizer", p.optimizer},        {"optimizer_step_s", p.optimizer_step_s}};
  if (!p.input.empty()) j["input"] = p.input;
  j["layers"] = nlohmann::json::array();
  for (const auto& l : p.layers)
    j["layers"].push_back({{"name", l.name}, {"forward_s", l.forward_s}, {"backward_s", l.backward_s}});
  if (p.memory_bytes_per_s) j["memory_bytes_per_s"] = *p.memory_bytes_per_s;
  if (p.runtime_rss_bytes) j["runtime_rss_bytes"] = *p.runtime_rss_bytes;
  if (p.runtime_device_bytes) j["runtime_device_bytes"] = *p.runtime_device_bytes;
  if (p.activation_peak_bytes) j["activation_peak_bytes"] = *p.activation_peak_bytes;
  if (!p.activation_peak_curve.empty()) {
    j["activation_peak_curve"] = nlohmann::json::array();
    for (const auto& [b, bytes] : p.activation_peak_curve) j["activation_peak_curve"].push_back({b, bytes});
  }
  if (!p.primitive_bytes_curve.empty()) {
    j["primitive_bytes_curve"] = nlohmann::json::array();
    for (const auto& [b, bytes] : p.primitive_bytes_curve) j["primitive_bytes_curve"].push_back({b, bytes});
  }
  if (p.fp16_convert_s) j["fp16_convert_s"] = {p.fp16_convert_s->first, p.fp16_convert_s->second};
  if (p.bf16_convert_s) j["bf16_convert_s"] = {p.bf16_convert_s->first, p.bf16_convert_s->second};
  if (!p.batch_curve.empty()) {
    j["batch_curve"] = nlohmann::json::array();
    for (const auto& [b, t] : p.batch_curve) j["batch_curve"].push_back({b, t});
  }
  j["threads"] = p.threads;
  if (p.cpu_quota) j["cpu_quota"] = *p.cpu_quota;
  if (p.cpu_quota_sustained) j["cpu_quota_sustained"] = *p.cpu_quota_sustained;
  if (p.tcp_cpu_s_per_byte) j["tcp_cpu_s_per_byte"] = *p.tcp_cpu_s_per_byte;
  if (p.copy_cpu_s_per_byte) j["copy_cpu_s_per_byte"] = *p.copy_cpu_s_per_byte;
  if (p.tcp_cpu_s_per_wakeup) j["tcp_cpu_s_per_wakeup"] = *p.tcp_cpu_s_per_wakeup;
  if (!p.corun_slowdown.empty()) {
    j["corun_slowdown"] = nlohmann::json::array();
    for (const auto& [x, f] : p.corun_slowdown) j["corun_slowdown"].push_back({x, f});
  }
  if (p.wakeup_latency_s) j["wakeup_latency_s"] = *p.wakeup_latency_s;
  if (p.compute_cv) j["compute_cv"] = *p.compute_cv;
  if (p.step_overhead_cpu_s) j["step_overhead_cpu_s"] = *p.step_overhead_cpu_s;
  if (p.p2p_bytes_per_s || p.p2p_latency_s) {
    j["p2p"] = nlohmann::json::object();
    if (p.p2p_bytes_per_s) j["p2p"]["bandwidth_bytes_per_s"] = *p.p2p_bytes_per_s;
    if (p.p2p_latency_s) j["p2p"]["latency_s"] = *p.p2p_latency_s;
  }
  return j;
}

}  // namespace tandem::simulator
