#pragma once
// Bootstrap: who this process is (rank, size, local rank/size), where the job meets (the
// rendezvous address), and the job's secret -- read from the environment so that `tandem launch`,
// torchrun-style launchers, `mpirun` and `srun` can all start a job -- then a communicator.
//
// Precedence, for each of rank/size (taken together), local rank, local size, address and port:
//   1. TANDEM_RANK, TANDEM_WORLD_SIZE, TANDEM_LOCAL_RANK, TANDEM_LOCAL_WORLD_SIZE,
//      TANDEM_MASTER_ADDR, TANDEM_MASTER_PORT
//   2. torchrun: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT
//   3. Open MPI: OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE
//   4. Slurm: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID
//   5. nothing set: a single rank (size 1).
// The secret is TANDEM_SECRET (`tandem launch` generates a random one per job).
// Who serves the rendezvous store: rank 0 of the job, in its process -- unless TANDEM_STORE=HOST:PORT names the
// job's rendezvous address and port (TANDEM_MASTER_ADDR:TANDEM_MASTER_PORT, exactly as spelled there): another
// process (`tandem launch`, which outlives every rank) serves it there, and every rank, rank 0 included, is
// only its client -- so the store, and the shrink agreement it carries, survive the death of any rank. A
// communicator that meets elsewhere (an explicit port, e.g. a sub-job's) ignores TANDEM_STORE.
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "engine/comm/comm_options_env.hpp"  // comm_options_from_env, EnvLookup
#include "engine/comm/communicator.hpp"
#include "engine/comm/rendezvous_client.hpp"
#include "engine/comm/rendezvous_server.hpp"
#include "transports/transport.hpp"

namespace tandem::engine::comm {

struct BootstrapConfig {
  BootstrapInfo info;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;     // 0 only for a single rank
  std::string secret;
  bool external_store = false;     // TANDEM_STORE names this rendezvous: no rank serves it (see above)
  std::string source = "default";  // which family gave rank/size: TANDEM, torchrun, Open MPI, Slurm, default
  std::vector<std::string> notes;  // decisions taken without being told (derived port, default secret), for logs
};

// Throws tandem::Error(kInvalidArgument) naming the variable for a malformed or inconsistent value
// (not an integer, rank outside [0, size), port outside 1..65535, ...).
BootstrapConfig bootstrap_config_from_env();
BootstrapConfig bootstrap_config_from_env(const EnvLookup& lookup);

// The job's meeting point for this process: rank 0 owns the server (none when config.external_store); every rank
// (rank 0 included) talks to it through `client`. For a single rank there is neither and `store` is in-memory.
struct Rendezvous {
  std::shared_ptr<RendezvousServer> server;  // rank 0 only
  std::shared_ptr<RendezvousClient> client;  // size > 1
  // The store to hand to transports: forwards to `client` and keeps `server` alive as long as it
  // is referenced, so rank 0's server outlives everything that may still use it.
  std::shared_ptr<transports::KvStore> store;
};

// True for 127.0.0.0/8, ::1 and "localhost" (the job then runs on one host).
bool is_loopback_address(const std::string& addr);
// This machine's host name ("localhost" when unknown).
std::string local_hostname();

// Rank 0 starts the server on master_port (listening on every interface unless master_addr is a
// loopback address); then every rank connects and authenticates within `timeout`.
Rendezvous start_rendezvous(const BootstrapConfig& config, std::chrono::milliseconds timeout);

// The meeting point of ranks that are threads of this process (the inproc transport): a store in
// memory shared by the ranks that name the same address, port, size and secret; no socket is opened,
// so jobs in different processes never collide. The k-th communicator a rank creates for one job
// meets the others' k-th.
Rendezvous in_process_rendezvous(const BootstrapConfig& config);

// Joins a running elastic job as a new rank (issue #17; admission.hpp states the rule): proves the job's
// secret to its rendezvous (kAuth when wrong: never admitted), asks for admission and waits up to `wait` for
// the running ranks to admit it at a step boundary, then connects to the grown world and returns it (its rank
// follows the old ranks'). config names the job as its ranks' do (address, port, secret; for the inproc
// transport also the job's size); config.info.rank/size only number the joiners for logs. Errors: kAuth,
// kUnsupported (refused: the job is at its maximum size), kTimeout (no admission within `wait`),
// kPeerFailure (the running ranks abandoned this admission).
std::unique_ptr<Communicator> join_communicator(const BootstrapConfig& config, const CommOptions& options,
                                                std::chrono::milliseconds wait);

// A joiner's meeting point: the job's store (tcp: a client of rank 0's server, authenticated with config's secret;
// inproc: the job's store in this process). No server.
Rendezvous join_rendezvous(const BootstrapConfig& config, const std::string& transport,
                           std::chrono::milliseconds timeout);

// The environment's job (bootstrap_config_from_env + comm_options_from_env) as a communicator.
// Rank 0's rendezvous server lives as long as the returned communicator (and any split of it).
std::unique_ptr<Communicator> create_communicator_from_env(const CommOptions& options = {});
// Explicit variant: no environment is read for rank/size/address/secret.
std::unique_ptr<Communicator> create_communicator(int rank, int size, const std::string& master_addr,
                                                  int master_port, const std::string& secret,
                                                  const CommOptions& options = {});
std::unique_ptr<Communicator> create_communicator(const BootstrapConfig& config, const CommOptions& options);

}  // namespace tandem::engine::comm
