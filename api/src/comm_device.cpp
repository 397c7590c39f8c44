// Collectives on device memory (issue #14): the device path of a communicator -- NCCL loaded at run time,
// or staged through host memory and the communicator's own transport -- decided by every rank together on
// the first device-memory call (tandem.h, "Device memory").
#include <cstring>
#include <string>
#include <vector>

#include "api/src/boundary.hpp"
#include "api/src/comm_handles.hpp"
#include "api/src/enums.hpp"
#include "api/src/guard.hpp"
#include "api/src/handles.hpp"
#include "engine/core/dtype.hpp"
#include "engine/core/settings.hpp"

namespace tandem::api {
namespace {

using engine::compute::DeviceRuntime;

// Waits for one engine operation of the communicator, recording a failure as the communicator's.
template <typename Start>
void run_host(tandem_comm& c, Start&& start) {
  recording(*c.state, [&] {
    auto work = start(*c.state->comm);
    TANDEM_CHECK(work != nullptr, Status::kInternal, "device path: the engine returned no operation");
    work->wait();
  });
}

std::string rank_list(const std::vector<int32_t>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i) out += (i == 0 ? "" : ", ") + std::to_string(ranks[i]);
  return out;
}

// This rank's view: can it use cuda:device, can it load NCCL (each with the reason when not), and which
// physical GPU cuda:device is (ranks on one GPU cannot share an NCCL communicator: NCCL refuses them).
struct LocalView {
  bool device_ok = false;
  std::string device_why;
  bool nccl_ok = false;
  std::string nccl_why;
  engine::compute::DeviceUuid uuid{};
};

LocalView local_view(const DeviceRuntime* rt, int device) {
  LocalView v;
  if (rt == nullptr) {
    v.device_why = "this libtandem was built without CUDA";
    v.nccl_why = v.device_why;
    return v;
  }
  try {
    rt->require_device(device);
    v.uuid = rt->device_uuid(device);
    v.device_ok = true;
  } catch (const Error& e) {
    v.device_why = e.what();
  }
  try {
    rt->nccl_version();
    v.nccl_ok = true;
  } catch (const Error& e) {
    v.nccl_why = e.what();
  }
  return v;
}

// The first pair of ranks whose devices are one physical GPU, as "ranks 0 and 1"; empty when none.
std::string shared_gpu(const std::vector<int32_t>& all, int n, int stride) {
  for (int a = 0; a < n; ++a)
    for (int b = a + 1; b < n; ++b)
      if (all[static_cast<size_t>(stride * a)] == 1 && all[static_cast<size_t>(stride * b)] == 1 &&
          std::memcmp(&all[static_cast<size_t>(stride * a + 2)], &all[static_cast<size_t>(stride * b + 2)],
                      sizeof(engine::compute::DeviceUuid)) == 0)
        return "ranks " + std::to_string(a) + " and " + std::to_string(b) + " use one GPU";
  return "";
}

void decide(const char* fn, tandem_comm& c, const DeviceCall& d) {
  DeviceState& s = c.state->device;
  engine::comm::Communicator& comm = *c.state->comm;
  const int n = comm.size();
  const int me = comm.rank();
  const ContextScope scope(c.state->env);  // the communicator's context decides (its settings, its logger)
  const std::string mode = settings::current()->text("TANDEM_DEVICE_COLLECTIVES").value_or("auto");
  const DeviceRuntime* rt = engine::compute::device_runtime();
  const LocalView v = local_view(rt, d.index);

  // Every rank's two flags and GPU, so that every rank reaches the same verdict and can name who lacks what.
  constexpr int kWords = 2 + static_cast<int>(sizeof(engine::compute::DeviceUuid) / sizeof(int32_t));
  int32_t mine[kWords] = {v.device_ok ? 1 : 0, v.nccl_ok ? 1 : 0};
  std::memcpy(&mine[2], v.uuid.data(), v.uuid.size());
  std::vector<int32_t> all(kWords * static_cast<size_t>(n));
  run_host(c, [&](engine::comm::Communicator& e) { return e.allgather(mine, all.data(), kWords, DType::kI32); });
  std::vector<int32_t> no_device, no_nccl;
  for (int r = 0; r < n; ++r) {
    if (all[static_cast<size_t>(kWords * r)] == 0) no_device.push_back(r);
    if (all[static_cast<size_t>(kWords * r + 1)] == 0) no_nccl.push_back(r);
  }
  const std::string shared = shared_gpu(all, n, kWords);
  s.decided = true;
  if (!no_device.empty()) {
    s.path = TANDEM_DEVICE_PATH_NONE;
    s.why = "device memory: no usable CUDA device on rank(s) " + rank_list(no_device) + " of " + std::to_string(n) +
            (v.device_ok ? "" : " (here, rank " + std::to_string(me) + ": " + v.device_why + ")");
    return;
  }
  if (mode == "staged" || (mode == "auto" && (!no_nccl.empty() || !shared.empty()))) {
    s.path = TANDEM_DEVICE_PATH_STAGED;
    s.why = mode == "staged"   ? "TANDEM_DEVICE_COLLECTIVES=staged"
            : !shared.empty() ? shared + " (NCCL takes one rank per GPU); staged through host memory"
                              : "NCCL cannot be loaded on rank(s) " + rank_list(no_nccl) +
                                    (v.nccl_ok ? "" : " (here: " + v.nccl_why + ")") + "; staged through host memory";
    return;
  }
  if (!shared.empty()) {  // mode nccl
    s.path = TANDEM_DEVICE_PATH_NONE;
    s.why = "TANDEM_DEVICE_COLLECTIVES=nccl, but " + shared + " and NCCL takes one rank per GPU";
    return;
  }
  if (!no_nccl.empty()) {  // mode nccl
    s.path = TANDEM_DEVICE_PATH_NONE;
    s.why = "TANDEM_DEVICE_COLLECTIVES=nccl, but NCCL cannot be loaded on rank(s) " + rank_list(no_nccl) +
            (v.nccl_ok ? "" : " (here: " + v.nccl_why + ")");
    return;
  }
  // NCCL everywhere: rank 0's unique id reaches the others over comm's own transport.
  engine::compute::NcclUniqueId id{};
  if (me == 0) id = rt->nccl_unique_id();
  run_host(c, [&](engine::comm::Communicator& e) { return e.broadcast(id.data(), id.size(), DType::kU8, 0); });
  s.nccl = recording(*c.state, [&] { return rt->nccl_init(d.index, n, me, id); });
  s.device = d.index;
  s.path = TANDEM_DEVICE_PATH_NCCL;
  s.why = "NCCL " + std::to_string(rt->nccl_version()) + " on cuda:" + std::to_string(d.index);
  (void)fn;
}

// The device path for a call on device memory: decided if needed; kUnsupported when there is none.
const DeviceState& usable(const char* fn, tandem_comm& c, const DeviceCall& d) {
  const DeviceState& s = device_path(fn, c, d);
  TANDEM_CHECK(s.path != TANDEM_DEVICE_PATH_NONE, Status::kUnsupported, "{}: {}", fn, s.why);
  engine::compute::device_runtime()->require_device(d.index);
  TANDEM_REQUIRE(s.path != TANDEM_DEVICE_PATH_NCCL || d.index == s.device,
                 "{}: device {} -- this communicator's NCCL path is bound to cuda:{} (its first device-memory call)",
                 fn, d.index, s.device);
  return s;
}

}  // namespace

void DeviceState::PinnedFree::operator()(unsigned char* p) const noexcept {
  if (const auto* rt = engine::compute::device_runtime()) rt->pinned_free(p);
}

unsigned char* DeviceState::staging_for(size_t bytes) {
  if (bytes > staging_bytes || !staging) {
    staging.reset();
    staging_bytes = 0;
    staging.reset(static_cast<unsigned char*>(engine::compute::device_runtime()->pinned_alloc(bytes)));
    staging_bytes = bytes;
  }
  return staging.get();
}

DeviceCall device_call(const char* fn, const tandem_coll_params_t* p) {
  DeviceCall d;
  if (p == nullptr) return d;
  check_field_mask(p->field_mask, mask_through(TANDEM_COLL_PARAM_STREAM), "tandem_coll_params_t");
  if (p->field_mask & TANDEM_COLL_PARAM_MEMORY) {
    TANDEM_REQUIRE(p->memory == TANDEM_MEMORY_HOST || p->memory == TANDEM_MEMORY_CUDA,
                   "{}: params->memory {} is not a tandem_memory_type_t (HOST 0, CUDA 1)", fn,
                   static_cast<int64_t>(p->memory));
    d.device = p->memory == TANDEM_MEMORY_CUDA;
    TANDEM_REQUIRE(p->device >= 0, "{}: params->device {} is negative", fn, p->device);
    d.index = p->device;
  }
  if (p->field_mask & TANDEM_COLL_PARAM_STREAM) d.stream = p->stream;
  return d;
}

const DeviceState& device_path(const char* fn, tandem_comm& c, const DeviceCall& d) {
  if (!c.state->device.decided) decide(fn, c, d);
  return c.state->device;
}

void device_allreduce(const char* fn, tandem_comm& c, const DeviceCall& d, const void* send, void* recv,
                      size_t count, DType dtype, ReduceOp op) {
  DeviceState& s = const_cast<DeviceState&>(usable(fn, c, d));
  const DeviceRuntime& rt = *engine::compute::device_runtime();
  if (s.path == TANDEM_DEVICE_PATH_NCCL) {
    recording(*c.state, [&] { s.nccl->allreduce(send, recv, count, dtype, op, d.stream); });
    return;
  }
  const size_t bytes = count * dtype_size(dtype);
  unsigned char* host = recording(*c.state, [&] { return s.staging_for(bytes); });
  recording(*c.state, [&] {
    rt.stream_synchronize(d.index, d.stream);
    rt.copy_to_host(d.index, host, send, bytes);
  });
  run_host(c, [&](engine::comm::Communicator& e) { return e.allreduce(host, host, count, dtype, op); });
  recording(*c.state, [&] { rt.copy_to_device(d.index, recv, host, bytes); });
}

void device_broadcast(const char* fn, tandem_comm& c, const DeviceCall& d, void* buf, size_t count, DType dtype,
                      int root) {
  DeviceState& s = const_cast<DeviceState&>(usable(fn, c, d));
  const DeviceRuntime& rt = *engine::compute::device_runtime();
  if (s.path == TANDEM_DEVICE_PATH_NCCL) {
    recording(*c.state, [&] { s.nccl->broadcast(buf, count, dtype, root, d.stream); });
    return;
  }
  const size_t bytes = count * dtype_size(dtype);
  unsigned char* host = recording(*c.state, [&] { return s.staging_for(bytes); });
  const bool sender = c.state->comm->rank() == root;
  recording(*c.state, [&] {
    rt.stream_synchronize(d.index, d.stream);
    if (sender) rt.copy_to_host(d.index, host, buf, bytes);
  });
  run_host(c, [&](engine::comm::Communicator& e) { return e.broadcast(host, count, dtype, root); });
  if (!sender) recording(*c.state, [&] { rt.copy_to_device(d.index, buf, host, bytes); });
}

}  // namespace tandem::api

using namespace tandem::api;

TANDEM_API tandem_status_t tandem_comm_device_path(tandem_comm_t* comm, const tandem_coll_params_t* params,
                                                   tandem_device_path_t* path, char* message,
                                                   size_t* message_bytes) TANDEM_NOEXCEPT {
  constexpr const char* fn = "tandem_comm_device_path";
  return guarded([&] {
    auto& c = checked(comm, fn, "comm");
    TANDEM_REQUIRE(path != nullptr, "{}: path is NULL", fn);
    TANDEM_REQUIRE(message == nullptr || message_bytes != nullptr, "{}: message is set but message_bytes is NULL",
                   fn);
    const DeviceCall d = device_call(fn, params);
    std::string why = "host memory: the collectives' own transport";
    tandem_device_path_t p = TANDEM_DEVICE_PATH_NONE;
    if (d.device) {
      const DeviceState& s = device_path(fn, c, d);
      p = s.path;
      why = s.why;
    }
    if (message_bytes != nullptr) copy_text_out(why, message, message_bytes, "tandem_comm_device_path: message_bytes");
    *path = p;
  });
}

TANDEM_API tandem_status_t tandem_nccl_version(int32_t* version) TANDEM_NOEXCEPT {
  return guarded([&] {
    TANDEM_REQUIRE(version != nullptr, "tandem_nccl_version: version is NULL");
    const auto* rt = tandem::engine::compute::device_runtime();
    TANDEM_CHECK(rt != nullptr, tandem::Status::kUnsupported,
                 "tandem_nccl_version: this libtandem was built without CUDA, so it never loads NCCL");
    *version = static_cast<int32_t>(rt->nccl_version());
  });
}

TANDEM_API tandem_status_t tandem_cuda_device_count(int32_t* count) TANDEM_NOEXCEPT {
  return guarded([&] {
    TANDEM_REQUIRE(count != nullptr, "tandem_cuda_device_count: count is NULL");
    const auto* rt = tandem::engine::compute::device_runtime();
    TANDEM_CHECK(rt != nullptr, tandem::Status::kUnsupported,
                 "tandem_cuda_device_count: this libtandem was built without CUDA");
    *count = static_cast<int32_t>(rt->device_count());
  });
}
