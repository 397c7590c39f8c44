#pragma once
// Runs one rank's part of a Plan on a Transport. The plan is first compiled: its ops in program
// order (round by round, transfers before local ops) with the dependencies that region conflicts
// impose (read-after-write, write-after-read, write-after-write, in a unified address space for
// in-place calls), and per-peer FIFO queues of sends and receives (the k-th send to a peer must be
// the k-th posted). The executor then starts every op as soon as its dependencies are done, so
// chunks pipeline across rounds: while chunk c is being reduced, chunk c+1 is already on the wire.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/comm/plan.hpp"
#include "engine/comm/wire.hpp"
#include "engine/core/cpu_isa.hpp"
#include "engine/core/dtype.hpp"
#include "transports/transport.hpp"

namespace tandem::engine::comm {

struct CompiledOp {
  OpKind kind = OpKind::kSend;
  int32_t peer = -1;
  Region src, dst;
  uint32_t succ_begin = 0, succ_end = 0;  // into CompiledPlan::succs
  uint32_t deps = 0;                       // ops that must finish first
  uint32_t slot = 0;                       // receives: index of its header slot
};

struct PeerQueue {
  int32_t peer = -1;
  std::vector<uint32_t> sends, recvs;  // op indices in plan order
};

struct CompiledPlan {
  Collective collective = Collective::kAllreduce;
  Algorithm algorithm = Algorithm::kRing;
  int32_t world = 1;
  int32_t rank = 0;
  uint64_t scratch_count = 0;
  uint64_t chunk_count = 0;
  std::string description;
  std::vector<CompiledOp> ops;
  std::vector<uint32_t> succs;
  std::vector<PeerQueue> queues;
  std::vector<uint32_t> ready_locals;  // local ops without dependencies
  uint32_t recv_count = 0;
};

// Compiles `rank`'s part of `plan` (plan.in_place decides how input and output alias).
std::shared_ptr<const CompiledPlan> compile_plan(const Plan& plan, int rank);
// The same analysis for `rank_plan` as `rank`'s part of `plan`, whose ranks are not read (a
// plan_header will do), into `out`'s ops, succs, queues, ready_locals and recv_count, reusing their
// storage; `out`'s other fields are left alone. The simulator compiles its plans with this call, so
// both executors order a plan's ops by one dependency analysis.
void compile_rank_plan(const Plan& plan, const RankPlan& rank_plan, int rank, CompiledPlan& out);

// Where region `r` of `rank`'s buffers lies in the address space compile_plan analyses: in-place calls
// put input and output in one space (space = the index of the Buffer that space belongs to). Ops
// conflict exactly when their regions overlap in one space and one of them writes.
struct PlanAddress {
  int space = 0;
  uint64_t offset = 0;  // elements
};
PlanAddress plan_address(const Plan& plan, int rank, const Region& r);

class PlanExecutor;

// What the executor asks of its owner (the communicator).
class ExecHooks {
 public:
  virtual ~ExecHooks() = default;
  // Every loop iteration: cheap polling of other work (point-to-point operations).
  virtual void poll() = 0;
  // An iteration without progress: may yield or sleep; throws to give up (timeout, abort).
  virtual void idle(const PlanExecutor& executor) = 0;
  // A received message is not what this rank's plan expects: throws (kMismatch).
  [[noreturn]] virtual void bad_message(int peer, const WireHeader& got, size_t got_bytes, size_t expected_bytes) = 0;
};

struct ExecBuffers {
  unsigned char* base[3] = {nullptr, nullptr, nullptr};  // input, output, scratch
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;
};

class PlanExecutor {
 public:
  // Runs the plan to completion. `transport_rank[peer]` maps communicator ranks to transport ranks;
  // every message carries `header` and is sent on `tag`. Exceptions from the transport or the hooks
  // propagate; call abandon() afterwards.
  void run(const CompiledPlan& plan, const ExecBuffers& buffers, transports::Transport& transport,
           const std::vector<int>& transport_rank, uint64_t tag, const WireHeader& header, ExecHooks& hooks);
  // Drops the requests of an abandoned run (incomplete receives are cancelled).
  void abandon();

  std::chrono::steady_clock::time_point last_event() const { return last_event_; }
  // Communicator ranks this rank still has a posted, incomplete transfer with.
  std::vector<int> waiting_peers() const;
  size_t ops_done() const { return done_; }
  // The ISA variant of the reduction kernels local reductions run (variant_cpu_isa of reduce_isa_).
  CpuIsa reduce_isa() const { return reduce_isa_; }
  // The communicator rank whose transfer threw the error that ended the last run (-1: none did).
  int failed_peer() const { return failed_peer_; }

 private:
  void post(uint32_t i);
  void finish(uint32_t i);
  void run_local(uint32_t i);
  bool test_request(uint32_t i);  // requests_[i]->test(), noting the peer when it throws

  // The reduction kernels' ISA: TANDEM_CPU_MAX_ISA of the settings in force where the executor is made (its
  // communicator's creation, under the caller's context), capped by the CPU.
  CpuIsa reduce_isa_ = active_cpu_isa();
  const CompiledPlan* plan_ = nullptr;
  ExecBuffers buffers_;
  size_t elem_bytes_ = 0;
  transports::Transport* transport_ = nullptr;
  const std::vector<int>* transport_rank_ = nullptr;
  uint64_t tag_ = 0;
  const WireHeader* header_ = nullptr;

  std::vector<uint32_t> remaining_;
  std::vector<std::unique_ptr<transports::Request>> requests_;
  std::vector<WireHeader> recv_headers_;
  std::vector<size_t> send_heads_, recv_heads_;
  std::vector<uint32_t> ready_, inflight_;
  size_t done_ = 0;
  int failed_peer_ = -1;
  std::chrono::steady_clock::time_point last_event_{};
};

}  // namespace tandem::engine::comm
