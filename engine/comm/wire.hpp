#pragma once
// What a communicator puts on the wire: every message is [WireHeader | payload]; the header says
// which communicator, which operation (sequence number, kind, dtype, op, count, root, plan shape)
// sent it, so a receiver detects ranks that called different collectives instead of reading
// corrupted data. Control messages (abort, timeout notice) travel on their own tag.
//
// Tags (transports keep tags below 2^40):
//   collective data   (comm_id << 8) | 0
//   control           (comm_id << 8) | 1
//   point-to-point    2^39 | (comm_id << 24) | user_tag      (user_tag < 2^24)
// comm_id < 2^15, unique among the communicators one rank belongs to (see split).
#include <cstdint>
#include <string>

#include "engine/comm/plan.hpp"
#include "engine/core/dtype.hpp"

namespace tandem::engine::comm {

constexpr uint32_t kMaxCommId = (1u << 15) - 1;
constexpr uint32_t kMaxUserTag = (1u << 24) - 1;

inline uint64_t collective_tag(uint32_t comm_id) { return static_cast<uint64_t>(comm_id) << 8; }
inline uint64_t control_tag(uint32_t comm_id) { return (static_cast<uint64_t>(comm_id) << 8) | 1u; }
inline uint64_t p2p_tag(uint32_t comm_id, uint32_t user_tag) {
  return (uint64_t{1} << 39) | (static_cast<uint64_t>(comm_id) << 24) | user_tag;
}

// Operation kinds on the wire: the Collective values, plus communicator-internal operations.
enum class WireKind : uint8_t {
  kAllreduce = 0, kReduceScatter = 1, kAllgather = 2, kBroadcast = 3, kReduce = 4, kBarrier = 5,
  kSend = 6, kRecv = 7, kSplit = 8,
};

constexpr uint32_t kWireMagic = 0x314d4454;  // "TDM1"

struct WireHeader {
  uint32_t magic = kWireMagic;
  uint32_t comm_id = 0;
  uint64_t seq = 0;       // collective sequence number in the communicator (point-to-point: 0)
  uint64_t count = 0;     // elements as the caller passed them
  uint64_t chunk = 0;     // the plan's chunk (elements): ranks must cut buffers alike
  int32_t root = 0;       // broadcast/reduce: root; send/recv: user tag; else 0
  int32_t sender = 0;     // communicator rank of the sender
  uint8_t kind = 0;       // WireKind
  uint8_t algorithm = 0;  // Algorithm the plan was built with
  uint8_t dtype = 0;
  uint8_t op = 0;         // ReduceOp (reductions only; else 0)
  uint32_t reserved = 0;
};
static_assert(sizeof(WireHeader) == 48, "the wire header is 48 bytes");

// Same operation (all fields but the sender)?
bool same_operation(const WireHeader& a, const WireHeader& b) noexcept;

// "allreduce(f32, sum, 1024)", "broadcast(f32, 1024, root 0)", "send(f32, 10, tag 3)", ...
std::string describe_call(WireKind kind, DType dtype, ReduceOp op, uint64_t count, int32_t root);
// A received header in the same words; `reference` is this rank's own header: the plan shape
// (algorithm, chunk) is added when it differs, and an unreadable header is said to be one.
std::string describe_header(const WireHeader& h, const WireHeader& reference);

// Control messages: fixed size, text truncated to fit.
enum class ControlType : uint32_t { kAbort = 1, kTimeoutNotice = 2 };
constexpr int kMaxBlamedRanks = 14;
struct ControlMessage {
  uint32_t magic = kWireMagic;
  uint32_t type = 0;      // ControlType
  int32_t origin = 0;     // communicator rank that sent it
  int32_t status = 0;     // tandem::Status of the failure (abort)
  uint64_t seq = 0;       // operation the message is about
  // Abort: where the failure started and whom it blames (FailureStatus), relayed unchanged.
  int32_t first_origin = -1;
  uint16_t aborted = 0;       // first_origin called abort()
  uint16_t blamed_count = 0;  // entries of `blamed` in use
  int32_t blamed[kMaxBlamedRanks] = {};
  char text[936] = {};    // abort: the failure message; timeout notice: ranks waited for, "2,5"
};
static_assert(sizeof(ControlMessage) == 1024, "control messages are 1 KiB");

ControlMessage make_control(ControlType type, int32_t origin, int32_t status, uint64_t seq, const std::string& text);

}  // namespace tandem::engine::comm
