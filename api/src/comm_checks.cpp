// Argument checks shared by the communicator shims, the live-handle registry, and the sticky
// failure state of a communicator handle.
#include <limits>
#include <mutex>
#include <unordered_set>

#include "api/src/comm_handles.hpp"
#include "engine/core/dtype.hpp"

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

size_t checked_bytes(const char* fn, const char* what, size_t count, size_t multiplier, tandem_dtype_t dtype) {
  TANDEM_REQUIRE(dtype_valid(static_cast<int32_t>(dtype)),
                 "{}: dtype {} is not a valid tandem_dtype_t (expected 0..{})", fn, static_cast<int32_t>(dtype),
                 kNumDTypes - 1);
  const size_t elem = dtype_size(static_cast<DType>(dtype));
  constexpr size_t kMax = std::numeric_limits<size_t>::max();
  TANDEM_REQUIRE(multiplier == 0 || count <= kMax / multiplier / elem,
                 "{}: {} {} overflows size_t in bytes ({} x {}-byte elements{}); a negative count cast to "
                 "size_t looks like this",
                 fn, what, count, count, elem, multiplier > 1 ? fmt::format(" x {} ranks", multiplier) : "");
  return count * multiplier * elem;
}

void check_op(const char* fn, tandem_op_t op) {
  TANDEM_REQUIRE(reduce_op_valid(static_cast<int32_t>(op)),
                 "{}: op {} is not a valid tandem_op_t (expected 0..{}: sum, avg, min, max, prod)", fn,
                 static_cast<int32_t>(op), kNumReduceOps - 1);
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

// Live handles. A destroyed or foreign pointer is caught by lookup here before any field is read,
// so the check holds even when the memory has been freed (and under AddressSanitizer).
namespace {
// Keyed by a library-private type so that the set's template code stays hidden in libtandem.so.
struct HandleKey {
  const void* p;
  bool operator==(const HandleKey& o) const { return p == o.p; }
};
struct HandleKeyHash {
  size_t operator()(const HandleKey& k) const { return std::hash<const void*>()(k.p); }
};
std::mutex g_live_mu;
std::unordered_set<HandleKey, HandleKeyHash>& live_set() {
  static std::unordered_set<HandleKey, HandleKeyHash> s;
  return s;
}
}  // namespace

void register_handle(const void* h) {
  std::lock_guard<std::mutex> lock(g_live_mu);
  live_set().insert(HandleKey{h});
}
bool unregister_handle(const void* h) {
  std::lock_guard<std::mutex> lock(g_live_mu);
  return live_set().erase(HandleKey{h}) == 1;
}
bool handle_live(const void* h) {
  std::lock_guard<std::mutex> lock(g_live_mu);
  return live_set().count(HandleKey{h}) == 1;
}

}  // namespace tandem::api
