// Communicators from the environment: bootstrap_env.cpp finds the job and starts the rendezvous;
// here the rendezvous is tied to the communicator's lifetime.
#include <cerrno>
#include <cstdlib>
#include <optional>

#include "engine/comm/bootstrap.hpp"
#include "engine/core/error.hpp"
#include "engine/core/log.hpp"

namespace tandem::engine::comm {

namespace {

// Owns the rendezvous (rank 0's server among it) together with the communicator built on it and
// forwards everything to the communicator. Members are destroyed in reverse order: the
// communicator first, then the store it may still use while shutting down.
class BootstrappedCommunicator final : public Communicator {
 public:
  BootstrappedCommunicator(Rendezvous rendezvous, std::unique_ptr<Communicator> inner)
      : rendezvous_(std::move(rendezvous)), inner_(std::move(inner)) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const char* transport_name() const override { return inner_->transport_name(); }
  const CommOptions& options() const override { return inner_->options(); }
  std::unique_ptr<Communicator> split(int color, int key) override {
    auto child = inner_->split(color, key);
    if (!child) return child;
    // A child may use the store after this communicator is gone: it shares the rendezvous.
    return std::make_unique<BootstrappedCommunicator>(rendezvous_, std::move(child));
  }
  std::unique_ptr<Work> allreduce(const void* s, void* r, size_t n, DType t, ReduceOp op) override {
    return inner_->allreduce(s, r, n, t, op);
  }
  std::unique_ptr<Work> reduce_scatter(const void* s, void* r, size_t n, DType t, ReduceOp op) override {
    return inner_->reduce_scatter(s, r, n, t, op);
  }
  std::unique_ptr<Work> allgather(const void* s, void* r, size_t n, DType t) override {
    return inner_->allgather(s, r, n, t);
  }
  std::unique_ptr<Work> broadcast(void* b, size_t n, DType t, int root) override {
    return inner_->broadcast(b, n, t, root);
  }
  std::unique_ptr<Work> reduce(const void* s, void* r, size_t n, DType t, ReduceOp op, int root) override {
    return inner_->reduce(s, r, n, t, op, root);
  }
  std::unique_ptr<Work> barrier() override { return inner_->barrier(); }
  std::unique_ptr<Work> send(const void* b, size_t n, DType t, int peer, uint32_t tag) override {
    return inner_->send(b, n, t, peer, tag);
  }
  std::unique_ptr<Work> recv(void* b, size_t n, DType t, int peer, uint32_t tag) override {
    return inner_->recv(b, n, t, peer, tag);
  }
  bool is_failed() const override { return inner_->is_failed(); }
  std::string failure_message() const override { return inner_->failure_message(); }
  FailureStatus failure_status() const override { return inner_->failure_status(); }
  void abort(const std::string& reason) override { inner_->abort(reason); }
  Algorithm allreduce_algorithm_for(size_t count, DType dtype) const override {
    return inner_->allreduce_algorithm_for(count, dtype);
  }

 private:
  Rendezvous rendezvous_;
  std::unique_ptr<Communicator> inner_;
};

std::optional<std::string> lookup(const EnvLookup& env, const char* name) {
  const char* v = env(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

}  // namespace

CommOptions comm_options_from_env(CommOptions base) {
  return comm_options_from_env(std::move(base), [](const char* n) -> const char* { return std::getenv(n); });
}

CommOptions comm_options_from_env(CommOptions base, const EnvLookup& env) {
  if (auto t = lookup(env, "TANDEM_TRANSPORT"); t && base.transport == "auto") base.transport = *t;
  if (auto t = lookup(env, "TANDEM_TIMEOUT_MS")) {
    char* end = nullptr;
    errno = 0;
    const long long ms = std::strtoll(t->c_str(), &end, 10);
    TANDEM_REQUIRE(end != nullptr && *end == '\0' && errno == 0 && ms > 0,
                   "TANDEM_TIMEOUT_MS='{}' is not a positive number of milliseconds", *t);
    base.timeout = std::chrono::milliseconds(ms);
  }
  if (auto a = lookup(env, "TANDEM_ALLREDUCE_ALGO"); a && base.allreduce_algorithm == Algorithm::kAuto) {
    base.allreduce_algorithm = parse_algorithm(*a);
  }
  if (auto d = lookup(env, "TANDEM_DETERMINISTIC")) {
    TANDEM_REQUIRE(*d == "0" || *d == "1", "TANDEM_DETERMINISTIC='{}' must be 0 or 1", *d);
    base.deterministic = base.deterministic || *d == "1";
  }
  return base;
}

std::unique_ptr<Communicator> create_communicator(const BootstrapConfig& config, const CommOptions& options) {
  Rendezvous rdv = start_rendezvous(config, options.timeout);
  std::unique_ptr<Communicator> inner = Communicator::create(config.info, rdv.store, options);
  TANDEM_CHECK(inner != nullptr, Status::kInternal, "rank {}: Communicator::create returned no communicator",
               config.info.rank);
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
