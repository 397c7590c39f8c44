#include "engine/parallel/step_trace.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "engine/core/error.hpp"

namespace tandem::engine::parallel {

TimeSplit& TimeSplit::operator+=(const TimeSplit& o) noexcept {
  steps += o.steps;
  step_ns += o.step_ns;
  compute_ns += o.compute_ns;
  bubble_ns += o.bubble_ns;
  comm_ns += o.comm_ns;
  data_ns += o.data_ns;
  allreduce_ns += o.allreduce_ns;
  return *this;
}

void Tracer::add(std::string name, const char* category, int64_t start_ns, int64_t end_ns, int32_t tid) {
  if (!enabled_) return;
  if (events_.size() >= kMaxEvents) {
    ++dropped_;
    return;
  }
  events_.push_back(TraceEvent{std::move(name), category, start_ns, std::max<int64_t>(end_ns - start_ns, 0), tid});
}

std::string Tracer::to_json(int rank, const std::string& process_name) const {
  std::string out;
  out.reserve(events_.size() * 110 + 256);
  // Metadata: process and thread names (Perfetto shows them instead of numbers).
  out += fmt::format(R"({{"name":"process_name","ph":"M","pid":{},"tid":0,"args":{{"name":{}}}}},)", rank,
                     nlohmann::json(process_name).dump());
  out += fmt::format(R"({{"name":"process_sort_index","ph":"M","pid":{},"tid":0,"args":{{"sort_index":{}}}}},)", rank,
                     rank);
  out += fmt::format(R"({{"name":"thread_name","ph":"M","pid":{},"tid":0,"args":{{"name":"train"}}}},)", rank);
  out += fmt::format(R"({{"name":"thread_name","ph":"M","pid":{},"tid":1,"args":{{"name":"allreduce"}}}})", rank);
  for (const TraceEvent& e : events_) {
    // Chrome traces are in microseconds; keep sub-microsecond precision.
    out += fmt::format(R"(,{{"name":{},"cat":"{}","ph":"X","pid":{},"tid":{},"ts":{:.3f},"dur":{:.3f}}})",
                       nlohmann::json(e.name).dump(), e.category, rank, e.tid, static_cast<double>(e.start_ns) / 1e3,
                       static_cast<double>(e.dur_ns) / 1e3);
  }
  return out;
}

void write_chrome_trace(const std::string& path, const std::vector<std::string>& bodies) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    TANDEM_CHECK(f.good(), Status::kIo, "trace '{}': cannot open for writing", tmp);
    f << "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[";
    bool first = true;
    for (const std::string& b : bodies) {
      if (b.empty()) continue;
      if (!first) f << ',';
      f << b;
      first = false;
    }
    f << "]}\n";
    f.flush();
    TANDEM_CHECK(f.good(), Status::kIo, "trace '{}': write failed (disk full?)", tmp);
  }
  TANDEM_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, Status::kIo, "trace '{}': cannot rename {} over it", path,
               tmp);
}

}  // namespace tandem::engine::parallel
