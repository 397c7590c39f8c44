#include "transports/spin.hpp"

#include <cstdlib>

#include "engine/core/error.hpp"

namespace tandem::transports {

std::chrono::microseconds spin_from_env(const char* var) {
  const char* env = std::getenv(var);
  if (!env || !*env) return kDefaultSpin;
  char* end = nullptr;
  const long us = std::strtol(env, &end, 10);
  TANDEM_REQUIRE(end && *end == '\0' && us >= 0 && us <= 1000000, "{} must be in [0, 1000000], got '{}'", var, env);
  return std::chrono::microseconds(us);
}

}  // namespace tandem::transports
