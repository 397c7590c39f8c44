// C shims for communicator lifetime and queries: create, split, destroy, rank/size, transport,
// algorithm choice, the sticky async status and abort.
#include <algorithm>
#include <cstring>
#include <memory>

#include "api/src/comm_handles.hpp"
#include "api/src/enums.hpp"
#include "api/src/guard.hpp"
#include "engine/comm/plan.hpp"

namespace tandem::api {
namespace {


std::string required_string(const char* what, const char* s) {
  TANDEM_REQUIRE(s != nullptr, "tandem_comm_create: params->{} is flagged in field_mask but NULL", what);
  TANDEM_REQUIRE(*s != '\0', "tandem_comm_create: params->{} is flagged in field_mask but empty", what);
  return s;
}

CreateParams to_create_params(const tandem_comm_params_t* p) {
  CreateParams out;
  if (p == nullptr) return out;
  const uint64_t m = p->field_mask;
  check_field_mask(m, mask_through(TANDEM_COMM_PARAM_DETERMINISTIC), "tandem_comm_params_t");
  if (m & TANDEM_COMM_PARAM_SIZE) {
    TANDEM_REQUIRE(p->size >= 1, "tandem_comm_create: params->size {} must be >= 1", p->size);
    out.size = p->size;
  }
  if (m & TANDEM_COMM_PARAM_RANK) {
    TANDEM_REQUIRE(p->rank >= 0, "tandem_comm_create: params->rank {} must be >= 0", p->rank);
    TANDEM_REQUIRE(!out.size || p->rank < *out.size, "tandem_comm_create: params->rank {} is out of range [0, {})",
                   p->rank, *out.size);
    out.rank = p->rank;
  }
  if (m & TANDEM_COMM_PARAM_MASTER_ADDR) out.master_addr = required_string("master_addr", p->master_addr);
  if (m & TANDEM_COMM_PARAM_MASTER_PORT) {
    TANDEM_REQUIRE(p->master_port >= 1 && p->master_port <= 65535,
                   "tandem_comm_create: params->master_port {} is out of range [1, 65535]", p->master_port);
    out.master_port = p->master_port;
  }
  if (m & TANDEM_COMM_PARAM_SECRET) out.secret = required_string("secret", p->secret);
  if (m & TANDEM_COMM_PARAM_TRANSPORT) out.transport = required_string("transport", p->transport);
  if (m & TANDEM_COMM_PARAM_TIMEOUT_MS) {
    TANDEM_REQUIRE(p->timeout_ms > 0, "tandem_comm_create: params->timeout_ms {} must be > 0", p->timeout_ms);
    out.timeout_ms = p->timeout_ms;
  }
  if (m & TANDEM_COMM_PARAM_ALLREDUCE_ALGO) {
    out.allreduce_algorithm = checked_enum(p->allreduce_algo, "tandem_comm_create: params->allreduce_algo");
  }
  if (m & TANDEM_COMM_PARAM_DETERMINISTIC) out.deterministic = p->deterministic != 0;
  return out;
}

tandem_comm* wrap(std::unique_ptr<engine::comm::Communicator> engine_comm, const ContextEnv& env) {
  auto h = std::make_unique<tandem_comm>();
  h->state = StateRef(new CommState());
  h->state->env = env;
  h->state->transport_name = engine_comm->transport_name();
  h->state->comm = std::move(engine_comm);
  return h.release();
}

}  // namespace
}  // namespace tandem::api

using namespace tandem::api;  // NOLINT: shim file

extern "C" {

TANDEM_API tandem_status_t tandem_comm_create(tandem_context_t* ctx, const tandem_comm_params_t* params,
                                              tandem_comm_t** out) TANDEM_NOEXCEPT {
  return guarded([&] {
    const ContextEnv& env = checked(ctx, "tandem_comm_create", "context").env;
    TANDEM_REQUIRE(out != nullptr, "tandem_comm_create: out is NULL");
    const ContextScope scope(env);
    const CreateParams p = to_create_params(params);
    *out = wrap(create_engine_comm(p), env);
  });
}

TANDEM_API tandem_status_t tandem_comm_split(tandem_comm_t* comm, int32_t color, int32_t key,
                                             tandem_comm_t** out) TANDEM_NOEXCEPT {
  return guarded([&] {
    auto& c = checked(comm, "tandem_comm_split", "comm");
    TANDEM_REQUIRE(out != nullptr, "tandem_comm_split: out is NULL");
    auto sub = recording(*c.state, [&] { return c.state->comm->split(color, key); });
    *out = sub ? wrap(std::move(sub), c.state->env) : nullptr;
  });
}

TANDEM_API tandem_status_t tandem_comm_shrink(tandem_comm_t* failed, tandem_comm_t** out) TANDEM_NOEXCEPT {
  return guarded([&] {
    auto& c = checked(failed, "tandem_comm_shrink", "failed");
    TANDEM_REQUIRE(out != nullptr, "tandem_comm_shrink: out is NULL");
    // Not through recording(): the failed communicator's sticky status must stay the original failure.
    const ContextScope scope(c.state->env);
    *out = wrap(c.state->comm->shrink(), c.state->env);
  });
}

TANDEM_API tandem_status_t tandem_comm_pending_joins(tandem_comm_t* comm, int64_t* pending) TANDEM_NOEXCEPT {
  return guarded([&] {
    auto& c = checked(comm, "tandem_comm_pending_joins", "comm");
    TANDEM_REQUIRE(pending != nullptr, "tandem_comm_pending_joins: pending is NULL");
    *pending = recording(*c.state, [&] { return c.state->comm->pending_joins(); });
  });
}

TANDEM_API tandem_status_t tandem_comm_grow(tandem_comm_t* comm, int32_t max_ranks, tandem_comm_t** out) TANDEM_NOEXCEPT {
  return guarded([&] {
    auto& c = checked(comm, "tandem_comm_grow", "comm");
    TANDEM_REQUIRE(out != nullptr, "tandem_comm_grow: out is NULL");
    TANDEM_REQUIRE(max_ranks >= 0, "tandem_comm_grow: max_ranks must be >= 0 (0: no bound; got {})", max_ranks);
    tandem::engine::comm::GrowOptions o;
    o.max_ranks = max_ranks;
    auto grown = recording(*c.state, [&] { return c.state->comm->grow(o); });
    *out = grown ? wrap(std::move(grown), c.state->env) : nullptr;
  });
}

TANDEM_API tandem_status_t tandem_comm_join(tandem_context_t* ctx, const tandem_comm_params_t* params,
                                            int64_t wait_ms, tandem_comm_t** out) TANDEM_NOEXCEPT {
  return guarded([&] {
    const ContextEnv& env = checked(ctx, "tandem_comm_join", "context").env;
    TANDEM_REQUIRE(out != nullptr, "tandem_comm_join: out is NULL");
    TANDEM_REQUIRE(wait_ms > 0, "tandem_comm_join: wait_ms must be > 0 (got {})", wait_ms);
    const ContextScope scope(env);
    *out = wrap(join_engine_comm(to_create_params(params), std::chrono::milliseconds(wait_ms)), env);
  });
}

TANDEM_API void tandem_comm_destroy(tandem_comm_t* comm) TANDEM_NOEXCEPT {
  destroy_handle(comm);  // the engine communicator lives on while requests still reference it
}

TANDEM_API tandem_status_t tandem_comm_rank(const tandem_comm_t* comm, int32_t* rank) TANDEM_NOEXCEPT {
  return guarded([&] {
    auto& c = checked(comm, "tandem_comm_rank", "comm");
    TANDEM_REQUIRE(rank != nullptr, "tandem_comm_rank: rank is NULL");
    *rank = c.state->comm->rank();
  });
}

TANDEM_API tandem_status_t tandem_comm_size(const tandem_comm_t* comm, int32_t* size) TANDEM_NOEXCEPT {
  return guarded([&] {
    auto& c = checked(comm, "tandem_comm_size", "comm");
    TANDEM_REQUIRE(size != nullptr, "tandem_comm_size: size is NULL");
    *size = c.state->comm->size();
  });
}

TANDEM_API tandem_status_t tandem_comm_transport_name(const tandem_comm_t* comm, const char** name) TANDEM_NOEXCEPT {
  return guarded([&] {
    auto& c = checked(comm, "tandem_comm_transport_name", "comm");
    TANDEM_REQUIRE(name != nullptr, "tandem_comm_transport_name: name is NULL");
    *name = c.state->transport_name.c_str();
  });
}

TANDEM_API tandem_status_t tandem_comm_allreduce_algo(const tandem_comm_t* comm, size_t count, tandem_dtype_t dtype,
                                                      tandem_algo_t* algo) TANDEM_NOEXCEPT {
  constexpr const char* fn = "tandem_comm_allreduce_algo";
  return guarded([&] {
    auto& c = checked(comm, fn, "comm");
    checked_bytes(fn, "count", count, 1, dtype);
    TANDEM_REQUIRE(algo != nullptr, "{}: algo is NULL", fn);
    *algo = to_c(c.state->comm->allreduce_algorithm_for(count, from_c(dtype)));
  });
}

TANDEM_API const char* tandem_algo_string(tandem_algo_t algo) TANDEM_NOEXCEPT {
  return enum_valid(algo) ? tandem::engine::comm::algorithm_name(from_c(algo)) : "unknown";
}

TANDEM_API tandem_status_t tandem_comm_get_async_status(const tandem_comm_t* comm, tandem_status_t* status,
                                                        char* message, size_t* message_bytes) TANDEM_NOEXCEPT {
  constexpr const char* fn = "tandem_comm_get_async_status";
  return guarded([&] {
    auto& c = checked(comm, fn, "comm");
    TANDEM_REQUIRE(status != nullptr, "{}: status is NULL", fn);
    TANDEM_REQUIRE(message == nullptr || message_bytes != nullptr, "{}: message is set but message_bytes is NULL",
                   fn);
    std::string text;
    const tandem::Status s = c.state->current(&text);
    // message_bytes may be NULL when message is (checked above): then there is nothing to copy out.
    if (message_bytes != nullptr) {
      copy_text_out(text, message, message_bytes, "tandem_comm_get_async_status: message_bytes");
    }
    *status = to_c(s);
  });
}

TANDEM_API tandem_status_t tandem_comm_get_failure(const tandem_comm_t* comm, int32_t* origin, int32_t* aborted,
                                                   int32_t* ranks, size_t* num_ranks) TANDEM_NOEXCEPT {
  constexpr const char* fn = "tandem_comm_get_failure";
  return guarded([&] {
    auto& c = checked(comm, fn, "comm");
    TANDEM_REQUIRE(origin != nullptr, "{}: origin is NULL", fn);
    TANDEM_REQUIRE(ranks == nullptr || num_ranks != nullptr, "{}: ranks is set but num_ranks is NULL", fn);
    const tandem::engine::comm::FailureStatus f = c.state->comm->failure_status();
    *origin = f.failed ? static_cast<int32_t>(f.origin) : -1;
    if (aborted != nullptr) *aborted = f.failed && f.aborted ? 1 : 0;
    if (ranks != nullptr) {
      const size_t n = std::min(f.ranks.size(), *num_ranks);
      for (size_t i = 0; i < n; ++i) ranks[i] = static_cast<int32_t>(f.ranks[i]);
    }
    if (num_ranks != nullptr) *num_ranks = f.failed ? f.ranks.size() : 0;
  });
}

TANDEM_API tandem_status_t tandem_comm_abort(tandem_comm_t* comm, const char* reason) TANDEM_NOEXCEPT {
  return guarded([&] {
    auto& c = checked(comm, "tandem_comm_abort", "comm");
    const std::string why = reason != nullptr ? reason : "aborted by the application";
    c.state->record_failure(tandem::Status::kPeerFailure, "communicator aborted on this rank: " + why);
    c.state->comm->abort(why);
  });
}

}  // extern "C"
