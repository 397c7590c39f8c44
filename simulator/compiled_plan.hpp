#pragma once
// A collective plan (engine/comm/plan.hpp) compiled for execution by the simulator: the same
// rounds, sends, receives and local reductions, in flat arrays, with every send matched to its
// receive up front (the k-th send from a to b matches the k-th receive on b from a). Nothing of
// the algorithm is re-derived here: the ops come from engine::comm::make_plan / make_rank_plan,
// the runtime's.
//
// Two forms. The full form holds every member's rounds (32 bytes per transfer plus 16 per round: a
// ring's 4,096-rank plan in 1.6 GB). The symmetric form holds member 0's alone, for plans proven rotation-symmetric rank by
// rank (every member's ops are member 0's rotated): symmetric execution (step.cpp) needs nothing
// else, so a 4,096-rank ring all-reduce of 33.5 M transfers compiles in O(ops of one rank) memory.
// full() builds the full form of a symmetric one on first use.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/comm/plan.hpp"

namespace tandem::simulator {

struct CompiledPlan {
  struct Send {
    int32_t src;          // member (rank in the plan) sending
    int32_t dst;          // member receiving
    uint32_t recv;        // index into recvs of the matching receive (symmetric form: unset)
    uint32_t recv_round;  // index into rounds of the round holding that receive (symmetric form: unset)
    uint64_t bytes;
  };
  struct Recv {  // its size is its send's
    int32_t src;
    uint32_t round;
  };
  struct Round {  // its sends run to the next round's send_begin, its receives likewise
    uint32_t send_begin;  // into sends
    uint32_t recv_begin;  // into recvs
    uint64_t local_bytes;  // bytes the round's copies and reductions read and write
  };
  int32_t world = 0;
  int32_t members = 0;               // members whose rounds are compiled: world, or 1 (symmetric form)
  uint64_t elem_bytes = 4;
  std::string description;           // Plan::describe() (large plans: the same fields from counts)
  std::vector<uint32_t> first_round;  // per compiled member, members + 1 entries into rounds
  std::vector<Round> rounds;          // and one more at the end that only closes the last round
  std::vector<Send> sends;
  std::vector<Recv> recvs;
  uint64_t finish_bytes = 0;          // per member, the closing average (ReduceOp avg), if any
  // Every member's rounds are member 0's with peers shifted by the member's index (mod world) and
  // identical sizes: ring-like plans. Then member q's k-th send to member 0 is the image of member
  // 0's k-th send to member (world - q), and mirror_recv[i] is the receive of member 0 that member 0's
  // send i mirrors (see step.cpp, symmetric execution).
  bool rotation_symmetric = false;
  std::vector<uint32_t> mirror_recv;
  std::optional<engine::comm::PlanRequest> request;  // what the plan was built from (for full())

  uint32_t send_end(uint32_t round) const { return rounds[round + 1].send_begin; }
  uint32_t recv_end(uint32_t round) const { return rounds[round + 1].recv_begin; }
  uint64_t total_bytes_sent() const;  // over all members (the symmetric form counts member 0's world times)
  bool is_full() const noexcept { return members == world; }
  // This plan when full; else the full form, compiled rank by rank on first use and kept.
  const CompiledPlan& full() const;

 private:
  mutable std::shared_ptr<const CompiledPlan> full_;
};

// Compiles `plan` (validated first with engine::comm::validate_plan when small). elem_bytes is the
// dtype size.
CompiledPlan compile_plan(const engine::comm::Plan& plan, uint64_t elem_bytes);
// The full form built rank by rank from engine::comm::make_rank_plan, never holding the runtime's
// whole plan: equal to compile_plan(make_plan(request), request.elem_bytes) but for the description,
// which is made from counts (as compile_plan makes it for worlds over 256).
CompiledPlan compile_plan_by_rank(const engine::comm::PlanRequest& request);
// The symmetric form, if every rank's plan (make_rank_plan, checked one rank at a time) is member 0's
// rotated and member 0's receives mirror its sends; else nullopt. Costs O(ops of the whole plan) time
// and O(ops of one rank) memory.
std::optional<CompiledPlan> compile_symmetric(const engine::comm::PlanRequest& request);

// Worlds above this compile rank by rank (symmetric form where proven); smaller ones from make_plan.
constexpr int32_t kRankByRankWorld = 256;

// make_plan + compile_plan, memoised per request (the same bucket sizes recur in every step and in
// every configuration a search tries); above kRankByRankWorld, compile_symmetric or
// compile_plan_by_rank. Not thread-safe; one cache per simulation.
class PlanCache {
 public:
  const CompiledPlan& get(const engine::comm::PlanRequest& request);
  size_t size() const noexcept { return plans_.size(); }

 private:
  std::unordered_map<std::string, std::unique_ptr<CompiledPlan>> plans_;
};

}  // namespace tandem::simulator
