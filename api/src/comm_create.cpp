// Bootstrapping the engine communicator for tandem_comm_create. Explicit parameters are given to
// the bootstrap as the highest-precedence (TANDEM_*) variables of an overlaid environment over the
// context's settings (current() under tandem_comm_create's ContextScope), so the
// precedence rules and consistency checks of engine/comm/bootstrap.hpp apply unchanged to mixes
// of parameters and environment.
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "api/src/comm_handles.hpp"
#include "engine/comm/bootstrap.hpp"
#include "engine/core/log.hpp"
#include "engine/core/settings.hpp"

namespace tandem::api {
namespace {

struct Override {
  const char* name;
  std::string value;
  bool unset;
};

class OverlaidEnv {
 public:
  void set(const char* name, std::string value) { vars_.push_back({name, std::move(value), false}); }
  void unset(const char* name) { vars_.push_back({name, {}, true}); }
  const char* operator()(const char* name) const {
    for (const auto& v : vars_) {
      if (std::strcmp(v.name, name) == 0) return v.unset ? nullptr : v.value.c_str();
    }
    return settings::lookup(name);  // TANDEM_* from the context's snapshot, other launchers' names from the environment
  }

 private:
  std::vector<Override> vars_;
};

}  // namespace

namespace {

// The job these settings name: explicit settings first, the environment for the rest.
std::pair<engine::comm::BootstrapConfig, engine::comm::CommOptions> resolve(const CreateParams& p) {
  using namespace engine::comm;
  OverlaidEnv env;
  if (p.rank || p.size) {
    int rank = 0;
    int size = 1;
    if (p.rank && p.size) {
      rank = *p.rank;
      size = *p.size;
    } else {
      // Only one of the pair given: the other comes from the environment (TANDEM_RANK and
      // TANDEM_WORLD_SIZE are read together).
      const BootstrapConfig from_env = bootstrap_config_from_env(OverlaidEnv());
      rank = p.rank.value_or(from_env.info.rank);
      size = p.size.value_or(from_env.info.size);
      TANDEM_REQUIRE(rank < size, "tandem_comm_create: rank {} ({}) is not below size {} ({})", rank,
                     p.rank ? "params->rank" : from_env.source + " environment", size,
                     p.size ? "params->size" : from_env.source + " environment");
    }
    env.set("TANDEM_RANK", std::to_string(rank));
    env.set("TANDEM_WORLD_SIZE", std::to_string(size));
    // The launcher's placement on this host describes its own world, not the one given here:
    // the bootstrap derives it afresh (all local when the rendezvous address is loopback).
    for (const char* v : {"TANDEM_LOCAL_RANK", "TANDEM_LOCAL_WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                          "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_LOCALID",
                          "SLURM_NTASKS_PER_NODE"}) {
      env.unset(v);
    }
  }
  if (p.master_addr) env.set("TANDEM_MASTER_ADDR", *p.master_addr);
  if (p.master_port) env.set("TANDEM_MASTER_PORT", std::to_string(*p.master_port));
  if (p.secret) env.set("TANDEM_SECRET", *p.secret);
  if (p.transport) env.set("TANDEM_TRANSPORT", *p.transport);
  if (p.timeout_ms) env.set("TANDEM_TIMEOUT_MS", std::to_string(*p.timeout_ms));
  if (p.deterministic) env.set("TANDEM_DETERMINISTIC", *p.deterministic ? "1" : "0");

  const EnvLookup lookup = [&env](const char* name) { return env(name); };
  const BootstrapConfig config = bootstrap_config_from_env(lookup);
  CommOptions base;
  if (p.allreduce_algorithm) base.allreduce_algorithm = *p.allreduce_algorithm;
  CommOptions options = comm_options_from_env(base, lookup);
  if (p.deterministic) options.deterministic = *p.deterministic;  // an explicit 0 wins over the environment
  log::debug("tandem_comm_create: rank {} of {} ({}), rendezvous {}:{}, transport {}, timeout {} ms", config.info.rank,
             config.info.size, config.source, config.master_addr, config.master_port, options.transport,
             options.timeout.count());
  return {config, options};
}

}  // namespace

std::unique_ptr<engine::comm::Communicator> create_engine_comm(const CreateParams& p) {
  const auto [config, options] = resolve(p);
  return engine::comm::create_communicator(config, options);
}

std::unique_ptr<engine::comm::Communicator> join_engine_comm(const CreateParams& p, std::chrono::milliseconds wait) {
  const auto [config, options] = resolve(p);
  return engine::comm::join_communicator(config, options, wait);
}

}  // namespace tandem::api
