#pragma once
// Small readers of what Linux says about this process and host (/proc, cgroups), shared by the memory guard and
// the calibration's machine description.
#include <string>
#include <string_view>
#include <vector>

namespace tandem {

// A "Key:   123 kB" line of a /proc file (/proc/self/status, /proc/meminfo) in bytes; -1 when absent.
double proc_kib_field_bytes(const std::string& path, std::string_view key);

// One line of /proc/self/cgroup: "4:memory:/a/b" (v1: controllers {"memory"}) or "0::/a/b" (v2: none).
struct CgroupEntry {
  std::string hierarchy;                 // "4", "0"
  std::vector<std::string> controllers;  // empty for the v2 unified hierarchy
  std::string path;                      // relative to the hierarchy's root
  bool has(std::string_view controller) const;
};
std::vector<CgroupEntry> self_cgroups();

}  // namespace tandem
