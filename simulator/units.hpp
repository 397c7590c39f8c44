#pragma once
// Reading numbers with units from JSON objects: a field may be given in any of several units
// ("bandwidth_gbps", "bandwidth_mbps", "bandwidth_bytes_per_s", ...); errors name the field path.
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace tandem::simulator {

// A number at j[key] (must be a finite number >= 0); `where` prefixes error messages.
std::optional<double> json_number(const nlohmann::json& j, const std::string& key, const std::string& where);
// Bandwidth in bytes/s from "<base>_bytes_per_s", "<base>_gbps", "<base>_mbps" (bits/s units).
std::optional<double> json_bandwidth(const nlohmann::json& j, const std::string& base, const std::string& where);
// Seconds from "<base>_s", "<base>_ms", "<base>_us".
std::optional<double> json_seconds(const nlohmann::json& j, const std::string& base, const std::string& where);
// Bytes from "<base>_bytes", "<base>_mib", "<base>_gib".
std::optional<double> json_bytes(const nlohmann::json& j, const std::string& base, const std::string& where);
// The JSON document in file `path`: an unreadable file is kIo, malformed JSON kInvalidArgument, both naming
// `what` and the path ("job file \"x.json\": ...").
nlohmann::json read_json_file(const std::string& path, const std::string& what);
// Rejects keys of `j` not in `allowed` (typos in cluster files must not pass silently).
void json_check_keys(const nlohmann::json& j, std::initializer_list<const char*> allowed, const std::string& where);

}  // namespace tandem::simulator
