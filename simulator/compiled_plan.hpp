#pragma once
// A collective plan (engine/comm/plan.hpp) compiled for execution by the simulator: the same
// rounds, sends, receives and local reductions, in flat arrays, with every send matched to its
// receive up front (the k-th send from a to b matches the k-th receive on b from a). Nothing of
// the algorithm is re-derived here: the plan comes from engine::comm::make_plan, the runtime's.
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/comm/plan.hpp"

namespace tandem::simulator {

struct CompiledPlan {
  struct Send {
    int32_t src;          // member (rank in the plan) sending
    int32_t dst;          // member receiving
    uint32_t recv;        // index into recvs of the matching receive
    uint32_t recv_round;  // index into rounds of the round holding that receive
    uint64_t bytes;
  };
  struct Recv {
    int32_t src;
    uint32_t round;
    uint64_t bytes;
  };
  struct Round {
    uint32_t send_begin, send_end;  // into sends
    uint32_t recv_begin, recv_end;  // into recvs
    uint64_t local_bytes;           // bytes the round's copies and reductions read and write
  };
  int32_t world = 0;
  uint64_t elem_bytes = 4;
  std::string description;           // Plan::describe()
  std::vector<uint32_t> first_round;  // per member, world + 1 entries into rounds
  std::vector<Round> rounds;
  std::vector<Send> sends;
  std::vector<Recv> recvs;
  uint64_t finish_bytes = 0;          // per member, the closing average (ReduceOp avg), if any
  // Every member's rounds are member 0's with peers shifted by the member's index (mod world) and
  // identical sizes: ring-like plans. Then member q's k-th send to member 0 is the image of member
  // 0's k-th send to member (world - q), and mirror_recv[i] is the receive of member 0 that member 0's
  // send i mirrors (see step.cpp, symmetric execution).
  bool rotation_symmetric = false;
  std::vector<uint32_t> mirror_recv;

  uint64_t total_bytes_sent() const;
};

// Compiles `plan` (validated first with engine::comm::validate_plan). elem_bytes is the dtype size.
CompiledPlan compile_plan(const engine::comm::Plan& plan, uint64_t elem_bytes);

// make_plan + compile_plan, memoised per request (the same bucket sizes recur in every step and in
// every configuration a search tries). Not thread-safe; one cache per simulation.
class PlanCache {
 public:
  const CompiledPlan& get(const engine::comm::PlanRequest& request);
  size_t size() const noexcept { return plans_.size(); }

 private:
  std::unordered_map<std::string, std::unique_ptr<CompiledPlan>> plans_;
};

}  // namespace tandem::simulator
