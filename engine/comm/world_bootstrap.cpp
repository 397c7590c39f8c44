// Communicator::create: validates the request, agrees with the other ranks on hosts and settings
// through the store, connects the transport and builds the world communicator (id 0).
#include "engine/comm/world_bootstrap.hpp"

#include <unistd.h>

#include <limits>
#include <map>
#include <mutex>

#include <fmt/format.h>

#include "engine/comm/comm_options_env.hpp"
#include "engine/comm/communicator_impl.hpp"
#include "engine/core/error.hpp"
#include "engine/core/log.hpp"
#include "transports/memory_store.hpp"
#include "transports/socket_setup.hpp"

namespace tandem::engine::comm {

std::string world_key_prefix(const std::shared_ptr<transports::KvStore>& store, int rank) {
  // Stores are told apart by their control block (kept alive by the weak_ptr, so a new store never
  // looks like an old one).
  static std::mutex gen_mu;
  static std::map<std::weak_ptr<transports::KvStore>, std::map<int, uint64_t>, std::owner_less<>> generations;
  uint64_t gen = 0;
  {
    std::lock_guard lock(gen_mu);
    for (auto it = generations.begin(); it != generations.end();)
      it = it->first.expired() ? generations.erase(it) : std::next(it);
    gen = generations[std::weak_ptr<transports::KvStore>(store)][rank]++;
  }
  return fmt::format("tandem/comm{}/", gen);
}

std::string agreed_settings(const CommOptions& options) {
  return fmt::format("algo={} det={} chunk={}", algorithm_name(options.allreduce_algorithm),
                     options.deterministic ? 1 : 0, options.chunk_bytes);
}

std::vector<std::string> exchange_hosts(transports::KvStore& store, const std::string& prefix, int rank, int size,
                                        const std::string& host, const std::string& settings,
                                        std::chrono::milliseconds timeout) {
  store.set(fmt::format("{}host/{}", prefix, rank), host + "\n" + settings);
  std::vector<std::string> hosts(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    std::string v;
    try {
      v = store.get(fmt::format("{}host/{}", prefix, r), timeout);
    } catch (const Error& e) {
      // Name the rank that never came (stalled or dead before it joined), not only the store key.
      if (e.status() != Status::kTimeout) throw;
      TANDEM_THROW(Status::kTimeout, "communicator: rank {} did not join within {} ms (rank {} waited for it: {})", r,
                   timeout.count(), rank, e.what());
    }
    const size_t nl = v.find('\n');
    hosts[r] = v.substr(0, nl);
    const std::string theirs = nl == std::string::npos ? "" : v.substr(nl + 1);
    TANDEM_CHECK(theirs == settings, Status::kMismatch,
                 "communicator: rank {} was created with {} but rank {} with {} (TANDEM_ALLREDUCE_ALGO, "
                 "TANDEM_DETERMINISTIC and TANDEM_CHUNK_BYTES must agree on every rank)",
                 rank, settings, r, theirs);
  }
  return hosts;
}

Topology topology_of(const std::vector<std::string>& hosts) {
  Topology t;
  std::map<std::string, int32_t> host_index;
  for (const auto& h : hosts) {
    auto [it, fresh] = host_index.emplace(h, static_cast<int32_t>(host_index.size()));
    t.host_of.push_back(it->second);
  }
  return t;
}

std::unique_ptr<Communicator> Communicator::create(const BootstrapInfo& info,
                                                   std::shared_ptr<transports::KvStore> store,
                                                   const CommOptions& options_in) {
  TANDEM_REQUIRE(info.size >= 1, "communicator: world size must be at least 1 (got {})", info.size);
  TANDEM_REQUIRE(info.rank >= 0 && info.rank < info.size, "communicator: rank {} is outside [0, {})", info.rank,
                 info.size);
  TANDEM_REQUIRE(info.size <= static_cast<int>(std::numeric_limits<int32_t>::max() / 2),
                 "communicator: world size {} is too large", info.size);
  if (!store) {
    TANDEM_REQUIRE(info.size == 1, "communicator: a store is required for {} ranks", info.size);
    store = std::make_shared<transports::MemoryStore>();
  }
  const CommOptions options = comm_options_from_env(options_in);
  TANDEM_REQUIRE(options.timeout.count() > 0, "communicator: timeout must be positive (got {} ms)",
                 options.timeout.count());
  TANDEM_REQUIRE(static_cast<uint8_t>(options.allreduce_algorithm) <= static_cast<uint8_t>(Algorithm::kDeterministic),
                 "communicator: allreduce algorithm value {} is not one of auto, ring, hd, tree, hier, det",
                 static_cast<int>(options.allreduce_algorithm));
  // "direct" names the barrier's and point-to-point's pattern; allreduce has no such plan.
  TANDEM_CHECK(options.allreduce_algorithm != Algorithm::kDirect, Status::kUnsupported,
               "communicator: allreduce has no 'direct' algorithm (choose auto, ring, hd, tree, hier or det)");
  transports::require_known_transport(options.transport);

  // Every world communicator built on one store gets its own key namespace.
  const std::string prefix = world_key_prefix(store, info.rank);
  return create_world(info, std::move(store), options, prefix, 0, {});
}

std::unique_ptr<Communicator> create_world(const BootstrapInfo& info, std::shared_ptr<transports::KvStore> store,
                                           const CommOptions& options, const std::string& prefix, int epoch,
                                           std::vector<int> parent_ranks, std::string host) {
  // Ranks group by host name *and* by kernel boot and network namespace (local_host_id): machines that share a
  // name (containers all called "localhost") and the emulated hosts of one machine (bench/emu: a namespace each)
  // are apart.
  if (host.empty()) {
    host = info.host;
    if (host.empty()) {
      char buf[256] = {};
      host = gethostname(buf, sizeof(buf) - 1) == 0 ? buf : "localhost";
    }
    host += "@" + transports::local_host_id();
  }
  std::vector<std::string> hosts =
      exchange_hosts(*store, prefix, info.rank, info.size, host, agreed_settings(options), options.timeout);

  transports::TransportOptions to;
  to.name = options.transport;
  to.rank = info.rank;
  to.size = info.size;
  to.store = store.get();
  to.key_prefix = prefix + "transport/";
  if (!info.listen_addr.empty()) to.bind_host = info.listen_addr;
  to.connect_timeout = std::max(options.timeout, std::chrono::milliseconds(1000));
  auto shared = std::make_shared<SharedTransport>(transports::create_transport(to));
  std::vector<int> members(static_cast<size_t>(info.size));
  for (int r = 0; r < info.size; ++r) members[r] = r;
  CommunicatorImpl::Lineage lineage{store, prefix, epoch, std::move(parent_ranks), info.listen_addr};
  auto comm = std::make_unique<CommunicatorImpl>(std::move(shared), info.rank, std::move(members), 0, options,
                                                 std::move(hosts), std::move(lineage));
  log::info("comm: rank {}/{} connected over {} (allreduce {}{}, timeout {} ms{})", info.rank, info.size,
            comm->transport_name(), algorithm_name(options.allreduce_algorithm),
            options.deterministic ? ", deterministic" : "", options.timeout.count(),
            epoch > 0 ? fmt::format(", epoch {}", epoch) : std::string());
  return comm;
}

}  // namespace tandem::engine::comm
