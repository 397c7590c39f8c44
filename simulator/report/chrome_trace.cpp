#include "simulator/report/chrome_trace.hpp"

#include <fstream>

#include "engine/core/error.hpp"

namespace tandem::simulator {

nlohmann::json chrome_trace(const std::vector<TraceSpan>& spans, const std::vector<std::string>& rank_names,
                            const nlohmann::json& other_data) {
  nlohmann::json ev = nlohmann::json::array();
  for (size_t r = 0; r < rank_names.size(); ++r) {
    ev.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", r}, {"args", {{"name", rank_names[r]}}}});
    ev.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", r}, {"tid", 0}, {"args", {{"name", "train"}}}});
    ev.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", r}, {"tid", 1}, {"args", {{"name", "allreduce"}}}});
  }
  for (const TraceSpan& s : spans) {
    ev.push_back({{"name", s.name},
                  {"cat", s.category},
                  {"ph", "X"},
                  {"ts", s.start_s * 1e6},
                  {"dur", (s.end_s - s.start_s) * 1e6},
                  {"pid", s.rank},
                  {"tid", s.lane}});
  }
  return {{"traceEvents", std::move(ev)}, {"displayTimeUnit", "ms"}, {"otherData", other_data}};
}

void write_chrome_trace(const std::string& path, const nlohmann::json& trace) {
  std::ofstream out(path);
  TANDEM_CHECK(out.good(), Status::kIo, "cannot write trace file \"{}\"", path);
  out << trace.dump() << "\n";
  out.close();
  TANDEM_CHECK(out.good(), Status::kIo, "writing trace file \"{}\" failed", path);
}

}  // namespace tandem::simulator
