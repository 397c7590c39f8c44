#pragma once
// Chrome trace JSON (opens in Perfetto or chrome://tracing) of a simulated step, in the runtime's
// format (engine/parallel/step_trace.hpp): "X" events with microsecond times, pid = rank, tid 0 the
// training thread and tid 1 the all-reduces, categories compute, bubble, comm, allreduce. Process
// names say which node each rank ran on.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "simulator/step.hpp"

namespace tandem::simulator {

nlohmann::json chrome_trace(const std::vector<TraceSpan>& spans, const std::vector<std::string>& rank_names,
                            const nlohmann::json& other_data);
// Writes the trace to `path` (kIo naming the file when it cannot be written).
void write_chrome_trace(const std::string& path, const nlohmann::json& trace);

}  // namespace tandem::simulator
