#pragma once
// CommOptions from the environment: the one reader of TANDEM_TRANSPORT, TANDEM_TIMEOUT_MS,
// TANDEM_ALLREDUCE_ALGO, TANDEM_DETERMINISTIC and TANDEM_CHUNK_BYTES (Communicator::create and the
// bootstrap both go through it).
#include <functional>

#include "engine/comm/communicator.hpp"

namespace tandem::engine::comm {

// Returns the value of an environment variable or nullptr (std::getenv by default; tests pass maps).
using EnvLookup = std::function<const char*(const char*)>;

// Overrides the options `base` leaves at their defaults (an explicit choice is never overridden):
// transport "auto" <- TANDEM_TRANSPORT, timeout <- TANDEM_TIMEOUT_MS (positive ms),
// allreduce_algorithm kAuto <- TANDEM_ALLREDUCE_ALGO, deterministic false <- TANDEM_DETERMINISTIC
// (0, 1, true, false), chunk_bytes 0 <- TANDEM_CHUNK_BYTES (positive). Empty counts as unset.
// kInvalidArgument naming the variable when a value it applies is malformed.
CommOptions comm_options_from_env(CommOptions base);
CommOptions comm_options_from_env(CommOptions base, const EnvLookup& lookup);

}  // namespace tandem::engine::comm
