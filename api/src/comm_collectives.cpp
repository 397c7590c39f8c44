// C shims for the collectives and their requests. Each tandem_comm_X validates its arguments,
// starts the engine's non-blocking operation and waits on it; tandem_comm_iX hands the operation
// back as a tandem_request_t.
#include <memory>
#include <utility>

#include "api/src/comm_handles.hpp"
#include "api/src/enums.hpp"
#include "api/src/guard.hpp"
#include "engine/core/dtype.hpp"
#include "engine/core/log.hpp"

namespace tandem::api {
namespace {

using engine::comm::Work;

// Starts an engine operation on a live communicator and wraps it in a request. `start` receives
// the engine communicator and returns the Work.
template <typename Start>
std::unique_ptr<tandem_request> start_request(const char* op_name, tandem_comm& c, Start&& start) {
  auto req = std::make_unique<tandem_request>();
  req->op_name = op_name;
  req->state = c.state;
  req->work = recording(*c.state, [&] { return start(*c.state->comm); });
  TANDEM_CHECK(req->work != nullptr, Status::kInternal, "{}: the engine returned no operation", op_name);
  return req;
}

void fail_request(tandem_request& r, const Error& e) {
  r.status = e.status();
  r.message = e.what();
}

bool request_test(tandem_request& r) {
  if (r.status != Status::kOk) throw Error(r.status, r.message);
  if (r.done) return true;
  try {
    r.done = recording(*r.state, [&] { return r.work->test(); });
  } catch (const Error& e) {
    fail_request(r, e);
    throw;
  }
  return r.done;
}

void request_wait(tandem_request& r) {
  if (r.status != Status::kOk) throw Error(r.status, r.message);
  if (r.done) return;
  try {
    recording(*r.state, [&] { r.work->wait(); });
    r.done = true;
  } catch (const Error& e) {
    fail_request(r, e);
    throw;
  }
}

// The blocking form: start, wait, release.
template <typename Start>
tandem_status_t blocking(const char* fn, const char* op_name, tandem_comm_t* comm, Start&& start) {
  return guarded([&] {
    auto& c = checked(comm, fn, "comm");
    auto req = start_request(op_name, c, start);
    request_wait(*req);
  });
}

// The non-blocking form: start and hand over the request.
template <typename Start>
tandem_status_t nonblocking(const char* fn, const char* op_name, tandem_comm_t* comm, tandem_request_t** out,
                            Start&& start) {
  return guarded([&] {
    auto& c = checked(comm, fn, "comm");
    TANDEM_REQUIRE(out != nullptr, "{}: req (the out-parameter) is NULL", fn);
    auto req = start_request(op_name, c, start);
    *out = req.release();
  });
}

int comm_size(tandem_comm& c) { return c.state->comm->size(); }

// Validation per collective; each returns a callable that starts the engine operation.
auto allreduce_start(const char* fn, tandem_comm& /*c*/, const void* send, void* recv, size_t count,
                     tandem_dtype_t dtype, tandem_op_t op) {
  const size_t bytes = checked_bytes(fn, "count", count, 1, dtype);
  check_op(fn, op);
  check_buffer(fn, "send", send, bytes);
  check_buffer(fn, "recv", recv, bytes);
  check_overlap(fn, send, bytes, recv, bytes, send == recv, "send == recv");
  return [=](engine::comm::Communicator& e) {
    return e.allreduce(send, recv, count, from_c(dtype), from_c(op));
  };
}

auto reduce_scatter_start(const char* fn, tandem_comm& c, const void* send, void* recv, size_t count,
                          tandem_dtype_t dtype, tandem_op_t op) {
  const int n = comm_size(c);
  const size_t send_bytes = checked_bytes(fn, "count", count, static_cast<size_t>(n), dtype);
  const size_t recv_bytes = checked_bytes(fn, "count", count, 1, dtype);
  check_op(fn, op);
  check_buffer(fn, "send", send, send_bytes);
  check_buffer(fn, "recv", recv, recv_bytes);
  const size_t offset = static_cast<size_t>(c.state->comm->rank()) * recv_bytes;
  const bool in_place = send != nullptr && recv == static_cast<const unsigned char*>(send) + offset;
  check_overlap(fn, send, send_bytes, recv, recv_bytes, in_place, "recv == send + rank * count elements");
  return [=](engine::comm::Communicator& e) {
    return e.reduce_scatter(send, recv, count, from_c(dtype), from_c(op));
  };
}

auto allgather_start(const char* fn, tandem_comm& c, const void* send, void* recv, size_t count,
                     tandem_dtype_t dtype) {
  const int n = comm_size(c);
  const size_t send_bytes = checked_bytes(fn, "count", count, 1, dtype);
  const size_t recv_bytes = checked_bytes(fn, "count", count, static_cast<size_t>(n), dtype);
  check_buffer(fn, "send", send, send_bytes);
  check_buffer(fn, "recv", recv, recv_bytes);
  const size_t offset = static_cast<size_t>(c.state->comm->rank()) * send_bytes;
  const bool in_place = recv != nullptr && send == static_cast<const unsigned char*>(recv) + offset;
  check_overlap(fn, send, send_bytes, recv, recv_bytes, in_place, "send == recv + rank * count elements");
  return [=](engine::comm::Communicator& e) {
    return e.allgather(send, recv, count, from_c(dtype));
  };
}

auto broadcast_start(const char* fn, tandem_comm& c, void* buf, size_t count, tandem_dtype_t dtype, int32_t root) {
  const size_t bytes = checked_bytes(fn, "count", count, 1, dtype);
  check_buffer(fn, "buf", buf, bytes);
  check_rank_arg(fn, "root", root, comm_size(c));
  return [=](engine::comm::Communicator& e) {
    return e.broadcast(buf, count, from_c(dtype), root);
  };
}

auto reduce_start(const char* fn, tandem_comm& c, const void* send, void* recv, size_t count, tandem_dtype_t dtype,
                  tandem_op_t op, int32_t root) {
  const size_t bytes = checked_bytes(fn, "count", count, 1, dtype);
  check_op(fn, op);
  check_rank_arg(fn, "root", root, comm_size(c));
  check_buffer(fn, "send", send, bytes);
  const bool is_root = root == c.state->comm->rank();
  if (is_root) check_buffer(fn, "recv (on the root)", recv, bytes);
  check_overlap(fn, send, bytes, recv, bytes, send == recv, "send == recv");
  return [=](engine::comm::Communicator& e) {
    return e.reduce(send, recv, count, from_c(dtype), from_c(op), root);
  };
}

auto p2p_check(const char* fn, tandem_comm& c, const void* buf, size_t count, tandem_dtype_t dtype, int32_t peer) {
  const size_t bytes = checked_bytes(fn, "count", count, 1, dtype);
  check_buffer(fn, "buf", buf, bytes);
  check_rank_arg(fn, "peer", peer, comm_size(c));
  return bytes;
}

void check_tag(const char* fn, uint32_t tag) {
  TANDEM_REQUIRE(tag < TANDEM_TAG_LIMIT, "{}: tag {} is out of range [0, {})", fn, tag, TANDEM_TAG_LIMIT);
}

auto send_start(const char* fn, tandem_comm& c, const void* buf, size_t count, tandem_dtype_t dtype, int32_t peer,
                uint32_t tag) {
  p2p_check(fn, c, buf, count, dtype, peer);
  check_tag(fn, tag);
  return [=](engine::comm::Communicator& e) {
    return e.send(buf, count, from_c(dtype), peer, tag);
  };
}

auto recv_start(const char* fn, tandem_comm& c, void* buf, size_t count, tandem_dtype_t dtype, int32_t peer,
                uint32_t tag) {
  p2p_check(fn, c, buf, count, dtype, peer);
  check_tag(fn, tag);
  return [=](engine::comm::Communicator& e) {
    return e.recv(buf, count, from_c(dtype), peer, tag);
  };
}

auto barrier_start() {
  return [](engine::comm::Communicator& e) { return e.barrier(); };
}

}  // namespace
}  // namespace tandem::api

using namespace tandem::api;  // NOLINT: shim file

extern "C" {

TANDEM_API tandem_status_t tandem_comm_allreduce(tandem_comm_t* comm, const void* send, void* recv, size_t count,
                                                 tandem_dtype_t dtype, tandem_op_t op) TANDEM_NOEXCEPT {
  constexpr const char* fn = "tandem_comm_allreduce";
  return blocking(fn, "allreduce", comm, [&](auto& e) {
    return allreduce_start(fn, *comm, send, recv, count, dtype, op)(e);
  });
}
TANDEM_API tandem_status_t tandem_comm_iallreduce(tandem_comm_t* comm, const void* send, void* recv, size_t count,
                                                  tandem_dtype_t dtype, tandem_op_t op,
                                                  tandem_request_t** req) TANDEM_NOEXCEPT {
  constexpr const char* fn = "tandem_comm_iallreduce";
  return nonblocking(fn, "allreduce", comm, req, [&](auto& e) {
    return allreduce_start(fn, *comm, send, recv, count, dtype, op)(e);
  });
}

TANDEM_API tandem_status_t tandem_comm_reduce_scatter(tandem_comm_t* comm, const void* send, void* recv,
                                                      size_t count, tandem_dtype_t dtype,
                                                      tandem_op_t op) TANDEM_NOEXCEPT {
  constexpr const char* fn = "tandem_comm_reduce_scatter";
  return blocking(fn, "reduce_scatter", comm, [&](auto& e) {
    return reduce_scatter_start(fn, *comm, send, recv, count, dtype, op)(e);
  });
}
TANDEM_API tandem_status_t tandem_comm_ireduce_scatter(tandem_comm_t* comm, const void* send, void* recv,
                                                       size_t count, tandem_dtype_t dtype, tandem_op_t op,
                                                       tandem_request_t** req) TANDEM_NOEXCEPT {
  constexpr const char* fn = "tandem_comm_ireduce_scatter";
  return nonblocking(fn, "reduce_scatter", comm, req, [&](auto& e) {
    return reduce_scatter_start(fn, *comm, send, recv, count, dtype, op)(e);
  });
}

TANDEM_API tandem_status_t tandem_comm_allgather(tandem_comm_t* comm, const void* send, void* recv, size_t count,
                                                 tandem_dtype_t dtype) TANDEM_NOEXCEPT {
  constexpr const char* fn = "tandem_comm_allgather";
  return blocking(fn, "allgather", comm, [&](auto& e) {
    return allgather_start(fn, *comm, send, recv, count, dtype)(e);
  });
}
TANDEM_API tandem_status_t tandem_comm_iallgather(tandem_comm_t* comm, const void* send, void* recv, size_t count,
                                                  tandem_dtype_t dtype, tandem_request_t** req) TANDEM_NOEXCEPT {
  constexpr const char* fn = "tandem_comm_iallgather";
  return nonblocking(fn, "allgather", comm, req, [&](auto& e) {
    return allgather_start(fn, *comm, send, recv, count, dtype)(e);
  });
}

TANDEM_API tandem_status_t tandem_comm_broadcast(tandem_comm_t* comm, void* buf, size_t count, tandem_dtype_t dtype,
                                                 int32_t root) TANDEM_NOEXCEPT {
  constexpr const char* fn = "tandem_comm_broadcast";
  return blocking(fn, "broadcast", comm, [&](auto& e) {
    return broadcast_start(fn, *comm, buf, count, dtype, root)(e);
  });
}
// Device memory (comm_device.cpp): the host form's argument checks, then the communicator's device path.
TANDEM_API tandem_status_t tandem_comm_allreduce_ex(tandem_comm_t* comm, const void* send, void* recv, size_t count,
                                                    tandem_dtype_t dtype, tandem_op_t op,
                                                    const tandem_coll_params_t* params) TANDEM_NOEXCEPT {
  constexpr const char* fn = "tandem_comm_allreduce_ex";
  return guarded([&] {
    auto& c = checked(comm, fn, "comm");
    const DeviceCall d = device_call(fn, params);
    auto start = allreduce_start(fn, c, send, recv, count, dtype, op);
    if (!d.device) {
      request_wait(*start_request("allreduce", c, start));
      return;
    }
    device_allreduce(fn, c, d, send, recv, count, from_c(dtype), from_c(op));
  });
}
TANDEM_API tandem_status_t tandem_comm_broadcast_ex(tandem_comm_t* comm, void* buf, size_t count,
                                                    tandem_dtype_t dtype, int32_t root,
                                                    const tandem_coll_params_t* params) TANDEM_NOEXCEPT {
  constexpr const char* fn = "tandem_comm_broadcast_ex";
  return guarded([&] {
    auto& c = checked(comm, fn, "comm");
    const DeviceCall d = device_call(fn, params);
    auto start = broadcast_start(fn, c, buf, count, dtype, root);
    if (!d.device) {
      request_wait(*start_request("broadcast", c, start));
      return;
    }
    device_broadcast(fn, c, d, buf, count, from_c(dtype), root);
  });
}
TANDEM_API tandem_status_t tandem_comm_ibroadcast(tandem_comm_t* comm, void* buf, size_t count, tandem_dtype_t dtype,
                                                  int32_t root, tandem_request_t** req) TANDEM_NOEXCEPT {
  constexpr const char* fn = "tandem_comm_ibroadcast";
  return nonblocking(fn, "broadcast", comm, req, [&](auto& e) {
    return broadcast_start(fn, *comm, buf, count, dtype, root)(e);
  });
}

TANDEM_API tandem_status_t tandem_comm_reduce(tandem_comm_t* comm, const void* send, void* recv, size_t count,
                                              tandem_dtype_t dtype, tandem_op_t op, int32_t root) TANDEM_NOEXCEPT {
  constexpr const char* fn = "tandem_comm_reduce";
  return blocking(fn, "reduce", comm, [&](auto& e) {
    return reduce_start(fn, *comm, send, recv, count, dtype, op, root)(e);
  });
}
TANDEM_API tandem_status_t tandem_comm_ireduce(tandem_comm_t* comm, const void* send, void* recv, size_t count,
                                               tandem_dtype_t dtype, tandem_op_t op, int32_t root,
                                               tandem_request_t** req) TANDEM_NOEXCEPT {
  constexpr const char* fn = "tandem_comm_ireduce";
  return nonblocking(fn, "reduce", comm, req, [&](auto& e) {
    return reduce_start(fn, *comm, send, recv, count, dtype, op, root)(e);
  });
}

TANDEM_API tandem_status_t tandem_comm_barrier(tandem_comm_t* comm) TANDEM_NOEXCEPT {
  return blocking("tandem_comm_barrier", "barrier", comm, barrier_start());
}
TANDEM_API tandem_status_t tandem_comm_ibarrier(tandem_comm_t* comm, tandem_request_t** req) TANDEM_NOEXCEPT {
  return nonblocking("tandem_comm_ibarrier", "barrier", comm, req, barrier_start());
}

TANDEM_API tandem_status_t tandem_comm_send(tandem_comm_t* comm, const void* buf, size_t count, tandem_dtype_t dtype,
                                            int32_t peer, uint32_t tag) TANDEM_NOEXCEPT {
  constexpr const char* fn = "tandem_comm_send";
  return blocking(fn, "send", comm, [&](auto& e) {
    return send_start(fn, *comm, buf, count, dtype, peer, tag)(e);
  });
}
TANDEM_API tandem_status_t tandem_comm_isend(tandem_comm_t* comm, const void* buf, size_t count,
                                             tandem_dtype_t dtype, int32_t peer, uint32_t tag,
                                             tandem_request_t** req) TANDEM_NOEXCEPT {
  constexpr const char* fn = "tandem_comm_isend";
  return nonblocking(fn, "send", comm, req, [&](auto& e) {
    return send_start(fn, *comm, buf, count, dtype, peer, tag)(e);
  });
}
TANDEM_API tandem_status_t tandem_comm_recv(tandem_comm_t* comm, void* buf, size_t count, tandem_dtype_t dtype,
                                            int32_t peer, uint32_t tag) TANDEM_NOEXCEPT {
  constexpr const char* fn = "tandem_comm_recv";
  return blocking(fn, "recv", comm, [&](auto& e) {
    return recv_start(fn, *comm, buf, count, dtype, peer, tag)(e);
  });
}
TANDEM_API tandem_status_t tandem_comm_irecv(tandem_comm_t* comm, void* buf, size_t count, tandem_dtype_t dtype,
                                             int32_t peer, uint32_t tag, tandem_request_t** req) TANDEM_NOEXCEPT {
  constexpr const char* fn = "tandem_comm_irecv";
  return nonblocking(fn, "recv", comm, req, [&](auto& e) {
    return recv_start(fn, *comm, buf, count, dtype, peer, tag)(e);
  });
}

TANDEM_API tandem_status_t tandem_request_test(tandem_request_t* req, int* done) TANDEM_NOEXCEPT {
  return guarded([&] {
    auto& r = checked(req, "tandem_request_test", "req");
    TANDEM_REQUIRE(done != nullptr, "tandem_request_test: done is NULL");
    *done = request_test(r) ? 1 : 0;
  });
}

TANDEM_API tandem_status_t tandem_request_wait(tandem_request_t* req) TANDEM_NOEXCEPT {
  return guarded([&] { request_wait(checked(req, "tandem_request_wait", "req")); });
}

TANDEM_API void tandem_request_destroy(tandem_request_t* req) TANDEM_NOEXCEPT {
  if (!is_live(req)) return;  // NULL, destroyed or foreign: a no-op
  std::unique_ptr<tandem_request> owned(req);
  if (owned->done || owned->status != tandem::Status::kOk) return;
  // Still in flight: the engine may be using the caller's buffers until it
  // completes, so wait before freeing. A failure here is recorded on the communicator.
  try {
    request_wait(*owned);
  } catch (const std::exception& e) {
    tandem::log::warn("tandem_request_destroy: {} was still in flight and failed: {}", owned->op_name, e.what());
  }
}

}  // extern "C"
