#pragma once
// A collective plan (engine/comm/plan.hpp) compiled for execution by the simulator. Every member's
// ops, their dependencies and their per-peer order come from the runtime's own compiler
// (engine::comm::compile_rank_plan, executor.hpp): the ops in program order, an op waiting for the
// ops whose regions it conflicts with (read-after-write, write-after-read, write-after-write), and
// the sends (receives) to one peer posted in plan order. The simulator starts an op when the runtime's
// executor would, so both executors run one schedule; nothing of it is re-derived here. What is added
// is the matching of every send to its receive (the k-th send from a to b is the k-th receive on b
// from a) and the bytes each op moves.
//
// Two forms. The full form holds every member's ops (32 bytes per op plus 4 per dependency). The
// symmetric form holds member 0's alone, for plans proven rotation-symmetric rank by rank (every
// member's ops are member 0's rotated, with the same dependencies): symmetric execution (step.cpp)
// needs nothing else, so a 4,096-rank ring all-reduce of 33.5 M transfers compiles in O(ops of one
// rank) memory. full() builds the full form of a symmetric one on first use.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/comm/plan.hpp"

namespace tandem::simulator {

struct CompiledPlan {
  enum class Kind : uint8_t { kSend = 0, kRecv = 1, kLocal = 2 };  // kLocal: a copy or reduction
  static constexpr uint32_t kNone = UINT32_MAX;
  // Indices inside an Op (succs, fifo_next, link) are member-local: op i of member m is
  // ops[first_op[m] + i].
  struct Op {
    uint64_t bytes;       // send, receive: payload; local: bytes read and written (copy 2x, reduce 3x)
    uint32_t succ_begin;  // into succs; the list ends at the next op's succ_begin
    uint32_t deps;        // ops that must finish before this one starts, plus one for a transfer
                          // whose predecessor in its peer queue must be posted first
    uint32_t fifo_next;   // transfers: the next send (receive) to the same peer, posted after this one
    uint32_t link;        // sends of the full form: the matching receive of member `peer`
    int32_t peer;         // transfers: the member sent to / received from
    Kind kind;
  };
  int32_t world = 0;
  int32_t members = 0;                // members whose ops are compiled: world, or 1 (symmetric form)
  uint64_t elem_bytes = 4;
  std::string description;            // Plan::describe() (large plans: the same fields from counts)
  std::vector<uint32_t> first_op;     // members + 1 entries into ops
  std::vector<Op> ops;                // and one more at the end that only closes the last succ list
  std::vector<uint32_t> succs;
  uint64_t finish_bytes = 0;          // per member, the closing average (ReduceOp avg), if any
  uint64_t sends = 0;                 // send ops compiled (over the compiled members)
  // Every member's ops are member 0's with peers shifted by the member's index (mod world), identical
  // sizes and dependencies: ring-like plans. Then member q's k-th send to member 0 is the image of
  // member 0's k-th send to member (world - q), and mirror_recv[i] is the receive of member 0 that
  // member 0's send i mirrors (see step.cpp, symmetric execution; per op of member 0).
  bool rotation_symmetric = false;
  std::vector<uint32_t> mirror_recv;
  // Symmetric form only: ranks run member 0's graph but move unequal amounts (a ring whose count is
  // not divisible by the world: segments differ by one element), and each op holds the most any rank
  // moves with it. Symmetric execution then times every rank as the slowest image (an upper bound on
  // the full model's step, tight to the time of a few elements per step); exact_bytes_sent keeps
  // the true total.
  bool sizes_bounded = false;
  uint64_t exact_bytes_sent = 0;
  std::optional<engine::comm::PlanRequest> request;  // what the plan was built from (for full())

  uint32_t op_count(int32_t member) const { return first_op[member + 1] - first_op[member]; }
  const Op& op(int32_t member, uint32_t i) const { return ops[first_op[member] + i]; }
  // succs of member m's op i (member-local indices)
  const uint32_t* succ_begin(int32_t member, uint32_t i) const { return succs.data() + op(member, i).succ_begin; }
  const uint32_t* succ_end(int32_t member, uint32_t i) const {
    return succs.data() + ops[first_op[member] + i + 1].succ_begin;
  }
  uint64_t transfers() const { return is_full() ? sends : sends * static_cast<uint64_t>(world); }
  uint64_t total_bytes_sent() const;  // over all members (the symmetric form counts member 0's world times)
  size_t bytes_held() const { return ops.size() * sizeof(Op) + succs.size() * sizeof(uint32_t); }
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
// rotated -- same ops, peers shifted, its regions' ends the images of member 0's under one
// order-keeping map per address space (a rigid rotation where segments are equal), so the runtime's
// dependency analysis gives every rank member 0's graph -- and member 0's receives mirror its sends;
// else nullopt. Ranks must move equal amounts op by op unless `bound_sizes`: then each op takes the
// most any rank moves (CompiledPlan::sizes_bounded). Costs O(ops of the whole plan) time and O(ops
// of one rank) memory.
//
// How the proof reads the ranks. kEveryRank: every rank's plan is generated and checked (O(world^2) for a ring).
// kRingSample, for a ring all-reduce whose every op moves one whole segment (segments of q or q + 1 elements, one
// chunk each): the ring's structure -- rank r's ops are rank 0's with every segment index moved by r
// (plan_blocks.cpp: step s sends segment r - s - 1 and receives r - s - 2, then r - s and r - s - 1) -- is checked
// on a sample of ranks (the first and last few, those next to the boundary between the q + 1 and the q segments and
// its image, and 64 spread over the world): congruent as above, each user-buffer region at the start of segment
// (rank 0's + r) mod world and as long as it, every region a whole segment. Then each op visits every segment
// once as r runs over the ranks, so the most any rank moves with it is its (q + 1)-element size and its bytes over
// all ranks sum to the buffer's: the same figures the every-rank proof computes. Other plans: every rank.
enum class SymmetryProof : uint8_t { kEveryRank = 0, kRingSample = 1 };
std::optional<CompiledPlan> compile_symmetric(const engine::comm::PlanRequest& request, bool bound_sizes = false,
                                              SymmetryProof proof = SymmetryProof::kEveryRank);

// Worlds above this compile rank by rank (symmetric form where proven); smaller ones from make_plan.
constexpr int32_t kRankByRankWorld = 256;

// make_plan + compile_plan, memoised per request (the same bucket sizes recur in every step and in
// every configuration a search tries); above kRankByRankWorld, compile_symmetric (sizes bounded, so
// rings of unequal segments stay O(ops of one rank); kRingSample) or compile_plan_by_rank. Not thread-safe; one cache per simulation.
class PlanCache {
 public:
  const CompiledPlan& get(const engine::comm::PlanRequest& request);
  size_t size() const noexcept { return plans_.size(); }

 private:
  std::unordered_map<std::string, std::unique_ptr<CompiledPlan>> plans_;
};

}  // namespace tandem::simulator
