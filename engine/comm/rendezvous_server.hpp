#pragma once
// The rendezvous server: a small key-value store that rank 0 (or `tandem launch`, see bootstrap.hpp) serves over
// ZeroMQ (ROUTER on TCP) from a background thread, for as long as the object lives. Peers must prove they know
// the job's shared secret (challenge-response, rendezvous_protocol.hpp) before anything they send is acted
// on; refused peers are logged with their address and get no data. Garbage on the port, oversized
// frames and half-open connections never crash, stall or disturb the store.
//
// Threads: the public methods are thread-safe. Destruction waits until every joined client has
// closed (at most shutdown_grace), then answers pending GETs with "shutting down" and stops.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

namespace tandem::engine::comm {

struct RendezvousServerOptions {
  std::string bind_host = "127.0.0.1";  // an IP literal, "*" (every interface) or an interface name
  int port = 0;                         // 0 = an ephemeral port (see port())
  std::string secret;                   // the job's shared secret; must be non-empty
  int world_size = 0;                   // > 0: peers announcing another size (or rank >= size) are refused
  std::chrono::milliseconds handshake_timeout{10000};  // unauthenticated connections are forgotten after this
  // On destruction the server keeps serving until every client that joined has said goodbye (a
  // client does when destroyed), at most this long: rank 0 may finish first while other ranks still
  // wait on the store (e.g. in a final barrier).
  std::chrono::milliseconds shutdown_grace{3000};
  uint64_t generation = 0;  // the communicator generation served first (rendezvous_protocol.hpp); see admit()
  // true: every generation is served (a store hosted outside the ranks, e.g. by `tandem launch`, which cannot
  // know how many communicators the ranks create; `generation` and admit() are then moot).
  bool every_generation = false;
};

struct RendezvousServerStats {
  uint64_t authenticated = 0;  // successful handshakes
  uint64_t refused = 0;        // wrong proofs (wrong secret)
  uint64_t malformed = 0;      // messages dropped as malformed or unauthenticated
  uint64_t keys = 0;           // keys stored now
};

class RendezvousServer {
 public:
  // Binds and starts serving. Throws tandem::Error: kInvalidArgument (empty secret, bad port),
  // kTransport (cannot listen, e.g. the port is taken).
  explicit RendezvousServer(const RendezvousServerOptions& options);
  ~RendezvousServer();
  RendezvousServer(const RendezvousServer&) = delete;
  RendezvousServer& operator=(const RendezvousServer&) = delete;

  int port() const { return port_; }
  // Serves communicator generation `generation` too (a second communicator of the job created while
  // the first still lives shares this server). Thread-safe.
  void admit(uint64_t generation);
  // "tcp://host:port" as bound.
  const std::string& endpoint() const { return endpoint_; }
  RendezvousServerStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::thread thread_;
  int port_ = 0;
  std::string endpoint_;
};

}  // namespace tandem::engine::comm
