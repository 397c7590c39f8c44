#include "transports/spin.hpp"

#include "engine/core/settings.hpp"

namespace tandem::transports {

std::chrono::microseconds spin_from_env(const char* var) {
  const auto us = settings::current()->integer(var);  // the registry bounds it to [0, 1000000]
  return us ? std::chrono::microseconds(*us) : kDefaultSpin;
}

}  // namespace tandem::transports
