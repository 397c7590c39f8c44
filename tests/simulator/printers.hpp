#pragma once
// Boost.Test printers for the enums the simulator tests use as data or compare.
#include <ostream>

#include "engine/parallel/schedule.hpp"

namespace tandem::engine::parallel {
inline std::ostream& operator<<(std::ostream& o, ScheduleKind k) { return o << schedule_name(k); }
inline std::ostream& operator<<(std::ostream& o, StageOpKind k) { return o << stage_op_name(k); }
}  // namespace tandem::engine::parallel
