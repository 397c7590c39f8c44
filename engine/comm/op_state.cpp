#include "engine/comm/op_state.hpp"

#include "engine/core/error.hpp"

namespace tandem::engine::comm {

void OpState::complete(Status s, std::string msg) {
  {
    std::lock_guard lock(mu);
    status = s;
    message = std::move(msg);
    state.store(s == Status::kOk ? 1 : 2, std::memory_order_release);
  }
  cv.notify_all();
}

std::shared_ptr<OpState> new_op(WireKind kind, const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                                int root) {
  auto s = std::make_shared<OpState>();
  s->kind = kind;
  s->send = send;
  s->recv = recv;
  s->count = count;
  s->dtype = dtype;
  s->op = op;
  s->root = root;
  return s;
}

PlanRequest plan_request_for(const OpState& op, int rank, int world, const CommOptions& options) {
  PlanRequest r;
  const auto n = static_cast<uint64_t>(world);
  r.world = world;
  r.elem_bytes = dtype_size(op.dtype);
  r.root = op.root;
  r.count = op.count;  // r.topology stays empty here (no copy per call); the plan cache adds it on a miss
  const auto at_rank = [&](const void* base) {
    return static_cast<const unsigned char*>(base) + op.count * r.elem_bytes * static_cast<size_t>(rank);
  };
  switch (op.kind) {
    case WireKind::kAllreduce:
      r.collective = Collective::kAllreduce;
      r.algorithm = options.deterministic ? Algorithm::kDeterministic : options.allreduce_algorithm;
      r.in_place = op.send == op.recv;
      break;
    case WireKind::kReduceScatter:
      r.collective = Collective::kReduceScatter;
      r.algorithm = options.deterministic ? Algorithm::kDeterministic : Algorithm::kAuto;
      r.count = op.count * n;
      r.in_place = at_rank(op.send) == static_cast<const unsigned char*>(op.recv);
      break;
    case WireKind::kAllgather:
    case WireKind::kSplit:
      r.collective = Collective::kAllgather;
      r.count = op.count * n;
      r.in_place = at_rank(op.recv) == static_cast<const unsigned char*>(op.send);
      break;
    case WireKind::kBroadcast: r.collective = Collective::kBroadcast; break;
    case WireKind::kReduce:
      r.collective = Collective::kReduce;
      r.algorithm = options.deterministic ? Algorithm::kDeterministic : Algorithm::kAuto;
      r.in_place = op.send == op.recv;
      break;
    case WireKind::kBarrier: r.collective = Collective::kBarrier; break;
    case WireKind::kSend:
    case WireKind::kRecv: TANDEM_THROW(Status::kInternal, "point-to-point operations have no plan");
  }
  if (op.count == 0) r.in_place = false;
  r.chunk_bytes = effective_chunk_bytes(options.chunk_bytes, r.count * r.elem_bytes);
  return r;
}

std::string describe_op(const OpState& op) {
  const bool p2p = op.kind == WireKind::kSend || op.kind == WireKind::kRecv;
  return describe_call(op.kind, op.dtype, op.op, op.count, p2p ? static_cast<int32_t>(op.tag) : op.root);
}

int64_t steady_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace tandem::engine::comm
