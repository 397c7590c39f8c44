// tandem_store_*: a rendezvous store served by this process rather than by rank 0 of the job (issue #17): the
// job's ranks reach it through TANDEM_STORE, and it outlives them all, so the survivors of any rank's death,
// rank 0's included, can still agree on their membership through it. `tandem launch` hosts one per job.
#include <memory>
#include <string>

#include "api/src/guard.hpp"
#include "api/src/handles.hpp"
#include "engine/comm/rendezvous_server.hpp"

namespace tandem::api {
constexpr uint32_t kStoreMagic = 0x5453544f;  // "TSTO"
}  // namespace tandem::api

struct tandem_store : tandem::api::Handle<tandem::api::kStoreMagic> {
  tandem::api::ContextEnv env;
  std::unique_ptr<tandem::engine::comm::RendezvousServer> server;
};

extern "C" {

TANDEM_API tandem_status_t tandem_store_serve(tandem_context_t* ctx, const char* bind_addr, int32_t port,
                                              const char* secret, tandem_store_t** out) TANDEM_NOEXCEPT {
  using namespace tandem;
  return api::guarded([&] {
    const api::ContextEnv& env = api::checked(ctx, "tandem_store_serve", "context").env;
    TANDEM_REQUIRE(out != nullptr, "tandem_store_serve: out is NULL");
    *out = nullptr;
    TANDEM_REQUIRE(secret != nullptr && *secret != '\0', "tandem_store_serve: secret is {} (the job's secret)",
                   secret == nullptr ? "NULL" : "empty");
    TANDEM_REQUIRE(port >= 0 && port <= 65535, "tandem_store_serve: port {} is out of range [0, 65535]", port);
    TANDEM_REQUIRE(bind_addr == nullptr || *bind_addr != '\0', "tandem_store_serve: bind_addr is empty");
    const api::ContextScope scope(env);
    engine::comm::RendezvousServerOptions o;
    o.bind_host = bind_addr == nullptr ? "127.0.0.1" : bind_addr;
    o.port = port;
    o.secret = secret;
    o.world_size = 0;            // grown and shrunk worlds, and joiners, all meet here
    o.every_generation = true;   // the ranks' communicators, however many they create
    o.shutdown_grace = std::chrono::milliseconds(0);  // destroyed after the ranks are done (tandem.h)
    auto h = std::make_unique<tandem_store>();
    h->env = env;
    h->server = std::make_unique<engine::comm::RendezvousServer>(o);
    *out = h.release();
  });
}

TANDEM_API tandem_status_t tandem_store_port(const tandem_store_t* store, int32_t* port) TANDEM_NOEXCEPT {
  using namespace tandem;
  return api::guarded([&] {
    const auto& s = api::checked(store, "tandem_store_port", "store");
    TANDEM_REQUIRE(port != nullptr, "tandem_store_port: port is NULL");
    *port = s.server->port();
  });
}

TANDEM_API void tandem_store_destroy(tandem_store_t* store) TANDEM_NOEXCEPT {
  if (!tandem::api::is_live(store)) return;
  const tandem::api::ContextScope scope(store->env);
  try {
    delete store;
  } catch (...) {
  }
}

}  // extern "C"
