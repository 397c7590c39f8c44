// Argument checks shared by the communicator shims, and the sticky failure state of a communicator handle.
#include <mutex>

#include "api/src/comm_handles.hpp"
#include "api/src/enums.hpp"
#include "engine/core/buffer_bytes.hpp"

namespace tandem::api {

void CommState::record_failure(Status s, const std::string& what) {
  std::lock_guard<std::mutex> lock(mu);
  if (status != Status::kOk) return;
  status = s;
  message = what;
}

Status CommState::current(std::string* message_out) const {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (status != Status::kOk) {
      if (message_out != nullptr) *message_out = message;
      return status;
    }
  }
  if (comm && comm->is_failed()) {
    // Failed in the background (a peer's abort, a dead connection) without an operation of ours
    // having reported it yet.
    if (message_out != nullptr) *message_out = comm->failure_message();
    return Status::kPeerFailure;
  }
  if (message_out != nullptr) message_out->clear();
  return Status::kOk;
}

size_t checked_bytes(const char* fn, const char* what, size_t count, size_t ranks, tandem_dtype_t dtype) {
  return checked_buffer_bytes(fn, what, count, ranks, static_cast<int32_t>(dtype));
}

void check_op(const char* fn, tandem_op_t op) {
  if (enum_valid(op)) return;
  std::string names;
  for (const auto& r : CEnum<tandem_op_t>::kRows) {
    names += fmt::format("{}{}", names.empty() ? "" : ", ", reduce_op_name(r.e));
  }
  TANDEM_THROW(Status::kInvalidArgument, "{}: op {} is not a valid tandem_op_t (expected 0..{}: {})", fn,
               static_cast<int32_t>(op), enum_count<tandem_op_t>() - 1, names);
}

void check_buffer(const char* fn, const char* what, const void* p, size_t bytes) {
  TANDEM_REQUIRE(p != nullptr || bytes == 0, "{}: {} is NULL but must hold {} bytes", fn, what, bytes);
}

void check_rank_arg(const char* fn, const char* what, int32_t r, int size) {
  TANDEM_REQUIRE(r >= 0 && r < size, "{}: {} {} is out of range [0, {})", fn, what, r, size);
}

void check_overlap(const char* fn, const void* send, size_t send_bytes, const void* recv, size_t recv_bytes,
                   bool in_place, const char* in_place_rule) {
  if (send == nullptr || recv == nullptr || send_bytes == 0 || recv_bytes == 0 || in_place) return;
  const auto s = reinterpret_cast<uintptr_t>(send);
  const auto r = reinterpret_cast<uintptr_t>(recv);
  const bool overlap = s < r + recv_bytes && r < s + send_bytes;
  TANDEM_REQUIRE(!overlap, "{}: send ({} bytes at {}) and recv ({} bytes at {}) overlap; the only in-place form is {}",
                 fn, send_bytes, send, recv_bytes, recv, in_place_rule);
}

}  // namespace tandem::api
