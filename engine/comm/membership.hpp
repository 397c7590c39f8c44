#pragma once
// The survivors' agreement behind Communicator::shrink: who is left after a failure, decided once
// through the job's store so that no two survivors can ever hold different views.
//
// Rule (one coordinator, one decision, one deadline):
//  1. Every rank that calls shrink posts "alive/<rank>" (its lowest free communicator id and the
//     ranks it suspects, each with the kind of suspicion), then takes a ticket from the store's
//     atomic counter. A *fault* is proof: the peer's connection broke, it died, aborted or sent a
//     mismatched call. A *timeout* is only a suspicion: this rank waited for the peer and heard
//     nothing -- the peer may as well have been waiting for a third rank that stalled.
//  2. The rank holding ticket 1 coordinates. Ranks blamed for a fault, by it or by any post it
//     reads, are out at once. Ranks blamed for a timeout get a grace (a quarter of the window,
//     20 ms to 2 s, from its start): one that posts within it is alive and stays, one that does
//     not is out. Every other rank is waited for until one shared deadline (unsuspected_wait: the
//     window plus the time a live rank's transport may spend letting go of the failed
//     communicator's cancelled operations before that rank can post -- zmq waits up to 2 s per peer
//     for ZeroMQ to write a cancelled send out to a stalled one, transports/transport.hpp); a rank that has not
//     posted by then is out too -- a slow rank is treated as dead. So when every rank posts in
//     time and no fault was seen, nobody is dropped.
//     Transport evidence ends a wait early: every rank posts the peers its transport knows are gone for good
//     (Transport::dead_peers: a goodbye, a closed or reset connection, an exited process -- never a deadline), and the
//     coordinator asks its own transport again every poll slice (20 ms) while it waits. A rank so reported that has not
//     posted is out at once (its post is read once more first: it may have posted or left just before its connection
//     ended). A rank that has posted took part and stays, whatever a transport says of it, unless blamed for a fault.
//     Before, only the ranks of each survivor's *first* failure were named: a rank that died as well, but was nobody's
//     first failure (the survivors had already failed on another), was waited for until the shared deadline (12 s at
//     the CLI's 10 s window). Where a transport cannot know (a peer on another host that lost power, a network cut;
//     see transport.hpp), the window still decides.
//  3. The coordinator writes "decision" once: the new epoch, the new communicator id and the
//     members (old ranks, ascending). Everyone (the coordinator too) reads that one key.
//  4. A rank not among the members gets kPeerFailure saying it was declared dead: a rank that
//     comes back late is refused, never admitted into a second view.
//  5. A rank that is done with the failed communicator and will never shrink it (its program ended:
//     Communicator::leave) posts "left <note>" in place of its post. The coordinator counts it out as
//     soon as it reads that -- no grace, no window -- and names it in the decision ("left=<ranks>"),
//     so every survivor reads the same departed ranks' notes (post_departure, Membership::left).
//  6. A rank may keep a standing note in the store while it works (post_note: "note/<rank>", each write replacing
//     the last; Communicator::set_note). For a rank it counts out that posted no departure -- one killed by a signal
//     posts nothing -- the coordinator reads that note (without waiting) and hands it on as rule 5 does: so what a rank
//     recorded before it died reaches the survivors however it ended. The coordinator writes the notes it used
//     ("notes") before the decision, and every survivor reads them there: a rank declared dead that writes again
//     later changes nobody's view.
// Limits: the store must survive (on tcp it is served by rank 0 of the job's world unless TANDEM_STORE names one
// served elsewhere, as `tandem launch` does: bootstrap.hpp); a coordinator
// that dies between its ticket and its decision makes every survivor fail with kTimeout.
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "transports/transport.hpp"

namespace tandem::engine::comm {

struct ShrinkRequest {
  std::string key_base;    // store keys for this communicator's shrink (unique per world and communicator id)
  int rank = 0;            // this rank in the failed communicator
  int size = 1;            // the failed communicator's size
  int epoch = 0;           // the failed communicator's membership epoch
  uint32_t next_id = 0;    // lowest communicator id free on this rank
  std::vector<int> blamed;     // ranks this rank holds responsible for the failure: a fault (rule 1)
  std::vector<int> timed_out;  // ranks it waited for in vain (a deadline): suspected, not proven dead
  // The ranks this rank's transport knows are gone for good (Transport::dead_peers, in the failed communicator's
  // ranks; rule 2): asked when it posts, and again and again by the coordinator while it waits. Empty: none known.
  std::function<std::vector<int>()> dead_peers;
  std::chrono::milliseconds window{60000};  // how long the coordinator waits for the others' posts
};

struct Membership {
  int epoch = 0;              // the failed communicator's epoch + 1
  uint32_t comm_id = 0;       // id of the survivors' communicator (free on every member)
  int coordinator = -1;       // the rank that decided
  std::vector<int> members;   // old ranks, ascending
  int new_rank = -1;          // this rank's index in members (-1: declared dead; agree_membership throws)
  // Rules 5 and 6: the ranks counted out that left a note -- they posted that they left before the decision, or
  // kept a standing note -- (old ranks, ascending), with their notes.
  std::vector<std::pair<int, std::string>> left;
};

// Rule 5, for a rank leaving the failed communicator whose shrink keys are `key_base` (never after its own post):
// writes "left <note>" (the note on one line) to the store within `bound`; throws the store's error after it.
void post_departure(transports::KvStore& store, const std::string& key_base, int rank, const std::string& note,
                    std::chrono::milliseconds bound);

// Rule 6, for a rank of the communicator whose shrink keys are `key_base`: writes its standing note (on one line),
// replacing the one before, within `bound`; throws the store's error after it.
void post_note(transports::KvStore& store, const std::string& key_base, int rank, const std::string& note,
               std::chrono::milliseconds bound);

// Rule 2's grace for a rank suspected of a timeout: window / 4, clamped to [20 ms, 2 s] and to the window.
std::chrono::milliseconds timeout_grace(std::chrono::milliseconds window);
// Rule 2's wait for a rank nobody suspects: the window plus kLetGoAllowance (2 s, the longest a transport holds a
// cancelled send to a live but silent peer: zmq's release window). Before, it was the window alone, which over ucx a
// survivor held by that let-go after a stall could miss (posting ~2 s after its failure) and be dropped, healthy.
// ucx no longer waits in a cancel and tcp never did; the allowance stays for zmq (one value for every transport:
// it costs time only when a rank nobody suspects never posts).
inline constexpr std::chrono::milliseconds kLetGoAllowance{2000};
std::chrono::milliseconds unsuspected_wait(std::chrono::milliseconds window);

// Runs the rule above for one rank. Throws kPeerFailure when this rank was left out, kTimeout when
// no decision appears within the window plus unsuspected_wait, kUnsupported when the store cannot count.
Membership agree_membership(transports::KvStore& store, const ShrinkRequest& request);

// The decision's text, "epoch=<e> id=<id> coordinator=<r> members=<a,b,...> left=<c,...>" (the notes are not in it),
// and back
// (kInternal naming the text when it is malformed).
std::string format_decision(const Membership& m);
Membership parse_decision(const std::string& text);

}  // namespace tandem::engine::comm
