#pragma once
// Transport variants the test suites run beside the plain transport names.
#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "engine/core/settings.hpp"

namespace tandem::transports::testing {

// Suites run each transport under its name, plus variants written "<name>+<variant>":
// "tcp+inet" and "zmq+inet" keep every connection on TCP (TANDEM_TCP_LOCAL / TANDEM_ZMQ_LOCAL =
// tcp), where plain "tcp" and "zmq" reach the ranks of this host -- every rank of a test -- over
// local sockets; plain "tcp" moves its frames through shared memory beside them, "tcp+unix" over
// the local sockets themselves (TANDEM_TCP_LOCAL=unix).
inline std::vector<std::string> transport_variants(std::vector<std::string> names) {
  if (std::find(names.begin(), names.end(), "tcp") != names.end()) names.push_back("tcp+unix");
  for (const char* socket_transport : {"tcp", "zmq"})
    if (std::find(names.begin(), names.end(), socket_transport) != names.end())
      names.push_back(std::string(socket_transport) + "+inet");
  return names;
}

inline std::string transport_name(const std::string& spec) { return spec.substr(0, spec.find('+')); }

// Sets what a variant needs for its lifetime, in the process settings snapshot (this process) and in
// the environment (processes it starts); create it before any rank thread starts (neither is
// thread-safe) and let it go after they have all joined.
class VariantEnv {
 public:
  explicit VariantEnv(const std::string& spec)
      : var_(spec == "tcp+inet" || spec == "tcp+unix" ? "TANDEM_TCP_LOCAL"
             : spec == "zmq+inet"                     ? "TANDEM_ZMQ_LOCAL"
                                                      : nullptr) {
    if (var_) {
      const char* value = spec == "tcp+unix" ? "unix" : "tcp";
      ::setenv(var_, value, 1);
      setting_.emplace(var_, value);
    }
  }
  ~VariantEnv() {
    if (var_) ::unsetenv(var_);
  }
  VariantEnv(const VariantEnv&) = delete;
  VariantEnv& operator=(const VariantEnv&) = delete;

 private:
  const char* var_;
  std::optional<settings::ScopedProcessValue> setting_;
};

}  // namespace tandem::transports::testing
