#pragma once
// The structs behind tandem_comm_t and tandem_request_t, and the argument checks the collective
// shims share. A communicator's engine object and its sticky failure state are shared between the
// handle and its requests, so a request may outlive the tandem_comm_t it came from.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "api/src/handles.hpp"
#include "engine/comm/communicator.hpp"
#include "engine/compute/device_runtime.hpp"
#include "tandem/tandem.h"

namespace tandem::api {

constexpr uint32_t kCommMagic = 0x54434f4d;     // "TCOM"
constexpr uint32_t kRequestMagic = 0x54524551;  // "TREQ"

// How a communicator moves device memory (tandem_comm_allreduce_ex; comm_device.cpp): decided by every rank
// together on the first device-memory call, then fixed.
struct DeviceState {
  bool decided = false;
  tandem_device_path_t path = TANDEM_DEVICE_PATH_NONE;
  std::string why;                                      // why this path (for NONE: why device memory is unusable)
  int device = -1;                                      // the device NCCL is bound to
  std::unique_ptr<engine::compute::NcclComm> nccl;      // path NCCL
  // path STAGED: the host copy, page-locked (DeviceRuntime::pinned_alloc) so the copies run at the bus's rate
  struct PinnedFree {
    void operator()(unsigned char* p) const noexcept;
  };
  std::unique_ptr<unsigned char, PinnedFree> staging;
  size_t staging_bytes = 0;
  unsigned char* staging_for(size_t bytes);  // grows the buffer to `bytes` (contents not kept)
};

// Shared by a communicator handle and every request it created; reference counted by StateRef.
// (An intrusive count rather than std::shared_ptr: std templates instantiated only over std types
// would be exported from libtandem.so with default visibility; see tests/api/abi_test.cpp.)
struct CommState {
  std::atomic<int> refs{0};
  std::unique_ptr<engine::comm::Communicator> comm;
  std::string transport_name;  // stable storage for tandem_comm_transport_name
  DeviceState device;          // device memory (per handle: calls on a communicator are serialized)
  ContextEnv env;              // the creating context's settings and logger

  // First failure seen through this handle (sticky). Guarded by mu.
  mutable std::mutex mu;
  Status status = Status::kOk;
  std::string message;

  // Records the first failure; later ones are ignored (the first is the cause).
  void record_failure(Status s, const std::string& what);
  // The sticky status: the recorded one, else the engine's own failure state.
  Status current(std::string* message_out) const;
};

class StateRef {
 public:
  StateRef() = default;
  explicit StateRef(CommState* s) : s_(s) { retain(); }
  StateRef(const StateRef& o) : s_(o.s_) { retain(); }
  StateRef& operator=(const StateRef& o) {
    StateRef copy(o);
    std::swap(s_, copy.s_);
    return *this;
  }
  ~StateRef() {
    if (s_ != nullptr && s_->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete s_;
  }
  CommState& operator*() const { return *s_; }
  CommState* operator->() const { return s_; }

 private:
  void retain() {
    if (s_ != nullptr) s_->refs.fetch_add(1, std::memory_order_relaxed);
  }
  CommState* s_ = nullptr;
};

// The explicit settings of tandem_comm_create (unset: from the environment).
struct CreateParams {
  std::optional<int> rank;
  std::optional<int> size;
  std::optional<std::string> master_addr;
  std::optional<int> master_port;
  std::optional<std::string> secret;
  std::optional<std::string> transport;
  std::optional<int64_t> timeout_ms;
  std::optional<engine::comm::Algorithm> allreduce_algorithm;
  std::optional<bool> deterministic;
};

// Bootstraps the engine communicator: explicit settings first, the environment for the rest
// (comm_create.cpp).
std::unique_ptr<engine::comm::Communicator> create_engine_comm(const CreateParams& params);
// Joins the running job those settings name (tandem_comm_join; engine::comm::join_communicator).
std::unique_ptr<engine::comm::Communicator> join_engine_comm(const CreateParams& params, std::chrono::milliseconds wait);

// Runs `body` under the communicator's context (ContextScope) and, if it throws a tandem::Error,
// records it as the communicator's failure before rethrowing (argument errors are not failures of
// the communicator and are not recorded).
template <typename F>
decltype(auto) recording(CommState& state, F&& body) {
  const ContextScope scope(state.env);
  try {
    return body();
  } catch (const Error& e) {
    if (e.status() != Status::kInvalidArgument) state.record_failure(e.status(), e.what());
    throw;
  }
}

}  // namespace tandem::api

struct tandem_comm : tandem::api::Handle<tandem::api::kCommMagic> {
  tandem::api::StateRef state;
};

struct tandem_request : tandem::api::Handle<tandem::api::kRequestMagic> {
  const char* op_name = "";  // static text, for messages
  tandem::api::StateRef state;
  std::unique_ptr<tandem::engine::comm::Work> work;
  bool done = false;
  tandem::Status status = tandem::Status::kOk;  // sticky failure of this operation
  std::string message;
};

namespace tandem::api {

// Argument checks shared by the collective shims; each throws kInvalidArgument naming `fn` and the
// offending argument. checked_bytes: count x ranks elements of dtype in bytes (tandem::checked_buffer_bytes, the
// communicator's own check).
size_t checked_bytes(const char* fn, const char* what, size_t count, size_t ranks, tandem_dtype_t dtype);
void check_op(const char* fn, tandem_op_t op);
void check_buffer(const char* fn, const char* what, const void* p, size_t bytes);
void check_rank_arg(const char* fn, const char* what, int32_t r, int size);
// Device memory (comm_device.cpp). What a tandem_coll_params_t asks for, checked (mask, memory type).
struct DeviceCall {
  bool device = false;  // false: host memory, the plain collective
  int32_t index = 0;    // cuda:index
  void* stream = nullptr;
};
DeviceCall device_call(const char* fn, const tandem_coll_params_t* params);
// The collectives on device memory, after the host form's argument checks passed.
void device_allreduce(const char* fn, tandem_comm& c, const DeviceCall& d, const void* send, void* recv, size_t count,
                      DType dtype, ReduceOp op);
void device_broadcast(const char* fn, tandem_comm& c, const DeviceCall& d, void* buf, size_t count, DType dtype,
                      int root);
// Decides comm's device path (collective) unless decided; returns the state.
const DeviceState& device_path(const char* fn, tandem_comm& c, const DeviceCall& d);

// send and recv must not overlap unless `in_place` (they are in the collective's in-place layout,
// which `in_place_rule` describes for the message).
void check_overlap(const char* fn, const void* send, size_t send_bytes, const void* recv, size_t recv_bytes,
                   bool in_place, const char* in_place_rule);

}  // namespace tandem::api
