#include "transports/socket_setup.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <random>

#include "engine/core/error.hpp"
#include "engine/core/settings.hpp"

namespace tandem::transports {

uint64_t random_nonce() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

std::string local_host_id() {
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string id;
  if (!(boot >> id) || id.empty()) return "";
  struct stat ns {};
  if (::stat("/proc/self/ns/net", &ns) != 0) return "";
  return fmt::format("{}:{:x}:{:x}", id, static_cast<uint64_t>(ns.st_dev), static_cast<uint64_t>(ns.st_ino));
}

bool local_sockets_setting(const char* var, const char* on_word) {
  const auto v = settings::current()->text(var);  // checked: on_word or "tcp"
  return !v || *v == on_word;
}

std::vector<std::string> address_fields(const std::string& value) {
  std::vector<std::string> f;
  for (size_t at = 0; at <= value.size();) {
    const size_t sp = std::min(value.find(' ', at), value.size());
    f.push_back(value.substr(at, sp - at));
    at = sp + 1;
  }
  return f;
}

}  // namespace tandem::transports
