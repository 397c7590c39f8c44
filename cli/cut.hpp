#pragma once
// `--cut` (tandem train, simulate, plan): an explicit pipeline cut given as pp + 1 layer indices, "0,78,151".
// The library checks the cut against the model (first 0, last the layer count, increasing); this only parses.
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace tandem::cli {

inline std::vector<int32_t> parse_cut(const std::string& text) {
  std::vector<int32_t> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 0 || v > INT32_MAX)
      throw CLI::ValidationError("--cut", "expected layer indices like 0,78,151, got \"" + text + "\"");
    out.push_back(static_cast<int32_t>(v));
  }
  if (out.empty()) throw CLI::ValidationError("--cut", "expected layer indices like 0,78,151, got nothing");
  return out;
}

}  // namespace tandem::cli
