#pragma once
// Boost.Test printers for the enums the simulator tests use as data or compare.
#include <ostream>

#include "engine/parallel/parallel_config.hpp"
#include "engine/parallel/schedule.hpp"
#include "simulator/compute/compute_model.hpp"

namespace tandem::engine::parallel {
inline std::ostream& operator<<(std::ostream& o, ScheduleKind k) { return o << schedule_name(k); }
inline std::ostream& operator<<(std::ostream& o, StageOpKind k) { return o << stage_op_name(k); }
inline std::ostream& operator<<(std::ostream& o, Strategy s) { return o << strategy_name(s); }
}  // namespace tandem::engine::parallel
namespace tandem::simulator {
inline std::ostream& operator<<(std::ostream& o, OptimizerKind k) { return o << optimizer_name(k); }
}  // namespace tandem::simulator
