#pragma once
// Small readers of what Linux says about this process and host (/proc, cgroups), shared by the memory guard and
// the calibration's machine description.
#include <optional>
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

// Where the hierarchy of one controller ("memory", "cpu"; v2: the unified one) that this process belongs to is
// mounted, and the process's cgroup in it. `ip netns exec` (the emulated cluster's hosts) remounts /sys without the
// cgroup file systems while the process's cgroup still limits it: then an ancestor's view (/proc/<pid>/root) is used.
struct CgroupMount {
  int version = 0;          // 1 or 2
  std::string mount;        // /sys/fs/cgroup/memory (v1) or /sys/fs/cgroup (v2), possibly under /proc/<pid>/root
  std::string mount_root;   // the hierarchy path mounted there (usually "/")
  std::string path;         // the process's cgroup, relative to the hierarchy root
};
std::optional<CgroupMount> find_cgroup(std::string_view controller);

// The smallest CFS quota, in cores, on the way from this process's cgroup up to the mounted root (v1
// cpu.cfs_quota_us / cpu.cfs_period_us, v2 cpu.max); nullopt when unlimited or unknown.
std::optional<double> cgroup_cpu_quota_cores();

}  // namespace tandem
