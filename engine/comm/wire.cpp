#include "engine/comm/wire.hpp"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

namespace tandem::engine::comm {

bool same_operation(const WireHeader& a, const WireHeader& b) noexcept {
  return a.magic == b.magic && a.comm_id == b.comm_id && a.seq == b.seq && a.count == b.count && a.chunk == b.chunk &&
         a.root == b.root && a.kind == b.kind && a.algorithm == b.algorithm && a.dtype == b.dtype && a.op == b.op;
}

namespace {
const char* kind_name(WireKind k) {
  if (k == WireKind::kSplit) return "split";
  if (static_cast<uint8_t>(k) <= static_cast<uint8_t>(WireKind::kRecv))
    return collective_name(static_cast<Collective>(k));
  return nullptr;
}
}  // namespace

std::string describe_call(WireKind kind, DType dtype, ReduceOp op, uint64_t count, int32_t root) {
  const char* name = kind_name(kind);
  const std::string dt = dtype_valid(static_cast<int32_t>(dtype)) ? std::string(dtype_name(dtype))
                                                                  : fmt::format("dtype {}", static_cast<int>(dtype));
  const std::string opn = reduce_op_valid(static_cast<int32_t>(op)) ? std::string(reduce_op_name(op))
                                                                    : fmt::format("op {}", static_cast<int>(op));
  switch (kind) {
    case WireKind::kAllreduce:
    case WireKind::kReduceScatter: return fmt::format("{}({}, {}, {})", name, dt, opn, count);
    case WireKind::kAllgather: return fmt::format("{}({}, {})", name, dt, count);
    case WireKind::kBroadcast: return fmt::format("{}({}, {}, root {})", name, dt, count, root);
    case WireKind::kReduce: return fmt::format("{}({}, {}, {}, root {})", name, dt, opn, count, root);
    case WireKind::kBarrier: return "barrier()";
    case WireKind::kSend:
    case WireKind::kRecv: return fmt::format("{}({}, {}, tag {})", name, dt, count, root);
    case WireKind::kSplit: return "split()";
  }
  return fmt::format("unknown operation {}", static_cast<int>(kind));
}

std::string describe_header(const WireHeader& h, const WireHeader& reference) {
  if (h.magic != kWireMagic) return fmt::format("a message that is not a tandem message (magic 0x{:08x})", h.magic);
  std::string s = describe_call(static_cast<WireKind>(h.kind), static_cast<DType>(h.dtype),
                                static_cast<ReduceOp>(h.op), h.count, h.root);
  if (h.algorithm != reference.algorithm || h.chunk != reference.chunk)
    s += fmt::format(" [{}, chunk {}]", algorithm_name(static_cast<Algorithm>(h.algorithm)), h.chunk);
  if (h.comm_id != reference.comm_id) s += fmt::format(" on communicator {}", h.comm_id);
  return s;
}

ControlMessage make_control(ControlType type, int32_t origin, int32_t status, uint64_t seq, const std::string& text) {
  ControlMessage m;
  m.type = static_cast<uint32_t>(type);
  m.origin = origin;
  m.status = status;
  m.seq = seq;
  const size_t n = std::min(text.size(), sizeof(m.text) - 1);
  std::memcpy(m.text, text.data(), n);
  m.text[n] = '\0';
  return m;
}

}  // namespace tandem::engine::comm
