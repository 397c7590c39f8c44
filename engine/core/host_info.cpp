#include "engine/core/host_info.hpp"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <optional>
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


namespace {
std::string first_line(const std::string& path) {
  std::ifstream in(path);
  std::string s;
  if (!in.good() || !std::getline(in, s)) return {};
  return s;
}
}  // namespace

std::optional<CgroupMount> find_cgroup(std::string_view controller) {
  std::string v1_path, v2_path;
  bool have_v1 = false, have_v2 = false;
  for (const CgroupEntry& e : self_cgroups()) {
    if (e.has(controller)) {
      have_v1 = true;
      v1_path = e.path;
    } else if (e.controllers.empty() && e.hierarchy == "0") {
      have_v2 = true;
      v2_path = e.path;
    }
  }
  if (!have_v1 && !have_v2) return std::nullopt;
  // Where the hierarchy is mounted, from a mountinfo file: "id parent maj:min root mountpoint opts ... - fstype
  // source superopts". `prefix` is prepended to the mount point (to reach another mount namespace's view).
  auto from_mountinfo = [&](const std::string& mountinfo, const std::string& prefix) -> std::optional<CgroupMount> {
    std::ifstream in(mountinfo);
    std::string line;
    std::optional<CgroupMount> v2;
    while (std::getline(in, line)) {
      const size_t dash = line.find(" - ");
      if (dash == std::string::npos) continue;
      std::istringstream head(line.substr(0, dash)), tail(line.substr(dash + 3));
      std::string id, parent, dev, root, mountpoint, fstype, source, superopts;
      head >> id >> parent >> dev >> root >> mountpoint;
      tail >> fstype >> source >> superopts;
      if (fstype == "cgroup" && have_v1) {
        std::stringstream os(superopts);
        for (std::string o; std::getline(os, o, ',');)
          if (o == controller) return CgroupMount{1, prefix + mountpoint, root, v1_path};
      } else if (fstype == "cgroup2" && have_v2 && !v2) {
        v2 = CgroupMount{2, prefix + mountpoint, root, v2_path};
      }
    }
    return v2;
  };
  if (auto mine = from_mountinfo("/proc/self/mountinfo", "")) return mine;
  // `ip netns exec` (how the emulated cluster's hosts run) remounts /sys without the cgroup file systems, while the
  // process's cgroup still limits it. An ancestor started before that (the launcher, the shell) still sees them,
  // and its view is reachable through /proc/<pid>/root.
  pid_t pid = ::getppid();
  for (int depth = 0; depth < 8 && pid > 1; ++depth) {
    const std::string dir = "/proc/" + std::to_string(pid);
    if (auto theirs = from_mountinfo(dir + "/mountinfo", dir + "/root")) {
      if (::access((theirs->mount + "/").c_str(), R_OK) == 0) return theirs;
    }
    // The next ancestor: field 4 of /proc/<pid>/stat ("pid (comm) state ppid ..."; comm may hold spaces).
    const std::string stat = first_line(dir + "/stat");
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) break;
    std::istringstream rest(stat.substr(close + 1));
    std::string state;
    long ppid = 0;
    if (!(rest >> state >> ppid)) break;
    pid = static_cast<pid_t>(ppid);
  }
  return std::nullopt;
}


std::optional<double> cgroup_cpu_quota_cores() {
  const auto cg = find_cgroup("cpu");
  if (!cg) return std::nullopt;
  std::string rel = cg->path;
  if (cg->mount_root != "/" && rel.rfind(cg->mount_root, 0) == 0) rel = rel.substr(cg->mount_root.size());
  std::optional<double> best;
  for (;;) {
    const std::string dir = cg->mount + (rel == "/" ? std::string() : rel);
    double cores = 0;
    if (cg->version == 1) {
      std::ifstream q(dir + "/cpu.cfs_quota_us"), p(dir + "/cpu.cfs_period_us");
      long quota = -1, period = 0;
      if ((q >> quota) && (p >> period) && quota > 0 && period > 0)
        cores = static_cast<double>(quota) / static_cast<double>(period);
    } else {
      std::ifstream m(dir + "/cpu.max");
      std::string quota;
      long period = 0;
      if ((m >> quota >> period) && quota != "max" && period > 0)
        cores = std::atof(quota.c_str()) / static_cast<double>(period);
    }
    if (cores > 0 && (!best || cores < *best)) best = cores;
    if (rel.empty() || rel == "/") break;
    const size_t slash = rel.find_last_of('/');
    rel = slash == 0 || slash == std::string::npos ? "/" : rel.substr(0, slash);
  }
  return best;
}

}  // namespace tandem
