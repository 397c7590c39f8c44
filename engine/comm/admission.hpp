#pragma once
// Growing a running job (issue #17): new ranks ask to join through the job's store, and the running
// ranks admit them together at a point of their choosing (a trainer: a step boundary), with one
// decision, never two views -- the mirror of membership.hpp's shrink.
//
// Rule (one coordinator, one decision, one deadline):
//  1. A joiner proves the job's secret to the rendezvous (a wrong one is refused there: kAuth, nothing
//     it sends is acted on), takes a ticket t from the store's counter "tandem/join/asked" and posts
//     "tandem/join/request/<t>" (its host). Then it waits for "tandem/join/answer/<t>".
//  2. The running ranks check for joiners collectively (Communicator::pending_joins): rank 0 reads the
//     counters and broadcasts the count, so every rank sees the same number.
//  3. Communicator::grow, collective over the running ranks: rank 0 of the communicator coordinates. It
//     takes every ticket not yet handled, in order; a ticket whose request does not appear within the
//     window is dropped (the joiner died between its ticket and its request); one beyond max_ranks is
//     answered "refuse" with the reason. It marks them handled, answers each admitted joiner "admit"
//     (the grown world's key namespace, its rank, the new size, the epoch) and broadcasts the count to
//     the running ranks. The old ranks keep their ranks 0..n-1; joiners follow in ticket order. With a limit
//     (GrowOptions::limit: a pipeline grid widens by whole rows) only the oldest tickets are taken; the others stay
//     unhandled and wait, unanswered, for a later grow -- the grid's spares wait there too (Communicator::rejoin).
//     The grown world's namespace is named by the last ticket handled, so it is never used twice.
//  4. Every old rank and every admitted joiner builds the grown world (a new transport over the same
//     store, under its own namespace); the old ranks then vote on the old communicator, which is still
//     healthy: all built it -> rank 0 writes "ok", else "abandoned" and the old ranks go on without
//     the joiners (a joiner that died while being admitted costs at most one window, never a hang).
//     A joiner waits for that outcome and fails with kPeerFailure on "abandoned".
//  5. When the job ends, its rank 0 may answer every ticket still waiting "refuse <why>" (refuse_waiting), so
//     joiners and spares stop at once instead of at the end of their wait.
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "transports/transport.hpp"

namespace tandem::engine::comm {

// The coordinator's decision for one grow.
struct Admission {
  int64_t grow_id = 0;             // names the grown world's key namespace (grow_prefix)
  std::vector<int64_t> tickets;    // admitted joiners, in rank order after the old ranks
};

// Joiners asked but not yet handled (rank 0's view; Communicator::pending_joins broadcasts it).
int64_t joiners_waiting(transports::KvStore& store);

// Step 3 on the coordinator: `size` ranks run now; max_ranks > 0 bounds the grown size; limit > 0 admits at most
// that many (the oldest tickets first) and leaves the later tickets waiting, unhandled, for a later grow.
Admission admit_joiners(transports::KvStore& store, int size, int epoch, int max_ranks,
                        std::chrono::milliseconds window, int limit = 0);

// Answers every ticket not yet handled "refuse <why>" (the job ends, or admits nobody: its joiners and spares stop
// waiting) and closes the job to joiners: a later request_admission is refused at once with `why`, and one waiting
// learns it within half a second. Returns how many were waiting.
int64_t refuse_waiting(transports::KvStore& store, const std::string& why);

// "tandem/grow/<id>/": the grown world's key namespace (unique: ids are ticket counts, which only grow).
std::string grow_prefix(int64_t grow_id);

// What a joiner learns (step 1's answer).
struct JoinAnswer {
  int64_t grow_id = 0;
  int rank = 0, size = 0, epoch = 0;
  int old_size = 0;  // the ranks that ran before: ranks 0..old_size-1 of the grown world
};

// Step 1 for a joiner: takes a ticket, posts `host` and waits up to `wait` for the answer. Throws
// kUnsupported with the job's reason when refused (max ranks), kTimeout when no answer came (the job
// never reached a step boundary that admits, or it is not elastic).
JoinAnswer request_admission(transports::KvStore& store, const std::string& host, std::chrono::milliseconds wait);

// Step 4's outcome: written by the coordinator, read by the joiners (kPeerFailure on "abandoned",
// kTimeout when none comes within `wait`).
void publish_outcome(transports::KvStore& store, int64_t grow_id, bool ok);
void await_outcome(transports::KvStore& store, int64_t grow_id, std::chrono::milliseconds wait);

}  // namespace tandem::engine::comm
