#pragma once
// A communicator: a group of ranks over one transport that runs collectives. Collectives are
// queued in call order and executed by the communicator's progress engine as plans (plan.hpp);
// the non-blocking forms return a Work handle the caller tests or waits on, so training code can
// overlap communication with compute.
//
// Failure model: every wait has a deadline (CommOptions::timeout). When a peer dies, stalls, sends
// garbage or calls a different collective, every rank's pending and later operations fail with a
// tandem::Error naming the operation and the rank(s) involved (kTimeout, kPeerFailure, kMismatch);
// the communicator is then unusable (is_failed()): destroy it, or shrink() it to the ranks still alive
// (elastic training) and go on with the result.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/comm/plan.hpp"
#include "engine/core/dtype.hpp"
#include "engine/core/error.hpp"
#include "transports/transport.hpp"

namespace tandem::engine::comm {

struct CommOptions {
  std::string transport = "auto";          // inproc | zmq | ucx | auto (TANDEM_TRANSPORT overrides "auto")
  std::chrono::milliseconds timeout{60000}; // deadline of every blocking wait (TANDEM_TIMEOUT_MS)
  Algorithm allreduce_algorithm = Algorithm::kAuto;  // TANDEM_ALLREDUCE_ALGO
  bool deterministic = false;              // fixed reduction order, bit-identical run to run (TANDEM_DETERMINISTIC=1)
  uint64_t chunk_bytes = 0;                // pipelining chunk; 0 = default
};

// Who this process is and where the job meets.
struct BootstrapInfo {
  int rank = 0;
  int size = 1;
  int local_rank = 0;   // index among ranks on this host
  int local_size = 1;
  std::string host;     // host identity used for hierarchical algorithms (defaults to hostname)
  std::string listen_addr;  // where the transports listen and what they advertise ("": their default, 127.0.0.1;
                            // TANDEM_IFACE_ADDR overrides either)
};

// Who a communicator's failure is blamed on (Communicator::failure_status), for trainers and the C ABI to
// report. Ranks are ranks of the communicator the status comes from.
struct FailureStatus {
  bool failed = false;
  Status status = Status::kOk;
  // The rank where the failure started: the one that called abort(), or the one that first detected
  // the fault (a dead peer, a mismatch, a deadline) and told the others. -1 while not failed.
  int origin = -1;
  // The origin called abort() (the application gave up) rather than detecting a fault.
  bool aborted = false;
  // The ranks blamed, ascending: a peer that died or closed, the rank(s) that never took part before a
  // deadline, a rank that sent a mismatched call, a rank whose transport gave a link up for want of its own memory
  // (it blames itself, and the peer it cut blames it: Transport::at_fault). Empty for an abort and where nobody
  // can be named (every rank waited for was stuck itself).
  std::vector<int> ranks;
  // The ranks were blamed for a deadline (some rank waited for them and heard nothing: they may only have been
  // waiting for another), not for a fault they were seen to cause. Follows the report whose blame is kept.
  bool timed_out = false;
  std::string message;  // as failure_message()
};

// Communicator::grow's bounds.
struct GrowOptions {
  int max_ranks = 0;                       // > 0: joiners beyond this size are refused (with the reason)
  std::chrono::milliseconds window{0};     // how long to wait for a joiner's request after its ticket; 0 = timeout
  int limit = 0;                           // > 0: admit at most this many joiners, the oldest tickets first; the
                                           // others keep waiting, unanswered, for a later grow (a grid's spares)
};

class Work {
 public:
  virtual ~Work() = default;
  // True when complete; throws the operation's error if it failed.
  virtual bool test() = 0;
  // Waits until complete or the deadline passes; throws on failure or timeout.
  virtual void wait() = 0;
};

class Communicator {
 public:
  // Collective over `info.size` ranks: connects a transport through `store` (borrowed for the call;
  // the communicator keeps its own reference only if it needs the store later -- see split).
  static std::unique_ptr<Communicator> create(const BootstrapInfo& info, std::shared_ptr<transports::KvStore> store,
                                              const CommOptions& options);
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* transport_name() const = 0;
  virtual const CommOptions& options() const = 0;

  // Collective: ranks with equal color form a new communicator, ordered by (key, old rank).
  // color < 0 returns nullptr for that rank (it joins no group).
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;

  // Non-blocking collectives. Buffers are borrowed until the Work completes (after a failure, until
  // the communicator is destroyed: a transport may still read an abandoned send). Counts are
  // elements per rank as in MPI: allreduce/broadcast/reduce `count` elements; reduce_scatter: send
  // has size()*count, recv has count; allgather: send has count, recv size()*count.
  // In place (NCCL's layouts): allreduce/reduce send == recv; reduce_scatter recv == send +
  // rank()*count elements; allgather send == recv + rank()*count elements. Other overlaps work on
  // a private copy of the input. reduce: recv may be null off the root. send/recv: tag < 2^24.
  // send is buffered on every transport: it completes once the data is copied, without waiting for
  // the matching recv (a failed delivery fails the communicator; a later operation reports it).
  virtual std::unique_ptr<Work> allreduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) = 0;
  virtual std::unique_ptr<Work> reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) = 0;
  virtual std::unique_ptr<Work> allgather(const void* send, void* recv, size_t count, DType dtype) = 0;
  virtual std::unique_ptr<Work> broadcast(void* buf, size_t count, DType dtype, int root) = 0;
  virtual std::unique_ptr<Work> reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, int root) = 0;
  virtual std::unique_ptr<Work> barrier() = 0;
  virtual std::unique_ptr<Work> send(const void* buf, size_t count, DType dtype, int peer, uint32_t tag) = 0;
  virtual std::unique_ptr<Work> recv(void* buf, size_t count, DType dtype, int peer, uint32_t tag) = 0;

  // Sticky failure state (after any failed operation, or an abort received from a peer).
  virtual bool is_failed() const = 0;
  virtual std::string failure_message() const = 0;
  // The failure with the ranks it is blamed on (failed == false while the communicator is healthy).
  virtual FailureStatus failure_status() const = 0;
  // Fails every pending operation here and tells peers (best effort) so they fail fast too. It reaches every
  // communicator made from this one (split, shrink, grow), now and later; a child's abort leaves its parent.
  virtual void abort(const std::string& reason) = 0;
  // The reason of an abort called on this rank on this communicator or on one it was made from ("" when none): its
  // program stopped it, which no elastic recovery may take for a lost peer. A peer's abort does not count.
  virtual std::string stopped_by() const = 0;

  // Elastic recovery, collective over the survivors of this failed communicator: every rank still alive
  // calls it, they agree through the job's store on who is left (membership.hpp states the rule: one
  // coordinator decides once; out are the ranks seen to fail, those some rank timed out on that stay silent for a
  // grace, and those silent for options().timeout: a shrink may keep every rank, when all answer) and
  // each gets a new communicator of those ranks, in their old order, over the same transport -- no
  // process restarts; what the failure cut between two survivors is mended first (Transport::reconnect: ucx
  // moves a worker left deaf by a same-host death to a fresh one). This communicator stays failed (destroy it
  // when done). Errors: kInvalidArgument when this communicator has not failed (nobody to remove); kPeerFailure
  // on a rank the survivors declared dead (it came back too late, or it aborted); kTimeout when no decision came
  // (the store or the coordinator died) or a survivor did not publish its address (it died meanwhile);
  // kUnsupported for a store without counters.
  virtual std::unique_ptr<Communicator> shrink() = 0;
  // Not collective: this rank is done with this failed communicator and will never shrink it (its program has
  // finished, or gives up). It posts in the survivors' agreement that it left, with `note` (one line for the
  // survivors' program: membership.hpp, rule 5), so their coordinator counts it out at once instead of waiting out
  // the window for a post that would never come. The store write is bounded (min(options().timeout, 2 s)): a store
  // that is gone costs at most that, logged. A no-op on a healthy communicator, one without a store, or one this rank
  // has called shrink on. Never throws.
  virtual void leave(const std::string& note) noexcept { (void)note; }
  // Not collective: records `note` (one line) as this rank's standing note in the job's store, replacing the one
  // before. A shrink whose survivors count this rank out without its departure post -- it died, was killed by a
  // signal, stalled -- hands them this note (departures(); membership.hpp, rule 6): for what the survivors must know
  // however the rank ends. One bounded store write (min(options().timeout, 2 s)): a store that is gone costs at most
  // that, logged. A no-op without a store, or once this rank posted in a shrink of this communicator (shrink,
  // leave). Never throws.
  virtual void set_note(const std::string& note) noexcept { (void)note; }
  // For shrink's result: the ranks of the communicator it was shrunk from that were counted out with a note -- they
  // left it (leave) before the survivors decided, or kept a standing note (set_note) -- old ranks, ascending, with
  // their notes. Empty otherwise.
  virtual std::vector<std::pair<int, std::string>> departures() const { return {}; }
  // Elastic growth (admission.hpp states the rule), collective over this healthy communicator's ranks:
  // pending_joins() returns how many joiners (join_communicator) wait for admission -- rank 0 reads the job's
  // store and broadcasts the count, so every rank gets the same number. grow() admits them: one decision by
  // rank 0 (joiners beyond options.max_ranks are refused with the reason), then the old ranks (ranks
  // 0..size()-1, in order) and the admitted joiners (the next ranks, in the order they asked) build a new
  // communicator over a new transport. Returns it, or nullptr when nobody was admitted or when building it
  // failed on any old rank within options().timeout (a joiner died while being admitted: logged, this communicator
  // stays usable). This communicator stays as it was; destroy it when done. Errors: kUnsupported for a
  // communicator without a store; the errors of a failed collective on this communicator.
  virtual int64_t pending_joins() = 0;
  // Not collective: pending_joins()'s reading on rank 0 alone (one store round trip there; 0 on every other rank,
  // which does nothing). For a caller that tells the others its decision on messages they exchange anyway (the
  // parameter servers' piggy-backed joiner check, param_server.hpp). Errors: kUnsupported without a store.
  virtual int64_t peek_joins() = 0;
  virtual std::unique_ptr<Communicator> grow(const GrowOptions& options) = 0;
  // A rank of this communicator that has no place in its group's next grid (a spare) waits for a later grow
  // exactly as a joiner does (admission.hpp, step 1: a ticket in the job's store, then the answer), up to `wait`,
  // and returns the grown world it is admitted into (a joiner's communicator). Not collective: the others have
  // gone on without this rank. Errors: kUnsupported without a store, or with the job's reason when it refused
  // this rank (refuse_joiners: the job ended); kTimeout when no grow admitted it within `wait`.
  virtual std::unique_ptr<Communicator> rejoin(std::chrono::milliseconds wait) = 0;
  // Not collective (one rank, usually the job's rank 0 as it ends): answers every joiner still waiting in the job's
  // store "refuse <why>", so joiners and spares stop waiting at once. A no-op without a store.
  virtual void refuse_joiners(const std::string& why) = 0;
  // Membership epoch: 0 for a communicator from create or split, its parent's + 1 for shrink's and grow's result
  // (a joiner's: the epoch it was admitted at).
  virtual int epoch() const = 0;
  // For shrink's result: the rank each of its ranks had in the communicator it was shrunk from
  // (ascending). For grow's: 0..n-1 for the old ranks, -1 for each joiner. Empty for create or split.
  virtual std::vector<int> parent_ranks() const = 0;

  // The algorithm `auto` would choose (or the override), for logs and benchmarks.
  virtual Algorithm allreduce_algorithm_for(size_t count, DType dtype) const = 0;
};

}  // namespace tandem::engine::comm
