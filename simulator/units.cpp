#include "simulator/units.hpp"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "engine/core/error.hpp"

namespace tandem::simulator {

nlohmann::json read_json_file(const std::string& path, const std::string& what) {
  std::error_code ec;
  TANDEM_CHECK(!std::filesystem::is_directory(path, ec), Status::kInvalidArgument,
               "{} \"{}\" is a directory, not a JSON file", what, path);
  std::ifstream in(path);
  TANDEM_CHECK(in.good(), Status::kIo, "cannot read {} \"{}\"", what, path);
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    TANDEM_THROW(Status::kInvalidArgument, "{} \"{}\": {}", what, path, e.what());
  }
}

std::optional<double> json_number(const nlohmann::json& j, const std::string& key, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end()) return std::nullopt;
  TANDEM_REQUIRE(it->is_number(), "{}.{}: expected a number, got {}", where, key, it->dump());
  double v = it->get<double>();
  TANDEM_REQUIRE(std::isfinite(v) && v >= 0, "{}.{}: expected a finite number >= 0, got {}", where, key, v);
  return v;
}

namespace {
std::optional<double> first_of(const nlohmann::json& j, const std::string& base, const std::string& where,
                               std::initializer_list<std::pair<const char*, double>> units) {
  std::optional<double> out;
  std::string found;
  for (auto [suffix, scale] : units) {
    std::string key = base + suffix;
    if (auto v = json_number(j, key, where)) {
      TANDEM_REQUIRE(!out, "{}: both {} and {} given; use one", where, found, key);
      out = *v * scale;
      found = key;
    }
  }
  return out;
}
}  // namespace

std::optional<double> json_bandwidth(const nlohmann::json& j, const std::string& base, const std::string& where) {
  return first_of(j, base, where, {{"_bytes_per_s", 1.0}, {"_gbps", 1e9 / 8}, {"_mbps", 1e6 / 8}});
}
std::optional<double> json_seconds(const nlohmann::json& j, const std::string& base, const std::string& where) {
  return first_of(j, base, where, {{"_s", 1.0}, {"_ms", 1e-3}, {"_us", 1e-6}});
}
std::optional<double> json_bytes(const nlohmann::json& j, const std::string& base, const std::string& where) {
  return first_of(j, base, where, {{"_bytes", 1.0}, {"_mib", 1048576.0}, {"_gib", 1073741824.0}});
}

void json_check_keys(const nlohmann::json& j, std::initializer_list<const char*> allowed, const std::string& where) {
  TANDEM_REQUIRE(j.is_object(), "{}: expected an object, got {}", where, j.dump());
  for (auto it = j.begin(); it != j.end(); ++it) {
    bool ok = false;
    for (const char* a : allowed) ok = ok || it.key() == a;
    if (!ok) {
      std::string list;
      for (const char* a : allowed) list += std::string(list.empty() ? "" : ", ") + a;
      TANDEM_THROW(Status::kInvalidArgument, "{}: unknown field \"{}\" (known: {})", where, it.key(), list);
    }
  }
}

}  // namespace tandem::simulator
