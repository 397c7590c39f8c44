// The explicit transport registry. Built-ins are listed here rather than self-registering from
// static initializers: the module archives are linked without --whole-archive, so such
// registrations would be dropped by the linker.
#include <functional>

#include "engine/core/error.hpp"
#include "transports/inproc/inproc_transport.hpp"
#include "transports/transport.hpp"
#include "transports/tcp/tcp_transport.hpp"
#include "transports/zmq/zmq_transport.hpp"
#ifdef TANDEM_HAVE_UCX
#include "transports/ucx/ucx_transport.hpp"
#endif

namespace tandem::transports {
namespace {

struct Entry {
  const char* name;
  std::unique_ptr<Transport> (*create)(const TransportOptions&);
};

constexpr Entry kBuiltins[] = {
    {"inproc", &inproc::create},
    {"zmq", &zmq::create},
    {"tcp", &tcp::create},
#ifdef TANDEM_HAVE_UCX
    {"ucx", &ucx::create},
#endif
};

}  // namespace

std::vector<std::string> available_transports() {
  std::vector<std::string> names;
  for (const auto& e : kBuiltins) names.emplace_back(e.name);
  return names;
}

void require_known_transport(const std::string& name) {
  if (name == "auto") return;
  for (const auto& e : kBuiltins)
    if (name == e.name) return;
  std::string known;
  for (const auto& e : kBuiltins) known += fmt::format("{}{}", known.empty() ? "" : ", ", e.name);
  TANDEM_THROW(Status::kUnsupported, "unknown transport '{}' (this library has: {}, auto)", name, known);
}

std::unique_ptr<Transport> create_transport(const TransportOptions& options) {
  TANDEM_REQUIRE(options.size >= 1, "transport: world size must be at least 1, got {}", options.size);
  TANDEM_REQUIRE(options.rank >= 0 && options.rank < options.size, "transport: rank {} is outside [0, {})",
                 options.rank, options.size);
#ifdef TANDEM_HAVE_UCX
  const std::string name = options.name == "auto" ? "ucx" : options.name;
#else
  const std::string name = options.name == "auto" ? "tcp" : options.name;
#endif
  require_known_transport(options.name);
  for (const auto& e : kBuiltins)
    if (name == e.name) return e.create(options);
  TANDEM_THROW(Status::kInternal, "transport '{}' is registered but has no factory", name);
}

}  // namespace tandem::transports
