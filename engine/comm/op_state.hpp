#pragma once
// One queued communicator operation (collective, split or point-to-point) and its completion, shared
// between the caller's Work handle and the progress engine that runs it.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/comm/communicator.hpp"
#include "engine/comm/wire.hpp"

namespace tandem::engine::comm {

struct OpState {
  WireKind kind = WireKind::kAllreduce;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  int peer = -1;
  uint32_t tag = 0;
  uint64_t seq = 0;
  std::chrono::steady_clock::time_point enqueued{};

  std::atomic<int> state{0};  // 0 pending, 1 done, 2 failed
  Status status = Status::kOk;
  std::string message;
  std::mutex mu;
  std::condition_variable cv;

  // Point-to-point in flight (progress engine only).
  std::unique_ptr<transports::Request> request;
  WireHeader header, received;
  std::chrono::steady_clock::time_point posted{};
  // A send is buffered: the transport sends this copy of the caller's data, and the caller's operation
  // completes once it is taken (`detached`), never waiting for the matching receive.
  std::vector<unsigned char> payload;
  bool detached = false;
  // Split's own buffers.
  std::vector<int64_t> split_in, split_out;

  // For Work::wait's stall backstop.
  std::shared_ptr<std::atomic<int64_t>> activity;
  std::chrono::milliseconds timeout{0};

  void complete(Status s, std::string msg);
};

std::shared_ptr<OpState> new_op(WireKind kind, const void* send, void* recv, size_t count, DType dtype,
                                ReduceOp op = ReduceOp::kSum, int root = 0);

// The plan request for collective `op` on rank `rank` of `world` (request.topology left empty).
// kInternal for point-to-point operations, which have no plan.
PlanRequest plan_request_for(const OpState& op, int rank, int world, const CommOptions& options);

// "allreduce(f32, sum, 1024)" and the like, for logs and errors.
std::string describe_op(const OpState& op);

// Nanoseconds of steady_clock, for the activity stamps.
int64_t steady_now_ns();

}  // namespace tandem::engine::comm
