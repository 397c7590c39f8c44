// Communicators from the environment: bootstrap_env.cpp finds the job and starts the rendezvous,
// comm_options_env.cpp reads the options; here the rendezvous is tied to the communicator's lifetime
// (bootstrapped_communicator.hpp).
#include "engine/comm/bootstrap.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include "engine/comm/admission.hpp"
#include "engine/comm/bootstrapped_communicator.hpp"
#include "engine/comm/world_bootstrap.hpp"
#include "transports/socket_setup.hpp"
#include "engine/core/error.hpp"
#include "engine/core/log.hpp"

namespace tandem::engine::comm {

namespace {

// This host's address on the route to `host` (a UDP connect sends nothing); "" when there is none.
std::string route_source_address(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  std::string h = host;
  if (h.size() > 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  if (::getaddrinfo(h.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || res == nullptr) return "";
  std::string out;
  const int fd = ::socket(res->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_storage local{};
  socklen_t len = sizeof(local);
  char text[INET6_ADDRSTRLEN] = {};
  if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
    const void* a = local.ss_family == AF_INET6 ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6&>(local).sin6_addr)
                                                : static_cast<const void*>(&reinterpret_cast<sockaddr_in&>(local).sin_addr);
    if (::inet_ntop(local.ss_family, a, text, sizeof(text)) != nullptr) out = text;
  }
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(res);
  return out;
}

}  // namespace

std::unique_ptr<Communicator> create_communicator(const BootstrapConfig& config, const CommOptions& options) {
  // An unknown transport fails here, on every rank, before anyone waits for anyone.
  const std::string transport = comm_options_from_env(options).transport;
  transports::require_known_transport(transport);
  // Ranks that are threads of this process meet in memory: no port, no secret on the wire.
  Rendezvous rdv = transport == "inproc" ? in_process_rendezvous(config) : start_rendezvous(config, options.timeout);
  BootstrapInfo info = config.info;
  if (info.size > 1 && info.listen_addr.empty() && transport != "inproc" && !is_loopback_address(config.master_addr)) {
    // Ranks on other machines must reach ours: listen where this host meets rank 0's, not on loopback.
    info.listen_addr = route_source_address(config.master_addr, config.master_port);
    log::debug("rank {}: transports listen on {} (the route to {})", info.rank, info.listen_addr, config.master_addr);
  }
  std::unique_ptr<Communicator> inner = Communicator::create(info, rdv.store, options);
  TANDEM_CHECK(inner != nullptr, Status::kInternal, "rank {}: Communicator::create returned no communicator",
               config.info.rank);
  return std::make_unique<BootstrappedCommunicator>(std::move(rdv), std::move(inner));
}

std::unique_ptr<Communicator> join_communicator(const BootstrapConfig& config, const CommOptions& options_in,
                                                std::chrono::milliseconds wait) {
  const CommOptions options = comm_options_from_env(options_in);
  transports::require_known_transport(options.transport);
  TANDEM_REQUIRE(wait.count() > 0, "join: the wait for admission must be positive (got {} ms)", wait.count());
  Rendezvous rdv = join_rendezvous(config, options.transport, options.timeout);
  std::string host = config.info.host.empty() ? local_hostname() : config.info.host;
  host += "@" + transports::local_host_id();
  log::info("join: joiner {} asks the job at {}:{} for admission (waiting up to {} ms)", config.info.rank,
            config.master_addr, config.master_port, wait.count());
  const JoinAnswer a = request_admission(*rdv.store, host, wait);
  BootstrapInfo info = config.info;
  info.rank = a.rank;
  info.size = a.size;
  if (info.listen_addr.empty() && options.transport != "inproc" && !is_loopback_address(config.master_addr))
    info.listen_addr = route_source_address(config.master_addr, config.master_port);
  std::vector<int> parents(static_cast<size_t>(a.size), -1);
  for (int r = 0; r < a.old_size; ++r) parents[static_cast<size_t>(r)] = r;
  std::unique_ptr<Communicator> inner =
      create_world(info, rdv.store, options, grow_prefix(a.grow_id), a.epoch, std::move(parents), host);
  await_outcome(*rdv.store, a.grow_id, 2 * options.timeout);
  log::info("join: admitted as rank {} of {} (epoch {})", a.rank, a.size, a.epoch);
  return std::make_unique<BootstrappedCommunicator>(std::move(rdv), std::move(inner));
}

std::unique_ptr<Communicator> create_communicator_from_env(const CommOptions& options) {
  return create_communicator(bootstrap_config_from_env(), comm_options_from_env(options));
}

std::unique_ptr<Communicator> create_communicator(int rank, int size, const std::string& master_addr, int master_port,
                                                  const std::string& secret, const CommOptions& options) {
  TANDEM_REQUIRE(size >= 1 && rank >= 0 && rank < size, "rank {} is outside a world of size {}", rank, size);
  TANDEM_REQUIRE(size == 1 || !secret.empty(), "a job of {} ranks needs a non-empty secret", size);
  BootstrapConfig c;
  c.info.rank = rank;
  c.info.size = size;
  c.master_addr = master_addr.empty() ? "127.0.0.1" : master_addr;
  c.master_port = master_port;
  c.secret = secret.empty() ? "tandem-single-rank" : secret;
  c.source = "explicit";
  const bool loopback = is_loopback_address(c.master_addr);
  c.info.local_rank = loopback ? rank : 0;
  c.info.local_size = loopback ? size : 1;
  c.info.host = local_hostname();
  return create_communicator(c, options);
}

}  // namespace tandem::engine::comm
