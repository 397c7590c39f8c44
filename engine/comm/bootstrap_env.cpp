// Environment parsing and the rendezvous start-up (no communicator here: bootstrap.cpp adds that).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <string_view>
#include <tuple>

#include <fmt/format.h>

#include "engine/comm/bootstrap.hpp"
#include "engine/core/error.hpp"
#include "engine/core/log.hpp"
#include "transports/memory_store.hpp"

namespace tandem::engine::comm {

namespace {

struct Family {
  const char* name;
  const char* rank;
  const char* size;
  const char* local_rank;
  const char* local_size;
};

// In precedence order (bootstrap.hpp).
constexpr Family kFamilies[] = {
    {"TANDEM", "TANDEM_RANK", "TANDEM_WORLD_SIZE", "TANDEM_LOCAL_RANK", "TANDEM_LOCAL_WORLD_SIZE"},
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {"Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
};
// World sizes that launchers announce, read only to catch a process that would otherwise run alone: MPICH and
// Intel MPI (PMI_SIZE), MVAPICH (MV2_COMM_WORLD_SIZE), plus every family's own size variable.
constexpr const char* kAnnouncedSizeVars[] = {"TANDEM_WORLD_SIZE", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS",
                                              "PMI_SIZE", "MV2_COMM_WORLD_SIZE"};
constexpr const char* kAddrVars[] = {"TANDEM_MASTER_ADDR", "MASTER_ADDR"};
constexpr const char* kPortVars[] = {"TANDEM_MASTER_PORT", "MASTER_PORT"};
constexpr int kDefaultPort = 29500;  // torchrun's default, when nothing better is known

struct Var {
  const char* name;
  std::string value;
};

std::optional<Var> first_set(const EnvLookup& env, std::initializer_list<const char*> names) {
  for (const char* n : names) {
    const char* v = env(n);
    if (v != nullptr) return Var{n, v};
  }
  return std::nullopt;
}

int64_t parse_int(const Var& v, int64_t lo, int64_t hi) {
  int64_t out = 0;
  const char* b = v.value.data();
  const char* e = b + v.value.size();
  auto [p, ec] = std::from_chars(b, e, out);
  TANDEM_REQUIRE(!v.value.empty() && ec == std::errc() && p == e, "{}='{}' is not an integer", v.name, v.value);
  TANDEM_REQUIRE(out >= lo && out <= hi, "{}={} is outside the allowed range [{}, {}]", v.name, out, lo, hi);
  return out;
}


// Open MPI and Slurm export a job id; a port derived from it lets every rank agree on one without
// being told (and keeps two concurrent jobs apart).
std::optional<std::string> job_id(const EnvLookup& env) {
  if (auto v = first_set(env, {"OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE"})) return v->value;
  if (auto v = first_set(env, {"SLURM_JOB_ID", "SLURM_JOBID"})) {
    auto step = first_set(env, {"SLURM_STEP_ID", "SLURM_STEPID"});
    return v->value + "." + (step ? step->value : std::string("0"));
  }
  return std::nullopt;
}

int port_from_job_id(const std::string& id) {
  uint32_t h = 2166136261u;  // FNV-1a
  for (unsigned char c : id) h = (h ^ c) * 16777619u;
  // [20000, 32767]: below Linux's default ephemeral range (32768-60999), so a client connection of another
  // program on the host cannot hold the port (seen in CI: a derived 44496 was taken, "Address already in use")
  return 20000 + static_cast<int>(h % 12768);
}


std::string default_secret(const std::optional<std::string>& job) {
  // Anyone who can reach the port and guess this can join; bootstrap warns about it.
  return "tandem-default-secret:" + job.value_or("");
}

// The store every transport gets: forwards to the client and keeps rank 0's server alive.
class ServingStore final : public transports::KvStore {
 public:
  ServingStore(std::shared_ptr<RendezvousServer> server, std::shared_ptr<RendezvousClient> client)
      : server_(std::move(server)), client_(std::move(client)) {}
  void set(const std::string& key, const std::string& value) override { client_->set(key, value); }
  void set_within(const std::string& key, const std::string& value, std::chrono::milliseconds timeout) override {
    client_->set_within(key, value, timeout);
  }
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    return client_->get(key, timeout);
  }
  int64_t add(const std::string& key, int64_t delta) override { return client_->add(key, delta); }

 private:
  std::shared_ptr<RendezvousServer> server_;  // declared first: destroyed after the client
  std::shared_ptr<RendezvousClient> client_;
};

// The communicators this process created per rendezvous address and rank: the k-th is generation k
// (rendezvous_protocol.hpp); every rank of a job creates them collectively, so they count alike.
uint64_t next_generation(const std::string& scope, int rank) {
  static std::mutex mu;
  static std::map<std::pair<std::string, int>, uint64_t> created;
  std::lock_guard lock(mu);
  return created[{scope, rank}]++;
}

// Rank 0's server for generation `generation`: the one an earlier, still living communicator of the same
// job (port, secret, size) runs in this process, admitting the new generation, or a new one.
std::shared_ptr<RendezvousServer> serve(const RendezvousServerOptions& so) {
  struct Entry {
    std::weak_ptr<RendezvousServer> server;
    std::string secret;
    int world_size;
  };
  static std::mutex mu;
  static std::map<std::pair<std::string, int>, Entry> live;  // (bind host, port)
  std::lock_guard lock(mu);
  std::erase_if(live, [](const auto& kv) { return kv.second.server.expired(); });
  const auto key = std::make_pair(so.bind_host, so.port);
  if (auto it = live.find(key); it != live.end()) {
    if (auto server = it->second.server.lock();
        server && it->second.secret == so.secret && it->second.world_size == so.world_size) {
      server->admit(so.generation);
      return server;
    }
  }
  auto server = std::make_shared<RendezvousServer>(so);
  live[key] = Entry{server, so.secret, so.world_size};
  return server;
}

}  // namespace

namespace {

// The in-process jobs' stores, by (job, generation): in_process_rendezvous and a joiner's join_rendezvous.
std::mutex inproc_stores_mu;
std::map<std::pair<std::string, uint64_t>, std::weak_ptr<transports::KvStore>>& inproc_stores() {
  static std::map<std::pair<std::string, uint64_t>, std::weak_ptr<transports::KvStore>> stores;
  return stores;
}

// A joiner meets a job that runs already: its rendezvous accepts at once. Connection refused (or no route) for
// kNoJobWindow means nobody serves that address and port -- the job ended, or it is the wrong --port.
constexpr std::chrono::milliseconds kNoJobWindow{3000};
constexpr std::chrono::milliseconds kJoinHandshake{10000};

// "" when a TCP connection to host:port is accepted, else why not (strerror).
std::string tcp_refusal(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res); rc != 0 || res == nullptr)
    return ::gai_strerror(rc);
  std::string why = "no address";
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) continue;
    int err = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0 ? 0 : errno;
    if (err == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      socklen_t len = sizeof(err);
      err = ::poll(&p, 1, 1000) == 1 && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 ? err : ETIMEDOUT;
    }
    ::close(fd);
    if (err == 0) {
      why.clear();
      break;
    }
    why = std::strerror(err);
  }
  ::freeaddrinfo(res);
  return why;
}

std::string inproc_job(const BootstrapConfig& config) {
  // The job's identity never leaves the process; the secret is part of it so that two jobs that share
  // an address and port (defaults) but not a secret stay apart.
  return fmt::format("{}:{}/{}/{}", config.master_addr, config.master_port, config.info.size, config.secret);
}

}  // namespace

Rendezvous join_rendezvous(const BootstrapConfig& config, const std::string& transport,
                           std::chrono::milliseconds timeout) {
  Rendezvous r;
  if (transport == "inproc") {
    // The job's newest live store in this process (the one its ranks' communicators use now).
    const std::string job = inproc_job(config);
    std::lock_guard lock(inproc_stores_mu);
    for (const auto& [key, weak] : inproc_stores())
      if (key.first == job)
        if (auto s = weak.lock()) r.store = s;
    TANDEM_CHECK(r.store != nullptr, Status::kTimeout,
                 "join: no job of {} ranks at {}:{} with this secret runs in this process (inproc)", config.info.size,
                 config.master_addr, config.master_port);
    return r;
  }
  TANDEM_REQUIRE(config.master_port > 0 && config.master_port <= 65535,
                 "join: the job's rendezvous port must be in 1..65535, got {}", config.master_port);
  RendezvousClientOptions co;
  co.host = config.master_addr;
  if (co.host.size() > 2 && co.host.front() == '[' && co.host.back() == ']') co.host = co.host.substr(1, co.host.size() - 2);
  co.port = config.master_port;
  co.secret = config.secret;
  co.rank = 0;  // a joiner has no rank in the job's world yet; 0 passes the server's range check
  co.size = 0;  // and announces no size
  co.name = fmt::format("joiner {} on {}", config.info.rank, config.info.host);
  co.timeout = std::min(timeout, kJoinHandshake);  // a running job's rendezvous answers at once
  co.generation = 0;  // the job's first communicator's namespace, where elastic jobs admit joiners
  const std::string where = fmt::format("{}:{}", config.master_addr, config.master_port);
  const auto until = std::chrono::steady_clock::now() + std::min(timeout, kNoJobWindow);
  for (std::string why = tcp_refusal(co.host, co.port); !why.empty(); why = tcp_refusal(co.host, co.port)) {
    TANDEM_CHECK(std::chrono::steady_clock::now() < until, Status::kPeerFailure,
                 "join: no job answers at {} ({} for {} ms): is the job still running, and is --port its rendezvous "
                 "port (the --port of its tandem launch)?",
                 where, why, std::min(timeout, kNoJobWindow).count());
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  try {
    r.client = std::make_shared<RendezvousClient>(co);
  } catch (const Error& e) {
    if (e.status() != Status::kTimeout) throw;
    TANDEM_THROW(Status::kPeerFailure,
                 "join: no job answers at {}: something accepts connections there but no tandem rendezvous answered "
                 "within {} ms -- is --port the job's rendezvous port? ({})",
                 where, co.timeout.count(), e.what());
  }
  r.store = std::make_shared<ServingStore>(nullptr, r.client);
  return r;
}

Rendezvous in_process_rendezvous(const BootstrapConfig& config) {
  const BootstrapInfo& info = config.info;
  TANDEM_REQUIRE(info.size >= 1 && info.rank >= 0 && info.rank < info.size, "rank {} is outside a world of size {}",
                 info.rank, info.size);
  for (const auto& note : config.notes) log::debug("bootstrap ({} variables, in process): {}", config.source, note);
  Rendezvous r;
  if (info.size == 1) {
    r.store = std::make_shared<transports::MemoryStore>();
    return r;
  }
  const std::string job = inproc_job(config);
  const uint64_t generation = next_generation("inproc:" + job, info.rank);
  std::lock_guard lock(inproc_stores_mu);
  auto& stores = inproc_stores();
  std::erase_if(stores, [](const auto& kv) { return kv.second.expired(); });
  auto& slot = stores[{job, generation}];
  r.store = slot.lock();
  if (!r.store) {
    r.store = std::make_shared<transports::MemoryStore>();
    slot = r.store;
  }
  return r;
}

bool is_loopback_address(const std::string& addr) {
  return addr == "localhost" || addr == "::1" || addr == "[::1]" || addr.rfind("127.", 0) == 0;
}

std::string local_hostname() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

BootstrapConfig bootstrap_config_from_env() {
  return bootstrap_config_from_env([](const char* name) -> const char* { return std::getenv(name); });
}

BootstrapConfig bootstrap_config_from_env(const EnvLookup& env) {
  BootstrapConfig c;
  const Family* fam = nullptr;
  for (const Family& f : kFamilies) {
    if (env(f.rank) != nullptr || env(f.size) != nullptr) {
      fam = &f;
      break;
    }
  }
  constexpr int64_t kMaxRanks = 1 << 20;
  if (fam != nullptr) {
    auto rank = first_set(env, {fam->rank});
    auto size = first_set(env, {fam->size});
    TANDEM_REQUIRE(rank && size, "{} is set but {} is not (both are needed to place this process in the job)",
                   rank ? fam->rank : fam->size, rank ? fam->size : fam->rank);
    c.info.size = static_cast<int>(parse_int(*size, 1, kMaxRanks));
    c.info.rank = static_cast<int>(parse_int(*rank, 0, kMaxRanks));
    TANDEM_REQUIRE(c.info.rank < c.info.size, "{}={} is not below {}={}", fam->rank, c.info.rank, fam->size,
                   c.info.size);
    c.source = fam->name;
  }
  if (c.info.size == 1 && (fam == nullptr || std::string_view(fam->name) != "TANDEM")) {
    // "Rank 0 of 1" while some launcher announced more: every process would train alone and exit 0 (a wrapper that
    // dropped our variables, an MPI whose names we do not read). Refuse, naming what was seen. Tandem's own
    // variables (tandem launch, or a size given to tandem_comm_create) are taken as meant.
    for (const char* name : kAnnouncedSizeVars) {
      const char* v = env(name);
      int64_t n = 0;
      if (v == nullptr || std::from_chars(v, v + std::strlen(v), n).ec != std::errc() || n <= 1) continue;
      TANDEM_REQUIRE(false,
                     "this process would be rank 0 of 1 ({}) but {}={} announces a job of {} ranks: the launcher's "
                     "rank variables did not arrive (set TANDEM_RANK/TANDEM_WORLD_SIZE, RANK/WORLD_SIZE, "
                     "OMPI_COMM_WORLD_* or SLURM_PROCID/SLURM_NTASKS for every rank, e.g. with `tandem launch`)",
                     fam != nullptr ? fmt::format("{} variables", fam->name) : std::string("no rank variables set"),
                     name, v, n);
    }
  }
  // Local rank / size: the first family that sets each, from the family that placed us onward.
  std::optional<Var> local_rank, local_size;
  for (const Family& f : kFamilies) {
    if (fam != nullptr && &f < fam) continue;
    if (!local_rank) local_rank = first_set(env, {f.local_rank});
    if (!local_size) local_size = first_set(env, {f.local_size});
  }

  auto addr = first_set(env, {kAddrVars[0], kAddrVars[1]});
  auto port = first_set(env, {kPortVars[0], kPortVars[1]});
  if (addr) {
    TANDEM_REQUIRE(!addr->value.empty() && addr->value.find_first_of(" \t\n/") == std::string::npos,
                   "{}='{}' is not a host name or address", addr->name, addr->value);
    c.master_addr = addr->value;
  }
  const std::optional<std::string> job = job_id(env);
  if (port) {
    c.master_port = static_cast<int>(parse_int(*port, c.info.size == 1 ? 0 : 1, 65535));
  } else if (c.info.size > 1) {
    c.master_port = job ? port_from_job_id(*job) : kDefaultPort;
    c.notes.push_back(job ? fmt::format("no TANDEM_MASTER_PORT/MASTER_PORT: using port {} derived from {} job id {}",
                                        c.master_port, c.source, *job)
                          : fmt::format("no TANDEM_MASTER_PORT/MASTER_PORT: using the default port {}", c.master_port));
  }

  // What we know about where the ranks are: true = all on this host, false = several hosts.
  std::optional<bool> one_host;
  if (addr) {
    if (is_loopback_address(addr->value)) one_host = true;
  } else if (fam != nullptr && std::string_view(fam->name) == "Slurm") {
    if (auto n = first_set(env, {"SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"})) {
      one_host = parse_int(*n, 1, kMaxRanks) == 1;
    }
  }
  if (local_size) {
    c.info.local_size = static_cast<int>(parse_int(*local_size, 1, kMaxRanks));
    if (!one_host && !addr) one_host = c.info.local_size == c.info.size;
  } else if (one_host.value_or(!addr)) {
    c.info.local_size = c.info.size;
  }
  if (local_rank) {
    c.info.local_rank = static_cast<int>(parse_int(*local_rank, 0, kMaxRanks));
  } else if (one_host.value_or(!addr)) {
    c.info.local_rank = c.info.rank;
  }
  if (!local_size) c.info.local_size = std::max(c.info.local_size, c.info.local_rank + 1);
  TANDEM_REQUIRE(c.info.local_rank < c.info.local_size, "local rank {} ({}) is not below local size {} ({})",
                 c.info.local_rank, local_rank ? local_rank->name : "default", c.info.local_size,
                 local_size ? local_size->name : "default");
  TANDEM_REQUIRE(c.info.local_size <= c.info.size, "local size {} ({}) exceeds the world size {}", c.info.local_size,
                 local_size ? local_size->name : "default", c.info.size);

  if (!addr && c.info.size > 1) {
    // mpirun / srun give no meeting point. One host: loopback works. Several: we cannot guess.
    TANDEM_REQUIRE(one_host.value_or(true),
                   "the job ({} ranks from {} variables, {} on this host) spans several hosts and no "
                   "TANDEM_MASTER_ADDR/MASTER_ADDR is set: set it to rank 0's host address (and "
                   "TANDEM_MASTER_PORT/MASTER_PORT)",
                   c.info.size, c.source, c.info.local_size);
    c.notes.push_back(fmt::format("no TANDEM_MASTER_ADDR/MASTER_ADDR: all {} ranks are on this host, using {}",
                                  c.info.size, c.master_addr));
  }

  if (const char* s = env("TANDEM_STORE"); s != nullptr && *s != '\0') {
    // HOST:PORT of a store another process serves (bootstrap.hpp); it applies when it is this job's rendezvous.
    const std::string v = s;
    const size_t colon = v.rfind(':');
    TANDEM_REQUIRE(colon != std::string::npos && colon > 0 && colon + 1 < v.size(),
                   "TANDEM_STORE='{}' is not HOST:PORT (the rendezvous store `tandem launch` serves)", v);
    const Var store_port{"TANDEM_STORE's port", v.substr(colon + 1)};
    const int64_t p = parse_int(store_port, 1, 65535);
    c.external_store = v.substr(0, colon) == c.master_addr && p == c.master_port;
  }
  if (const char* s = env("TANDEM_SECRET"); s != nullptr && *s != '\0') {
    c.secret = s;
  } else {
    c.secret = default_secret(job);
    if (c.info.size > 1) {
      c.notes.push_back(
          "TANDEM_SECRET is not set: using a predictable default, so anyone who can reach the rendezvous port "
          "can join (tandem launch sets a random one; export your own for mpirun/srun/torchrun)");
    }
  }
  c.info.host = local_hostname();
  return c;
}

Rendezvous start_rendezvous(const BootstrapConfig& config, std::chrono::milliseconds timeout) {
  const BootstrapInfo& info = config.info;
  TANDEM_REQUIRE(info.size >= 1 && info.rank >= 0 && info.rank < info.size, "rank {} is outside a world of size {}",
                 info.rank, info.size);
  for (const auto& note : config.notes) {
    if (info.rank == 0) {
      log::warn("bootstrap ({} variables): {}", config.source, note);
    } else {
      log::info("bootstrap ({} variables): {}", config.source, note);
    }
  }
  Rendezvous r;
  if (info.size == 1) {
    r.store = std::make_shared<transports::MemoryStore>();
    return r;
  }
  TANDEM_REQUIRE(config.master_port > 0 && config.master_port <= 65535,
                 "the rendezvous port must be in 1..65535 for a job of {} ranks, got {}", info.size,
                 config.master_port);
  const uint64_t generation = next_generation(fmt::format("{}:{}", config.master_addr, config.master_port), info.rank);
  if (config.external_store) {
    log::debug("rank {}: the rendezvous store at {}:{} is served by another process (TANDEM_STORE)", info.rank,
               config.master_addr, config.master_port);
  } else if (info.rank == 0) {
    RendezvousServerOptions so;
    so.bind_host = is_loopback_address(config.master_addr) ? (config.master_addr == "localhost" ? "127.0.0.1"
                                                                                          : config.master_addr)
                                                   : "*";
    if (so.bind_host == "[::1]") so.bind_host = "::1";
    so.port = config.master_port;
    so.secret = config.secret;
    so.world_size = info.size;
    so.generation = generation;
    r.server = serve(so);
  }
  RendezvousClientOptions co;
  co.host = config.master_addr;
  if (co.host.size() > 2 && co.host.front() == '[' && co.host.back() == ']') co.host = co.host.substr(1, co.host.size() - 2);
  co.port = config.master_port;
  co.secret = config.secret;
  co.rank = info.rank;
  co.size = info.size;
  co.name = fmt::format("rank {} on {}", info.rank, info.host);
  co.timeout = timeout;
  co.generation = generation;
  r.client = std::make_shared<RendezvousClient>(co);
  r.store = std::make_shared<ServingStore>(r.server, r.client);
  return r;
}

}  // namespace tandem::engine::comm
