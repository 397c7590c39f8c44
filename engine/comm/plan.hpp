#pragma once
// Collective algorithms as plans: plain data listing, for every rank, rounds of sends, receives and
// local reductions over element ranges of the caller's buffers. The runtime's PlanExecutor runs a
// plan on a Transport; the simulator runs the very same plan on a modelled cluster. Plans carry no
// transport, timing or dtype-specific logic: regions are in elements; the executor multiplies by
// the element size.
#include <cstdint>
#include <string>
#include <vector>

namespace tandem::engine::comm {

enum class Collective : uint8_t {
  kAllreduce = 0, kReduceScatter = 1, kAllgather = 2, kBroadcast = 3, kReduce = 4, kBarrier = 5,
  kSend = 6, kRecv = 7,
};

enum class Algorithm : uint8_t {
  kAuto = 0, kRing = 1, kHalvingDoubling = 2, kTree = 3, kHierarchical = 4,
  kDirect = 5,         // every rank talks to every rank / the root directly (barrier, small gathers)
  kDeterministic = 6,  // fixed reduction order (rank 0, 1, ..., n-1) whatever the world size
};

const char* collective_name(Collective c) noexcept;
const char* algorithm_name(Algorithm a) noexcept;
Algorithm parse_algorithm(const std::string& s);  // "auto", "ring", "hd", "tree", "hier", ...

// Which buffer a region lives in. kInput is the caller's send buffer (equal to kOutput for in-place
// calls), kOutput the caller's result buffer, kScratch a plan-sized temporary the executor owns
// (Plan::scratch_count elements).
enum class Buffer : uint8_t { kInput = 0, kOutput = 1, kScratch = 2 };

struct Region {
  Buffer buffer = Buffer::kOutput;
  uint64_t offset = 0;  // elements
  uint64_t count = 0;   // elements
};

enum class OpKind : uint8_t {
  kSend = 0,    // send `src` to `peer`
  kRecv = 1,    // receive from `peer` into `dst` (dst.count elements expected)
  kCopy = 2,    // dst = src (local, same count)
  kReduce = 3,  // dst = dst (op) src (local, same count) -- applied in list order within a round,
                // after all of the round's transfers have completed
};

struct Op {
  OpKind kind = OpKind::kSend;
  int32_t peer = -1;  // kSend/kRecv only
  Region src;         // kSend, kCopy, kReduce
  Region dst;         // kRecv, kCopy, kReduce
};

// A round's transfers run concurrently; its local ops (kCopy, kReduce) run in order once every
// transfer of the round has completed; the next round starts after that. A rank's rounds are
// independent of other ranks' except through matching sends and receives: the k-th send from a to
// b in plan order matches the k-th receive on b from a.
struct Round {
  std::vector<Op> ops;
};

struct RankPlan {
  std::vector<Round> rounds;
};

struct Plan {
  Collective collective = Collective::kAllreduce;
  Algorithm algorithm = Algorithm::kRing;
  int32_t world = 1;
  int32_t root = 0;
  uint64_t count = 0;          // PlanRequest::count as given (see there: per collective)
  uint64_t scratch_count = 0;  // elements of scratch each rank needs
  bool finish_avg = false;     // executor divides the output by `world` at the end (ReduceOp avg)
  std::vector<RankPlan> ranks; // one per rank
  std::string describe() const;  // one line: collective, algorithm, world, count, rounds

  // Added by comm (see PlanRequest): the receiving rank of kSend/kRecv, the in-place layout the
  // plan was built for, and the chunk (elements) large transfers were cut into.
  int32_t peer = -1;
  bool in_place = false;
  uint64_t chunk_count = 0;
  // Messages and payload elements over all ranks (for describe(), logs and the simulator).
  uint64_t message_count() const;
  uint64_t payload_count() const;
};

// Elements of the caller's buffer `b` at `rank` (kScratch: scratch_count). reduce: non-roots have
// no output (0); kSend/kRecv: only the sender has input and only the receiver output.
uint64_t plan_buffer_count(const Plan& plan, Buffer b, int32_t rank);

// Per-rank host placement, for hierarchical algorithms: host_of[r] = host index of rank r.
struct Topology {
  std::vector<int32_t> host_of;
  bool multi_rank_hosts() const;
};

struct PlanRequest {
  Collective collective = Collective::kAllreduce;
  Algorithm algorithm = Algorithm::kAuto;
  int32_t world = 1;
  int32_t root = 0;
  uint64_t count = 0;           // allreduce/broadcast/reduce: elements in the buffer;
                                // reduce-scatter: elements of the full input (world * per-rank);
                                // allgather: elements of the full output (world * per-rank)
  uint64_t elem_bytes = 4;      // only for choosing an algorithm and chunk sizes, never for layout
  uint64_t chunk_bytes = 0;     // pipeline chunk size for large buffers; 0 picks a default
  Topology topology;            // empty: every rank on its own host
  // kSend/kRecv: `root` sends `count` elements to `peer` (both plans are the same transfer).
  int32_t peer = -1;
  // The caller's input lives inside its output (allreduce/reduce: same buffer; reduce-scatter: the
  // output is input + rank * count/world; allgather: the input is output + rank * count/world).
  // In-place plans never read a region after overwriting the caller's contribution in it.
  bool in_place = false;
};

// Builds the plan for every rank. kAuto resolves by size and world (see choose_algorithm).
// Throws kInvalidArgument for impossible requests (root out of range, count not divisible by world
// where the collective requires it, ...).
//
// Algorithms per collective (kAuto picks; kDeterministic on a collective without a reduction is the
// same as kAuto):
//   allreduce       ring (reduce-scatter + allgather, chunked and pipelined), halving-doubling
//                   (recursive doubling for small buffers, Rabenseifner for large; extra ranks of a
//                   non-power-of-two world are folded in first), tree (binomial reduce + broadcast),
//                   hierarchical (tree to a host leader, ring across leaders, tree back), deterministic
//                   (each segment's owner folds all contributions in rank order 0..n-1, then ring allgather)
//   reduce-scatter  ring, deterministic
//   allgather       ring
//   broadcast       tree (binomial), ring (pipelined chain root -> root+1 -> ...)
//   reduce          tree (binomial), ring (ring reduce-scatter then gather to root), deterministic
//   barrier         direct (dissemination: ceil(log2 n) rounds; a send waits for every earlier receive)
//   send/recv       direct
// Rounds are a valid sequential schedule; an executor may start an op earlier when its regions do not
// conflict with unfinished earlier ops and sends/receives to one peer keep plan order.
Plan make_plan(const PlanRequest& request);
Algorithm choose_algorithm(const PlanRequest& request);
// make_plan(request).ranks[rank], built without the other ranks' ops: O(ops of that rank) time and
// memory for ring, reduce-scatter, allgather and deterministic plans (the O(world^2)-op ones), O(ops
// of the whole plan) time for the others. Lets a simulator compile or check a 4,096-rank plan rank by
// rank instead of holding every rank's ops at once. Same errors as make_plan, and kInvalidArgument
// for a rank outside [0, world).
RankPlan make_rank_plan(const PlanRequest& request, int32_t rank);
// The same into `out`, reusing its storage (rank after rank without allocating per round).
void make_rank_plan(const PlanRequest& request, int32_t rank, RankPlan& out);
// make_plan(request) without its ranks' ops and scratch size: the fields that say how to read a rank's
// plan (collective, algorithm, world, root, peer, count, in-place layout, chunk). With make_rank_plan,
// what compile_rank_plan (executor.hpp) needs to compile one rank of a plan never built whole.
Plan plan_header(const PlanRequest& request);
// Pipeline chunk in elements that make_plan uses for `request` (chunk_bytes or the default).
uint64_t plan_chunk_count(const PlanRequest& request);
constexpr uint64_t kDefaultChunkBytes = 512 * 1024;
// The chunk the communicator asks for, for a collective over `buffer_bytes` (the plan's count times
// the element size) with CommOptions::chunk_bytes `configured` (0: default): larger than configured
// for huge buffers, so a plan has at most 512 chunks per buffer. The simulator uses it to model
// the plans the runtime really runs.
uint64_t effective_chunk_bytes(uint64_t configured, uint64_t buffer_bytes);

// Checks a plan's internal consistency: every send has a matching receive of equal size, regions in
// bounds, no rank waits forever. Used by tests and the simulator; throws kInternal describing the flaw.
void validate_plan(const Plan& plan);

}  // namespace tandem::engine::comm
