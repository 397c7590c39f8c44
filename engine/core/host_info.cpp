#include "engine/core/host_info.hpp"

#include <fstream>
#include <sstream>

namespace tandem {

double proc_kib_field_bytes(const std::string& path, std::string_view key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.size() <= key.size() || line.compare(0, key.size(), key) != 0 || line[key.size()] != ':') continue;
    std::istringstream ss(line.substr(key.size() + 1));
    double kib = -1;
    ss >> kib;
    return kib < 0 ? -1 : kib * 1024.0;
  }
  return -1;
}

bool CgroupEntry::has(std::string_view controller) const {
  for (const std::string& c : controllers)
    if (c == controller) return true;
  return false;
}

std::vector<CgroupEntry> self_cgroups() {
  std::vector<CgroupEntry> out;
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  while (std::getline(in, line)) {
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    CgroupEntry e;
    e.hierarchy = line.substr(0, a);
    std::stringstream cs(line.substr(a + 1, b - a - 1));
    for (std::string c; std::getline(cs, c, ',');)
      if (!c.empty()) e.controllers.push_back(c);
    e.path = line.substr(b + 1);
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace tandem
