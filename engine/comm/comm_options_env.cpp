#include "engine/comm/comm_options_env.hpp"

#include <charconv>
#include <cstdlib>
#include <cstring>
#include <string>

#include "engine/core/error.hpp"

namespace tandem::engine::comm {

namespace {

uint64_t parse_positive(const char* name, const char* v) {
  uint64_t out = 0;
  const char* end = v + std::strlen(v);
  auto [p, ec] = std::from_chars(v, end, out);
  TANDEM_REQUIRE(ec == std::errc() && p == end && out > 0, "{}='{}' is not a positive integer", name, v);
  return out;
}

}  // namespace

CommOptions comm_options_from_env(CommOptions base) {
  return comm_options_from_env(std::move(base), [](const char* n) -> const char* { return std::getenv(n); });
}

CommOptions comm_options_from_env(CommOptions o, const EnvLookup& lookup) {
  const CommOptions defaults;
  auto env = [&](const char* name) -> const char* {
    const char* v = lookup(name);
    return v != nullptr && *v != '\0' ? v : nullptr;
  };
  if (const char* v = env("TANDEM_TRANSPORT"); v && o.transport == defaults.transport) o.transport = v;
  if (const char* v = env("TANDEM_TIMEOUT_MS"); v && o.timeout == defaults.timeout)
    o.timeout = std::chrono::milliseconds(parse_positive("TANDEM_TIMEOUT_MS", v));
  if (const char* v = env("TANDEM_ALLREDUCE_ALGO"); v && o.allreduce_algorithm == Algorithm::kAuto)
    o.allreduce_algorithm = parse_algorithm(v);
  if (const char* v = env("TANDEM_DETERMINISTIC"); v && !o.deterministic) {
    const std::string s = v;
    TANDEM_REQUIRE(s == "0" || s == "1" || s == "true" || s == "false",
                   "TANDEM_DETERMINISTIC='{}' must be 0, 1, true or false", s);
    o.deterministic = s == "1" || s == "true";
  }
  if (const char* v = env("TANDEM_CHUNK_BYTES"); v && o.chunk_bytes == 0)
    o.chunk_bytes = parse_positive("TANDEM_CHUNK_BYTES", v);
  return o;
}

}  // namespace tandem::engine::comm
